"""CIFAR-10's download: a time limit, and one line that says how to place the archive by hand
(ddp_scripts/data.py). A local server plays the host; nothing goes to the internet."""
import http.server
import threading

import pytest

from ddp_scripts import data


class Trickle(http.server.BaseHTTPRequestHandler):
    """A host that answers, then sends the archive one byte at a time, until told to stop."""
    stop = threading.Event()

    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Length", str(data.ARCHIVE_BYTES))
        self.end_headers()
        while not self.stop.wait(0.05):
            try:
                self.wfile.write(b"x")
                self.wfile.flush()
            except OSError:
                return

    def log_message(self, *args):
        pass


@pytest.fixture
def slow_host():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Trickle)
    server.daemon_threads = True
    Trickle.stop.clear()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/{data.ARCHIVE}"
    Trickle.stop.set()
    server.shutdown()
    server.server_close()


def test_a_slow_host_gives_up_in_the_time_limit_and_says_how_to_place_the_file(slow_host, tmp_path):
    with pytest.raises(OSError) as raised:
        data.fetch_archive(tmp_path, url=slow_host, limit_s=0.5)
    message = str(raised.value)
    assert "\n" not in message and "not done after 0.5 s" in message
    assert f"put {data.ARCHIVE} (170,498,071 bytes, MD5 {data.ARCHIVE_MD5}) into {tmp_path}/" in message
    assert list(tmp_path.iterdir()) == [], "a half download is left behind"


def test_a_refused_connection_says_how_to_place_the_file(tmp_path):
    with pytest.raises(OSError, match="by hand and run again$"):
        data.fetch_archive(tmp_path, url="http://127.0.0.1:9/none.tar.gz", limit_s=5)


def test_the_md5_is_torchvision_s_and_a_wrong_file_in_place_is_named_not_deleted(tmp_path):
    from torchvision.datasets import CIFAR10
    assert (data.ARCHIVE, data.ARCHIVE_MD5) == (CIFAR10.filename, CIFAR10.tgz_md5)
    placed = tmp_path / data.ARCHIVE
    placed.write_bytes(b"not the archive")
    with pytest.raises(OSError, match="is not the CIFAR-10 archive"):
        data.fetch_archive(tmp_path, url="http://127.0.0.1:9/never-asked", limit_s=5)
    assert placed.read_bytes() == b"not the archive"


def test_the_fallback_line_carries_the_placing_instructions(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(data, "DOWNLOAD_TIMEOUT_S", 5)
    monkeypatch.setattr(data.fetch_archive, "__defaults__", ("http://127.0.0.1:9/x", 5, 5))
    train, _ = data.load_datasets("cifar10", str(tmp_path), train_samples=64, test_samples=16)
    assert train.source == "synthetic (fallback)"
    [line] = [line for line in capsys.readouterr().out.splitlines() if "could not be loaded" in line]
    assert f"MD5 {data.ARCHIVE_MD5}" in line and "using the synthetic CIFAR-shaped data set" in line
