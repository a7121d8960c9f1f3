"""A rank frees its model before it leaves the process group (ranks.leave_process_group).

DDP's Reducer keeps a reference to the group. Freed after destroy_process_group(), it frees the
group itself, holding the GIL, and on torch 2.11-2.13 a rank then hung at exit in about half the
runs on 2 CPU ranks (gloo's worker thread waited for the GIL). The hang is a race, so a test
that runs the script and waits proves little; these tests check the order instead, on every
torch: when destroy_process_group() runs, no DDP model is alive. (FSDP has no Reducer: its
groups are held by Python objects, whose binding releases the GIL before freeing them.)
"""
import gc
from unittest import mock

import pytest
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from tests.helpers import SCRIPTS, SMALL, run_one_rank

pytestmark = pytest.mark.timeout(300)

ONE_EPOCH = [*SMALL, "--epochs", "1"]
DEL_MODEL = "    del model  # DDP: the model goes before its group, or a rank can hang as it exits\n"


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
