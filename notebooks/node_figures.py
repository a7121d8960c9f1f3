"""Chapter 6: the two-node rehearsal drawn from what its workers wrote (ddp_scripts/recorders/who_am_i.py),
and the chapter's checks of this machine's network and of the installed torch.

    from notebooks.node_figures import who_am_i_command, read_workers, draw_nodes, draw_rendezvous
    from notebooks.node_figures import ask_store, listens_line, binds_line, api_available
"""
import json
import sys
from pathlib import Path

from notebooks.figures import colour, timeline

ROOT = Path(__file__).resolve().parents[1]


def who_am_i_command(node_rank, port, out, nnodes=2, nproc_per_node=2):
    """torchrun as typed on machine `node_rank`, with 127.0.0.1 as the master."""
    return [sys.executable, "-m", "torch.distributed.run",
            "--nnodes", str(nnodes), "--nproc-per-node", str(nproc_per_node),
            "--node-rank", str(node_rank), "--master-addr", "127.0.0.1",
            "--master-port", str(port), str(ROOT / "ddp_scripts" / "recorders" / "who_am_i.py"),
            "--out", str(out)]


def read_workers(folder):
    """The workers' records (worker-RANK.json), by global rank."""
    records = [json.loads(path.read_text()) for path in Path(folder).glob("worker-*.json")]
    return sorted(records, key=lambda record: int(record["RANK"]))


def draw_nodes(ax, workers):
    """One box per node (GROUP_RANK), and in it one box per worker with its global and local
    rank, all read from the workers' records. Returns {node label: [worker labels]}."""
    nodes = sorted({int(w["GROUP_RANK"]) for w in workers})
    per_node = max(sum(int(w["GROUP_RANK"]) == n for w in workers) for n in nodes)
    drawn = {}
    for column, node in enumerate(nodes):
        mine = sorted((w for w in workers if int(w["GROUP_RANK"]) == node),
                      key=lambda w: int(w["LOCAL_RANK"]))
        left = column * (per_node + 0.6)
        label = f"node rank {node} ({mine[0]['hostname'][:12]})"
        ax.add_patch(_rectangle(left - 0.05, 0.0, per_node - 0.1 + 0.2, 2.0, "idle"))
        ax.text(left + 0.05, 1.75, label, va="center", weight="bold")
        drawn[label] = []
        for k, worker in enumerate(mine):
            x = left + 0.1 + k
            ax.add_patch(_rectangle(x, 0.2, 0.85, 1.2, "compute", alpha=0.3))
            text = f"RANK {worker['RANK']}\nLOCAL_RANK {worker['LOCAL_RANK']}"
            ax.text(x + 0.425, 0.8, text, ha="center", va="center")
            drawn[label].append(text)
    first = workers[0]
    ax.set_title(f"WORLD_SIZE {first['WORLD_SIZE']}, MASTER_ADDR:PORT "
                 f"{first['MASTER_ADDR']}:{first['MASTER_PORT']}", fontsize=10)
    ax.set_xlim(-0.2, len(nodes) * (per_node + 0.6) - 0.4)
    ax.set_ylim(-0.1, 2.1)
    ax.axis("off")
    return drawn


def _rectangle(x, y, width, height, kind, alpha=1.0):
    from matplotlib.patches import FancyBboxPatch
    return FancyBboxPatch((x, y), width, height, boxstyle="round,pad=0.02",
                          fc=colour(kind), alpha=alpha, ec="#333333", lw=0.8)


RENDEZVOUS = "torchrun starts, nodes meet"
JOIN = "worker starts, joins group"


def rendezvous_rows(workers):
    """{worker label: [(start, end, kind)]}, seconds from the first launcher's start."""
    origin = min(w["launcher_started"] for w in workers)
    rows = {}
    for w in workers:
        label = f"node {w['GROUP_RANK']}, rank {w['RANK']}"
        rows[label] = [(w["launcher_started"] - origin, w["worker_started"] - origin, RENDEZVOUS),
                       (w["worker_started"] - origin, w["joined"] - origin, JOIN)]
    return rows


def draw_rendezvous(ax, workers):
    """When each worker's launcher started, when the worker started, when it had its rank in
    the group: a timeline per worker. Returns the bars drawn (figures.timeline's structure)."""
    drawn = timeline(ax, rendezvous_rows(workers), unit="s")
    ax.set_xlabel("seconds since the first launcher started")
    return drawn


def ask_store(address, port, key="who", timeout_s=20):
    """The value of `key` in the TCPStore at address:port, read by a client of its own; the
    error, as text, where no store answers there within timeout_s seconds."""
    import datetime

    import torch.distributed as dist
    try:
        client = dist.TCPStore(address, port, world_size=2, is_master=False,
                               timeout=datetime.timedelta(seconds=timeout_s))
        return client.get(key).decode()
    except RuntimeError as error:   # torch's DistNetworkError, DistStoreError, ...
        return f"{type(error).__name__}: {str(error).splitlines()[0]}"


def listens_line(name, answers, expected="the master"):
    """Whether a store started under `name` answered through every other address: one line.
    answers: {address: what ask_store read there}."""
    missed = [address for address, answer in answers.items() if answer != expected]
    loopback = [address for address in answers if address.startswith("127.")]
    if not answers:
        return (f"The store started under the name {name}: this machine has no other address "
                "to reach it through, so where it listens cannot show here.")
    if missed:
        return (f"The store started under the name {name} did NOT answer through "
                f"{', '.join(missed)} ({answers[missed[0]]}): it does not listen on all of "
                "this machine's addresses.")
    return (f"The store started under the name {name} answered through {len(answers)} other "
            f"address(es) of this machine: {', '.join(loopback) or 'no loopback address'}, "
            f"and {len(answers) - len(loopback)} more (not printed here): it listens on all "
            "of them.")


def binds_line(address):
    """Where gloo binds when GLOO_SOCKET_IFNAME is not set, the address this machine's host
    name resolves to (or the error, as text): one line, which says when no other machine can
    reach it."""
    import ipaddress
    try:
        loopback = ipaddress.ip_address(address).is_loopback
    except ValueError:   # not an address: the name did not resolve
        loopback = False
    return (f"This machine's host name resolves to {address}: where GLOO_SOCKET_IFNAME is not "
            "set, gloo binds there"
            + (", a loopback address that no other machine can reach" if loopback else ""))


def api_available(module, name):
    """Whether the installed torch has `module`.`name` (False where the module is missing)."""
    import importlib
    try:
        return hasattr(importlib.import_module(module), name)
    except ImportError:
        return False
