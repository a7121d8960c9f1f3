"""Chapter 9's practice programs (ddp_scripts/practice/): how they are written and started.

What each demonstrates is checked in the run chapter 9 makes (tests/site/test_chapter9_run.py).
"""
import ast
import os
import subprocess
import sys

import torch

from helpers import ROOT, run_in_process

PRACTICE = ROOT / "ddp_scripts" / "practice"
# ddp_scripts' modules and packages, which a program imports as ddp_scripts.NAME, never as NAME
SECOND_NAMES = ({path.stem for path in (ROOT / "ddp_scripts").glob("*.py")}
                | {path.parent.name for path in (ROOT / "ddp_scripts").glob("*/__init__.py")})
DEMOS = ["by_hand", "buckets", "accumulation", "batchnorm", "unused_parameters", "seeding",
         "compression", "zero", "uneven_inputs"]


def test_a_practice_program_starts_as_a_file_from_another_folder(tmp_path):
    """`python ddp_scripts/practice/everyday.py` finds ddp_scripts through the installed package
    (pip install -e .), as torchrun starts it by path: no line before its imports."""
    env = {name: value for name, value in os.environ.items() if name != "PYTHONPATH"}
    result = subprocess.run([sys.executable, str(PRACTICE / "everyday.py"), "--help"], cwd=tmp_path,
                            env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and "--out" in result.stdout, result.stderr


def test_every_practice_program_imports_through_ddp_scripts():
    programs = sorted(p for p in PRACTICE.glob("*.py") if "__main__" in p.read_text())
    assert {p.stem for p in programs} >= set(DEMOS) | {"everyday"}
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


# Chapter 9's verdicts, decided by small functions of the programs' records: each fed the flaw
# it exists to catch, and a right case. (The programs' two-rank run is read in
# tests/site/test_chapter9_run.py.)

def test_planted_replicas_one_bit_apart_are_not_identical():
    from ddp_scripts.practice.by_hand import fingerprint
    from ddp_scripts.practice.group import all_equal
    weight = torch.randn(4, 4, dtype=torch.float64)
    drifted = weight.clone()
    drifted[0, 0] = torch.nextafter(drifted[0, 0], torch.tensor(2.0, dtype=torch.float64))
    assert not all_equal([fingerprint([weight]), fingerprint([drifted])])
    assert not all_equal([[1.0, 2.0], [1.0, 2.0 + 2**-50]])   # running means, as gathered


def test_right_case_bitwise_equal_replicas_are_identical():
    from ddp_scripts.practice.by_hand import fingerprint
    from ddp_scripts.practice.group import all_equal
    weight = torch.randn(4, 4, dtype=torch.float64)
    assert all_equal([fingerprint([weight]), fingerprint([weight.clone()])])
    assert all_equal([[1.0, 2.0], [1.0, 2.0]])


def momentum_after(steps):
    torch.manual_seed(0)
    layer = torch.nn.Linear(3, 1).double()
    optimizer = torch.optim.SGD(layer.parameters(), lr=0.05, momentum=0.9)
    x = torch.randn(8, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    for _ in range(steps):
        optimizer.zero_grad()
        layer(x).square().mean().backward()
        optimizer.step()
    return [optimizer.state[p]["momentum_buffer"] for p in layer.parameters()]


def test_planted_the_momentum_of_a_rank_that_skipped_a_step_differs():
    from ddp_scripts.practice.by_hand import fingerprint
    from ddp_scripts.practice.group import all_equal
    assert not all_equal([fingerprint(momentum_after(5)), fingerprint(momentum_after(4))])


def test_right_case_the_same_steps_give_the_same_momentum():
    from ddp_scripts.practice.by_hand import fingerprint
    from ddp_scripts.practice.group import all_equal
    assert all_equal([fingerprint(momentum_after(5)), fingerprint(momentum_after(5))])


def test_planted_one_seed_on_every_rank_draws_the_same():
    from ddp_scripts.practice.group import all_equal
    from ddp_scripts.practice.seeding import SEED, augmentations
    draws = [augmentations(torch.Generator().manual_seed(SEED)) for rank in range(2)]
    assert all_equal(draws)


def test_right_case_seed_plus_rank_draws_differently():
    from ddp_scripts.practice.group import all_equal
    from ddp_scripts.practice.seeding import SEED, augmentations
    draws = [augmentations(torch.Generator().manual_seed(SEED + rank)) for rank in range(2)]
    assert not all_equal(draws)


def test_planted_a_layer_stitched_from_two_initialisations_is_not_rank_0s():
    from ddp_scripts.practice.seeding import whose_rows
    inits = [torch.randn(4, 2, generator=torch.Generator().manual_seed(r)) for r in range(2)]
    whole = torch.cat([inits[0][:2], inits[1][2:]])   # rank r keeps rows 2r and 2r + 1
    assert whose_rows(whole, inits) == {"row_from_rank": [0, 0, 1, 1],
                                        "equal_to_rank_0s_init": False}


def test_right_case_one_seed_everywhere_gives_rank_0s_layer():
    from ddp_scripts.practice.seeding import whose_rows
    init = torch.randn(4, 2, generator=torch.Generator().manual_seed(0))
    assert whose_rows(init.clone(), [init, init.clone()]) == {
        "row_from_rank": [0, 0, 0, 0], "equal_to_rank_0s_init": True}


def test_planted_a_checkpoint_read_too_early_is_not_the_one_written():
    from ddp_scripts.out_dir import identical
    from ddp_scripts.practice.by_hand import make_model
    written = make_model().state_dict()
    older = {name: tensor + 1 for name, tensor in written.items()}   # a previous run's file
    half = dict(list(written.items())[:2])                            # a file cut short
    assert not identical(older, written) and not identical(half, written)


def test_right_case_the_checkpoint_read_is_the_one_written():
    from ddp_scripts.out_dir import identical
    from ddp_scripts.practice.by_hand import make_model
    written = make_model().state_dict()
    read = {name: tensor.clone() for name, tensor in written.items()}
    assert identical(read, written)


def test_planted_a_negative_zero_is_not_the_zero_written():
    from ddp_scripts.out_dir import identical
    written = {"w": torch.zeros(3, dtype=torch.float64)}
    assert torch.equal(-written["w"], written["w"])   # equal as numbers, not as bits
    assert not identical({"w": -written["w"]}, written)


def test_right_case_a_nan_read_back_with_the_same_bits_is_the_one_written():
    from ddp_scripts.out_dir import identical
    written = {"w": torch.tensor([1.0, float("nan")], dtype=torch.float64)}
    read = {"w": written["w"].clone()}
    assert not torch.equal(read["w"], written["w"])   # NaN != NaN as numbers
    assert identical(read, written)


def test_planted_a_rank_that_did_not_fail_is_not_every_rank():
    from ddp_scripts.practice.unused_parameters import failed_on_every_rank
    assert not failed_on_every_rank(["Expected to have finished reduction ...", None])


def test_right_case_both_ranks_failed():
    from ddp_scripts.practice.unused_parameters import failed_on_every_rank
    assert failed_on_every_rank(["Expected to have finished reduction ..."] * 2)


def spare_head_grad(tmp_path, model):
    """One step of DDP with find_unused_parameters=True in a world of one: spare_head's grad."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        ddp = DDP(model, find_unused_parameters=True)
        ddp(torch.randn(4, 8)).square().mean().backward()
        return model.spare_head.weight.grad
    finally:
        dist.destroy_process_group()


def test_planted_a_forward_that_uses_the_spare_head_gives_it_a_gradient(tmp_path):
    from ddp_scripts.practice.unused_parameters import TwoHeads

    class BothHeads(TwoHeads):
        def forward(self, x):
            features = self.body(x)
            return self.head(features) + self.spare_head(features)

    assert spare_head_grad(tmp_path, BothHeads(depth=2)) is not None


def test_right_case_the_unused_spare_head_keeps_no_gradient(tmp_path):
    from ddp_scripts.practice.unused_parameters import TwoHeads
    assert spare_head_grad(tmp_path, TwoHeads(depth=2)) is None


def test_planted_an_analyser_that_refuses_gloo_is_said_to(monkeypatch):
    from torch.distributed.flight_recorder.components import types

    from ddp_scripts.practice.uneven_inputs import analyser_reads_gloo

    class OnlyNccl:   # torch 2.11's Op: it stops at a record of any backend but NCCL's and XCCL's
        def __init__(self, event, memberships, pg_name):
            assert event["profiling_name"].startswith("nccl:"), (
                f"name formatting error? {event['profiling_name'].split(':')[0]} != nccl")

    monkeypatch.setattr(types, "Op", OnlyNccl)
    assert not analyser_reads_gloo()


def test_right_case_this_torchs_analyser_reads_gloo():
    from ddp_scripts.practice.uneven_inputs import analyser_reads_gloo
    assert analyser_reads_gloo()
