"""The token viewer: one self-contained HTML page per run, every stored group of the run with each
token coloured by what a loss does with it (its weight, entropy, probability, TEPO's KL mask).

    python plots.py RUN_DIR --html          # writes OUT/pages/<run>.html

For the reader who wants to see which tokens each loss trusts, token by token; plots.py calls it.
"""
import html
import json
import math
import re
import sys

import matplotlib
import torch

from plots import ORDER, read_jsonl, token_weights

#
# `python plots.py RUN_DIR --html` writes OUT/pages/<run>.html: every stored group of the run,
# each token coloured by what a loss does with it, a step slider, the run's curves on top. One
# self-contained file: the data as JSON in a <script type="application/json"> (every <, > and &
# escaped, so no token can close it), the DOM built by a little plain JS with textContent (model
# output never becomes markup), the curves inline SVG. Deterministic: the same logs give the
# same bytes (sorted keys, numbers rounded to 4 significant digits, no timestamp). Every log
# value is typed before it is used: steps are whole numbers (read_jsonl), a stored group's fields
# and the curves' metrics numbers or text of the right shape (else an error naming the file and
# line or step, before any page is written); config values are escaped text or typed JSON.

VIEW_MODES = [   # (key, button, what the colour says); a loss's key is its weight
    ("grpo", "GRPO weight", "GRPO: weight 1 on every token, each token gets its answer's advantage."),
    ("tr_grpo", "TR-GRPO weight", "TR-GRPO: w(p) = clamp(2 (sigmoid(9p) - 1/4), 1, 1.4), from the token's "
     "probability p: confident tokens (p > 0.33) count 1.4x, unsure ones (p < 0.12) 1x."),
    ("cw_grpo", "CW-GRPO weight", "CW-GRPO: a Gaussian kernel on (log p - its answer's mean) x (A - the "
     "group's mean): the tokens where that covariance is extreme count less; mean 1 over the group."),
    ("tepo", "TEPO weight", "TEPO: weight 1 on every token; what it changes is the sequence ratio and "
     "the KL mask (colour by it)."),
    ("entropy", "entropy", "Full-vocabulary entropy H of the policy where the token was sampled, in nats."),
    ("prob", "probability", "p = exp(log p): the sampled token's probability under the sampling policy."),
    ("kl", "TEPO's KL mask", "TEPO's KL mask: A > 0 and log p + H > 0 (reinforcing the token lowers the "
     "entropy). TEPO's KL term acts on these tokens only."),
]


def is_number(x):
    """A JSON number a float holds: not a bool (true is no log-prob), not a 400-digit integer."""
    return type(x) is float or type(x) is int and abs(x) <= sys.float_info.max


def checked_group(sample, where):
    """A stored group from samples.jsonl with every field the page uses checked: the prompt and
    each token text, one list of numbers per answer for the mask (0 or 1), log-probs and entropies,
    as long as its tokens, one reward and advantage per answer. Else an error naming `where`
    (the file and line) and the field: nothing of a broken or hostile log reaches the page."""
    def fail(field, what):
        raise SystemExit(f"error: {where}: '{field}' {what}")
    if not isinstance(sample.get("prompt"), str):
        fail("prompt", "is missing or not text")
    tokens = sample.get("tokens")
    if not (isinstance(tokens, list) and tokens and all(isinstance(row, list) for row in tokens)
            and len({len(row) for row in tokens}) == 1
            and all(isinstance(t, str) for row in tokens for t in row)):
        fail("tokens", "is not a list of answers, each a list of token texts, all of one length")
    for field in ("mask", "logp", "entropy"):
        rows = sample.get(field)
        if not (isinstance(rows, list) and len(rows) == len(tokens)
                and all(isinstance(row, list) and len(row) == len(tokens[0]) for row in rows)
                and all(is_number(x) for row in rows for x in row)):
            fail(field, f"is not {len(tokens)} lists of {len(tokens[0])} numbers (one per answer's token)")
    if not all(x in (0, 1) for row in sample["mask"] for x in row):
        fail("mask", "holds a value other than 0 and 1")
    for field in ("advantages", "rewards"):
        values = sample.get(field)
        if not (isinstance(values, list) and len(values) == len(tokens) and all(map(is_number, values))):
            fail(field, f"is not {len(tokens)} numbers (one per answer)")
    return sample


def curve(run, key):
    """[(step, value)] of a metric of the run's metrics.jsonl: a value that is not a number is an
    error naming the file and step; a non-finite one (e.g. a step fp16 skipped) is left out."""
    points = []
    for x in run["eval" if key == "eval_accuracy" else "train"]:
        if key in x and not is_number(x[key]):
            raise SystemExit(f"error: {run['dir'] / 'metrics.jsonl'}, step {x['step']}: '{key}' is "
                             f"{x[key]!r:.40}, not a number")
        if key in x and math.isfinite(x[key]):
            points.append((x["step"], float(x[key])))
    return points


def rounded(x, digits=4):
    """The page's one number format: `digits` significant digits, a whole number written as one
    (1, not 1.0: the page's size); None (shown '–') if not finite."""
    if not math.isfinite(x):
        return None
    x = float(f"{x:.{digits}g}")
    return int(x) if x.is_integer() and abs(x) < 1e15 else x


def page_group(sample, tr_mean_one=False):
    """One stored group as the page holds it: per answer its reward, advantage and valid tokens
    (the padding after the first EOS is left out), each with its log-prob, entropy, the four
    losses' weights and TEPO's KL mask, from token_weights(), rounded."""
    weights = token_weights(sample, dtype=torch.float64, tr_mean_one=tr_mean_one)
    rows = []
    for i, tokens in enumerate(sample["tokens"]):
        keep = [j for j, m in enumerate(sample["mask"][i]) if m]
        pick = lambda values: [values[j] for j in keep]
        rows.append({"reward": rounded(sample["rewards"][i]), "adv": rounded(sample["advantages"][i]),
                     "tokens": pick(tokens), "logp": [rounded(x) for x in pick(sample["logp"][i])],
                     "entropy": [rounded(x) for x in pick(sample["entropy"][i])],
                     "kl": [int(x) for x in pick(weights["tepo"][1][i].tolist())],
                     "w": {name: [rounded(x) for x in pick(weights[name][0][i].tolist())] for name in ORDER}})
    return {"step": sample["step"], "prompt": sample["prompt"], "rows": rows}


def colour_stops(name, lo=0.0, hi=1.0, n=11):
    """n colours of a matplotlib colour map from `lo` to `hi`, as hex: the page interpolates them."""
    cmap = matplotlib.colormaps[name]
    return [matplotlib.colors.to_hex(cmap(lo + (hi - lo) * k / (n - 1))) for k in range(n)]


def curve_svg(points, title, smin, smax, width=372, height=74):
    """A small line chart of [(step, value)] as inline SVG, x from smin to smax, y over the values'
    own range, the first and last value written; a vertical line the page moves to the step shown."""
    left, right, top, bottom = 6, 6, 18, 14
    x = lambda s: left + (width - left - right) * (s - smin) / max(smax - smin, 1)
    esc = lambda value: html.escape(str(value))     # typed already; escaped all the same
    parts = [f'<svg class="curve" width="{width}" height="{height}" viewBox="0 0 {width} {height}" '
             f'data-smin="{esc(smin)}" data-smax="{esc(smax)}" data-left="{left}" data-right="{right}">',
             f'<text x="{left}" y="11" class="ctitle">{html.escape(title)}</text>']
    if points:
        vmin, vmax = min(v for _, v in points), max(v for _, v in points)
        y = lambda v: top + (height - top - bottom) * (1 - (v - vmin) / ((vmax - vmin) or 1))
        line = " ".join(f"{x(s):.1f},{y(v):.1f}" for s, v in points)
        parts += [f'<polyline points="{line}" class="cline"/>',
                  f'<text x="{left}" y="{height - 2}" class="cval">{points[0][1]:.3g}</text>',
                  f'<text x="{width - right}" y="{height - 2}" class="cval" text-anchor="end">'
                  f'{points[-1][1]:.3g} at step {esc(points[-1][0])}</text>']
    parts += [f'<line class="now" x1="{left}" x2="{left}" y1="{top - 4}" y2="{height - bottom + 2}"/>',
              "</svg>"]
    return "".join(parts)


def viewer_data(run, records):
    """Everything the page shows of a run, as one JSON-able dict."""
    cfg = run["config"]
    mean1 = bool(cfg.get("tr_mean_one"))       # a --tr-mean-one control: its own weights, and says so
    groups = [page_group(rec, mean1) for rec in records]
    valid = [v for g in groups for row in g["rows"] for name in ORDER for v in row["w"][name]
             if v is not None]
    norm = [min(0.0, min(valid, default=0.0)), 1.0, max(1.5, max(valid, default=1.5))]     # as the figure's
    weight = {"stops": colour_stops("RdYlBu", 0.08, 0.92), "domain": norm}
    scales = {name: weight for name in ORDER} | {
        "entropy": {"stops": colour_stops("YlOrRd", 0.0, 0.85), "domain": [0.0, 2.0]},
        "prob": {"stops": colour_stops("BuPu", 0.0, 0.85)[::-1], "domain": [0.0, 1.0]},
        "kl": {"stops": ["#f2f2f2", "#c44e52"], "domain": [0, 1]}}
    modes = [(k, label + " (mean 1)", about + " This run's control (--tr-mean-one) divides them by their "
              "mean over the answer's tokens, so some count less than 1x.") if k == "tr_grpo" and mean1
             else (k, label, about) for k, label, about in VIEW_MODES]
    beta, seed = cfg.get("beta"), run["seed"]      # config.json's values: typed, or text
    beta = beta if is_number(beta) and math.isfinite(beta) else None
    return {"run": run["dir"].name, "loss": str(run["loss"]), "beta": beta,
            "seed": seed if type(seed) is int else str(seed),
            "modes": [{"key": k, "label": label, "about": about, **scales[k]} for k, label, about in modes],
            "groups": groups}


def script_json(obj):
    """obj as JSON that is safe inside <script>: no <, > or & survives, so `</script>` or `<!--`
    in a token cannot end the block; ASCII only."""
    text = json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def viewer_page(run, records):
    """The token viewer of a run: one HTML page, as a string."""
    data = viewer_data(run, records)
    steps = [x["step"] for x in run["train"] + run["eval"]] + [g["step"] for g in data["groups"]]
    smin, smax = min(steps, default=0), max(steps, default=1)
    series = [("mean reward of the batch", curve(run, "reward")),
              ("held-out accuracy", curve(run, "eval_accuracy")),
              ("entropy, nats per token", curve(run, "entropy"))]
    curves = "".join(curve_svg(points, title, smin, smax) for title, points in series)
    cfg = run["config"]
    about = (f"{cfg.get('preset', '?')} preset, loss {run['loss']}, seed {run['seed']}, "
             f"β = {cfg.get('beta', '?')}, {cfg.get('group_size', '?')} answers a group; "
             f"a group stored every {cfg.get('sample_every', '?')} steps, {len(records)} in all")
    fill = {"TITLE": html.escape(f"{data['run']}: which tokens each loss trusts"),
            "ABOUT": html.escape(about), "CURVES": curves, "DATA": script_json(data)}
    return re.sub(r"%(TITLE|ABOUT|CURVES|DATA)%", lambda m: fill[m.group(1)], VIEWER_HTML)   # one pass


def write_pages(runs, out):
    """OUT/pages/<run>.html for each run that stored groups (two runs of one name, from two
    settings: <setting>-<run>.html); the paths written."""
    pages, names = {}, [run["dir"].name for run in runs]
    for run in runs:                             # every page made (every log checked) before one is written
        name = run["dir"].name
        name = name if names.count(name) == 1 else f"{run['dir'].parent.name}-{name}"
        samples = run["dir"] / "samples.jsonl"
        records = [checked_group(record, f"{samples}, line {line}")
                   for line, record in (read_jsonl(samples, numbered=True) if samples.exists() else [])]
        if not records:
            print(f"warning: {run['dir']} stored no groups (samples.jsonl): no page", file=sys.stderr)
            continue
        pages[out / "pages" / f"{name}.html"] = viewer_page(run, records)
    for path, page in pages.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(page, encoding="utf-8", errors="backslashreplace", newline="\n")  # a lone \udcff
    return list(pages)


# ----------------------------------------------------------------------------------------
# The token viewer's page: plain HTML, CSS and JS, filled in by viewer_page() (its data as JSON).

VIEWER_HTML = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>%TITLE%</title>
<style>
body { font: 14px/1.45 system-ui, sans-serif; margin: 0 auto; max-width: 1180px; padding: 0 16px 40px;
       color: #222; background: #fff; }
h1 { font-size: 19px; margin: 14px 0 2px; } .about { color: #666; margin: 0 0 8px; }
.curves { display: flex; gap: 14px; flex-wrap: wrap; }
.curve { background: #fafafa; border: 1px solid #e3e3e3; border-radius: 4px; cursor: pointer; }
.ctitle { font-size: 11px; fill: #444; } .cval { font-size: 10px; fill: #777; }
.cline { fill: none; stroke: #4c72b0; stroke-width: 1.6; } .now { stroke: #c44e52; stroke-width: 1.5; }
.bar { position: sticky; top: 0; background: #fff; border-bottom: 1px solid #ddd; padding: 8px 0 6px;
       z-index: 1; }
.row { display: flex; align-items: center; gap: 8px; flex-wrap: wrap; margin: 3px 0; }
#slider { flex: 1; min-width: 200px; } #steplabel { min-width: 120px; font-weight: 600; }
.modes button { border: 1px solid #bbb; background: #f6f6f6; padding: 3px 9px; border-radius: 13px;
                cursor: pointer; font: inherit; font-size: 13px; }
.modes button.on { background: #333; color: #fff; border-color: #333; }
.legend { display: flex; align-items: center; gap: 10px; font-size: 12.5px; color: #444; }
.ramp { position: relative; width: 260px; height: 12px; border: 1px solid #999; flex: none; }
.ticks { position: relative; width: 260px; height: 14px; font-size: 11px; color: #555; flex: none; }
.ticks span { position: absolute; transform: translateX(-50%); white-space: nowrap; }
#info { font: 12.5px/1.4 ui-monospace, monospace; background: #f4f6fa; border-radius: 4px;
        padding: 4px 8px; min-height: 2.8em; white-space: pre-wrap; }
#summary { color: #333; margin: 8px 0 4px; } #about { margin-left: 8px; }
pre.prompt { background: #f7f7f7; border: 1px solid #e5e5e5; padding: 6px 8px; white-space: pre-wrap;
             font-size: 12px; margin: 4px 0 10px; }
.answer { border-left: 5px solid #bbb; padding: 2px 0 6px 10px; margin: 8px 0 12px; }
.answer.up { border-color: #2a9d5c; } .answer.down { border-color: #c44e52; }
.head { font-size: 12.5px; color: #444; margin-bottom: 3px; } .head strong { color: #111; }
.tokens { font: 13.5px/1.95 ui-monospace, "DejaVu Sans Mono", monospace; }
.tok { padding: 1px 1px; margin: 0 1px 0 0; border-radius: 2px; white-space: pre; cursor: default; }
.tok:hover, .tok.pinned { outline: 2px solid #111; }
.ws { opacity: 0.45; }
#script-error { background: #c00; color: #fff; padding: 8px; }
</style></head>
<body>
<h1>%TITLE%</h1>
<p class="about">%ABOUT%. Hover over a token (or click it) for its numbers; ← → change the step.</p>
<div class="curves">%CURVES%</div>
<div class="bar">
  <div class="row"><button id="prev">◀</button><input id="slider" type="range" min="0" value="0">
    <button id="next">▶</button><span id="steplabel"></span></div>
  <div class="row modes" id="modes"><span>colour by:</span></div>
  <div class="row legend"><div><div class="ramp" id="ramp"></div><div class="ticks" id="ticks"></div></div>
    <span id="about"></span></div>
  <div id="info"></div>
</div>
<div id="summary"></div>
<details open><summary>the prompt</summary><pre class="prompt" id="prompt"></pre></details>
<div id="answers"></div>
<script type="application/json" id="data">%DATA%</script>
<script>
"use strict";
window.onerror = function (message) {          // a failure is shown, and the browser test sees it
  const box = document.createElement("pre");
  box.id = "script-error";
  box.textContent = "script error: " + message;
  document.body.insertBefore(box, document.body.firstChild);
};
const DATA = JSON.parse(document.getElementById("data").textContent);
const MODE = Object.create(null);              // no prototype: "constructor" is no mode
DATA.modes.forEach(function (m) { MODE[m.key] = m; });
const LOSS_NAMES = {grpo: "GRPO", tr_grpo: "TR-GRPO", cw_grpo: "CW-GRPO", tepo: "TEPO"};
const state = {group: 0, mode: DATA.loss in MODE ? DATA.loss : "grpo", pinned: null};
const $ = function (id) { return document.getElementById(id); };

function fmt(x) { return x === null || x === undefined ? "–" : String(x); }
function value(row, j, mode) {                  // the number a token is coloured by
  if (mode === "entropy") return row.entropy[j];
  if (mode === "prob") return row.logp[j] === null ? null : Math.exp(row.logp[j]);
  if (mode === "kl") return row.kl[j];
  return row.w[mode][j];
}
function hex(c) { return [1, 3, 5].map(function (i) { return parseInt(c.substr(i, 2), 16); }); }
function colour(mode, x) {                      // piecewise linear over the mode's domain and stops
  const m = MODE[mode], d = m.domain, s = m.stops;
  if (x === null) return [255, 255, 255];
  let t;
  if (d.length === 3) t = x <= d[1] ? 0.5 * (x - d[0]) / (d[1] - d[0])
                                     : 0.5 + 0.5 * (x - d[1]) / (d[2] - d[1]);
  else t = (x - d[0]) / (d[1] - d[0]);
  t = Math.min(1, Math.max(0, t)) * (s.length - 1);
  const k = Math.min(Math.floor(t), s.length - 2), f = t - k, a = hex(s[k]), b = hex(s[k + 1]);
  return a.map(function (v, i) { return Math.round(v + f * (b[i] - v)); });
}
function paint(span, rgb) {
  span.style.background = "rgb(" + rgb.join(",") + ")";
  const light = 0.299 * rgb[0] + 0.587 * rgb[1] + 0.114 * rgb[2] > 140;
  span.style.color = light ? "#111" : "#fff";
}
function shown(token) {                         // whitespace made visible: [text, is whitespace]
  if (token === "") return [["∅", true]];
  const parts = [];
  for (const ch of token) {
    const mark = {" ": "·", "\\n": "⏎", "\\t": "⇥", "\\r": "␍"}[ch];
    const text = mark || ch, ws = Boolean(mark), last = parts[parts.length - 1];
    if (last && last[1] === ws) last[0] += text; else parts.push([text, ws]);
  }
  return parts;
}
function details(g, i, j) {                     // a token's exact numbers, as the page holds them
  const row = g.rows[i], lp = row.logp[j], h = row.entropy[j];
  const p = lp === null ? null : Number(Math.exp(lp).toPrecision(4));
  const sum = lp === null || h === null ? null : Number((lp + h).toPrecision(4));
  const w = Object.keys(LOSS_NAMES).map(function (k) {
    return LOSS_NAMES[k] + " " + fmt(row.w[k][j]); });
  return JSON.stringify(row.tokens[j]) + "   answer " + (i + 1) + ", token " + (j + 1) + " of " +
    row.tokens.length + "   A = " + fmt(row.adv) + "\\nlog p = " + fmt(lp) + "   p = " + fmt(p) +
    "   entropy H = " + fmt(h) + " nats   log p + H = " + fmt(sum) + "\\nweights: " + w.join(" · ") +
    "   TEPO's KL mask: " + (row.kl[j] ? "yes" : "no");
}
function mean(xs) { xs = xs.filter(function (x) { return x !== null; });
  return xs.length ? xs.reduce(function (a, b) { return a + b; }, 0) / xs.length : null; }
function stat(row, mode) {                      // what an answer's header says for the colouring
  const n = row.tokens.length;
  if (mode === "kl") { const k = row.kl.reduce(function (a, b) { return a + b; }, 0);
    return "KL mask on " + k + " of " + n + " tokens"; }
  const xs = row.tokens.map(function (_, j) { return value(row, j, mode); }), m = mean(xs);
  return "mean " + MODE[mode].label + " " + (m === null ? "–" : m.toFixed(3));
}
function legend() {
  const m = MODE[state.mode], ramp = $("ramp"), ticks = $("ticks");
  ticks.textContent = "";
  if (state.mode === "kl") {
    ramp.style.background = "linear-gradient(to right, " + m.stops[0] + " 50%, " + m.stops[1] + " 50%)";
    [["not masked", 25], ["masked", 75]].forEach(function (t) { tick(ticks, t[0], t[1]); });
  } else {
    ramp.style.background = "linear-gradient(to right, " + m.stops.join(", ") + ")";
    const d = m.domain, at = d.length === 3 ? [0, 50, 100] : [0, 100];
    d.forEach(function (v, k) {
      const text = d.length === 3 && k === 1 ? "1 = GRPO's"
                 : state.mode === "entropy" && k === 1 ? "≥ " + v : v;
      tick(ticks, text, at[k]); });
  }
  let about = m.about;
  if (state.mode === "kl" && !DATA.beta) about += " This run has β = 0: the mask multiplies nothing.";
  $("about").textContent = about;
}
function tick(parent, text, percent) {
  const t = document.createElement("span");
  t.textContent = text;
  t.style.left = percent + "%";
  parent.appendChild(t);
}
function summary(g) {
  const all = [];                               // [row, j] of every token of the group
  g.rows.forEach(function (r) { r.tokens.forEach(function (_, j) { all.push([r, j]); }); });
  const right = g.rows.filter(function (r) { return r.reward >= 1; }).length;
  const masked = all.filter(function (t) { return t[0].kl[t[1]]; }).length;
  const h = mean(all.map(function (t) { return t[0].entropy[t[1]]; }));
  const ws = Object.keys(LOSS_NAMES).map(function (k) {
    const xs = all.map(function (t) { return t[0].w[k][t[1]]; }).filter(function (x) { return x !== null; });
    if (!xs.length) return LOSS_NAMES[k] + " –";
    return LOSS_NAMES[k] + " " + mean(xs).toFixed(3) + " (" + Math.min.apply(null, xs) + "–" +
      Math.max.apply(null, xs) + ")";
  });
  return "Step " + g.step + ": " + g.rows.length + " answers, " + right + " right (reward ≥ 1), " +
    all.length + " tokens, mean entropy " + (h === null ? "–" : h.toFixed(3)) +
    " nats; TEPO's KL mask on " +
    masked + " (" + (all.length ? (100 * masked / all.length).toFixed(1) : "0") + "%). " +
    "Mean weight (min–max): " + ws.join(", ") + "." + (g.rows.every(function (r) { return r.adv === 0; }) ?
    " Every reward is equal, so every advantage is 0: no loss pushes any token at this step." : "");
}
function render() {
  const g = DATA.groups[state.group];
  $("slider").value = state.group;
  $("steplabel").textContent = "step " + g.step + "  (" + (state.group + 1) + " of " +
    DATA.groups.length + ")";
  $("prompt").textContent = g.prompt;
  $("summary").textContent = summary(g);
  const answers = $("answers");
  answers.textContent = "";
  g.rows.forEach(function (row, i) {
    const box = document.createElement("div");
    box.className = "answer" + (row.adv > 0 ? " up" : row.adv < 0 ? " down" : "");
    const head = document.createElement("div");
    head.className = "head";
    const name = document.createElement("strong");
    name.textContent = "answer " + (i + 1);
    head.appendChild(name);
    head.appendChild(document.createTextNode("   reward " + fmt(row.reward) + "   advantage " +
      (row.adv > 0 ? "+" : "") + fmt(row.adv) + "   " + row.tokens.length + " tokens   "));
    const st = document.createElement("span");
    st.className = "stat";
    head.appendChild(st);
    box.appendChild(head);
    const line = document.createElement("div");
    line.className = "tokens";
    row.tokens.forEach(function (token, j) {
      const span = document.createElement("span");
      span.className = "tok";
      span.dataset.i = i;
      span.dataset.j = j;
      shown(token).forEach(function (part) {
        if (!part[1]) { span.appendChild(document.createTextNode(part[0])); return; }
        const ws = document.createElement("span");
        ws.className = "ws";
        ws.textContent = part[0];
        span.appendChild(ws);
      });
      line.appendChild(span);
      for (const ch of token) if (ch === "\\n") line.appendChild(document.createElement("br"));
    });
    box.appendChild(line);
    answers.appendChild(box);
  });
  recolour();
  document.querySelectorAll(".curve").forEach(function (svg) {
    const d = svg.dataset, w = svg.viewBox.baseVal.width - d.left - d.right;
    const x = Number(d.left) + w * (g.step - d.smin) / Math.max(d.smax - d.smin, 1);
    svg.querySelector(".now").setAttribute("x1", x);
    svg.querySelector(".now").setAttribute("x2", x);
  });
  show(state.pinned);
  document.body.dataset.step = g.step;
}
function recolour() {
  const g = DATA.groups[state.group];
  document.querySelectorAll("#answers .tok").forEach(function (span) {
    const row = g.rows[span.dataset.i], j = Number(span.dataset.j);
    paint(span, colour(state.mode, value(row, j, state.mode)));
    span.title = details(g, Number(span.dataset.i), j);
    const pin = state.pinned;
    span.classList.toggle("pinned", pin !== null && pin[0] === Number(span.dataset.i) && pin[1] === j);
  });
  document.querySelectorAll("#answers .stat").forEach(function (st, i) {
    st.textContent = stat(g.rows[i], state.mode); });
  document.querySelectorAll("#modes button").forEach(function (b) {
    b.classList.toggle("on", b.dataset.mode === state.mode); });
  legend();
}
function show(at) {
  const g = DATA.groups[state.group];
  const ok = at && g.rows[at[0]] && at[1] < g.rows[at[0]].tokens.length;
  $("info").textContent = ok ? details(g, at[0], at[1]) : "Hover over a token (or click it to pin it) " +
    "to see its log-prob, entropy, each loss's weight and TEPO's KL mask.";
}
function go(k) {
  state.group = Math.min(DATA.groups.length - 1, Math.max(0, k));
  state.pinned = null;
  render();
  save();
}
function save() {                               // the view in the address: a link shows the same
  const pin = state.pinned ? "&token=" + (state.pinned[0] + 1) + "." + (state.pinned[1] + 1) : "";
  history.replaceState(null, "", "#step=" + DATA.groups[state.group].step + "&colour=" + state.mode + pin);
}
function load() {                               // #step=200&colour=kl&token=3.5 picks what is shown
  const q = {};
  location.hash.slice(1).split("&").forEach(function (kv) { const p = kv.split("="); q[p[0]] = p[1]; });
  const k = DATA.groups.findIndex(function (g) { return String(g.step) === q.step; });
  if (k >= 0) state.group = k;
  if (q.colour in MODE) state.mode = q.colour;
  if (q.token) { const t = q.token.split("."); state.pinned = [Number(t[0]) - 1, Number(t[1]) - 1]; }
}

DATA.modes.forEach(function (m) {
  const b = document.createElement("button");
  b.textContent = m.label;
  b.dataset.mode = m.key;
  b.onclick = function () { state.mode = m.key; recolour(); save(); };
  $("modes").appendChild(b);
});
$("slider").max = DATA.groups.length - 1;
$("slider").oninput = function () { go(Number(this.value)); };
$("prev").onclick = function () { go(state.group - 1); };
$("next").onclick = function () { go(state.group + 1); };
document.addEventListener("keydown", function (e) {
  if (e.target.tagName === "INPUT" && e.target.type !== "range") return;
  if (e.key !== "ArrowLeft" && e.key !== "ArrowRight") return;
  e.preventDefault();
  go(state.group + (e.key === "ArrowRight" ? 1 : -1));
});
$("answers").addEventListener("mouseover", function (e) {
  const t = e.target.closest(".tok");
  if (t) show([Number(t.dataset.i), Number(t.dataset.j)]);
});
$("answers").addEventListener("mouseleave", function () { show(state.pinned); });
$("answers").addEventListener("click", function (e) {
  const t = e.target.closest(".tok");
  if (!t) return;
  const at = [Number(t.dataset.i), Number(t.dataset.j)];
  state.pinned = state.pinned && state.pinned[0] === at[0] && state.pinned[1] === at[1] ? null : at;
  recolour();
  show(state.pinned);
  save();
});
document.querySelectorAll(".curve").forEach(function (svg) {   // a click on a curve: the nearest stored step
  svg.addEventListener("click", function (e) {
    const d = svg.dataset, box = svg.getBoundingClientRect(), w = box.width - d.left - d.right;
    const step = Number(d.smin) + (e.clientX - box.left - d.left) / w * (d.smax - d.smin);
    let best = 0;
    DATA.groups.forEach(function (g, k) {
      if (Math.abs(g.step - step) < Math.abs(DATA.groups[best].step - step)) best = k; });
    go(best);
  });
});
load();
render();
</script>
</body></html>
"""
