"""Run under torchrun by test_between_ranks.py, with the repository root on PYTHONPATH:
ranks.check_one_gpu_per_rank on 2 CPU processes, with the GPUs' UUIDs faked. Each rank
writes what it saw to OUT/gpus<N>.json.

The ranks first report different GPUs (the check passes), then the same one (every rank
refuses). A second process group would fail the probe: the check uses the default group.
"""
import json
import os
import sys
from pathlib import Path
from types import SimpleNamespace

import torch
import torch.distributed as dist

from ddp_scripts import cli, ranks

out = Path(sys.argv[1])
dist.init_process_group("gloo")
rank = dist.get_rank()


def no_second_group(*args, **kwargs):
    raise AssertionError("check_one_gpu_per_rank made a second process group")


dist.new_group = no_second_group
seen = {}
for case, uuid in (("different", f"GPU-{rank}"), ("same", "GPU-shared")):
    torch.cuda.get_device_properties = lambda device, uuid=uuid: SimpleNamespace(uuid=uuid)
    try:
        ranks.check_one_gpu_per_rank(torch.device("cuda", 0))
        seen[case] = "passed"
    except cli.UsageError as error:
        seen[case] = str(error)
(out / f"gpus{rank}.json").write_text(json.dumps(seen))
dist.destroy_process_group()
print(f"rank {os.environ['RANK']} done", flush=True)
