"""A model's summary (trace.summarize's numbers) by formula: what a decoder block saves, by name.

    summary = decoder_summary(layers, hidden, heads, vocab, seq, batch, "bf16-autocast")
    summary = linear_summary(coefficients, batch)   # a traced model's, at any batch

decoder_summary is, to the byte, what trace.summarize reads from ddp_scripts.models:Decoder
(layers >= 2: with one block, no block repeats and the units are its Linear layers), on
torch's CPU kernels under FakeTensorMode. Each term below names the tensor autograd keeps.
linear_summary is a traced model's summary at any batch: each of its numbers is a + b x batch,
or a constant where that is larger (tests/scripts/test_fit_page.py checks it, to the byte).

Written in the same small part of Python as rules.py: the page's calculator runs it too (tojs.py).
"""

LONG = 8       # a token id, a position or a label: int64
FLOAT32 = 4    # what stays in float32 whatever the precision: SDPA's logsumexp, the loss under autocast


def largest_of(values):
    best = 0
    for value in values:
        if value > best:
            best = value
    return best


def total_of(values):
    total = 0
    for value in values:
        total += value
    return total


def segment(name, unit, saved, inputs, output):
    return {"name": name, "unit": unit, "saved": total_of(saved), "input": inputs,
            "output": output, "largest": largest_of(saved)}


def decoder_tensors(layers, hidden, vocab, seq):
    """[segment, rows, columns] of each parameter, in model.parameters()' order: the stem's
    embeddings, each block's, then the final LayerNorm and the head (the root's, segment 0)."""
    h = hidden
    tensors = [[0, vocab, h], [0, seq, h]]   # embed, position
    for i in range(layers):
        block = i + 1
        for shape in [[h, 1], [h, 1], [3 * h, h], [3 * h, 1], [h, h], [h, 1], [h, 1], [h, 1],
                      [4 * h, h], [4 * h, 1], [h, 4 * h], [h, 1]]:
            # norm1 weight, bias; qkv weight, bias; proj weight, bias; norm2 weight, bias;
            # up weight, bias; down weight, bias
            tensors.append([block, shape[0], shape[1]])
    tensors.append([0, h, 1])   # norm weight
    tensors.append([0, h, 1])   # norm bias
    tensors.append([0, vocab, h])   # head weight (no bias)
    return tensors


def decoder_summary(layers, hidden, heads, vocab, seq, batch, precision):
    """trace.summarize's summary of Decoder(layers, hidden, heads, vocab, seq), fed `batch`
    sequences of token ids, in precision "float32", "bf16-autocast", "bf16" or "float64"."""
    tokens = batch * seq
    h = hidden
    # w: the weights' and the residual stream's bytes (bfloat16 only in "bf16": under autocast
    # x + proj(...) adds a bfloat16 output to a float32 x, which stays float32);
    # c: a matrix product's output (bfloat16 under autocast as in "bf16");
    # cast: under autocast each Linear keeps the bfloat16 copy of its weight it multiplied by.
    w = 4
    c = 4
    cast = 0
    if precision == "bf16":
        w = 2
        c = 2
    lse = FLOAT32   # SDPA's statistics, in the type it accumulates in: float32 but for float64
    if precision == "float64":
        w = 8
        c = 8
        lse = 8
    if precision == "bf16-autocast":
        c = 2
        cast = 2
    stem = [seq * LONG]      # the positions, torch.arange(seq), which position keeps (the
                             # token ids it keeps too are the batch, counted there)
    block = [tokens * h * w,          # norm1's input: the block's input x
             tokens * w,              # norm1's mean, one per token
             tokens * w,              # norm1's 1/std
             tokens * h * c,          # qkv's input: norm1's output (under autocast its bfloat16 copy)
             3 * h * h * cast,        # qkv's weight, cast
             tokens * 3 * h * c,      # qkv's output, which q, k and v are views of: SDPA keeps it
             batch * heads * seq * lse,   # SDPA's logsumexp per head and position
             tokens * h * c,          # SDPA's output, laid out so that proj's input is a view of it
             h * h * cast,            # proj's weight, cast
             tokens * h * w,          # norm2's input: x + attention
             tokens * w,              # norm2's mean
             tokens * w,              # norm2's 1/std
             tokens * h * c,          # up's input: norm2's output
             4 * h * h * cast,        # up's weight, cast
             tokens * 4 * h * c,      # GELU's input: up's output
             tokens * 4 * h * c,      # down's input: GELU's output
             4 * h * h * cast]        # down's weight, cast
    head = [tokens * h * w,           # the final LayerNorm's input: the last block's output
            tokens * w,               # its mean
            tokens * w,               # its 1/std
            tokens * h * c,           # head's input: the LayerNorm's output
            vocab * h * cast,         # head's weight, cast
            tokens * vocab * w,       # cross entropy's log-softmax (float32 under autocast)
            tokens * LONG,            # the labels
            w]                        # the weight total that nll_loss divides by
    # Each segment's input and output (trace.summarize's): the stem's input is the batch, which
    # takes no gradient; its output, a block's input, the residual stream; the head's output,
    # the loss.
    segments = [segment("the stem", False, stem, 0, tokens * h * w)]
    for i in range(layers):
        segments.append(segment("blocks." + str_of(i), True, block, tokens * h * w, tokens * h * w))
    segments.append(segment("the head", False, head, tokens * h * w, w))
    return {"tensors": decoder_tensors(layers, hidden, vocab, seq), "segments": segments,
            "buffers": 0, "batch": tokens * LONG, "element": w}


def str_of(number):
    """A block's number as text (str() is not in the subset): digits, most significant first."""
    digits = "0123456789"
    text = digits[number - number // 10 * 10]
    rest = number // 10
    for i in range(20):
        if rest > 0:
            text = digits[rest - rest // 10 * 10] + text
            rest = rest // 10
    return text


def at_batch(numbers, batch):
    """[a, b, floor] at `batch`: a + b x batch, or floor where that is larger (under autocast
    a weight's bfloat16 copy, the same at every batch, can be the largest tensor kept)."""
    value = numbers[0] + numbers[1] * batch
    if numbers[2] > value:
        value = numbers[2]
    return value


def linear_summary(coefficients, batch):
    """A traced model's summary at `batch`, from coefficients: the summary with each number
    that grows with the batch given as [a, b, floor] (at_batch)."""
    segments = []
    for s in coefficients["segments"]:
        segments.append({"name": s["name"], "unit": s["unit"],
                         "saved": at_batch(s["saved"], batch),
                         "input": at_batch(s["input"], batch),
                         "output": at_batch(s["output"], batch),
                         "largest": at_batch(s["largest"], batch)})
    return {"tensors": coefficients["tensors"], "segments": segments,
            "buffers": coefficients["buffers"], "batch": at_batch(coefficients["batch"], batch),
            "element": coefficients["element"]}
