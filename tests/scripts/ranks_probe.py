"""Run under torchrun by test_between_ranks.py: what ranks decide together, checked on 2 CPU
processes. Each rank writes what it saw to OUT/rank<N>.json; the test reads those files.

Ranks 0 and 1 are made to see different disks (OUT/rank0, OUT/rank1), as two nodes without a
shared file system would.
"""
import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from ddp_scripts import cifar10, cli, data, options, out_dir, ranks

out = Path(sys.argv[1])
device = torch.device(sys.argv[2] if len(sys.argv) > 2 else "cpu")  # "cuda": one GPU per rank
if device.type == "cuda":
    device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
    torch.cuda.set_device(device)
ranks.init_process_group(device, timeout_s=120)
rank = dist.get_rank()
seen = {"rank": rank}

# 1. Resuming: only rank 0's disk holds the run; every rank must resume as rank 0 decides.
args = options.build_parser("probe").parse_args(
    ["--out", str(out / f"rank{rank}"), "--dataset", "synthetic", "--resume", "--epochs", "4",
     "--batch-size", "16"])  # as the checkpoint was trained: a global batch of 32
checkpoint = ranks.on_rank_0(out_dir.prepare_out_dir, args)
seen["resumes_after_epoch"] = None if checkpoint is None else checkpoint["epoch"]

# 2. Bad input found by rank 0 reaches every rank as the same one-line error.
overwrite = options.build_parser("probe").parse_args(["--out", str(out / "rank0"), "--dataset", "synthetic"])
try:
    ranks.on_rank_0(out_dir.prepare_out_dir, overwrite)
except cli.UsageError as error:
    seen["refused"] = str(error)

# 3. CIFAR-10: rank 0 downloads alone, first; a rank whose disk lacks the files while
#    another's has them stops the run on every rank instead of training on other data.
calls = []
def fake_cifar10(data_dir, download):
    calls.append(download)
    if rank == 1:
        raise RuntimeError("Dataset not found or corrupted")
    return [(torch.zeros(8, 3, 32, 32), torch.zeros(8, dtype=torch.long))] * 2  # CPU, as the real one
cifar10.cifar10_tensors = fake_cifar10
try:
    data.load_datasets("cifar10", str(out / "data"), 8, 8)
except cli.UsageError as error:
    seen["data_refused"] = str(error)
seen["cifar10_calls"] = calls

# 4. BatchNorm statistics: each rank's own after its last step, the same after averaging.
norm = torch.nn.BatchNorm1d(3).to(device)
norm(torch.randn(16, 3, device=device) + rank)
ranks.average_buffers(norm)
seen["running_mean"] = norm.running_mean.tolist()

(out / f"rank{rank}.json").write_text(json.dumps(seen))
dist.destroy_process_group()
