"""Time the same training on the CPU, one GPU, DataParallel and DDP; write one results file.

    python ddp_scripts/measure/benchmark.py --size smoke --out runs/benchmark.json     # seconds
    python ddp_scripts/measure/benchmark.py --size full --out results/my-lab.json      # minutes on a GPU
    python ddp_scripts/measure/benchmark.py --configs cpu,ddp --epochs 3 --out runs/b.json
    python ddp_scripts/measure/benchmark.py --size full --tuned --out results/my-lab-tuned.json

Every configuration trains the same model on the same data for the same epochs with the
same global batch (DDP with N processes: --batch-size global/N per process). Each one is a
run of the companion scripts, in a directory of its own under --runs-dir:

    cpu   train_single.py --device cpu                   one process, all cores
    gpu   train_single.py --device cuda                  one process, one GPU
    dp    train_dp.py --device cuda                      one process, every visible GPU
    ddp   train_ddp.py under torchrun                    one process per visible GPU (nccl);
                                                         on a machine without a GPU, processes
                                                         that share the cores (gloo)

With --tuned, three more rows, each beside its plain one (chapter 10):

    cpu-tuned  the cpu row with the thread count and batch that trained fastest in a short probe
    gpu-tuned  train_fast.py under torchrun, one process, one GPU, with its levers: data on
               the GPU, TF32, the model compiled (the CNN with CUDA graphs); for ResNet-18 also
               bf16 (fp16 without bf16) and channels_last (tuned_gpu_options)
    ddp-tuned  train_fast.py with the same levers on the ddp row's GPUs (on the CPU: skipped,
               with the reason)

Each configuration runs --repeats times, round after round (cpu, gpu, dp, ddp, then again), so
that other work on the machine slows one repeat of several configurations rather than every
repeat of one. A configuration whose steady epochs disagree by more than RELIABLE_SPREAD is
labelled unreliable, and so is every ratio computed with it. A configuration this machine
cannot run is recorded as skipped, with the reason. The results file holds, per run and per
repeat: wall time, start-up and training time, every epoch's time, samples/s over the epochs
after the first (the first is warm-up), final test accuracy; their medians and spread; and
once, the hardware: CPU, GPUs, how the GPUs are connected (nvidia-smi topo -m), torch, CUDA.
"""
import datetime
import json
import os
import shlex
import sys
import time
from pathlib import Path

from ddp_scripts.out_dir import write_atomically
from ddp_scripts.cli import UsageError, first_line, run_cli
from ddp_scripts.mishaps import cannot_write
from ddp_scripts.cifar10 import cifar10_tensors
from ddp_scripts.measure.links import describe_machine
from ddp_scripts.launcher import (ROOT, SCRIPTS, LaunchError, as_cli, read_metrics, repository_relative,
                                  run_command, torchrun_command)
from ddp_scripts.options import ArgumentParser, check_at_least_one, count, seconds, seed_number
from ddp_scripts.runfiles import CHECKPOINT, METRICS, SUMMARY

CONFIGS = ("cpu", "gpu", "dp", "ddp")
TUNED = ("cpu-tuned", "gpu-tuned", "ddp-tuned")  # --tuned: each runs after its plain row
ROW_ORDER = ("cpu", "cpu-tuned", "gpu", "gpu-tuned", "dp", "ddp", "ddp-tuned")
SCHEMA = 1

# Two sizes. smoke: seconds on two CPU cores (CI). full: the whole CIFAR-10 training set
# for several epochs, minutes on one lab GPU, so that CPU and GPU differ as in practice.
SIZES = {
    "smoke": {"dataset": "synthetic", "train_samples": 1024, "test_samples": 256,
              "epochs": 3, "batch_size": 64, "model": "cnn", "repeats": 2, "timeout_s": 600},
    "full": {"dataset": "cifar10", "train_samples": None, "test_samples": None,
             "epochs": 5, "batch_size": 64, "model": "cnn", "repeats": 3, "timeout_s": 7200},
}
# A configuration's steady epochs (every repeat's, warm-up left out) must agree within this
# factor, fastest over slowest, or its speed is labelled unreliable: other work on the
# machine took its cores during some of them, and a ratio with it would say more about that
# work than about the hardware.
RELIABLE_SPREAD = 1.5


# ---------------------------------------------------------------------------------------
# The plan: one command per configuration, or the reason it cannot run here
# ---------------------------------------------------------------------------------------
def tuned_gpu_options(model, bf16=True):
    """train_fast.py's levers for a tuned GPU row (chapter 10): the data set kept on the GPU,
    TF32, and the model compiled. The CNN's forward and backward are replayed as CUDA graphs
    (--compile reduce-overhead): the H200's hand-written graph replay of the whole step
    (results/gpu-runs/2026-11-30-h200/micro.txt) showed launches to be what it waits for.
    ResNet-18, whose convolutions are large enough for tensor cores, also gets bf16 (fp16 on a
    GPU without bf16) and channels_last, and is compiled without CUDA graphs (--compile
    default): its BatchNorm buffers under DDP, which train_fast.py uses even on one GPU, make
    torch.compile skip the graphs ("skipping cudagraphs due to mutated inputs",
    pytorch/pytorch#139207, open). None of these choices has been timed on a GPU yet."""
    options = {"data_on_device": True, "compile": "reduce-overhead", "tf32": True}
    if model == "resnet18":
        options.update(amp="bf16" if bf16 else "fp16", channels_last=True, compile="default")
    return options


def plan_runs(configs, settings, gpu_count, runs_dir, cpu_processes=2, gpu_names=(),
              tuned=False, cpu_best=None, bf16=True):
    """A list of runs: each with its command and batch split, or status 'skipped' and why.

    tuned: each of cpu, gpu and ddp is followed by its tuned row (`tuned_runs`); cpu_best
    gives the cpu-tuned row its threads and batch (`best_cpu_setting`); bf16: whether the
    GPUs have bfloat16 arithmetic (else the tuned rows use fp16)."""
    runs = []
    shared = {"dataset": settings["dataset"], "data_dir": settings["data_dir"],
              "train_samples": settings["train_samples"],
              "test_samples": settings["test_samples"], "model": settings["model"],
              "epochs": settings["epochs"], "seed": settings["seed"]}
    global_batch = settings["batch_size"]
    first_gpu = gpu_names[0] if gpu_names else "one GPU"
    for config in configs:
        run = {"config": config, "out": str(Path(runs_dir) / config),
               "global_batch_size": global_batch}
        if config == "cpu":
            run.update(description="one process on the CPU, all cores", script="train_single.py",
                       processes=1, torchrun=False, device="cpu", options={"device": "cpu"})
        elif config == "gpu":
            run.update(description="one process, one GPU", script="train_single.py",
                       processes=1, torchrun=False, device="cuda", options={"device": "cuda"})
            if gpu_count == 0:
                run["skip"] = ("no CUDA GPU is visible on this machine "
                               "(torch.cuda.is_available() is False)")
        elif config == "dp":
            run.update(description="DataParallel: one process, every visible GPU",
                       script="train_dp.py", processes=1, torchrun=False, device="cuda",
                       options={"device": "cuda"})
            if gpu_count == 0:
                run["skip"] = "no CUDA GPU is visible, and DataParallel needs CUDA GPUs"
            elif gpu_count == 1:
                run["skip"] = (f"only one GPU is visible ({first_gpu}); DataParallel needs two "
                               "or more to split a batch over")
        elif config == "ddp":
            if gpu_count >= 2:
                # One process per GPU, as many GPUs as the global batch splits over evenly:
                # on 3 GPUs a batch of 64 runs on 2 (the same global batch for every row).
                processes = max(n for n in range(1, gpu_count + 1) if global_batch % n == 0)
                device, backend = "cuda", "nccl"
                what = f"DDP: {processes} processes, one GPU each (nccl)"
                if processes < gpu_count:
                    what += (f", on {processes} of the {gpu_count} GPUs: the global batch of "
                             f"{global_batch} does not split evenly over {gpu_count}")
            else:
                processes, device, backend = cpu_processes, "cpu", "gloo"
                what = f"DDP: {processes} processes sharing the CPU cores (gloo)"
            run.update(description=what, script="train_ddp.py", processes=processes,
                       torchrun=True, device=device, backend=backend, options={"device": device})
            if gpu_count == 1:
                run["skip"] = (f"only one GPU is visible ({first_gpu}); DDP over GPUs needs two "
                               "or more (one process per GPU)")
            elif processes < 2:
                run["skip"] = (f"the global batch of {global_batch} does not split evenly over "
                               f"2 or more of the {max(gpu_count, processes)} processes: pass a "
                               "--batch-size that does")
            elif global_batch % processes:
                run["skip"] = (f"the global batch of {global_batch} does not split evenly over "
                               f"{processes} processes: pass a --batch-size that is a multiple "
                               f"of {processes}")
        else:
            raise UsageError(f"unknown configuration {config!r}: choose from {', '.join(CONFIGS)}")
        run["batch_size_per_process"] = global_batch // run["processes"]
        run["options"] = {**shared, **run["options"], "batch_size": run["batch_size_per_process"]}
        runs.append(run)
        if tuned and config in ("cpu", "gpu", "ddp"):
            runs.append(tuned_run(run, settings["model"], runs_dir, cpu_best, bf16))
    return runs


def tuned_run(plain, model, runs_dir, cpu_best=None, bf16=True):
    """The tuned row of a plain one: the same training, with the fastest options."""
    config = plain["config"] + "-tuned"
    run = {**plain, "config": config, "out": str(Path(runs_dir) / config),
           "options": dict(plain["options"]), "tuned": True}
    if plain["config"] == "cpu":
        if cpu_best is None:
            run["skip"] = "no thread count and batch were probed (best_cpu_setting)"
            return run
        batch = cpu_best["batch_size"]
        run.update(description=f"one process on the CPU, its fastest setting: "
                               f"{cpu_best['threads']} thread(s), batch {batch}",
                   global_batch_size=batch, batch_size_per_process=batch)
        run["options"].update(threads=cpu_best["threads"], batch_size=batch)
        return run
    if plain["device"] != "cuda":
        run.setdefault("skip", "the tuned options are GPU levers (data on the GPU, CUDA graphs, "
                               "bf16); on the CPU the cpu-tuned row tunes threads and batch")
        return run
    levers = tuned_gpu_options(model, bf16)
    run.update(script="train_fast.py", torchrun=True)  # one rank, or the ddp row's N
    run["options"].update(levers)
    run["description"] = plain["description"] + ", tuned: " + ", ".join(
        f"{key}={value}" if value is not True else key for key, value in levers.items())
    return run


def best_cpu_setting(settings, cores, echo=print, steps_per_probe=None):
    """The thread count and batch with which this CPU trains the model fastest.

    A short probe in this process: a few training steps of the model on random images for
    each thread count (1, half the cores, all of them) and each batch (the global batch, 4
    and 16 times it, at most 512 and the training set); the first step of each is left out.
    Returns {"threads", "batch_size", "probe": [{threads, batch_size, samples_per_s}]}.
    """
    import torch
    import torch.nn.functional as F
    from ddp_scripts.models import build_model
    threads_before = torch.get_num_threads()
    batches = sorted({min(b, 512, settings["train_samples"] or 50_000)
                      for b in (settings["batch_size"], 4 * settings["batch_size"],
                                16 * settings["batch_size"])})
    probe = []
    try:
        for threads in sorted({1, max(1, cores // 2), cores}):
            torch.set_num_threads(threads)
            for batch in batches:
                model = build_model(settings["model"])
                optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
                images, labels = torch.randn(batch, 3, 32, 32), torch.randint(0, 10, (batch,))
                steps = steps_per_probe or max(2, 2048 // batch)
                for step in range(steps + 1):
                    if step == 1:  # the first step warms up
                        start = time.perf_counter()
                    optimizer.zero_grad(set_to_none=True)
                    F.cross_entropy(model(images), labels).backward()
                    optimizer.step()
                speed = steps * batch / (time.perf_counter() - start)
                probe.append({"threads": threads, "batch_size": batch, "samples_per_s": speed})
    finally:
        torch.set_num_threads(threads_before)
    best = max(probe, key=lambda row: row["samples_per_s"])
    echo(f"[benchmark] fastest on the CPU: {best['threads']} thread(s), batch "
         f"{best['batch_size']} ({best['samples_per_s']:.0f} samples/s in the probe)")
    return {"threads": best["threads"], "batch_size": best["batch_size"], "probe": probe}


def command_for(run, overwrite=False):
    """The argv that runs `run`: the script itself, or under torchrun as the plan says."""
    args = as_cli({**run["options"], "out": run["out"], "overwrite": overwrite})
    if run["torchrun"]:
        return torchrun_command(run["script"], run["processes"], args)
    return [sys.executable, str(SCRIPTS / run["script"]), *args]


def readable(command):
    """The command as a person would type it: python/torchrun, paths relative to the repo."""
    words = list(command)
    if words[1:3] == ["-m", "torch.distributed.run"]:
        words = ["torchrun", *words[3:]]
        for flag in ("--master-addr", "--master-port", "--nnodes", "--log-dir"):  # the launcher's details
            if flag in words:
                i = words.index(flag)
                del words[i:i + 2]
        words.insert(1, "--standalone")
    else:
        words[0] = "python"
    return shlex.join(repository_relative(word) for word in words)


# ---------------------------------------------------------------------------------------
# Running and measuring
# ---------------------------------------------------------------------------------------
def measure(run, overwrite, timeout_s, echo=print):
    """Run one configuration once more through the launcher; add what it wrote to `run`."""
    repeat = len(run.setdefault("repeats", [])) + 1
    out = Path(run["out"]) / f"repeat-{repeat}"
    command = command_for({**run, "out": str(out)}, overwrite)
    run["command"] = readable(command)
    started = time.perf_counter()
    run_command(command, timeout=timeout_s, progress=False, echo=echo)
    wall_s = time.perf_counter() - started  # process start to exit, as a stopwatch sees it
    summary = json.loads((out / SUMMARY).read_text())
    metrics = read_metrics(out)
    epoch_times = metrics["epoch_time_s"].tolist()
    warmup = 1 if len(epoch_times) > 1 else 0  # the first epoch pays for one-off costs
    last = metrics.iloc[-1]
    run["repeats"].append({
        "out": repository_relative(str(out)), "wall_s": wall_s, "startup_s": summary["startup_s"],
        "train_s": summary["train_s"], "total_s": summary["total_s"],
        "epoch_time_s": epoch_times, "warmup_epochs": warmup,
        "steady_samples_per_s": [int(last["train_samples"]) / t for t in epoch_times[warmup:]],
        "test_accuracy": float(last["test_accuracy"])})
    run.update(
        status="measured", train_samples=int(last["train_samples"]),
        test_samples=int(last["test_samples"]), dataset=str(last["dataset"]),
        threads_per_process=int(last["threads"]),
        backend=last["backend"] if isinstance(last["backend"], str) else None,
        gpus=int(last["gpus"]), world_size=int(last["world_size"]),
        run_device=summary["hardware"]["device"])
    summarise_repeats(run)
    return run


def summarise_repeats(run):
    """The run's figures over its repeats: medians, and how far its steady epochs spread."""
    repeats = run["repeats"]
    steady = sorted(x for r in repeats for x in r["steady_samples_per_s"])
    median = lambda values: sorted(values)[len(values) // 2]  # noqa: E731 - a middle value
    run.update(
        wall_s=median([r["wall_s"] for r in repeats]),
        startup_s=median([r["startup_s"] for r in repeats]),
        train_s=median([r["train_s"] for r in repeats]),
        total_s=median([r["total_s"] for r in repeats]),
        epoch_time_s=repeats[0]["epoch_time_s"], warmup_epochs=repeats[0]["warmup_epochs"],
        samples_per_s=median(steady),
        samples_per_s_range=[steady[0], steady[-1]],
        spread=steady[-1] / steady[0],
        reliable=steady[-1] / steady[0] <= RELIABLE_SPREAD,
        test_accuracy=median([r["test_accuracy"] for r in repeats]))
    run["steady_epoch_s"] = run["train_samples"] / run["samples_per_s"]


def prepare_data(settings, echo=print):
    """Fetch CIFAR-10 once, before any clock starts; if it cannot be had, use synthetic data
    of the full size for every run (announced), rather than let each run try and fail."""
    if settings["dataset"] != "cifar10":
        return None
    try:
        cifar10_tensors(settings["data_dir"], download=True)
        return None
    except Exception as error:  # offline, or a broken download
        reason = first_line(error)
        note = (f"CIFAR-10 could not be loaded from {repository_relative(settings['data_dir'])} "
                f"({reason}); every configuration uses the synthetic CIFAR-shaped data set of "
                "the same size instead")
        echo(f"[benchmark] {note}")
        settings["dataset"] = "synthetic"
        return note


def run_benchmark(configs, settings, out, runs_dir, overwrite=False, cpu_processes=2,
                  echo=print, tuned=False):
    """Plan, run each configuration in turn, write the results file. Returns the results.

    The results file is written again after each measured repeat ("finished": false until
    the last): an interrupted benchmark keeps what it had measured."""
    machine = describe_machine()
    echo(f"[benchmark] hardware: {machine['label']}")
    preset = SIZES[settings["size"]]
    changed = {k: v for k, v in settings.items() if k in preset and v != preset[k]}
    data_note = prepare_data(settings, echo)
    cpu_best = None
    if tuned and "cpu" in configs:
        cpu_best = best_cpu_setting(settings, machine["cpu"]["usable_cores"], echo)
    runs = plan_runs(configs, settings, machine["gpu_count"], runs_dir, cpu_processes,
                     [gpu["name"] for gpu in machine["gpus"]], tuned, cpu_best, _has_bf16())
    load_before = _load_average()

    def write_results(finished):
        results = {
            "schema": SCHEMA,
            "created": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
            "finished": finished,
            "size": settings["size"], "data_note": data_note, "reliable_spread": RELIABLE_SPREAD,
            "changed_from_size": changed,
            "settings": {**settings, "data_dir": repository_relative(settings["data_dir"])},
            "tuned": tuned, "cpu_probe": cpu_best,
            "hardware": {**machine, "load_average_before": load_before,
                         "load_average_after": _load_average()},
            "runs": [{"status": "not run yet", **{k: v for k, v in run.items() if k != "options"},
                      "out": repository_relative(run["out"]),
                      **({"levers": _levers(run["options"])} if run.get("tuned") else {})}
                     for run in runs],
        }
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        write_atomically(out, lambda f: f.write(json.dumps(results, indent=1) + "\n"), mode="w")
        return results

    for run in runs:
        if "skip" in run:
            run.update(status="skipped", reason=run.pop("skip"))
            echo(f"[benchmark] {run['config']}: {run['description']}: skipped, {run['reason']}")
    to_run = [run for run in runs if run.get("status") != "skipped"]
    # Round after round, every configuration once per round: a burst of other work on the
    # machine then slows one repeat of several configurations, not every repeat of one.
    for repeat in range(1, settings["repeats"] + 1):
        for run in to_run:
            if run.get("status") == "failed":
                continue
            echo(f"[benchmark] round {repeat}/{settings['repeats']}, {run['config']}: "
                 f"{run['description']}, batch {run['batch_size_per_process']} per process "
                 f"(global {run['global_batch_size']})")
            try:
                measure(run, overwrite, settings["timeout_s"], echo)
            except LaunchError as error:  # recorded, and the other configurations still run
                run.update(status="failed", reason=str(error))
                echo(f"[benchmark] {run['config']} failed: {error}")
                write_results(finished=False)
                continue
            write_results(finished=False)
            last = run["repeats"][-1]
            echo(f"[benchmark] {run['config']}: wall {last['wall_s']:.1f} s (start-up "
                 f"{last['startup_s']:.1f} s), steady epochs at "
                 f"{', '.join(f'{x:.0f}' for x in last['steady_samples_per_s'])} samples/s, "
                 f"test accuracy {last['test_accuracy']:.3f}")
    for run in to_run:
        if run.get("status") == "measured" and not run["reliable"]:
            echo(f"[benchmark] {run['config']}: unreliable: its steady epochs ran at "
                 f"{run['samples_per_s_range'][0]:.0f} to {run['samples_per_s_range'][1]:.0f} "
                 f"samples/s, {run['spread']:.2f}x apart (more than {RELIABLE_SPREAD}x): other "
                 "work was using the machine")
    results = write_results(finished=True)
    echo(f"[benchmark] results written to {out}")
    return results


def _levers(options):
    """What a tuned row changed: the options beyond the plain row's."""
    keys = ("threads", "batch_size", *tuned_gpu_options("resnet18"))
    return {key: options[key] for key in keys if key in options}


def _has_bf16():
    import torch
    return torch.cuda.is_available() and torch.cuda.is_bf16_supported(including_emulation=False)


def _load_average():
    """Other work on the machine slows every run: recorded, so a reader can tell."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except (AttributeError, OSError):
        return None


# ---------------------------------------------------------------------------------------
# Reading results back (used by the chapter)
# ---------------------------------------------------------------------------------------
def load_results(path):
    results = json.loads(Path(path).read_text())
    if not isinstance(results, dict) or results.get("schema") != SCHEMA or "runs" not in results:
        raise UsageError(f"{path} is not a results file of this benchmark (schema {SCHEMA})")
    return results


def results_table(results):
    """One row per configuration: times, speed-ups and scaling efficiency, all computed.

    speed-up vs CPU / vs 1 GPU: the baseline's time per steady epoch over this one's (the
    same samples per epoch, so it is also the ratio of samples/s). "wall" compares whole runs,
    start-up included, as a stopwatch would. Scaling efficiency: the speed-up over one GPU
    divided by the number of GPUs (1.0 = every added GPU pays in full). Tuned rows (--tuned)
    compare with the tuned one-GPU row for "x 1 GPU" and efficiency; "x untuned" is each tuned
    row's speed-up over its plain row, "x tuned CPU" every row's over the cpu-tuned row.
    """
    import pandas as pd
    rows = []
    for run in results["runs"]:
        row = {"config": run["config"], "status": run["status"],
               "description": run["description"], "processes": run["processes"],
               "batch/process": run["batch_size_per_process"],
               "global batch": run["global_batch_size"]}
        if run["status"] == "measured":
            row.update({"threads/process": run["threads_per_process"], "gpus": run["gpus"],
                        "wall s": run["wall_s"], "startup s": run["startup_s"],
                        "epoch s (steady)": run["steady_epoch_s"],
                        "samples/s": run["samples_per_s"],
                        "spread": run.get("spread", float("nan")),
                        "reliable": run.get("reliable", True),
                        "test accuracy": run["test_accuracy"]})
        row["reason"] = run.get("reason", "")
        rows.append(row)
    table = pd.DataFrame(rows).set_index("config")
    for column in ("threads/process", "gpus", "wall s", "startup s", "epoch s (steady)",
                   "samples/s", "spread", "test accuracy"):
        if column not in table:
            table[column] = float("nan")
    if "reliable" not in table:
        table["reliable"] = True
    table["reliable"] = table["reliable"].fillna(True).astype(bool)
    measured = table["status"] == "measured"

    def baseline(config, column):
        ok = config in table.index and measured.get(config, False)
        return table.loc[config, column] if ok else float("nan")

    epoch = table["epoch s (steady)"]
    tuned = table.index.str.endswith("-tuned")
    table["x CPU (wall)"] = baseline("cpu", "wall s") / table["wall s"]
    table["x CPU"] = baseline("cpu", "epoch s (steady)") / epoch
    table["x 1 GPU"] = (baseline("gpu", "epoch s (steady)") / epoch).where(~tuned)
    table.loc[tuned, "x 1 GPU"] = baseline("gpu-tuned", "epoch s (steady)") / epoch[tuned]
    on_gpus = table.index.isin(["dp", "ddp", "ddp-tuned"]) & (table["gpus"] > 1)
    table["efficiency"] = (table["x 1 GPU"] / table["gpus"]).where(on_gpus)
    if tuned.any():
        plain = pd.Series([baseline(config.removesuffix("-tuned"), "epoch s (steady)")
                           for config in table.index[tuned]], index=table.index[tuned])
        table["x untuned"] = plain / epoch[tuned]  # empty on the plain rows
        table["x tuned CPU"] = baseline("cpu-tuned", "epoch s (steady)") / epoch
    # A ratio is only as good as both of its speeds: where the row or a baseline it is
    # divided by (cpu and gpu; for a tuned row also their tuned rows) is unreliable, the
    # ratio is labelled, not compared.
    unreliable = set(table.index[measured & ~table["reliable"]])

    def ratios(config):
        if not measured[config]:
            return ""
        baselines = {config, "cpu", "gpu"}
        if config.endswith("-tuned"):
            baselines |= {"cpu-tuned", "gpu-tuned", config.removesuffix("-tuned")}
        return "unreliable" if baselines & unreliable else "ok"

    table["ratios"] = [ratios(config) for config in table.index]
    order = [config for config in ROW_ORDER if config in table.index]
    return table.loc[order + [c for c in table.index if c not in order]]


# ---------------------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------------------
def parse_configs(text):
    configs = [c.strip() for c in text.split(",") if c.strip()]
    if configs == ["all"]:
        return list(CONFIGS)
    unknown = [c for c in configs if c not in CONFIGS]
    if unknown or not configs:
        raise UsageError(f"unknown configuration {', '.join(map(repr, unknown)) or repr(text)}: "
                         f"choose from {', '.join(CONFIGS)} (comma-separated) or all")
    return list(dict.fromkeys(configs))  # in the order given, each once


def build_parser():
    p = ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size", choices=sorted(SIZES), default="smoke",
                   help="smoke: seconds, synthetic data; full: all of CIFAR-10, several epochs")
    p.add_argument("--configs", default="all",
                   help=f"comma-separated, from {', '.join(CONFIGS)}; default all")
    p.add_argument("--out", required=True, help="the results file (JSON) to write")
    p.add_argument("--runs-dir", default=None,
                   help="where each configuration's run directory goes "
                        "(default: runs/benchmark/<name of --out>)")
    p.add_argument("--overwrite", action="store_true",
                   help="replace an existing results file and the runs it came from")
    p.add_argument("--epochs", type=count, default=None, help="override the size's epochs")
    p.add_argument("--batch-size", type=count, default=None,
                   help="the global batch, held fixed across configurations")
    p.add_argument("--dataset", choices=["cifar10", "synthetic"], default=None)
    p.add_argument("--train-samples", type=count, default=None)
    p.add_argument("--test-samples", type=count, default=None)
    p.add_argument("--model", choices=["cnn", "resnet18"], default=None,
                   help="cnn: the tutorial CNN; resnet18: ResNet-18 as CIFAR-10 papers use it "
                        "(3x3 stride-1 stem, no max-pool)")
    p.add_argument("--tuned", action="store_true",
                   help="also run cpu, gpu and ddp with their fastest settings (chapter 10): "
                        "the rows cpu-tuned, gpu-tuned and ddp-tuned")
    p.add_argument("--seed", type=seed_number, default=0)
    p.add_argument("--data-dir", default=str(ROOT / "data"))
    p.add_argument("--cpu-processes", type=count, default=2,
                   help="DDP processes on a machine without a GPU (gloo)")
    p.add_argument("--repeats", type=count, default=None,
                   help="runs of each configuration, interleaved (default: the size's)")
    p.add_argument("--timeout-s", type=seconds, default=None, help="per configuration and run")
    return p


def settings_for(size, seed=0, data_dir=ROOT / "data", **overrides):
    """The size's settings, with any override that is not None."""
    if size not in SIZES:
        raise UsageError(f"unknown size {size!r}: choose from {', '.join(SIZES)}")
    settings = {"size": size, **SIZES[size], "seed": seed, "data_dir": str(data_dir)}
    settings.update({k: v for k, v in overrides.items() if v is not None})
    check_at_least_one(epochs=settings["epochs"], batch_size=settings["batch_size"],
                       repeats=settings["repeats"])
    return settings


def check_writable(out, option="--out"):
    """Before anything runs: the results file can be made (a temporary file beside it), or
    with option="--runs-dir", a file in the folder `out`."""
    folder = out if option == "--runs-dir" else out.parent
    probe = folder / f".{out.name}.tmp{os.getpid()}"  # as write_atomically names it
    try:
        folder.mkdir(parents=True, exist_ok=True)
        probe.write_text("")
        probe.unlink()
    except OSError as error:
        raise cannot_write(option, out, error) from None


def main():
    args = build_parser().parse_args()
    configs = parse_configs(args.configs)
    settings = settings_for(args.size, args.seed, args.data_dir, epochs=args.epochs,
                            batch_size=args.batch_size, dataset=args.dataset,
                            train_samples=args.train_samples, test_samples=args.test_samples,
                            model=args.model, repeats=args.repeats, timeout_s=args.timeout_s)
    check_at_least_one(cpu_processes=args.cpu_processes)
    out = Path(args.out)
    if out.is_dir():
        raise UsageError(f"--out {out} is a directory; give a file name such as {out}/results.json")
    if out.exists() and not args.overwrite:
        raise UsageError(f"{out} already exists; pass --overwrite to replace it, "
                         "or choose another --out")
    check_writable(out)
    runs_dir = Path(args.runs_dir or ROOT / "runs" / "benchmark" / out.stem)
    check_writable(runs_dir, "--runs-dir")
    if not args.overwrite:  # checked before anything runs: no run replaces another's logs
        logs = (METRICS, CHECKPOINT)
        names = configs + [f"{c}-tuned" for c in configs if args.tuned and f"{c}-tuned" in TUNED]
        held = [runs_dir / c for c in names
                if any(path.name in logs for path in (runs_dir / c).rglob("*"))]
        if held:
            raise UsageError(f"{held[0]} already holds a run; pass --overwrite to replace it, "
                             "or choose another --runs-dir")
    results = run_benchmark(configs, settings, out, runs_dir, args.overwrite, args.cpu_processes,
                            tuned=args.tuned)
    failed = [run["config"] for run in results["runs"] if run["status"] == "failed"]
    if failed:
        print(f"error: {', '.join(failed)} failed (see above); the results file records why",
              file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    run_cli(main)
