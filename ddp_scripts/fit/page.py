"""The script behind chapter 11's calculator, made when the book is built (book/tools/build.py):

    python -m ddp_scripts.fit.page _build/fit-rules.js

It holds rules.py and shapes.py turned into JavaScript (tojs.py), the book's own models traced
into coefficients (a summary at any batch, shapes.linear_summary), and the cards' memory
(check.memory_size). The page's own script (book/theme/fit-calculator.js) draws the form and
the bars; every number it shows comes from here, so the page computes what
`python -m ddp_scripts.fit --no-tracker` prints.
"""
import json
import sys
from pathlib import Path

import torch

from ddp_scripts.fit import check, tojs, trace

HERE = Path(__file__).parent
SOURCES = [HERE / "rules.py", HERE / "shapes.py"]
# The book's models, as `python -m ddp_scripts.fit` is asked about them: CIFAR-10 images.
BOOK_MODELS = {
    "cnn": {"spec": "ddp_scripts.models:Net", "kwargs": {}},
    "resnet18": {"spec": "ddp_scripts.models:cifar_resnet18", "kwargs": {}},
    "mlp": {"spec": "ddp_scripts.sharding:WideMLP", "kwargs": {"width": 256, "depth": 4}},
    "mlp-8192x8": {"spec": "ddp_scripts.sharding:WideMLP", "kwargs": {"width": 8192, "depth": 8}},
}
INPUT_SHAPE = (3, 32, 32)
# Two batches large enough that what grows with the batch outweighs what does not (a
# weight's bfloat16 copy under autocast): their difference gives the slope.
LARGE = 2**16
# What the page's script uses; the rest stays inside.
EXPORTS = ["predict", "decoder_summary", "linear_summary", "KINDS", "RULES"]


def coefficients(model, units, precision):
    """The model's summary with each number that depends on the batch as [a, b, floor]:
    a + b x batch, or floor where that is larger (shapes.at_batch)."""
    def summary(batch):
        return trace.summarize(model, units, INPUT_SHAPE, torch.float32, batch, precision)
    one, large, larger = summary(1), summary(LARGE), summary(2 * LARGE)

    def fit(small, big, bigger):
        slope, rest = divmod(bigger - big, LARGE)
        assert rest == 0, "not a whole number of bytes per sample"
        start = big - slope * LARGE
        return [start, slope, small if small > start + slope else 0]
    segments = [{"name": s["name"], "unit": s["unit"],
                 **{key: fit(s[key], b[key], c[key]) for key in ("saved", "input", "output", "largest")}}
                for s, b, c in zip(one["segments"], large["segments"], larger["segments"])]
    return {"tensors": one["tensors"], "buffers": one["buffers"], "element": one["element"],
            "batch": fit(one["batch"], large["batch"], larger["batch"]), "segments": segments}


def book_models():
    """{key: {spec, kwargs, input_shape, precisions: {precision: coefficients}}}."""
    made = {}
    for key, entry in BOOK_MODELS.items():
        model = trace.build(entry["spec"], entry["kwargs"])
        units = trace.units_of(model)
        made[key] = {**entry, "input_shape": list(INPUT_SHAPE),
                     "precisions": {p: coefficients(model, units, p) for p in trace.PRECISIONS}}
    return made


def script():
    """The page's JavaScript: one object, window.fitRules."""
    data = {"BOOK_MODELS": book_models(),
            "GPUS": {name: check.memory_size(name) for name in check.GPUS},
            "PRECISIONS": list(trace.PRECISIONS)}
    constants = "".join(f"const {name} = {json.dumps(value)};\n" for name, value in data.items())
    names = EXPORTS + list(data)
    return ("// Made by `python -m ddp_scripts.fit.page` when the book was built: do not edit.\n"
            "window.fitRules = (function () {\n\"use strict\";\n" + tojs.transpile_files(SOURCES)
            + constants + "return {" + ", ".join(names) + "};\n})();\n")


def main(argv=None):
    target = Path((argv or sys.argv[1:])[0])
    target.write_text(script(), encoding="utf-8")
    print(f"the calculator's script: {target}")


if __name__ == "__main__":
    main()
