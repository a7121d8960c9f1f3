"""The rules: each rank's bytes at each point of a training step, by kind, and the peak.

    ranks = predict(summary, setup)   # summary: trace.summarize's; setup: the choices below

setup holds "strategy" ("single", "ddp", "fsdp", "fsdp-keep": FSDP without resharding after
forward), "ranks", "optimizer" ("sgd", "sgd-momentum", "adam", "adamw"), "checkpointing"
(True: each unit keeps only its input and recomputes its forward in backward).

The step is one after the first: the optimizer state exists, the gradients were set to None.
Each point adds up what is alive then; the peak is the largest. The kinds are parameters
(and buffers), gradients, optimizer state, activations (what autograd saves, the batch, the
gradients flowing back), communication buffers (DDP's buckets, FSDP's all-gather and
reduce-scatter buffers) and temporaries (the optimizer step's).

This file is arithmetic only, in a small part of Python (functions, loops, ifs, lists and
dicts of numbers): the book's build turns it into the JavaScript of the page's calculator
(tojs.py), so that the page and `python -m ddp_scripts.fit` compute alike.
"""

KINDS = ["parameters", "gradients", "optimizer state", "activations", "communication buffers",
         "temporaries"]
# Tensors of optimizer state per parameter, each the parameter's size, and whether the step
# makes a temporary of that size beside them: Adam's foreach step takes the square root of
# every exp_avg_sq at once (torch._foreach_sqrt in optim/adam.py, _multi_tensor_adam), SGD
# updates in place. Adam keeps a float32 "step" of 4 bytes per tensor.
STATES = {"sgd": 0, "sgd-momentum": 1, "adam": 2, "adamw": 2}
STEP_TEMPORARIES = {"sgd": 0, "sgd-momentum": 0, "adam": 1, "adamw": 1}
STEP_COUNTERS = {"sgd": 0, "sgd-momentum": 0, "adam": 4, "adamw": 4}
# Rules a test can switch off, to see the check against torch's tracker fail.
RULES = {"optimizer state": 1, "gradients": 1, "buckets": 1, "gathered": 1, "activations": 1,
         "recompute": 1, "step temporaries": 1, "flowing": 1, "reduce-scatter": 1}


def ceil_div(a, b):
    return (a + b - 1) // b


def shard_rows(rows, ranks, rank):
    """[allocated, real] rows of a tensor's first dimension on `rank` under FSDP: torch.chunk's
    pieces of ceil(rows / N); each rank allocates a full piece, the padding included."""
    size = ceil_div(rows, ranks)
    real = rows - rank * size
    if real > size:
        real = size
    if real < 0:
        real = 0
    return [size, real]


def held_weights(summary, setup, rank):
    """{"parameters", "gradients", "state", "counters", "whole": [per segment],
    "padded": [per segment]}: the elements' bytes each rank keeps."""
    e = summary["element"]
    ranks = setup["ranks"]
    fsdp = setup["strategy"] == "fsdp" or setup["strategy"] == "fsdp-keep"
    count = len(summary["segments"])
    whole = []
    padded = []
    for i in range(count):
        whole.append(0)
        padded.append(0)
    parameters = 0
    real = 0
    tensors = 0
    for tensor in summary["tensors"]:
        segment = tensor[0]
        rows = tensor[1]
        cols = tensor[2]
        tensors += 1
        whole[segment] += rows * cols * e
        if fsdp:
            piece = shard_rows(rows, ranks, rank)
            parameters += piece[0] * cols * e
            real += piece[1] * cols * e
            padded[segment] += piece[0] * ranks * cols * e
        else:
            parameters += rows * cols * e
            real += rows * cols * e
            padded[segment] += rows * cols * e
    return {"parameters": parameters, "real": real, "tensors": tensors, "whole": whole,
            "padded": padded}


def point(where, parts):
    total = 0
    for kind in KINDS:
        total += parts[kind]
    return {"at": where, "total": total, "parts": parts}


def parts_of(parameters, gradients, state, activations, buffers, temporaries):
    return {"parameters": parameters, "gradients": gradients, "optimizer state": state,
            "activations": activations, "communication buffers": buffers,
            "temporaries": temporaries}


def predict_rank(summary, setup, rank, rules):
    """The points of one rank's step, and its peak: {"peak", "at", "by_kind", "points"}."""
    strategy = setup["strategy"]
    ranks = setup["ranks"]
    fsdp = strategy == "fsdp" or strategy == "fsdp-keep"
    keep = strategy == "fsdp-keep"
    held = held_weights(summary, setup, rank)
    segments = summary["segments"]
    count = len(segments)
    parameters = held["parameters"] + summary["buffers"]
    state = (STATES[setup["optimizer"]] * held["real"] + STEP_COUNTERS[setup["optimizer"]]
             * held["tensors"]) * rules["optimizer state"]
    gradients = held["parameters"] * rules["gradients"]
    buckets = 0
    if strategy == "ddp":
        buckets = gradients * rules["buckets"]
    checkpointing = setup["checkpointing"]
    points = []
    # Forward: each segment's saved tensors added as it runs; a checkpointed unit keeps only
    # its input.
    kept = summary["batch"]
    for i in range(count):
        s = segments[i]
        gathered = 0
        if fsdp and s["unit"]:
            gathered = held["padded"][i] * rules["gathered"]
        comm = buckets
        if fsdp and s["unit"]:
            comm = held["padded"][i] * rules["gathered"]  # the all-gather output it came from
        during = kept + (s["saved"] + s["output"]) * rules["activations"]
        if fsdp:
            gathered += held["padded"][0]  # the root's weights, whole from forward to backward
            if keep:
                for j in range(1, i):
                    gathered += held["padded"][j]
        points.append(point("forward of " + s["name"],
                            parts_of(parameters + gathered, 0, state, during, comm, 0)))
        if checkpointing and s["unit"]:
            kept += s["input"] * rules["activations"]
        else:
            kept += s["saved"] * rules["activations"]
    # Backward, last segment first: its saved tensors (recomputed if checkpointed), the
    # gradient flowing in and the one flowing out, and the weights' gradients made so far.
    made = 0
    for i in range(count - 1, -1, -1):
        s = segments[i]
        if checkpointing and s["unit"]:
            kept += s["saved"] * rules["recompute"] * rules["activations"] - s["input"] * rules["activations"]
        # the gradient flowing in and the one flowing out, and the largest gradient inside; in
        # the head, where more, the loss's two: cross entropy's gradients of the log-softmax
        # and of the logits, each as large as the log-softmax it saved
        flowing = s["output"] + s["input"] + s["largest"]
        if i == count - 1 and 2 * s["largest"] > flowing:
            flowing = 2 * s["largest"]
        flowing = flowing * rules["flowing"]
        if fsdp:
            own = held["padded"][i] * rules["gradients"]
        else:
            own = held["whole"][i] * rules["gradients"]
        gathered = 0
        comm = buckets
        if fsdp:
            gathered = held["padded"][0]
            if s["unit"]:
                gathered += held["padded"][i] * rules["gathered"]
                comm = 0
                if i > 1:
                    comm = held["padded"][i - 1] * rules["gathered"]  # the prefetched unit
                if segments[i + 1]["unit"]:
                    # the unit before it in backward: its whole gradients, the reduce-scatter's
                    # input, held until the next reduce-scatter starts
                    comm += held["padded"][i + 1] * rules["reduce-scatter"]
            if keep:
                for j in range(1, i):
                    gathered += held["padded"][j]
        points.append(point("backward of " + s["name"],
                            parts_of(parameters + gathered, made + own, state, kept + flowing,
                                     comm, 0)))
        kept -= s["saved"] * rules["activations"]
        if fsdp and s["unit"]:
            made += held["padded"][i] // ranks * rules["gradients"]
        else:
            made += own
    if fsdp:
        made = gradients
    temporaries = STEP_TEMPORARIES[setup["optimizer"]] * held["real"] * rules["step temporaries"]
    points.append(point("optimizer step", parts_of(parameters, made, state, summary["batch"],
                                                   buckets, temporaries)))
    best = points[0]
    for p in points:
        if p["total"] > best["total"]:
            best = p
    return {"rank": rank, "peak": best["total"], "at": best["at"], "by_kind": best["parts"],
            "points": points}


def predict(summary, setup, rules=RULES):
    """predict_rank for every rank (one for "single")."""
    ranks = setup["ranks"]
    if setup["strategy"] == "single":
        ranks = 1
    result = []
    for rank in range(ranks):
        result.append(predict_rank(summary, setup, rank, rules))
    return result
