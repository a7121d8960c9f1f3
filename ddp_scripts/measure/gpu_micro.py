"""Where the GPU time goes for the book's CNN and ResNet-18: the scripts' data path, data kept on
the GPU, and a CUDA-graph replay of the same training step (its kernels without launch overhead).

    python -m ddp_scripts.measure.gpu_micro --out FOLDER     # FOLDER/micro.txt and FOLDER/micro.json

Run by `make gpu-check` (book/tools/gpu_check.py), which records it with the notebooks; it needs
a CUDA GPU and says so in one line elsewhere. Every row trains for real: SGD with momentum on
50,000 synthetic CIFAR-shaped images (--train-samples), one timed pass after a warm-up.

Every row's float32 arithmetic runs as the scripts run it (`devices.set_precision(False)`: no
TF32), set again before each row, so that no row inherits another's settings. A CUDA-graph row replays the
same eager kernels as the data-on-GPU row of the same precision and layout, without their launch
cost: it is the speed of those kernels with no launch overhead, not a limit of the GPU (fused,
16-bit or TF32 kernels can run faster). Compare a graph row only with the rows of its own
precision and layout.

The CUDA-graph rows follow chapter 10's recipe and PyTorch's whole-network example: the warm-up
runs on a side stream, and the gradients are set to None (`zero_grad(set_to_none=True)`) before
capture, so the captured backward allocates them from the graph's pool and every replay writes
them afresh instead of adding to the last step's. Autocast runs with its weight cache off
under capture (`cache_enabled=False`), as `torch.cuda.make_graphed_callables` requires. cuDNN's
autotuner stays as the scripts leave it (off), so the scripts' path rows are the scripts' path.
Each model is measured in float32 and with bf16 + channels_last, on both paths, so the table
shows what the precision and the layout gain with and without the launches.
"""
import datetime as dt
import json
import os
import sys
import time
from pathlib import Path


# (model, batch, timed steps (None: a whole pass), bf16 + channels_last, CUDA graph)
ROWS = [("cnn", b, None, fast, graph) for b in (64, 512) for fast in (False, True)
        for graph in (False, True)] + \
       [("resnet18", b, steps, fast, graph) for b, steps in ((64, 200), (512, 60))
        for fast in (False, True) for graph in (False, True)]


def load_average():
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except (AttributeError, OSError):
        return None


def measure(model_name, batch, max_steps, fast, graph, images, labels, torch):
    """samples/s of one pass of training steps on data kept on the GPU."""
    import torch.nn.functional as F
    from ddp_scripts.devices import set_precision
    from ddp_scripts.models import build_model
    set_precision(False)  # float32 as the scripts run it, whatever ran before
    device = torch.device("cuda")
    layout = torch.channels_last if fast else torch.contiguous_format
    model = build_model(model_name).to(device, memory_format=layout)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    X, Y = images.to(device).contiguous(memory_format=layout), labels.to(device)
    steps = min(len(X) // batch, max_steps or 10**9)

    def step(x, y):
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=fast, cache_enabled=not graph):
            loss = F.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()

    if graph:
        static_x, static_y = X[:batch].clone(), Y[:batch].clone()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                optimizer.zero_grad(set_to_none=True)
                step(static_x, static_y)
        torch.cuda.current_stream().wait_stream(side)
        captured = torch.cuda.CUDAGraph()
        optimizer.zero_grad(set_to_none=True)  # no .grad before capture: replays write them afresh
        with torch.cuda.graph(captured):
            step(static_x, static_y)

    def one_pass(n):
        order = torch.randperm(len(X), device=device)
        for i in range(n):
            index = order[i * batch:(i + 1) * batch]
            if graph:
                static_x.copy_(X[index])
                static_y.copy_(Y[index])
                captured.replay()
            else:
                optimizer.zero_grad(set_to_none=True)
                step(X[index], Y[index])

    return samples_per_s(one_pass, steps, batch, torch)


def samples_per_s(one_pass, steps, batch, torch):
    """one_pass(n) runs n steps: 5 to warm up, then `steps` timed, the GPU's work included."""
    one_pass(5)
    torch.cuda.synchronize()
    start = time.perf_counter()
    one_pass(steps)
    torch.cuda.synchronize()
    return steps * batch / (time.perf_counter() - start)


def scripts_path(model_name, batch, max_steps, dataset, torch):
    """samples/s of the scripts' own path: CPU tensors, a DataLoader, a copy per batch."""
    import torch.nn.functional as F
    from ddp_scripts.data import make_loader
    from ddp_scripts.devices import set_precision
    from ddp_scripts.models import build_model
    set_precision(False)  # float32 as the scripts run it, whatever ran before
    device = torch.device("cuda")
    model = build_model(model_name).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loader = make_loader(dataset, batch, torch.utils.data.RandomSampler(dataset))
    steps = min(len(loader), max_steps or 10**9)

    def one_pass(n):
        for i, (x, y) in enumerate(loader):
            if i == n:
                break
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            optimizer.zero_grad(set_to_none=True)
            F.cross_entropy(model(x), y).backward()
            optimizer.step()

    return samples_per_s(one_pass, steps, batch, torch)


def main(argv=None):
    from ddp_scripts.cli import UsageError
    from ddp_scripts.options import ArgumentParser, count
    parser = ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="the folder for micro.txt and micro.json")
    parser.add_argument("--train-samples", type=count, default=50_000)
    parser.add_argument("--commit", default="unknown", help="the commit this run measured")
    try:
        args = parser.parse_args(argv)
    except UsageError as error:   # one line, as every script says bad input
        print(f"error: {error}", file=sys.stderr)
        return 2
    import torch
    if not torch.cuda.is_available():
        print("error: gpu_micro.py measures a CUDA GPU, and this machine has none", file=sys.stderr)
        return 2
    if args.train_samples < 512:
        print("error: --train-samples must be at least 512 (one batch of 512)", file=sys.stderr)
        return 2
    from ddp_scripts.data import TensorImages, synthetic_cifar
    from ddp_scripts.measure.links import describe_machine
    (images, labels), _ = synthetic_cifar(args.train_samples, 256)
    dataset = TensorImages(images, labels, "synthetic")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    before = load_average()
    lines, rows = [f"{torch.__version__} {torch.cuda.get_device_name(0)}"], []
    print(lines[0], flush=True)
    done = set()
    for model_name, batch, max_steps, fast, graph in ROWS:
        if (model_name, batch) not in done:   # the scripts' path once per model and batch
            done.add((model_name, batch))
            speed = scripts_path(model_name, batch, max_steps, dataset, torch)
            rows.append({"model": model_name, "batch": batch, "path": "scripts", "bf16": False,
                         "channels_last": False, "cuda_graph": False, "samples_per_s": speed})
        speed = measure(model_name, batch, max_steps, fast, graph, images, labels, torch)
        rows.append({"model": model_name, "batch": batch, "path": "data on GPU", "bf16": fast,
                     "channels_last": fast, "cuda_graph": graph, "samples_per_s": speed})
        for row in rows[len(lines) - 1:]:
            what = ("scripts' path (CPU tensors, DataLoader)" if row["path"] == "scripts" else
                    "data on GPU" + (" channels_last bf16" if row["bf16"] else "")
                    + (" CUDA graph" if row["cuda_graph"] else ""))
            lines.append(f"{row['model']} b{row['batch']}: {what:44s} "
                         f"{row['samples_per_s']:10.0f} samples/s")
            print(lines[-1], flush=True)
    after = load_average()
    (out / "micro.txt").write_text("\n".join(lines) + "\n")
    machine = describe_machine()
    (out / "micro.json").write_text(json.dumps({
        "what": "where the GPU time goes for the book's CNN and ResNet-18: the scripts' data "
                "path, data kept on the GPU, and a CUDA-graph replay of the same training step "
                "(gradients set to None before capture); float32 without TF32 and without "
                "cuDNN autotuning, as the scripts run",
        "file": "micro.txt", "made_by": "ddp_scripts/measure/gpu_micro.py", "commit": args.commit,
        "created": dt.datetime.now().astimezone().isoformat(timespec="seconds"),
        "train_samples": args.train_samples, "hardware": machine["label"],
        "cores": os.cpu_count(), "load_average_before": before, "load_average_after": after,
        "rows": rows}, indent=1) + "\n")
    print(f"written: {out / 'micro.txt'}, {out / 'micro.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
