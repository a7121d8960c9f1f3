"""A rank frees its model before it leaves the process group (ranks.leave_process_group).

DDP's Reducer keeps a reference to the group. Freed after destroy_process_group(), it frees the
group itself, holding the GIL, and on torch 2.11-2.13 a rank then hung at exit in 3 or 4 of 10
runs on 2 CPU ranks (results/exit-benchmark.jsonl; gloo's worker thread waited for the GIL).
The hang is a race, so a test that runs the script and waits proves little; these tests check
the order instead, on every torch: when destroy_process_group() runs, no DDP model is alive.
(FSDP has no Reducer: its groups are held by Python objects, whose binding releases the GIL
before freeing them.)
"""
import gc
from unittest import mock

import pytest
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from tests.helpers import SCRIPTS, SMALL, run_one_rank

pytestmark = pytest.mark.timeout(300)

ONE_EPOCH = [*SMALL, "--epochs", "1"]
DEL_MODEL = "    del model  # DDP\n"


def wrapped_models_alive_at_destroy(script, out):
    """Run `script` on one rank; return how many DDP models were alive each time the
    process group was destroyed."""
    counts, destroy = [], dist.destroy_process_group

    def spy(*args, **kwargs):
        counts.append(sum(isinstance(o, DistributedDataParallel) for o in gc.get_objects()))
        return destroy(*args, **kwargs)
    with mock.patch.object(dist, "destroy_process_group", spy):
        result = run_one_rank(script, *ONE_EPOCH, "--out", out)
    assert result.returncode == 0, result.stderr
    return counts


@pytest.mark.parametrize("script", ["train_ddp.py", "train_fast.py"])
def test_right_case_the_model_is_freed_before_the_group(script, tmp_path):
    assert wrapped_models_alive_at_destroy(script, tmp_path / "run") == [0]


def test_planted_model_kept_past_the_group_is_caught(tmp_path):
    planted = tmp_path / "train_ddp_keeps_its_model.py"
    source = (SCRIPTS / "train_ddp.py").read_text()
    assert DEL_MODEL in source
    planted.write_text(source.replace(DEL_MODEL, ""))
    assert wrapped_models_alive_at_destroy(planted, tmp_path / "run") == [1]


def ddp_alive_at_destroy(leave):
    """Train a DDP model one step inside a function, on a group of one, with the model in a
    reference cycle (made here on purpose; a hook's closure that refers to the model makes one
    too), so returning from the function does not free it. Then `leave` the group with the
    collector off: how many DDP models were alive as the group was destroyed."""
    from ddp_scripts.launcher import free_port
    import torch
    counts, destroy = [], dist.destroy_process_group

    def spy(*args, **kwargs):
        counts.append(sum(isinstance(o, DistributedDataParallel) for o in gc.get_objects()))
        return destroy(*args, **kwargs)

    def one_step():
        model = DistributedDataParallel(torch.nn.Linear(4, 2))
        model(torch.ones(3, 4)).sum().backward()
        model.cycle = [model]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    gc.disable()
    try:
        one_step()
        with mock.patch.object(dist, "destroy_process_group", spy):
            leave()
    finally:
        gc.enable()
        if dist.is_initialized():
            destroy()
    return counts


def test_right_case_leaving_collects_a_model_held_by_a_cycle():
    from ddp_scripts.ranks import leave_process_group
    assert ddp_alive_at_destroy(leave_process_group) == [0]


def test_planted_leaving_without_collecting_keeps_the_cycle_alive():
    assert ddp_alive_at_destroy(lambda: dist.destroy_process_group()) == [1]
