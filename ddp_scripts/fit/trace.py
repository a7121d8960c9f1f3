"""The reader's model, read: built with no memory, its units found, and one forward pass
traced into the numbers the rules need (rules.py's summary).

    model = build("torchvision.models:resnet50", {})          # on the meta device
    summary = summarize(model, units_of(model), (3, 224, 224), torch.float32, 32, "float32")

Nothing is allocated: the model is built on the meta device, and the forward pass runs
under FakeTensorMode (tensors with shapes, dtypes and devices, and no data), so a model far
larger than this machine can be read. Autocast runs as on the CPU.
"""
import contextlib
import copy
import logging
import importlib
import importlib.util
import json
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensorMode, unset_fake_temporarily

from ddp_scripts.cli import UsageError, first_line

PRECISIONS = ("float32", "bf16-autocast", "bf16", "float64")
# The dtype each precision keeps its weights in (its master copy); bf16-autocast computes in
# bfloat16 from float32 weights.
MASTER = {"float32": torch.float32, "bf16-autocast": torch.float32, "bf16": torch.bfloat16,
          "float64": torch.float64}
# --input-dtype: what one sample of the reader's model is made of (long, int: token ids).
INPUT_DTYPES = {"float32": torch.float32, "long": torch.long, "int": torch.int32}


def factory(spec):
    """The callable that `spec` names: "package.module:callable" or "path/to/file.py:callable"."""
    where, _, name = spec.rpartition(":")
    if not where or not name:
        raise UsageError(f"--model {spec!r}: give module:callable or file.py:callable, "
                         "e.g. torchvision.models:resnet50")
    try:
        if where.endswith(".py"):
            path = Path(where)
            if not path.is_file():
                raise UsageError(f"--model {spec!r}: no file {where}")
            loader = importlib.util.spec_from_file_location(path.stem, path)
            module = importlib.util.module_from_spec(loader)
            loader.loader.exec_module(module)
        else:
            module = importlib.import_module(where)
    except UsageError:
        raise
    except Exception as error:  # the reader's own file: any error of its, in one line
        raise UsageError(f"--model {spec!r}: cannot import {where}: {first_line(error)}") from None
    made = getattr(module, name, None)
    if not callable(made):
        raise UsageError(f"--model {spec!r}: {where} has no callable {name!r}")
    return made


def parse_kwargs(text):
    """--kwargs: a JSON object of keyword arguments."""
    try:
        kwargs = json.loads(text)
    except json.JSONDecodeError as error:
        raise UsageError(f"--kwargs is not JSON: {error}") from None
    if not isinstance(kwargs, dict):
        raise UsageError(f"--kwargs must be a JSON object, got {text[:40]}")
    return kwargs


def input_shape(text):
    """--input-shape: one sample's sizes, "3,224,224" (or 3x224x224; "32" for 32 tokens)."""
    try:
        dims = tuple(int(d) for d in text.replace("x", ",").split(","))   # "3,,32" refused
    except ValueError:
        dims = ()
    if not dims or min(dims) < 1:
        raise UsageError(f"--input-shape {text!r}: give one sample's sizes, e.g. 3,224,224")
    return dims


def build(spec, kwargs, device="meta", dtype=torch.float32):
    """The model, built on `device` in `dtype`: "meta" allocates nothing; "cpu" under
    FakeTensorMode gives fake parameters (the model's own initialisation runs on them)."""
    made = factory(spec)
    default = torch.get_default_dtype()
    try:
        torch.set_default_dtype(dtype)
        with torch.device(device):
            model = made(**kwargs)
    except Exception as error:
        raise UsageError(f"--model {spec}: {first_line(error)}") from None
    finally:
        torch.set_default_dtype(default)
    if not isinstance(model, nn.Module):
        raise UsageError(f"--model {spec} made a {type(model).__name__}, not an nn.Module")
    model.spec, model.kwargs = spec, kwargs
    return model


def units_of(model, name=None):
    """The modules that FSDP shards as units of their own and checkpointing recomputes: those
    of class `name`, or by default the class that repeats (two or more, none inside another
    of its kind, no plain container such as nn.Sequential) and covers the most parameters: a
    transformer's blocks, a ResNet's. Of two that cover as many, the finer: more units, each
    gathered whole in its turn, so less held at once."""
    by_class = {}
    for module in model.modules():
        if module is not model:
            by_class.setdefault(type(module).__name__, []).append(module)
    if name is not None:
        if name not in by_class:
            raise UsageError(f"--units {name}: the model has no module of that class "
                             f"(it has {', '.join(sorted(by_class)[:8]) or 'no submodules'})")
        classes = [name]
    else:  # modules that hold others first (blocks), single layers only if none repeats
        containers = (nn.Sequential, nn.ModuleList, nn.ModuleDict)   # they hold; blocks compute
        repeated = [c for c, found in by_class.items()
                    if len(found) >= 2 and type(found[0]) not in containers]
        classes = [c for c in repeated if any(True for _ in by_class[c][0].children())] or repeated
    best, most = [], -1
    for cls in classes:
        outer = [m for m in by_class[cls]
                 if not any(m is not o and any(m is d for d in o.modules()) for o in by_class[cls])]
        covered = sum(p.numel() for m in outer for p in m.parameters())
        if covered > most or (covered == most and len(outer) > len(best)):
            best, most = outer, covered
    return best


@contextlib.contextmanager
def quiet_fake_mode():
    """FakeTensorMode's own log of an op that failed (a traceback on stderr, before the error
    is raised) held back: the error itself becomes the one line the reader gets."""
    log = logging.getLogger("torch._subclasses.fake_tensor")
    level = log.level
    log.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        log.setLevel(level)


def _bytes(tensor):
    return tensor.untyped_storage().nbytes()


def tensor_bytes(tree):
    """The bytes of the tensors in a module's output (a tensor, a tuple, a dict)."""
    return sum(_bytes(t) for t in torch.utils._pytree.tree_leaves(tree) if torch.is_tensor(t))


def sample_input(shape, dtype, batch):
    """The batch the model is fed: zeros (a valid token for every vocabulary)."""
    return torch.zeros(batch, *shape, dtype=dtype)


def main_tensor(output):
    """What a loss is taken of: the output, or its .logits or ["logits"] (Hugging Face's
    models), or else its first floating-point tensor (a tuple's, a dict's)."""
    if torch.is_tensor(output):
        return output
    logits = output.get("logits") if isinstance(output, dict) else getattr(output, "logits", None)
    if torch.is_tensor(logits):
        return logits
    leaves = [t for t in torch.utils._pytree.tree_leaves(output)
              if torch.is_tensor(t) and t.is_floating_point()]
    if not leaves:
        raise UsageError(f"the model returned a {type(output).__name__} with no floating-point "
                         "tensor to take a loss of")
    return leaves[0]


def loss_of(output):
    """Cross entropy against class 0 for logits of (rows, classes) (more dimensions are
    flattened into rows), the sum otherwise; of main_tensor(output)."""
    output = main_tensor(output)
    if output.dim() >= 2:
        logits = output.reshape(-1, output.shape[-1])
        return F.cross_entropy(logits, torch.zeros(logits.shape[0], dtype=torch.long))
    return output.sum()


def fake_model(model, dtype):
    """The model again under the current FakeTensorMode, in `dtype`, and its units: fake
    parameters, nothing allocated. Built as the reader's code builds it (its constants and
    attributes kept); where its initialisation reads values (nn.init.trunc_normal_ does), a
    copy of the meta model instead, each tensor an empty fake one."""
    try:
        fake = build(model.spec, model.kwargs, "cpu", dtype)
    except UsageError:
        fake = meta_copy(model, dtype)
    units = {id(u) for u in model.unit_list}
    return fake, [m for m, original in zip(fake.modules(), model.modules()) if id(original) in units]


def meta_copy(model, dtype):
    """A copy of the meta model whose parameters and buffers are empty fake tensors, those in
    float32 (the meta build's) in `dtype`; a tensor two modules share (tied weights) stays one."""
    try:
        with unset_fake_temporarily():   # a meta copy: fake mode would make its tensors fake
            fake = copy.deepcopy(model)
    except Exception as error:
        raise UsageError(f"--model {model.spec}: its initialisation reads values, and a copy of "
                         f"it cannot be made ({first_line(error)})") from None
    made = {}

    def like(tensor, parameter):
        if id(tensor) not in made:
            empty = torch.empty(tensor.shape, device="cpu",
                                dtype=dtype if tensor.dtype == torch.float32 else tensor.dtype)
            made[id(tensor)] = nn.Parameter(empty, tensor.requires_grad) if parameter else empty
        return made[id(tensor)]
    for module in fake.modules():
        for name, tensor in module._parameters.items():
            if tensor is not None:
                module._parameters[name] = like(tensor, True)
        for name, tensor in module._buffers.items():
            if tensor is not None:
                module._buffers[name] = like(tensor, False)
    return fake


def summarize(model, units, shape, input_dtype, batch, precision):
    """rules.py's summary of one forward pass of `batch` samples, traced under FakeTensorMode:
    - "tensors": [segment, rows, columns] of each parameter (its first dimension, the rest);
    - "buffers": bytes of the buffers (BatchNorm's statistics), which every rank holds whole;
    - "segments": the stem (what runs before the first unit), each unit, the head (what
      runs after the last, the loss included), each with "saved" (bytes autograd saves for
      backward, the weights left out), "input" and "output" (bytes), "largest" (the largest
      tensor it saves) and "name";
    - "batch": the bytes of the input and the labels; "element": a parameter's bytes."""
    master = MASTER[precision]
    with FakeTensorMode(allow_non_fake_inputs=True):
        model.unit_list = units
        fake, fake_units = fake_model(model, master)
        names = {m: n for n, m in fake.named_modules()}
        weights = {p.untyped_storage()._cdata for p in fake.parameters()}
        unit_index = {m: i for i, m in enumerate(fake_units)}
        segments = [{"name": "the stem", "unit": False}]
        segments += [{"name": names[m], "unit": True} for m in fake_units]
        segments += [{"name": "the head", "unit": False}]
        for s in segments:
            s.update(saved=0, input=0, output=0, largest=0)
        current = [0]
        seen = set()

        # A segment's input and output: what flows between them, so what their gradients
        # flow back through. The stem's input is the batch, which takes no gradient; the
        # stem's output is the first unit's input, and the last unit's output the head's input.
        def enter(module, inputs):
            i = unit_index[module] + 1
            current[0] = i
            segments[i]["input"] = sum(_bytes(t) for t in inputs if torch.is_tensor(t))
            if i == 1:
                segments[0]["output"] = segments[1]["input"]

        def leave(module, inputs, output):
            i = unit_index[module] + 1
            segments[i]["output"] = tensor_bytes(output)
            current[0] = len(segments) - 1 if i == len(fake_units) else i + 1
            if i == len(fake_units):
                segments[-1]["input"] = segments[i]["output"]

        def pack(tensor):
            storage = tensor.untyped_storage()
            key = storage._cdata
            if key not in weights and key not in seen:
                seen.add(key)
                s = segments[current[0]]
                s["saved"] += storage.nbytes()
                s["largest"] = max(s["largest"], storage.nbytes())
            return tensor

        for m in fake_units:
            m.register_forward_pre_hook(enter)
            m.register_forward_hook(leave)
        if not fake_units:
            current[0] = len(segments) - 1
        inputs = sample_input(shape, master if input_dtype.is_floating_point else input_dtype, batch)
        seen.add(inputs.untyped_storage()._cdata)  # counted once, as "batch"
        autocast = (torch.autocast("cpu", dtype=torch.bfloat16) if precision == "bf16-autocast"
                    else contextlib.nullcontext())
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), autocast, quiet_fake_mode():
            try:
                output = fake(inputs)
            except Exception as error:
                raise UsageError(f"the model refuses a batch of shape {tuple(inputs.shape)} "
                                 f"({str(input_dtype).removeprefix('torch.')}): {first_line(error)}") from None
            loss = loss_of(output)
        segments[-1]["output"] = _bytes(loss)   # the head ends with the loss
        del loss
        buffers = sum(b.numel() * b.element_size() for b in fake.buffers())
    segment_of = {}
    for i, m in enumerate(units):
        for p in m.parameters():
            segment_of[id(p)] = i + 1
    tensors = [[segment_of.get(id(p), 0 if not units else None), p.shape[0] if p.dim() else 1,
                p[0].numel() if p.dim() else 1] for p in model.parameters()]
    # the root's parameters: the stem's and the head's alike belong to FSDP's root unit
    tensors = [[0 if s is None else s, rows, cols] for s, rows, cols in tensors]
    return {"tensors": tensors, "segments": segments,
            "buffers": buffers,
            "batch": inputs.numel() * inputs.element_size(),   # the labels: the loss's, saved
            "element": torch.empty((), dtype=master).element_size()}

