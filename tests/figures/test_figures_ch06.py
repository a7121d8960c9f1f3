"""Chapter 6's figures, fed a two-node rehearsal of ddp_scripts/recorders/who_am_i.py on this machine:
what they draw is what the workers wrote."""
import os
import subprocess

import matplotlib

matplotlib.use("Agg")

import pytest

from ddp_scripts.launcher import end_process_tree, free_port
from notebooks import node_figures
from notebooks.figures import new_figure


@pytest.fixture(scope="module")
def workers(tmp_path_factory):
    out = tmp_path_factory.mktemp("who")
    port = free_port()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo"}
    launchers = [subprocess.Popen(node_figures.who_am_i_command(node, port, out), env=env,
                                  stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL, start_new_session=True)
                 for node in (0, 1)]
    try:
        codes = [launcher.wait(timeout=300) for launcher in launchers]
    finally:
        for launcher in launchers:
            end_process_tree(launcher)
    assert codes == [0, 0]
    return node_figures.read_workers(out)


def test_the_workers_record_what_torchrun_gave_them(workers):
    assert [int(w["RANK"]) for w in workers] == [0, 1, 2, 3]
    for w in workers:
        assert int(w["RANK"]) == int(w["GROUP_RANK"]) * 2 + int(w["LOCAL_RANK"])
        assert w["group_rank"] == int(w["RANK"]) and w["group_size"] == int(w["WORLD_SIZE"]) == 4
        assert w["launcher_started"] <= w["worker_started"] <= w["joined"]


def test_the_node_figure_puts_each_worker_in_its_node(workers):
    fig, ax = new_figure()
    drawn = node_figures.draw_nodes(ax, workers)
    expected = {}
    for w in workers:
        label = f"node rank {w['GROUP_RANK']} ({w['hostname'][:12]})"
        expected.setdefault(label, []).append(f"RANK {w['RANK']}\nLOCAL_RANK {w['LOCAL_RANK']}")
    assert drawn == expected
    texts = {t.get_text() for t in ax.texts}
    assert set(expected) | {text for labels in expected.values() for text in labels} <= texts
    assert f"{workers[0]['MASTER_ADDR']}:{workers[0]['MASTER_PORT']}" in ax.get_title()
    matplotlib.pyplot.close(fig)


def test_the_rendezvous_figure_draws_each_worker_s_moments(workers):
    fig, ax = new_figure()
    drawn = node_figures.draw_rendezvous(ax, workers)
    origin = min(w["launcher_started"] for w in workers)
    for w in workers:
        (start, first, _), (middle, second, _) = drawn[f"node {w['GROUP_RANK']}, rank {w['RANK']}"]
        assert start == pytest.approx(w["launcher_started"] - origin)
        assert start + first == pytest.approx(middle) == pytest.approx(w["worker_started"] - origin)
        assert middle + second == pytest.approx(w["joined"] - origin)
    matplotlib.pyplot.close(fig)


def test_who_am_i_outside_torchrun_is_one_line_and_a_non_zero_exit(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK", "GROUP_RANK")}
    child = subprocess.run([node_figures.sys.executable,
                            str(node_figures.ROOT / "ddp_scripts" / "recorders" / "who_am_i.py"),
                            "--out", str(tmp_path)], env=env, capture_output=True, text=True,
                           timeout=300)
    assert child.returncode == 2
    assert child.stderr.strip().splitlines() == [
        "error: RANK, LOCAL_RANK, GROUP_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR, "
        "MASTER_PORT not set: start this script with torchrun"]


# The chapter's checks of this machine's network and of the installed torch: each fed the flaw
# it exists to catch, and a right case.

def test_planted_an_address_where_no_store_listens_is_named():
    port = free_port()   # nothing listens there
    answers = {"127.0.0.1": node_figures.ask_store("127.0.0.1", port, timeout_s=1)}
    line = node_figures.listens_line("127.0.1.1", answers)
    assert line.startswith("The store started under the name 127.0.1.1 did NOT answer through "
                           "127.0.0.1 (DistNetworkError: "), line


def test_right_case_a_store_under_127_0_1_1_answers_through_127_0_0_1():
    import datetime

    import torch.distributed as dist
    store = dist.TCPStore("127.0.1.1", 0, world_size=2, is_master=True,
                          wait_for_workers=False, timeout=datetime.timedelta(seconds=20))
    store.set("who", "the master")
    answers = {"127.0.0.1": node_figures.ask_store("127.0.0.1", store.port)}
    assert node_figures.listens_line("127.0.1.1", answers).endswith(
        "answered through 1 other address(es) of this machine: 127.0.0.1, and 0 more (not "
        "printed here): it listens on all of them.")
    del store


def test_planted_a_host_name_on_127_0_1_1_is_called_unreachable():
    assert node_figures.binds_line("127.0.1.1").endswith(
        "gloo binds there, a loopback address that no other machine can reach")


def test_right_case_a_routable_address_is_not():
    assert node_figures.binds_line("192.0.2.7").endswith("gloo binds there")


def test_planted_a_missing_api_is_not_in_this_version():
    assert not node_figures.api_available("torch.distributed.fsdp", "no_such_function")
    assert not node_figures.api_available("torch.distributed.no_such_module", "fully_shard")


def test_right_case_fully_shard_is_available():
    assert node_figures.api_available("torch.distributed.fsdp", "fully_shard")
