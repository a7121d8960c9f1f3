"""Chapter 11's calculator in Chromium, on a phone's width, in both editions: for each of many
setups, every number it shows (each group of ranks, its peak and its bytes by kind, the verdict
against the GPU) is what `python -m ddp_scripts.fit --no-tracker` answers (check.fit, the same
code, in this process), to the byte. A rule perturbed in the page's generated script makes the
comparison fail. How long the page takes to answer a change is measured and printed."""
import json
import random
import re
import statistics

import pytest
import torch

from ddp_scripts.fit import check, page as fit_page, rules, trace
from ddp_scripts.fit.__main__ import gib

pytestmark = pytest.mark.xdist_group("browser")

PAGE = {"en": "notebooks/11_fsdp.html", "zh": "zh/notebooks/11_fsdp.html"}
PHONE = 390
DECODERS = [dict(layers=32, hidden=4096, heads=32, vocab=32000, seq=2048),   # 6.7 billion
            dict(layers=40, hidden=5120, heads=40, vocab=32000, seq=4096),   # 13 billion
            dict(layers=2, hidden=64, heads=4, vocab=256, seq=32),           # Decoder()'s
            dict(layers=3, hidden=96, heads=3, vocab=1000, seq=17),
            dict(layers=12, hidden=768, heads=12, vocab=50257, seq=1024)]    # GPT-2 small
MODELS = [("decoder", d) for d in DECODERS] + [(key, None) for key in fit_page.BOOK_MODELS]
STRATEGIES = [("single", 1), ("ddp", 2), ("ddp", 8), ("fsdp", 2), ("fsdp", 3), ("fsdp", 7),
              ("fsdp", 64), ("fsdp-keep", 4), ("fsdp-keep", 5)]


def setups(count=56, seed=0):
    """count setups: every model, strategy, optimizer, precision and card, in a mixed order."""
    pick = random.Random(seed)
    return [{"model": MODELS[i % len(MODELS)], "strategy": STRATEGIES[i % len(STRATEGIES)],
             "optimizer": rules.STATES and list(rules.STATES)[i % 4],
             "precision": trace.PRECISIONS[(i + i // 4) % len(trace.PRECISIONS)], "checkpointing": i % 2 == 1,
             "gpu": pick.choice(list(check.GPUS)), "batch": pick.choice([1, 2, 3, 8, 32, 256])}
            for i in range(count)]


SETUPS = setups()


def expected(setup):
    """check.fit's answer (the rules only, as --no-tracker), for the page's setup."""
    key, kwargs = setup["model"]
    if key == "decoder":
        spec, shape, dtype = "ddp_scripts.models:Decoder", (kwargs["seq"],), torch.long
    else:
        spec, kwargs = fit_page.BOOK_MODELS[key]["spec"], fit_page.BOOK_MODELS[key]["kwargs"]
        shape, dtype = fit_page.INPUT_SHAPE, torch.float32
    model = trace.build(spec, kwargs)
    strategy, ranks = setup["strategy"]
    return check.fit(model, trace.units_of(model),
                     {"input_shape": shape, "input_dtype": dtype, "batch": setup["batch"],
                      "optimizer": setup["optimizer"], "precision": setup["precision"],
                      "checkpointing": setup["checkpointing"], "strategy": strategy, "ranks": ranks},
                     track=False, gpu_memory=check.memory_size(setup["gpu"]))


@pytest.fixture(scope="module")
def answers():
    return [expected(setup) for setup in SETUPS]


# Sets the form and times the answer: the change event, the page's answer, the next frame drawn.
SET_AND_READ = """async ([values, phone]) => {
    const box = document.getElementById("fit-calculator");
    const started = performance.now();
    for (const [name, value] of Object.entries(values)) {
        const input = box.querySelector("#fit-" + name);
        if (input.type === "checkbox") input.checked = value; else input.value = String(value);
    }
    box.querySelector("#fit-model").dispatchEvent(new Event("change", {bubbles: true}));
    await new Promise(drawn => requestAnimationFrame(() => drawn()));
    const ms = performance.now() - started;
    const out = box.querySelector(".fit-answer");
    const text = (e, selector) => e.querySelector(selector).textContent;
    return {ms, computed: Number(out.dataset.ms),
            problem: out.querySelector(".fit-problem") && text(out, ".fit-problem"),
            verdict: out.querySelector(".fit-verdict") && text(out, ".fit-verdict"),
            groups: Array.from(out.querySelectorAll(".fit-group"), g => ({
                summary: text(g, "summary"), peak: text(g, ".fit-peak-bytes"),
                kinds: Array.from(g.querySelectorAll("tr.fit-kind"), row => [
                    text(row, "th"), text(row, ".fit-human"), text(row, ".fit-bytes")])})),
            sticking_out: Array.from(box.querySelectorAll("*"), e => e.getBoundingClientRect())
                .filter(r => r.width > 0 && r.right > phone + 1).length};
}"""
ZH_KINDS = ["参数", "梯度", "优化器状态", "激活值", "通信缓冲区", "临时张量"]


def form_values(setup):
    key, kwargs = setup["model"]
    strategy, ranks = setup["strategy"]
    return {"model": key, **(kwargs or {}), "batch": setup["batch"], "optimizer": setup["optimizer"],
            "precision": setup["precision"], "checkpointing": setup["checkpointing"],
            "strategy": strategy, "ranks": ranks, "gpu": setup["gpu"]}


def runs(ranks):
    """[0, 1, 2, 5] -> "0–2, 5", as the page writes a group's other ranks."""
    parts, start = [], 0
    for i, rank in enumerate(ranks):
        if i + 1 == len(ranks) or ranks[i + 1] != rank + 1:
            parts.append(f"{ranks[start]}–{rank}" if i > start else f"{rank}")
            start = i + 1
    return ", ".join(parts)


def point(where, edition):
    if edition == "en":
        return "at " + where
    if where == "optimizer step":
        return "在优化器步"
    way, _, name = where.partition(" of ")
    name = {"the stem": "输入层", "the head": "head"}.get(name, name)
    return f"在 {name} 的{'前向' if way == 'forward' else '反向'}传播中"


def shown_as_expected(shown, answer, edition):
    """The differences between what the page shows and check.fit's answer: [] when none."""
    colon, rank = ("：", "rank") if edition == "zh" else (": ", "rank")
    wanted = []
    for row in answer["ranks"]:
        if row["rank"] != row["alike"][0]:
            continue
        others = runs(row["alike"][1:])
        same = ("" if not others else f"（rank {others} 相同）" if edition == "zh"
                else f" (ranks {others} the same)")
        kinds = [[ZH_KINDS[i] if edition == "zh" else kind, gib(row["by_kind"][kind]),
                  f"{row['by_kind'][kind]:,} B"] for i, kind in enumerate(rules.KINDS)]
        wanted.append({"summary": f"{rank} {row['rank']}{same}{colon}{gib(row['predicted_peak_bytes'])} "
                                  f"{point(row['peak_point'], edition)}",
                       "peak": f"{row['predicted_peak_bytes']:,} B", "kinds": kinds})
    peak = max(row["predicted_peak_bytes"] for row in answer["ranks"])
    capacity, gpu = answer["gpu_memory_bytes"], answer["setup"]["gpu"]
    card = f"{gpu} ({gib(capacity)})"
    if edition == "zh":
        verdict = (f"放得下 {card}：还余 {gib(capacity - peak)}" if peak <= capacity
                   else f"放不下 {card}：还差 {gib(peak - capacity)}")
        verdict += f"（持有最多的 rank：{gib(peak)}, {peak:,} B）。"
    else:
        verdict = (f"Fits the {card}: {gib(capacity - peak)} to spare" if peak <= capacity
                   else f"Does not fit the {card}: {gib(peak - capacity)} short")
        verdict += f" (the rank that holds most: {gib(peak)}, {peak:,} B)."
    differences = [] if shown["verdict"] == verdict else [f"verdict {shown['verdict']!r}, not {verdict!r}"]
    if shown["groups"] != wanted:
        differences.append(f"groups {json.dumps(shown['groups'], ensure_ascii=False)[:600]}, "
                           f"not {json.dumps(wanted, ensure_ascii=False)[:600]}")
    return differences


def open_calculator(page, server, edition):
    page.set_viewport_size({"width": PHONE, "height": 844})
    page.goto(f"{server}/{PAGE[edition]}", wait_until="load")
    page.wait_for_selector("#fit-calculator .fit-answer")


def compare(page, answers, edition, chosen=None):
    """{setup index: differences} over the setups (or those chosen), and the times measured."""
    found, times = {}, []
    for index, (setup, answer) in enumerate(zip(SETUPS, answers)):
        if chosen is not None and index not in chosen:
            continue
        answer["setup"]["gpu"] = setup["gpu"]
        shown = page.evaluate(SET_AND_READ, [form_values(setup), PHONE])
        times.append((shown["ms"], shown["computed"]))
        differences = shown_as_expected(shown, answer, edition)
        if shown["sticking_out"]:
            differences.append(f"{shown['sticking_out']} elements past {PHONE} px")
        if differences:
            found[index] = differences
    return found, times


@pytest.mark.parametrize("edition", PAGE)
def test_right_case_every_number_the_calculator_shows_is_the_fit_commands(page, server, answers, edition):
    open_calculator(page, server, edition)
    found, times = compare(page, answers, edition)
    total, computed = [t for t, _ in times], [c for _, c in times]
    print(f"\n[{edition}] {len(times)} setups at {PHONE} px: answered and drawn in "
          f"{statistics.median(total):.1f} ms (median), {max(total):.1f} ms at most; "
          f"the rules alone {statistics.median(computed):.1f} ms (median), {max(computed):.1f} ms at most")
    assert not found, "\n".join(f"setup {i} {SETUPS[i]}: {d}" for i, ds in found.items() for d in ds)
    # A decoder whose hidden size does not split into its heads: a sentence, no numbers.
    shown = page.evaluate(SET_AND_READ, [{"model": "decoder", "hidden": 100, "heads": 3}, PHONE])
    assert shown["problem"] and not shown["groups"] and shown["verdict"] is None
    assert not page.errors and not page.blocked, (page.errors, page.blocked)


def test_planted_a_perturbed_rule_in_the_generated_script_fails_the_comparison(page, server, answers):
    """The gradients flowing back counted twice (RULES["flowing"] = 2), in the script the build
    made: the page then differs from the fit command, and the comparison says where."""
    def perturbed(route):
        script = route.fetch().text()
        assert '"flowing": 1' in script
        route.fulfill(body=script.replace('"flowing": 1', '"flowing": 2'),
                      content_type="application/javascript")
    page.route(re.compile(r"/_static/fit-rules\.js(\?.*)?$"), perturbed)   # Sphinx adds ?v=...
    answered = []
    page.on("response", lambda response: "fit-rules.js" in response.url and answered.append(response))
    open_calculator(page, server, "en")
    chosen = set(range(0, len(SETUPS), 4))
    found, _ = compare(page, answers, "en", chosen)
    assert answered, "the page never asked for fit-rules.js"
    assert len(found) >= len(chosen) // 2, f"only {len(found)} of {len(chosen)} setups differ"
