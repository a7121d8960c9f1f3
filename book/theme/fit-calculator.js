// Chapter 11's memory calculator: a form, and each rank's peak bytes by kind as a stacked bar.
// Loaded on the page that has a <div id="fit-calculator"> (book/extensions/editions.py), after
// fit-rules.js, which the build makes from ddp_scripts/fit (page.py): every number here comes
// from window.fitRules, the rules of `python -m ddp_scripts.fit` turned into JavaScript. This
// file only reads the form and draws; it computes nothing of its own. Nothing leaves the page.
(function () {
  "use strict";
  const zh = document.documentElement.lang.startsWith("zh");
  const WORDS = zh ? {
    model: "模型", decoder: "Transformer 解码器（`Decoder`）", layers: "层数", hidden: "隐藏维度",
    heads: "注意力头数", vocab: "词表大小", seq: "序列长度", batch: "每个 rank 的批量大小",
    optimizer: "优化器", precision: "精度", checkpointing: "激活重计算（每个单元）",
    strategy: "策略", ranks: "rank 数", gpu: "GPU",
    models: {cnn: "本书的 CNN（`Net`，CIFAR-10）", resnet18: "ResNet-18（CIFAR-10）",
             mlp: "`WideMLP`，宽度 256、深度 4（本章）", "mlp-8192x8": "`WideMLP`，宽度 8192、深度 8"},
    strategies: {single: "单进程", ddp: "DDP", fsdp: "FSDP", "fsdp-keep": "FSDP，前向后不重新分片"},
    kinds: {parameters: "参数", gradients: "梯度", "optimizer state": "优化器状态",
            activations: "激活值", "communication buffers": "通信缓冲区", temporaries: "临时张量"},
    rank: "rank", same: (others) => `（rank ${others} 相同）`, peak: "峰值",
    at: (where) => where === "optimizer step" ? "在优化器步" : where.replace(
      /^(forward|backward) of (.*)$/, (_, pass, name) =>
        `在 ${name === "the stem" ? "输入层" : name === "the head" ? "head" : name} 的${pass === "forward" ? "前向" : "反向"}传播中`),
    fits: (gpu, spare) => `放得下 ${gpu}：还余 ${spare}`,
    short: (gpu, short) => `放不下 ${gpu}：还差 ${short}`,
    worst: (peak) => `（持有最多的 rank：${peak}）`, colon: "：", stop: "。",
    heads_split: "隐藏维度必须能被注意力头数整除。", whole: "每一项都必须是不小于 1 的整数。",
    two_layers: "解码器至少要 2 层：只有 1 层时没有重复的块，单元就成了它的线性层。",
    two_ranks: "DDP 和 FSDP 至少需要 2 个 rank。", too_large: "数字超出了 JavaScript 能精确计算的范围（2^53）。",
  } : {
    model: "Model", decoder: "Transformer decoder (`Decoder`)", layers: "layers", hidden: "hidden size",
    heads: "heads", vocab: "vocabulary", seq: "sequence length", batch: "batch per rank",
    optimizer: "optimizer", precision: "precision", checkpointing: "activation checkpointing (each unit)",
    strategy: "strategy", ranks: "ranks", gpu: "GPU",
    models: {cnn: "The book's CNN (`Net`, CIFAR-10)", resnet18: "ResNet-18 (CIFAR-10)",
             mlp: "`WideMLP`, width 256, depth 4 (this chapter)", "mlp-8192x8": "`WideMLP`, width 8192, depth 8"},
    strategies: {single: "one process", ddp: "DDP", fsdp: "FSDP", "fsdp-keep": "FSDP, not resharded after forward"},
    kinds: null, rank: "rank", same: (others) => ` (ranks ${others} the same)`, peak: "peak",
    at: (where) => "at " + where,
    fits: (gpu, spare) => `Fits the ${gpu}: ${spare} to spare`,
    short: (gpu, short) => `Does not fit the ${gpu}: ${short} short`,
    worst: (peak) => ` (the rank that holds most: ${peak})`, colon: ": ", stop: ".",
    heads_split: "The hidden size must split evenly into the heads.", whole: "Every number must be a whole number, 1 or more.",
    two_layers: "A decoder needs 2 layers or more: with one, no block repeats, and its Linear layers become the units.",
    two_ranks: "DDP and FSDP need 2 ranks or more.", too_large: "The numbers are beyond what JavaScript computes exactly (2^53).",
  };
  // The kinds' colours, as notebooks/figures.py's KINDS gives them (colour-blind-safe).
  const COLOURS = {parameters: "#0173b2", gradients: "#56b4e9", "optimizer state": "#ca9161",
                   activations: "#029e73", "communication buffers": "#de8f05", temporaries: "#949494"};
  // The decoder's sizes and their first values: a Transformer of 6.7 billion parameters.
  const DECODER = [["layers", 32], ["hidden", 4096], ["heads", 32], ["vocab", 32000], ["seq", 2048]];

  const text = (s) => s.replace(/`/g, "");
  const bytes = (n) => n.toLocaleString("en-US") + " B";
  // As `python -m ddp_scripts.fit` prints them (gib() in its __main__.py): GiB from 256 MiB up,
  // two decimals rounded half to even on the exact quotient, as Python's format rounds.
  const human = (n) => {
    const [unit, name] = n >= 2 ** 28 ? [2n ** 30n, " GiB"] : [2n ** 20n, " MiB"];
    let hundredths = BigInt(n) * 100n / unit;
    const twice = 2n * (BigInt(n) * 100n % unit);
    if (twice > unit || (twice === unit && hundredths % 2n === 1n)) hundredths += 1n;
    return `${(hundredths / 100n).toLocaleString("en-US")}.${String(hundredths % 100n).padStart(2, "0")}${name}`;
  };
  const runs = (ranks) => {   // [0, 1, 2, 5] -> "0–2, 5"
    const parts = [];
    for (let i = 0; i < ranks.length; i++) {
      let j = i;
      while (j + 1 < ranks.length && ranks[j + 1] === ranks[j] + 1) j++;
      parts.push(j > i ? `${ranks[i]}–${ranks[j]}` : `${ranks[i]}`);
      i = j;
    }
    return parts.join(", ");
  };

  function element(tag, attributes, ...children) {
    const made = document.createElement(tag);
    for (const [key, value] of Object.entries(attributes || {})) made.setAttribute(key, value);
    made.append(...children);
    return made;
  }

  function field(name, label, input) {
    input.name = name;
    input.id = "fit-" + name;
    return element("label", {class: "fit-field", for: input.id}, element("span", {}, label), input);
  }

  function choice(options, selected) {
    const select = element("select");
    for (const [value, label] of options) select.append(element("option", {value: value}, label));
    select.value = selected;
    return select;
  }

  function number(value) {
    return element("input", {type: "number", min: "1", step: "1", value: String(value), inputmode: "numeric"});
  }

  function form(rules) {
    const models = [["decoder", text(WORDS.decoder)],
                    ...Object.keys(rules.BOOK_MODELS).map((key) => [key, text(WORDS.models[key])])];
    const gpus = Object.entries(rules.GPUS).map(([name, size]) => [name, `${name} (${human(size)})`]);
    const model = element("fieldset", {}, field("model", WORDS.model, choice(models, "decoder")));
    for (const [name, value] of DECODER) model.append(field(name, WORDS[name], number(value)));
    model.append(field("batch", WORDS.batch, number(1)));
    const checkbox = element("input", {type: "checkbox"});
    checkbox.checked = true;
    const training = element("fieldset", {},
      field("optimizer", WORDS.optimizer, choice(["sgd", "sgd-momentum", "adam", "adamw"].map((o) => [o, o]), "adamw")),
      field("precision", WORDS.precision, choice(rules.PRECISIONS.map((p) => [p, p]), "bf16-autocast")),
      field("strategy", WORDS.strategy, choice(Object.entries(WORDS.strategies), "fsdp")),
      field("ranks", WORDS.ranks, number(8)),
      field("gpu", WORDS.gpu, choice(gpus, "H100")),
      field("checkpointing", WORDS.checkpointing, checkbox));
    return element("form", {class: "fit-form"}, model, training);
  }

  function read(box) {
    const value = (name) => box.querySelector("#fit-" + name).value;
    const whole = (name) => Number(value(name));
    return {model: value("model"), layers: whole("layers"), hidden: whole("hidden"), heads: whole("heads"),
            vocab: whole("vocab"), seq: whole("seq"), batch: whole("batch"), optimizer: value("optimizer"),
            precision: value("precision"), strategy: value("strategy"), ranks: whole("ranks"),
            gpu: value("gpu"), checkpointing: box.querySelector("#fit-checkpointing").checked};
  }

  // The choices as the rules take them, or the sentence that says what is wrong.
  function problem(c) {
    const numbers = [c.batch, c.ranks].concat(c.model === "decoder" ? DECODER.map(([name]) => c[name]) : []);
    if (!numbers.every((n) => Number.isSafeInteger(n) && n >= 1)) return WORDS.whole;
    if (c.model === "decoder" && c.layers < 2) return WORDS.two_layers;
    if (c.model === "decoder" && c.hidden % c.heads) return WORDS.heads_split;
    if (c.strategy !== "single" && c.ranks < 2) return WORDS.two_ranks;
    return null;
  }

  function predict(rules, c) {
    const summary = c.model === "decoder"
      ? rules.decoder_summary(c.layers, c.hidden, c.heads, c.vocab, c.seq, c.batch, c.precision)
      : rules.linear_summary(rules.BOOK_MODELS[c.model].precisions[c.precision], c.batch);
    return rules.predict(summary, {strategy: c.strategy, ranks: c.strategy === "single" ? 1 : c.ranks,
                                   optimizer: c.optimizer, checkpointing: c.checkpointing});
  }

  // Ranks whose predictions are the same, as check.alike groups them: [[rank, ...], ...].
  function alike(ranks) {
    const groups = new Map();
    for (const row of ranks) {
      const key = [row.peak, ...Object.values(row.by_kind)].join(" ");
      if (!groups.has(key)) groups.set(key, []);
      groups.get(key).push(row);
    }
    return [...groups.values()];
  }

  function bar(rules, row, scale, capacity) {
    const drawn = element("div", {class: "fit-bar", role: "img"});
    for (const kind of rules.KINDS) {
      if (row.by_kind[kind] > 0) {
        drawn.append(element("span", {class: "fit-part", title: kindName(kind),
          style: `width:${100 * row.by_kind[kind] / scale}%;background:${COLOURS[kind]}`}));
      }
    }
    drawn.append(element("span", {class: "fit-capacity", style: `left:${100 * Math.min(capacity / scale, 1)}%`}));
    return drawn;
  }

  const kindName = (kind) => WORDS.kinds ? WORDS.kinds[kind] : kind;

  function group(rules, rows, scale, capacity, open) {
    const first = rows[0];
    const ranks = rows.map((row) => row.rank);
    const others = runs(ranks.slice(1));
    const table = element("table", {class: "fit-kinds"});
    for (const kind of rules.KINDS) {
      table.append(element("tr", {class: "fit-kind"},
        element("th", {}, element("span", {class: "fit-swatch", style: `background:${COLOURS[kind]}`}), kindName(kind)),
        element("td", {}, element("span", {class: "fit-human"}, human(first.by_kind[kind])), " ",
                element("span", {class: "fit-bytes"}, bytes(first.by_kind[kind])))));
    }
    const details = element("details", {class: "fit-group"},
      element("summary", {}, element("span", {class: "fit-ranks"}, `${WORDS.rank} ${first.rank}`),
              others ? WORDS.same(others) : "", WORDS.colon, element("span", {class: "fit-peak-human"}, human(first.peak)),
              " ", element("span", {class: "fit-point"}, WORDS.at(first.at))),
      element("p", {class: "fit-peak"}, WORDS.peak + WORDS.colon, element("span", {class: "fit-peak-bytes"}, bytes(first.peak))),
      bar(rules, first, scale, capacity), table);
    details.open = open;
    return details;
  }

  function show(rules, box, out) {
    const started = performance.now();
    const c = read(box);
    box.querySelector("#fit-ranks").disabled = c.strategy === "single";
    for (const [name] of DECODER) box.querySelector("#fit-" + name).closest("label").hidden = c.model !== "decoder";
    let wrong = problem(c);
    const ranks = wrong ? [] : predict(rules, c);
    if (ranks.some((row) => !Number.isSafeInteger(row.peak))) wrong = WORDS.too_large;
    if (wrong) {
      out.replaceChildren(element("p", {class: "fit-problem"}, wrong));
      return;
    }
    const capacity = rules.GPUS[c.gpu];
    const peak = Math.max(...ranks.map((row) => row.peak));
    const scale = Math.max(peak, capacity);
    const gpu = `${c.gpu} (${human(capacity)})`;
    const verdict = peak <= capacity ? WORDS.fits(gpu, human(capacity - peak)) : WORDS.short(gpu, human(peak - capacity));
    out.replaceChildren(
      element("p", {class: "fit-verdict " + (peak <= capacity ? "fit-yes" : "fit-no")}, verdict,
              WORDS.worst(`${human(peak)}, ${bytes(peak)}`), WORDS.stop),
      ...alike(ranks).map((rows, index) => group(rules, rows, scale, capacity, index === 0)));
    out.dataset.ms = (performance.now() - started).toFixed(2);   // how long the answer took
  }

  document.addEventListener("DOMContentLoaded", () => {
    const box = document.getElementById("fit-calculator");
    const rules = window.fitRules;
    if (!box || !rules) return;
    const out = element("div", {class: "fit-answer", "aria-live": "polite"});
    box.replaceChildren(form(rules), out);
    const again = () => show(rules, box, out);
    box.addEventListener("input", again);
    box.addEventListener("change", again);
    again();
  });
})();
