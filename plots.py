"""plots.py — figures from the runs' plain JSONL logs (no training, works on partial logs).

    python plots.py runs/compare/*-s* --out runs/compare/figures --table

writes entropy.png, grad_norm.png, reward.png, eval_accuracy.png, summary.png (the four in
one), token_weights.png (which tokens each loss trusts, on one stored group) and, with
--table, results.md: a table per loss over seeds, every run's final held-out accuracy, and
every run's dynamics (first and last step, KL, the gradient norm's smoothness) and, for runs
evaluated along the way, held-out accuracy at every evaluation and the entropy, the share cut
off and the completion length around it.
The gradient-norm panel goes to a log axis when one step is over 10x the median (a spike).

    python plots.py RUN_DIR --html

writes only the token viewer, OUT/pages/<run>.html: every stored group of the run in a browser,
each token coloured by each loss's weight, its entropy, its probability or TEPO's KL mask.
The README's figures and table come from the shipped logs: `make figures`.
"""
import argparse
import html
import json
import math
import re
import statistics
import sys
import textwrap
from collections import defaultdict
from pathlib import Path

import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402
from matplotlib.colors import TwoSlopeNorm  # noqa: E402

from losses import LOSSES  # noqa: E402

COLORS = {"grpo": "#4C72B0", "tr_grpo": "#DD8452", "cw_grpo": "#55A868", "tepo": "#C44E52"}
ORDER = list(LOSSES)
PANELS = {   # metric -> (title, y label)
    "entropy": ("Policy entropy — a collapse means exploration dies", "nats per token"),
    "grad_norm": ("Gradient norm before clipping — spikes mean unstable updates", "L2 norm"),
    "reward": ("Mean reward of the sampled answers", "reward (1 = right, +0.1 format)"),
    "eval_accuracy": ("Held-out accuracy, greedy decoding", "fraction correct"),
}


# ----------------------------------------------------------------------------------------
# Reading runs

def read_jsonl(path):
    """Records of a JSONL file; a half-written last line (run in progress) is skipped."""
    records, lines = [], Path(path).read_text(encoding="utf-8").splitlines()
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            if i == len(lines) - 1:
                print(f"warning: {path}: skipping an incomplete last line (run still writing?)",
                      file=sys.stderr)
            else:
                raise SystemExit(f"error: {path}, line {i + 1}: not valid JSON")
    return records


def read_run(run_dir):
    run_dir = Path(run_dir)
    metrics = run_dir / "metrics.jsonl"
    if not metrics.exists():
        raise SystemExit(f"error: {run_dir} has no metrics.jsonl (is it a run directory of train.py?)")
    cfg_path = run_dir / "config.json"
    cfg = json.loads(cfg_path.read_text()) if cfg_path.exists() else {}
    cfg = {RENAMED.get(k, k): v for k, v in cfg.items()}
    records = read_jsonl(metrics)
    for r in records:     # a step fp16's gradient scaler skipped (gradients overflowed): no norm of a step
        if "grad_norm" in r and not math.isfinite(r["grad_norm"]):
            del r["grad_norm"]
    return {"dir": run_dir, "loss": cfg.get("loss", run_dir.name), "seed": cfg.get("seed", "?"),
            "config": cfg, "train": [r for r in records if "loss" in r],
            "eval": [r for r in records if "eval_accuracy" in r]}


def ema(values, smooth):
    out, avg = [], None
    for v in values:
        avg = v if avg is None else smooth * avg + (1 - smooth) * v
        out.append(avg)
    return out


VARIANTS = [   # config -> what a control or another reading of docs/METHODS.md changes in its loss
    (lambda c: c.get("tr_mean_one"), " mean-1 w"), (lambda c: c.get("tr_inside_clip"), " w in clip"),
    (lambda c: c.get("tepo_full_kl_beta"), " + full KL"),
    (lambda c: c.get("tepo_token_ratio"), " token ratio"),
    (lambda c: c.get("loss") == "cw_grpo" and c.get("cw_detach") is False
     and c.get("cw_normalise") == "padded", " (authors')")]
RENAMED = {"tr_normalise": "tr_mean_one", "tepo_full_kl": "tepo_full_kl_beta"}   # config fields of older runs


def variant(run):
    """The loss, and what a control or another reading of docs/METHODS.md changes in it:
    "tr_grpo mean-1 w" for --tr-mean-one, "tepo + full KL" for --tepo-full-kl-beta, ..."""
    return run["loss"] + "".join(label for on, label in VARIANTS if on(run["config"]))


def by_loss(runs):
    """[(label, runs)] in the order of LOSSES: a row or a line per loss, or per control of a loss.
    Runs of one label with different KL coefficients are told apart by theirs ("grpo β=0")."""
    betas = defaultdict(set)
    for r in runs:
        betas[variant(r)].add(r["config"].get("beta"))
    groups = defaultdict(list)
    for r in runs:
        beta = r["config"].get("beta")
        groups[variant(r) + (f" β={beta:g}" if len(betas[variant(r)]) > 1 else "")].append(r)
    return sorted(groups.items(), key=lambda kv: (ORDER.index(kv[1][0]["loss"]) if kv[1][0]["loss"] in ORDER
                                                  else 99, kv[0]))


# ----------------------------------------------------------------------------------------
# Trajectories

def largest_over_median(values):
    """How far the largest value stands out: 1 for a flat series, 50 for one spike of 30 among
    steps near 0.6. The figure's log axis and the dynamics table's spike column both use it."""
    return max(values) / statistics.median(values)


def moved(grad_norms):
    """The gradient norms of the steps that updated the model. A step where every group's rewards
    were equal, and no KL pulled, has a gradient of exactly 0: no update, rather than a smooth one,
    so smoothness is measured without it (a run collapsed onto one answer a prompt has many)."""
    return [g for g in grad_norms if g > 0]


def spiky(values, ratio=10):
    """True when the largest value is over `ratio` times the median: on a linear axis that one
    spike would flatten every other step against zero."""
    return bool(values) and min(values) > 0 and largest_over_median(values) > ratio


def draw_metric(ax, runs, key, smooth):
    title, ylabel = PANELS[key]
    raw = []
    for loss, group in by_loss(runs):
        color = COLORS.get(group[0]["loss"], "gray")
        control = variant(group[0]) != group[0]["loss"] or (loss != group[0]["loss"]
                                                            and group[0]["config"].get("beta") == 0)
        style = "--" if control else "-"              # a control (the KL-free run among others): dashed
        series = []
        for r in group:
            rows = r["eval"] if key == "eval_accuracy" else r["train"]
            steps = [x["step"] for x in rows if key in x]
            values = [x[key] for x in rows if key in x]
            if not values:
                continue
            raw += values
            if key == "eval_accuracy":
                ax.plot(steps, values, color=color, alpha=0.35, marker="o", markersize=3, linewidth=1)
            else:
                ax.plot(steps, values, color=color, alpha=0.3, linewidth=0.8)     # every seed, raw
                values = ema(values, smooth)
            series.append((steps, values))
        if not series:
            continue
        n = min(len(s[0]) for s in series)
        mean = [sum(s[1][i] for s in series) / len(series) for i in range(n)]
        label = f"{loss} ({len(series)} seed{'s' if len(series) > 1 else ''})"
        ax.plot(series[0][0][:n], mean, color=color, linewidth=2.2, linestyle=style, label=label)
    if key == "grad_norm" and spiky(moved(raw)):     # e.g. one step at 30 among steps near 0.6
        ax.set_yscale("log")                     # a ratio reads the same at every height
        ylabel += " (log scale" + ("; 0 off the axis)" if 0 in raw else ")")    # a 0 is clipped
    ax.set_title(title, fontsize=10)
    ax.set_xlabel("training step")
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8, frameon=False)


def trajectory_figures(runs, out, smooth):
    for key in PANELS:
        fig, ax = plt.subplots(figsize=(7, 4), dpi=120)
        draw_metric(ax, runs, key, smooth)
        fig.tight_layout()
        fig.savefig(out / f"{key}.png")
        plt.close(fig)
    fig, axes = plt.subplots(2, 2, figsize=(12, 7.5), dpi=110)
    for ax, key in zip(axes.flat, ["entropy", "grad_norm", "reward", "eval_accuracy"]):
        draw_metric(ax, runs, key, smooth)
    fig.suptitle("Four token-level losses from the same start "
                 "(thin: each seed, raw; bold: smoothed mean over seeds)", fontsize=11)
    fig.tight_layout()
    fig.savefig(out / "summary.png")
    plt.close(fig)


# ----------------------------------------------------------------------------------------
# Token weights: the same stored tokens, weighted by each loss

def token_weights(sample, dtype=torch.float32, tr_mean_one=False):
    """Per-token weights (and TEPO's KL mask) the four losses give a stored group,
    recomputed with losses.LOSSES on its log-probs, entropies and advantages. beta = 0: no
    reference log-probs are stored, and the weights do not depend on them (nor on TEPO's
    --tepo-full-kl-beta control). tr_mean_one: TR-GRPO's weights as its --tr-mean-one control
    computes them (mean 1 per answer), for a page of such a run. The token viewer asks for
    float64: its rounded numbers are then the same on every CPU (float32 sums may differ in the
    last bit between vector widths); the KL mask is the same in either dtype."""
    logp = torch.tensor(sample["logp"], dtype=dtype)
    mask = torch.tensor(sample["mask"], dtype=dtype)
    entropy = torch.tensor(sample["entropy"], dtype=dtype)
    adv = torch.tensor(sample["advantages"], dtype=dtype)
    out = {}
    for name, fn in LOSSES.items():
        control = {"mean_one": True} if name == "tr_grpo" and tr_mean_one else {}
        _, info = fn(logp, logp, None, adv, mask, entropy, beta=0.0, **control)
        out[name] = (info["weights"], info.get("kl_mask", torch.zeros_like(mask)))
    return out


def show(token):
    return token.replace("\n", "⏎").replace("\t", "⇥").replace("\r", "␍") or "∅"


def token_figure(sample, path, max_chars=48, tr_mean_one=False):
    weights = token_weights(sample, tr_mean_one=tr_mean_one)
    rewards = sample["rewards"]
    best = max(range(len(rewards)), key=lambda i: rewards[i])
    worst = min(range(len(rewards)), key=lambda i: rewards[i])
    picks = sorted({best, worst})
    lines = []                                  # (loss, completion index, [(token, weight, masked)])
    for name in ORDER:
        w, m = weights[name]
        for i in picks:
            toks = [(show(t), w[i, j].item(), m[i, j].item() > 0)
                    for j, t in enumerate(sample["tokens"][i]) if sample["mask"][i][j]]
            row, width = [], 0
            for tok in toks:                    # wrap long completions
                if width + len(tok[0]) > max_chars and row:
                    lines.append((name, i, row))
                    row, width = [], 0
                row.append(tok)
                width += len(tok[0])
            lines.append((name, i, row))
    all_w = torch.cat([weights[n][0][torch.tensor(sample["mask"]) > 0] for n in ORDER])
    norm = TwoSlopeNorm(vmin=min(0.0, all_w.min().item()), vcenter=1.0, vmax=max(1.5, all_w.max().item()))
    cmap = plt.get_cmap("RdYlBu")
    fig = plt.figure(figsize=(15, 0.42 * len(lines) + 2.6), dpi=110)
    text_ax = fig.add_axes([0.01, 0.16, 0.58, 0.72])
    text_ax.set_xlim(0, max_chars + 16)
    text_ax.set_ylim(len(lines), -0.5)
    text_ax.axis("off")
    previous = None
    for y, (name, i, row) in enumerate(lines):
        if (name, i) != previous:
            label = f"{name}  A={sample['advantages'][i]:+.2f}"
            text_ax.text(0, y, label, fontsize=8.5, color=COLORS[name], va="center", fontweight="bold",
                         parse_math=False)
            previous = (name, i)
        x = 15.5
        for tok, w, masked in row:
            text_ax.text(x, y, tok, family="monospace", fontsize=9, va="center", ha="left", parse_math=False,
                         bbox=dict(boxstyle="square,pad=0.15", facecolor=cmap(norm(w)),
                                   edgecolor="black" if masked else "none", linewidth=1.4 if masked else 0))
            x += max(len(tok), 1) * 1.0
    question = sample["prompt"].strip().splitlines()
    text_ax.set_title(textwrap.shorten(" ".join(question), 110, placeholder=" …"), fontsize=9, loc="left",
                      parse_math=False)
    cax = fig.add_axes([0.05, 0.09, 0.5, 0.02])
    bar = fig.colorbar(plt.cm.ScalarMappable(norm=norm, cmap=cmap), cax=cax, orientation="horizontal")
    bar.set_label("per-token weight (1 = as in GRPO; black outline = TEPO's KL mask)", fontsize=9)
    ax = fig.add_axes([0.66, 0.15, 0.32, 0.7])
    p = torch.tensor(sample["logp"]).exp()
    valid = torch.tensor(sample["mask"]) > 0
    for name in ORDER:
        w = weights[name][0]
        label = f"{name} (always 1)" if name in ("grpo", "tepo") else name
        label += " (mean 1)" if name == "tr_grpo" and tr_mean_one else ""
        ax.scatter(p[valid], w[valid], s=10, alpha=0.6, color=COLORS[name], label=label)
    ax.set_xlabel("token probability p under the sampling policy")
    ax.set_ylabel("weight the loss gives the token")
    ax.set_title("Weight vs probability (all tokens of the group)", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, frameon=False)
    fig.suptitle(f"Which tokens each loss trusts — one sampled group, step {sample['step']} "
                 f"(best and worst answer; CW-GRPO's statistics here are this group's own)", fontsize=11)
    fig.savefig(path)
    plt.close(fig)


# ----------------------------------------------------------------------------------------
# Token viewer: one HTML page per run
#
# `python plots.py RUN_DIR --html` writes OUT/pages/<run>.html: every stored group of the run,
# each token coloured by what a loss does with it, a step slider, the run's curves on top. One
# self-contained file: the data as JSON in a <script type="application/json"> (every <, > and &
# escaped, so no token can close it), the DOM built by a little plain JS with textContent (model
# output never becomes markup), the curves inline SVG. Deterministic: the same logs give the
# same bytes (sorted keys, numbers rounded to 4 significant digits, no timestamp).

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
    parts = [f'<svg class="curve" width="{width}" height="{height}" viewBox="0 0 {width} {height}" '
             f'data-smin="{smin}" data-smax="{smax}" data-left="{left}" data-right="{right}">',
             f'<text x="{left}" y="11" class="ctitle">{html.escape(title)}</text>']
    if points:
        vmin, vmax = min(v for _, v in points), max(v for _, v in points)
        y = lambda v: top + (height - top - bottom) * (1 - (v - vmin) / ((vmax - vmin) or 1))
        line = " ".join(f"{x(s):.1f},{y(v):.1f}" for s, v in points)
        parts += [f'<polyline points="{line}" class="cline"/>',
                  f'<text x="{left}" y="{height - 2}" class="cval">{points[0][1]:.3g}</text>',
                  f'<text x="{width - right}" y="{height - 2}" class="cval" text-anchor="end">'
                  f'{points[-1][1]:.3g} at step {points[-1][0]}</text>']
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
    return {"run": run["dir"].name, "loss": run["loss"], "seed": run["seed"], "beta": cfg.get("beta"),
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
    train = lambda key: [(x["step"], x[key]) for x in run["train"] if key in x]
    series = [("mean reward of the batch", train("reward")),
              ("held-out accuracy", [(x["step"], x["eval_accuracy"]) for x in run["eval"]]),
              ("entropy, nats per token", train("entropy"))]
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
    written, names = [], [run["dir"].name for run in runs]
    for run in runs:
        name = run["dir"].name
        name = name if names.count(name) == 1 else f"{run['dir'].parent.name}-{name}"
        samples = run["dir"] / "samples.jsonl"
        records = read_jsonl(samples) if samples.exists() else []
        if not records:
            print(f"warning: {run['dir']} stored no groups (samples.jsonl): no page", file=sys.stderr)
            continue
        path = out / "pages" / f"{name}.html"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(viewer_page(run, records), encoding="utf-8", newline="\n")
        written.append(path)
    return written


# ----------------------------------------------------------------------------------------
# Table

def spread(values, digits=3):
    """'mean (min–max)' over seeds; the mean alone for one seed."""
    if not values:
        return "–"
    mean = f"{sum(values) / len(values):.{digits}f}"
    return mean if len(values) == 1 else f"{mean} ({min(values):.{digits}f}–{max(values):.{digits}f})"


def summary_table(runs, last=5):
    """A row per loss: mean and min–max over its seeds. 'At the end' means the mean over the last
    `last` steps; the gradient norm is before clipping; clip_frac, abs_log_ratio and kl_mask_frac
    are means over all steps (each step's over every update). The abs_log_ratio and kl_mask_frac
    columns appear only when some run logged them (kl_mask_frac: TEPO with beta > 0)."""
    mean = lambda xs: sum(xs) / len(xs)
    at_end = lambda values: mean(values[-last:])
    columns = [("entropy at the end", "entropy", at_end), ("grad norm, mean", "grad_norm", mean),
               ("grad norm, max", "grad_norm", max), ("truncated at the end", "truncated_frac", at_end),
               ("clip_frac", "clip_frac", mean), ("abs_log_ratio", "abs_log_ratio", mean),
               ("kl_mask_frac", "kl_mask_frac", mean)]          # (header, metric, reduction over steps)

    def per_run(group, key, f):
        return [f([x[key] for x in r["train"] if key in x]) for r in group
                if r["train"] and key in r["train"][0] and not masks_nothing(r, key)]

    columns = [c for c in columns if c[1] not in ("abs_log_ratio", "kl_mask_frac") or per_run(runs, *c[1:])]
    rows = ["| loss | seeds | held-out acc. | strict acc. | " + " | ".join(c[0] for c in columns) + " |",
            "|" + "---|" * (4 + len(columns))]
    for loss, group in by_loss(runs):
        ends = [r["eval"][-1] for r in group if len(r["eval"]) > 1]
        rows.append(f"| {loss} | {len(group)} | {spread([e['eval_accuracy'] for e in ends])} "
                    f"| {spread([e['eval_strict'] for e in ends if 'eval_strict' in e])} | "
                    + " | ".join(spread(per_run(group, key, f)) for _, key, f in columns) + " |")
    starts = sorted({(r["eval"][0]["eval_accuracy"], r["eval"][0].get("eval_strict"))
                     for r in runs if r["eval"]}, key=str)
    start = "; ".join(f"{a:.3f}" + (f" (strict {s:.3f})" if s is not None else "") for a, s in starts)
    return "\n".join(rows) + f"\n\nHeld-out accuracy at step 0: {start or '–'}.\n"


def masks_nothing(run, key):
    """kl_mask_frac of a run with beta = 0 (older logs have it): the mask multiplied nothing."""
    return key == "kl_mask_frac" and run["config"].get("beta", 1) == 0


def final_accuracy(run):
    """'0.715 (0.635)': the last held-out accuracy, strict in brackets (older logs: none)."""
    end = run["eval"][-1]
    strict = f" ({end['eval_strict']:.3f})" if "eval_strict" in end else ""
    return f"{end['eval_accuracy']:.3f}{strict}"


def per_seed_table(runs):
    """Final held-out accuracy of every run, strict accuracy in brackets: a row per loss, a column
    per seed."""
    seeds = sorted({r["seed"] for r in runs}, key=str)
    rows = ["| loss | " + " | ".join(f"seed {s}" for s in seeds) + " |", "|---|" + "---|" * len(seeds)]
    for loss, group in by_loss(runs):
        cell = {r["seed"]: final_accuracy(r) for r in group if len(r["eval"]) > 1}
        rows.append(f"| {loss} | " + " | ".join(cell.get(s, "–") for s in seeds) + " |")
    return "\n".join(rows) + "\n"


def dynamics_table(runs):
    """Run by run, how a run moved: completion length, the share cut off at the token budget and
    entropy at the first and the last step; the KL to the reference (median of the last 5 steps:
    one step can spike); the gradient norm's smoothness, which its mean hides (TR-GRPO's weights
    of 1-1.4 scale the norm up): its mean step-to-step change over its mean, and its largest
    value over its median (a spike), both over the steps that updated the model (`moved`); the
    final held-out accuracy, strict in brackets. A row per loss, its seeds separated by " / "."""
    seeds = sorted({r["seed"] for r in runs}, key=str)

    def first_last(fmt):
        return lambda v: f"{v[0]:{fmt}} → {v[-1]:{fmt}}"

    def change(g):
        return statistics.mean(abs(b - a) for a, b in zip(g, g[1:])) / statistics.mean(g)

    def smoothness(stat):    # over the steps that moved the model; "–" where fewer than two did
        return lambda g: f"{stat(m):.2f}" if len(m := moved(g)) > 1 else "–"
    columns = [   # (header, metric, its values over the steps -> the cell)
        ("completion length, first → last step", "completion_len", first_last(".0f")),
        ("cut off, first → last", "truncated_frac", first_last(".0%")),
        ("entropy, first → last", "entropy", first_last(".2f")),
        ("KL at the end", "kl", lambda v: f"{statistics.median(v[-5:]):.2f}"),
        ("grad norm, step-to-step change / mean", "grad_norm", smoothness(change)),
        ("grad norm, largest / median", "grad_norm", smoothness(largest_over_median))]

    def logged(r, key):      # at two steps or more; the KL only where there is a reference model
        beta = r["config"].get("beta", 1)
        return len(r["train"]) > 1 and key in r["train"][0] and (key != "kl" or beta != 0)
    columns = [c for c in columns if any(logged(r, c[1]) for r in runs)]    # no reference model: no KL
    header = [f"loss, seeds {' / '.join(map(str, seeds))}", *(c[0] for c in columns), "held-out (strict)"]
    rows = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for loss, group in by_loss(runs):
        of_seed = {r["seed"]: r for r in group}

        def cell(f, enough):         # one value per seed; "–" where the run has not logged it (yet)
            return " / ".join(f(of_seed[s]) if s in of_seed and enough(of_seed[s]) else "–" for s in seeds)
        cells = [cell(lambda r: f([x[key] for x in r["train"] if key in x]), lambda r: logged(r, key))
                 for _, key, f in columns]
        cells.append(cell(final_accuracy, lambda r: len(r["eval"]) > 1))
        rows.append(f"| {loss} | " + " | ".join(cells) + " |")
    return "\n".join(rows) + "\n"


AROUND = [("entropy", "Entropy", 3),     # (metric, name, digits): averaged around each evaluation
          ("truncated_frac", "Share of completions cut off at the token budget", 3),
          ("completion_len", "Completion length in tokens", 1),
          ("frac_zero_std", "Share of groups with no learning signal (every reward in the group equal)", 2)]


def over_time_table(runs, window=5):
    """For runs evaluated along the way (--eval-every): held-out accuracy at every evaluation, and
    the entropy, the share cut off, the completion length and the share of groups with no signal
    around it (the mean of the `window` training steps up to it; at step 0, the first step's),
    per loss: mean (min–max) over the seeds that got there. A column per evaluation; a metric
    no run logged gets no table."""
    steps = sorted({e["step"] for r in runs for e in r["eval"]})
    logged = [m for m in AROUND if any(m[0] in x for r in runs for x in r["train"])]
    rows = {"acc": []} | {key: [] for key, _, _ in logged}
    for loss, group in by_loss(runs):
        evals = [{e["step"]: e for e in r["eval"]} for r in group]
        at = [[by_step.get(step) for by_step in evals] for step in steps]     # [step][seed]
        acc = [spread([e["eval_accuracy"] for e in seeds if e]) for seeds in at]
        rows["acc"].append(f"| {loss} | " + " | ".join(acc) + " |")
        for key, _, digits in logged:
            cells = []
            for step, seeds in zip(steps, at):
                around = [[x[key] for x in r["train"] if step - window < x["step"] <= max(step, 1)
                           and key in x] for r, e in zip(group, seeds) if e]
                cells.append(spread([sum(v) / len(v) for v in around if v], digits))
            rows[key].append(f"| {loss} | " + " | ".join(cells) + " |")
    header = "| loss | " + " | ".join(f"step {s}" for s in steps) + " |\n|---|" + "---|" * len(steps) + "\n"
    text = "Held-out accuracy at each evaluation:\n\n" + header + "\n".join(rows["acc"]) + "\n"
    for key, name, _ in logged:
        text += (f"\n{name} around each evaluation (the mean of the {window} steps up to it;"
                 " at step 0, the first step's):\n\n" + header + "\n".join(rows[key]) + "\n")
    return text


def pick_group(records):
    """The last stored group whose rewards differ (all-equal rewards mean zero advantages,
    so every loss would give every token a zero push: nothing to see); else the last one."""
    mixed = [rec for rec in records if len(set(rec["rewards"])) > 1]
    return (mixed or records)[-1]


def main(argv=None):
    parser = argparse.ArgumentParser(description="Figures and a table from train.py run directories.")
    parser.add_argument("runs", nargs="+", help="run directories (each with metrics.jsonl)")
    parser.add_argument("--out", default="figures", help="where to write the PNGs (and results.md)")
    parser.add_argument("--smooth", type=float, default=0.8, help="EMA smoothing factor in [0, 1)")
    parser.add_argument("--table", action="store_true", help="print a markdown table and write results.md")
    parser.add_argument("--html", action="store_true",
                        help="only the token viewer: OUT/pages/<run>.html, a page per run (no figures)")
    args = parser.parse_args(argv)
    runs = [read_run(d) for d in args.runs]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.html:
        for path in write_pages(runs, out):
            print(f"wrote {path} ({path.stat().st_size // 1024} KB)")
        return 0
    trajectory_figures(runs, out, args.smooth)
    written = [f"{k}.png" for k in PANELS] + ["summary.png"]
    first = lambda r: (r["loss"] != "grpo", r["seed"] if isinstance(r["seed"], int) else 1e9, str(r["dir"]))
    for r in sorted(runs, key=first):           # GRPO's lowest seed with stored groups, else the next
        samples = r["dir"] / "samples.jsonl"
        if samples.exists() and (records := read_jsonl(samples)):
            token_figure(pick_group(records), out / "token_weights.png",
                         tr_mean_one=bool(r["config"].get("tr_mean_one")))
            written.append("token_weights.png")
            break
    if args.table:
        table = (summary_table(runs)
                 + "\nHeld-out accuracy at the end, strict in brackets, seed by seed:\n\n"
                 + per_seed_table(runs)
                 + "\nRun by run (the gradient norm's smoothness: its mean step-to-step change over its mean,"
                 + "\nand its largest value over its median, over the steps with a gradient):\n\n"
                 + dynamics_table(runs))
        if any(len(r["eval"]) > 2 for r in runs):                 # evaluated along the way
            table += "\n" + over_time_table(runs)
        (out / "results.md").write_text(table)
        print(table)
    print(f"wrote {', '.join(written)} to {out}")
    return 0


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
const MODE = {};
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


if __name__ == "__main__":
    sys.exit(main())
