"""Chapter 9's practice programs (ddp_scripts/practice/): how they are written and started.

What each demonstrates is checked in the run chapter 9 makes (tests/site/test_chapter9_run.py).
"""
import ast

import torch

from helpers import ROOT, run_in_process

PRACTICE = ROOT / "ddp_scripts" / "practice"
BOOTSTRAP = ("import sys\nfrom pathlib import Path\n\n"
             "if not __package__:  # run as a file, not imported: find ddp_scripts as notebooks do\n"
             "    sys.path[0] = str(Path(__file__).resolve().parents[2])")
# ddp_scripts' modules and packages, which a program imports as ddp_scripts.NAME, never as NAME
SECOND_NAMES = ({path.stem for path in (ROOT / "ddp_scripts").glob("*.py")} - {"ddp_scripts"}
                | {path.parent.name for path in (ROOT / "ddp_scripts").glob("*/__init__.py")})
DEMOS = ["by_hand", "buckets", "accumulation", "batchnorm", "unused_parameters", "seeding",
         "compression", "zero", "uneven_inputs"]


def test_every_practice_program_has_the_bootstrap_and_imports_through_ddp_scripts():
    programs = sorted(p for p in PRACTICE.glob("*.py") if "__main__" in p.read_text())
    assert {p.stem for p in programs} >= set(DEMOS) | {"everyday"}
    for path in programs:
        source = path.read_text()
        assert BOOTSTRAP in source, f"{path.name} lacks the bootstrap of ddp_scripts/"
        assert source.index(BOOTSTRAP) < source.index("from ddp_scripts"), path.name
    for path in PRACTICE.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                assert node.module.split(".")[0] not in SECOND_NAMES, (
                    f"{path.name}: `from {node.module} import`; use `from ddp_scripts...`")


def test_everyday_runs_each_demonstration_by_name():
    """The names the chapter and everyday.py use are the names of the programs."""
    tree = ast.parse((PRACTICE / "everyday.py").read_text())
    demos = next(node.value for node in ast.walk(tree) if isinstance(node, ast.Assign)
                 and getattr(node.targets[0], "id", None) == "DEMOS")
    names = [key.value for key in demos.keys]
    assert names == DEMOS and names[-1] == "uneven_inputs"  # it breaks a group: last
    assert all((PRACTICE / f"{name}.py").exists() for name in names)


def test_persistent_workers_serve_every_epoch_and_new_workers_draw_new_seeds():
    from torch.utils.data import DataLoader

    from ddp_scripts.practice.loader_workers import WhoMadeMe, epochs
    fresh = epochs(DataLoader(WhoMadeMe(), batch_size=2, num_workers=1))
    kept = epochs(DataLoader(WhoMadeMe(), batch_size=2, num_workers=1, persistent_workers=True))
    assert fresh[0][0] != fresh[1][0]  # new processes every epoch
    assert kept[0][0] == kept[1][0]    # the same process for both


def test_the_static_memory_of_the_memory_model_is_three_copies_of_its_parameters():
    from ddp_scripts.practice import memory
    model = memory.make_model(width=8, depth=2)
    static = memory.static_bytes(model)
    assert static["parameters"] == 4 * (2 * (8 * 8 + 8))
    assert static["gradients"] == static["optimizer state"] == static["parameters"]


def test_a_practice_program_started_without_torchrun_says_so_in_one_line(tmp_path, monkeypatch):
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    done = run_in_process("practice/compression.py", "--out", tmp_path)
    assert done.returncode == 2 and "torchrun" in done.stderr
    assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 2


def test_the_backward_timers_record_every_bucket_and_leave_the_gradients_as_ddp_makes_them(tmp_path):
    """attach_timers (chapters 5 and 9) only watches: the gradients DDP leaves are the same
    with and without it, and every bucket's all-reduce has a start and an end."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    from ddp_scripts.practice.hooks import attach_timers
    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        grads, events = [], []
        for timed in (False, True):
            torch.manual_seed(0)
            model = DDP(torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Linear(64, 3)),
                        bucket_cap_mb=0.01)
            if timed:
                attach_timers(model, lambda: 0.0, events.append)
            for _ in range(2):   # the first step has one bucket; DDP rebuilds them after it
                model.zero_grad()
                model(torch.ones(4, 64)).square().sum().backward()
            grads.append([p.grad.clone() for p in model.parameters()])
        assert all(torch.equal(a, b) for a, b in zip(*grads))
        buckets = [e for e in events if e["kind"] == "all-reduce"]
        assert buckets and all("end" in e for e in buckets)
        assert {e["name"] for e in events if e["kind"] == "gradient"} == {
            "0.weight", "0.bias", "1.weight", "1.bias"}
    finally:
        dist.destroy_process_group()
