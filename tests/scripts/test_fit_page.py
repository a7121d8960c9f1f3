"""The calculator's arithmetic, before any page is built: tojs.py turns rules.py and shapes.py
into JavaScript and refuses what JavaScript would run differently; the JavaScript computes
what the Python does (Node.js); shapes.decoder_summary is trace.summarize's summary of the
Decoder to the byte, and the book's models' coefficients give it at any batch. Each check
has its planted flaw."""
import itertools
import json
import shutil
import subprocess

import pytest
import torch

from ddp_scripts.fit import page, rules, shapes, tojs, trace

# (layers, hidden, heads, vocab, seq, batch): odd sizes, one head, a head per channel, seq 1
DECODERS = [(2, 64, 4, 256, 32, 3), (2, 8, 2, 10, 4, 1), (3, 12, 3, 7, 5, 2), (2, 6, 6, 5, 3, 4),
            (2, 5, 5, 11, 1, 1), (4, 16, 1, 33, 17, 2), (2, 96, 8, 50, 9, 5), (3, 3, 1, 2, 7, 3),
            (2, 130, 13, 300, 257, 7)]
SETUPS = [{"strategy": strategy, "ranks": ranks, "optimizer": optimizer, "checkpointing": checkpointing}
          for (strategy, ranks), optimizer, checkpointing in itertools.product(
              [("single", 1), ("ddp", 2), ("fsdp", 3), ("fsdp", 8), ("fsdp-keep", 5)],
              ["sgd", "sgd-momentum", "adam", "adamw"], [False, True])]


def traced(layers, hidden, heads, vocab, seq, batch, precision):
    model = trace.build("ddp_scripts.models:Decoder",
                        dict(layers=layers, hidden=hidden, heads=heads, vocab=vocab, seq=seq))
    return trace.summarize(model, trace.units_of(model), (seq,), torch.long, batch, precision)


# A construct outside the subset, and what JavaScript would do with it instead.
OUTSIDE = {
    "while n > 0:\n        n -= 1": "a loop JavaScript has, but the subset does not",
    "n = n / 2": "true division: a float",
    "n = 0.5": "a float",
    "n = KINDS[-1]": "x[-1]: undefined in JavaScript",
    "n = 'a' in KINDS": "`in`: an object's keys in JavaScript",
    "n = 1 < n < 3": "a chained comparison: (1 < n) < 3 in JavaScript",
    "print(n)": "a call of a name the module does not define",
    "n = sorted(KINDS)": "a built-in",
    "a, b = 1, 2": "a tuple",
    "n = f(n, rank=1)": "keyword arguments",
    "n = n % 2": "% (its sign differs for negative numbers)",
    "n = 2**60": "an int beyond 2**53",
    "n = KINDS[1:]": "a slice",
    "var = 1": "a JavaScript word as a name",
}


@pytest.mark.parametrize("line", OUTSIDE, ids=list(OUTSIDE.values()))
def test_planted_a_construct_outside_the_subset_is_refused_naming_its_line(line):
    source = f"KINDS = [1, 2]\n\n\ndef f(n, rank=0):\n    {line}\n    return n\n"
    with pytest.raises(tojs.TranspileError, match=r"planted.py, line 5: "):
        tojs.transpile({"planted.py": source})


def test_right_case_rules_and_shapes_transpile_into_one_script():
    script = tojs.transpile_files(page.SOURCES)
    assert "function predict(summary, setup, rules = RULES)" in script
    assert "function decoder_summary(" in script and "floorDiv(" in script


def node_runs(script, calls):
    """[result of each call] in Node.js: calls, [(function name, [arguments])]."""
    node = shutil.which("node")
    assert node, "Node.js is needed to run the calculator's JavaScript (Debian: apt-get install nodejs)"
    program = script + f"""
const calls = {json.dumps(calls)};
process.stdout.write(JSON.stringify(calls.map(([name, args]) => eval(name)(...args))));"""
    done = subprocess.run([node, "-"], input=program, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_the_javascript_computes_what_the_python_does():
    """Every setup on two decoders in every precision, and floor division near 2**53: the same
    numbers, to the byte, in Node.js as in Python."""
    script = tojs.transpile_files(page.SOURCES)
    summaries = [shapes.decoder_summary(*d, p) for d in DECODERS[:2] for p in trace.PRECISIONS]
    calls = [("predict", [summary, setup]) for summary in summaries for setup in SETUPS]
    calls += [("decoder_summary", [*d, p]) for d in DECODERS for p in trace.PRECISIONS]
    big = 2**53 - 1
    cases = [(big, 3), (big - 1, 7), (-big, 3), (big, -7), (10**15 + 1, 10**8), (7, 2), (-7, 2)]
    calls += [("floorDiv", list(case)) for case in cases]
    expected = [rules.predict(summary, setup) for summary in summaries for setup in SETUPS]
    expected += [shapes.decoder_summary(*d, p) for d in DECODERS for p in trace.PRECISIONS]
    expected += [a // b for a, b in cases]
    assert node_runs(script, calls) == expected


@pytest.mark.parametrize("precision", trace.PRECISIONS)
def test_right_case_the_decoders_formula_is_its_traced_summary_to_the_byte(precision):
    for decoder in DECODERS:
        assert shapes.decoder_summary(*decoder, precision) == traced(*decoder, precision), decoder


def test_planted_a_term_changed_makes_the_formula_differ_from_the_trace():
    """GELU's output counted in the weights' precision, not the compute's: the same under
    float32, and under autocast the check finds it."""
    source = (page.HERE / "shapes.py").read_text()
    right = "tokens * 4 * h * c,      # down's input: GELU's output"
    assert right in source
    planted = {}
    exec(compile(source.replace(right, right.replace("* c", "* w")), "shapes.py", "exec"), planted)
    decoder = DECODERS[0]
    assert planted["decoder_summary"](*decoder, "float32") == traced(*decoder, "float32")
    assert planted["decoder_summary"](*decoder, "bf16-autocast") != traced(*decoder, "bf16-autocast")


@pytest.fixture(scope="module")
def book_models():
    return {key: trace.build(entry["spec"], entry["kwargs"]) for key, entry in page.BOOK_MODELS.items()}


BATCHES = [1, 2, 3, 7, 64, 513]


@pytest.mark.parametrize("precision", trace.PRECISIONS)
@pytest.mark.parametrize("key", page.BOOK_MODELS)
def test_right_case_a_book_models_coefficients_give_its_traced_summary_at_any_batch(
        book_models, key, precision):
    model = book_models[key]
    units = trace.units_of(model)
    made = page.coefficients(model, units, precision)
    for batch in BATCHES:
        assert shapes.linear_summary(made, batch) == trace.summarize(
            model, units, page.INPUT_SHAPE, torch.float32, batch, precision), batch


def test_planted_coefficients_without_their_floor_miss_autocasts_largest_tensor(book_models):
    """Under autocast the largest tensor a segment keeps can be a weight's bfloat16 copy, the
    same at every batch: a straight line through two batches misses it at small batches."""
    model = book_models["resnet18"]
    units = trace.units_of(model)
    made = page.coefficients(model, units, "bf16-autocast")
    for segment in made["segments"]:
        segment["largest"][2] = 0
    assert any(shapes.linear_summary(made, batch) != trace.summarize(
        model, units, page.INPUT_SHAPE, torch.float32, batch, "bf16-autocast") for batch in BATCHES)
