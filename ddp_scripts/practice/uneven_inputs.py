"""Uneven inputs: one rank has a batch more than the other. By hand, its extra all_reduce
waits for a partner that has finished (here a group with a 3-second timeout turns the hang
into an error, and each rank's Flight Recorder shows which collective had no partner); DDP
inside Join() lets the finished rank keep answering until all are done. Join makes the
parameters equal at the end, not the optimizer state: with momentum, the replicas drift
apart in the next epoch unless the state is made equal too.

    torchrun --nproc-per-node 2 ddp_scripts/practice/uneven_inputs.py --out runs/practice
"""
from pathlib import Path

import contextlib
import datetime
import io
import logging
import pickle
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.algorithms.join import Join
from torch.nn.parallel import DistributedDataParallel as DDP

from ddp_scripts.out_dir import write_atomically
from ddp_scripts.practice.by_hand import fingerprint, make_model, my_batches, train_by_hand
from ddp_scripts.practice.group import all_equal, counting_all_reduces, gather, main

TIMEOUT_S, MOMENTUM = 3, 0.9


def uneven_batches(rank, world_size):
    """Rank 0 gets one batch more than the others: a data set that does not split evenly."""
    batches = my_batches(rank, world_size)[:4]
    return batches + my_batches(rank, world_size)[4:5] if rank == 0 else batches


def dump_flight_record(folder, rank, group_desc):
    """Write this rank's Flight Recorder (the ring buffer of its last collectives) as
    FOLDER/rank_RANK, the file NCCL writes on a timeout with TORCH_NCCL_DUMP_ON_TIMEOUT=1;
    the entries of the group `group_desc` only, the one this demonstration tests. gloo's
    record leaves its table of process groups empty in torch 2.14; it is filled in, so that
    torch's analyser (torchfrtrace FOLDER) can read the files."""
    record = pickle.loads(torch._C._distributed_c10d._dump_fr_trace())
    record["entries"] = [e for e in record["entries"] if e["process_group"][1] == group_desc]
    members = {name: str(dist.get_process_group_ranks(group))
               for group, name in dist.distributed_c10d._world.pg_names.items()}
    record["pg_config"] = {name: {"name": name, "desc": desc, "ranks": members[name]}
                           for name, desc in {e["process_group"] for e in record["entries"]}}
    Path(folder).mkdir(parents=True, exist_ok=True)
    write_atomically(Path(folder) / f"rank_{rank}", lambda f: pickle.dump(record, f), mode="wb")


def analyser_reads_gloo():
    """Whether this torch's Flight Recorder analyser reads gloo's records. torch 2.11's reads
    NCCL's and XCCL's only: its Op stops with "name formatting error? gloo != ..." (gloo was
    added in pytorch/pytorch#180268, April 2026). A record of gloo, empty but for its name,
    shows it: past the backend check, the missing fields raise something else."""
    from torch.distributed.flight_recorder.components.types import Op
    try:
        Op({"profiling_name": "gloo:allreduce"}, {}, "")
    except AssertionError as error:
        return "name formatting error" not in str(error)
    except Exception:  # noqa: BLE001 - the backend was accepted; the empty record was not
        return True
    return True


def analyse_flight_records(folder):
    """torch's analyser (`torchfrtrace FOLDER`) on the ranks' records: its report, as text."""
    from torch.distributed.flight_recorder.components.fr_logger import FlightRecorderLogger
    from torch.distributed.flight_recorder.fr_trace import main as fr_trace
    log, report = FlightRecorderLogger().logger, io.StringIO()
    saved, log.handlers = log.handlers, [logging.StreamHandler(report)]
    try:
        with contextlib.redirect_stdout(report):
            fr_trace([str(folder)])
    finally:
        log.handlers = saved
    return report.getvalue()


def train_under_join(model, optimizer, batches):
    """DDP inside Join: (steps taken, bytes of each all_reduce that Python code called)."""
    steps = 0
    with counting_all_reduces() as calls, Join([model]):
        for x, y in batches:
            optimizer.zero_grad()
            F.mse_loss(model(x), y).backward()
            optimizer.step()
            steps += 1
    return steps, calls


def one_more_epoch(model, optimizer, batches):
    """An epoch of even inputs, after Join: the same number of batches on every rank."""
    for x, y in batches:
        optimizer.zero_grad()
        F.mse_loss(model(x), y).backward()
        optimizer.step()


def same_everywhere(tensors):
    """Whether every rank holds the same tensors, bit for bit."""
    return all_equal(gather(fingerprint([t.detach() for t in tensors])))


def momentum_buffers(optimizer):
    return [optimizer.state[p]["momentum_buffer"] for p in optimizer.param_groups[0]["params"]]


def demo(out):
    rank, world_size = dist.get_rank(), dist.get_world_size()
    batches = uneven_batches(rank, world_size)
    # 1. By hand, in a group of its own whose collectives give up after TIMEOUT_S seconds
    #    (without a timeout, rank 0 would wait for 30 minutes, the default of gloo).
    short_fuse = dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=TIMEOUT_S),
                                group_desc="short_fuse")
    dist.barrier()                     # start together: only the extra step may wait
    start = time.monotonic()
    try:
        train_by_hand(make_model(), batches, group=short_fuse)
        outcome = "finished"
    except RuntimeError as error:
        outcome = f"{type(error).__name__}: {str(error).splitlines()[0]}"
    waited = time.monotonic() - start
    dump_flight_record(Path(out) / "flight_recorder", rank, "short_fuse")
    dist.barrier()                     # the default group still works: everyone meets here
    # 2. DDP under Join, with momentum: a rank out of data shadows the others' all-reduces.
    model = DDP(make_model())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=MOMENTUM)
    steps, calls = train_under_join(model, optimizer, batches)
    parameters_equal = same_everywhere(model.parameters())
    momentum_equal = same_everywhere(momentum_buffers(optimizer))
    # 3. The next epoch, even: the same averaged gradients through different momentum.
    even = my_batches(rank, world_size)[5:9]
    one_more_epoch(model, optimizer, even)
    drifted = not same_everywhere(model.parameters())
    # 4. The same, with the optimizer state made equal after Join: the momentum of the rank
    #    that took every step, broadcast to the others.
    model = DDP(make_model())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=MOMENTUM)
    steps_per_rank = gather(train_under_join(model, optimizer, batches)[0])
    longest = steps_per_rank.index(max(steps_per_rank))
    for buffer in momentum_buffers(optimizer):
        dist.broadcast(buffer, src=longest)
    one_more_epoch(model, optimizer, even)
    return {
        "timeout_s": TIMEOUT_S,
        "batches_per_rank": gather(len(batches)),
        "by_hand_outcome_per_rank": gather(outcome),
        "by_hand_seconds_per_rank": gather(round(waited, 2)),
        "flight_recorder": "flight_recorder",
        "join_steps_per_rank": gather(steps),
        "join_models_identical": parameters_equal,
        "join_momentum_identical": momentum_equal,
        "join_one_number_all_reduces_per_step": gather(
            sum(size <= 8 for size in calls) / steps),
        "join_drifted_after_one_more_epoch": drifted,
        "join_with_state_broadcast_identical_after_one_more_epoch":
            same_everywhere(model.parameters()),
        "momentum": MOMENTUM,
    }


if __name__ == "__main__":
    main({"uneven_inputs": demo}, __doc__.splitlines()[0])
