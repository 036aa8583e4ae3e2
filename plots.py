"""plots.py — figures from the runs' plain JSONL logs (no training, works on partial logs).

    python plots.py runs/compare/*-s* --out runs/compare/figures --table
    python plots.py RUN_DIR --html          # only the token viewer: OUT/pages/<run>.html

writes entropy.png, grad_norm.png, reward.png, eval_accuracy.png and summary.png (the four in
one): each seed thin, the mean over seeds bold with its 95% band (the gradient-norm panel on a
log axis when one step is over 10x the median); families.png where a loss ran beside its controls
(a column per such loss: its arms and the arm each is compared with); and token_weights.png (which
tokens each loss trusts, on one stored group). --table writes results.md (experiments/tables.py:
means with intervals over seeds, each arm against GRPO); --html the token viewer (experiments/viewer.py).
"""
import argparse
import json
import math
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

from experiments import stats  # noqa: E402
from losses import LOSSES  # noqa: E402

COLORS = {"grpo": "#4C72B0", "tr_grpo": "#DD8452", "cw_grpo": "#55A868", "tepo": "#C44E52"}
ORDER = list(LOSSES)
PANELS = {   # metric -> (title, short name, y label)
    "entropy": ("Policy entropy — a collapse means exploration dies", "entropy", "nats per token"),
    "grad_norm": ("Gradient norm before clipping — spikes mean unstable updates",
                  "grad norm before clipping", "L2 norm"),
    "reward": ("Mean reward of the sampled answers", "reward", "reward (1 = right, +0.1 format)"),
    "eval_accuracy": ("Held-out accuracy, greedy decoding", "held-out accuracy", "fraction correct"),
}


# ----------------------------------------------------------------------------------------
# Reading runs

def read_jsonl(path, numbered=False):
    """Records of a JSONL file, each a JSON object with a whole-number "step" (else an error naming
    the line); a half-written last line (run in progress) is skipped. numbered: (line, record) pairs."""
    records, lines = [], Path(path).read_bytes().splitlines()
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except (json.JSONDecodeError, UnicodeDecodeError):       # a cut-off last line may end mid-character
            if i == len(lines) - 1:
                print(f"warning: {path}: skipping an incomplete last line (run still writing?)",
                      file=sys.stderr)
                continue
            raise SystemExit(f"error: {path}, line {i + 1}: not valid JSON (in UTF-8)")
        if not isinstance(record, dict):
            raise SystemExit(f"error: {path}, line {i + 1}: not a JSON object")
        step = record.get("step")
        if type(step) is not int or not 0 <= step < 2 ** 53:     # a string step once reached the page
            raise SystemExit(f"error: {path}, line {i + 1}: 'step' is {step!r:.40}, not a whole number "
                             "from 0")
        records.append((i + 1, record) if numbered else record)
    return records


def read_run(run_dir):
    run_dir = Path(run_dir)
    metrics = run_dir / "metrics.jsonl"
    if not metrics.exists():
        raise SystemExit(f"error: {run_dir} has no metrics.jsonl (is it a run directory of train.py?)")
    cfg_path = run_dir / "config.json"
    try:
        cfg = json.loads(cfg_path.read_text(encoding="utf-8")) if cfg_path.exists() else {}
    except (ValueError, UnicodeDecodeError):
        cfg = None
    if not isinstance(cfg, dict):
        raise SystemExit(f"error: {cfg_path} is not a JSON object (cut off or damaged); train.py wrote it")
    cfg = {RENAMED.get(k, k): v for k, v in cfg.items()}
    records = read_jsonl(metrics)
    for r in records:
        for k in PANELS:
            if k in r and (isinstance(r[k], bool) or not isinstance(r[k], (int, float))):
                raise SystemExit(f"error: {metrics}, step {r['step']}: '{k}' is {r[k]!r:.40}, not a number")
        if "grad_norm" in r and not math.isfinite(r["grad_norm"]):   # a step fp16's scaler skipped
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
    title, _, ylabel = PANELS[key]
    raw, drawn, others = [], [], defaultdict(int)
    for loss, group in by_loss(runs):
        color = COLORS.get(group[0]["loss"], "gray")
        control = variant(group[0]) != group[0]["loss"] or (loss != group[0]["loss"]
                                                            and group[0]["config"].get("beta") == 0)
        style = "-"                 # the loss solid; a control or another reading of it (the KL-free
        if control:                 # run among others) dashed, a second one dotted, a third dash-dot
            style = ["--", ":", "-."][others[group[0]["loss"]] % 3]
            others[group[0]["loss"]] += 1
        series = []
        for r in group:
            rows = r["eval"] if key == "eval_accuracy" else r["train"]
            steps = [x["step"] for x in rows if key in x]
            values = [x[key] for x in rows if key in x]
            if not values:
                continue
            raw += values
            if key == "eval_accuracy":
                ax.plot(steps, values, color=color, alpha=0.25, marker="o", markersize=3, linewidth=0.8)
            else:
                ax.plot(steps, values, color=color, alpha=0.3, linewidth=0.8)     # every seed, raw
                values = ema(values, smooth)
            series.append((steps, values))
        if not series:
            continue
        steps, mean, lo, hi = stats.band(series)         # the mean over seeds, its 95% interval per step
        label = f"{loss} ({len(series)} seed{'s' if len(series) > 1 else ''})"
        if key == "eval_accuracy":        # a few evaluations: the interval as a bar, each loss a bit apart
            shift = 0.012 * (max(steps) - min(steps) or 1) * (len(drawn) - 1.5)
            yerr = [[m - a if a == a else 0 for m, a in zip(mean, lo)], [b - m if b == b else 0
                                                                        for m, b in zip(mean, hi)]]
            ax.errorbar([s + shift for s in steps], mean, yerr=yerr, color=color, linewidth=2.2,
                        linestyle=style, capsize=3, label=label)
        else:
            ax.plot(steps, mean, color=color, linewidth=2.2, linestyle=style, label=label)
            ax.fill_between(steps, lo, hi, color=color, alpha=0.12, linewidth=0)
        drawn.append(loss)
    if key == "grad_norm" and spiky(moved(raw)):     # e.g. one step at 30 among steps near 0.6
        ax.set_yscale("log")                     # a ratio reads the same at every height
        ylabel += " (log scale" + ("; 0 off the axis)" if 0 in raw else ")")    # a 0 is clipped
    elif raw:                                    # the axis fits the runs; a wide band is cut at its edge
        pad = 0.05 * ((max(raw) - min(raw)) or 1)
        ax.set_ylim(min(raw) - pad, max(raw) + pad)
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
    fig.suptitle("Four token-level losses from the same start (thin: each seed, raw; bold: smoothed "
                 "mean over seeds; band: its 95% interval over seeds)", fontsize=11)
    fig.tight_layout()
    fig.savefig(out / "summary.png")
    plt.close(fig)


def families(runs):
    """[(loss, runs)] for each loss run beside a control or another reading of it: those arms
    and the arm each is compared with (GRPO for the loss, the loss for its controls), so that a
    comparison is read among three or four lines, not ten. [] where no loss has a control."""
    from experiments.tables import reference_of
    groups = dict(by_loss(runs))
    columns = []
    for loss in ORDER:
        labels = [label for label, group in groups.items() if group[0]["loss"] == loss]
        if len(labels) < 2:
            continue
        refs = {reference_of(label, groups[label], groups) for label in labels} - {None}
        first = sorted(refs, key=lambda label: (label in labels, label))     # GRPO, the loss, the rest
        column = first + [label for label in labels if label not in refs]
        columns.append((loss, [r for label in column for r in groups[label]]))
    return columns


def family_figure(columns, path, smooth):
    """families.png: a column per loss with controls (families()), a row per metric."""
    fig, axes = plt.subplots(len(PANELS), len(columns), figsize=(4.6 * len(columns), 12), dpi=100,
                             squeeze=False)
    for col, (loss, runs) in enumerate(columns):
        for row, key in enumerate(PANELS):
            short = PANELS[key][1]
            ax = axes[row][col]
            draw_metric(ax, runs, key, smooth)
            title = f"{loss} and its controls: {short}" if row == 0 else short
            ax.set_title(title, fontsize=10)
            ax.set_ylabel(ax.get_ylabel() if col == 0 else "")
            if row and ax.get_legend():             # the arms are the same down a column
                ax.get_legend().remove()
    fig.suptitle("Each loss beside its controls and other readings, and the arm each is compared with "
                 "(thin: each seed; bold: the mean over seeds; band: its 95% interval over seeds)",
                 fontsize=11)
    fig.tight_layout()
    fig.savefig(path)
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
        from experiments.viewer import write_pages
        for path in write_pages(runs, out):
            print(f"wrote {path} ({path.stat().st_size // 1024} KB)")
        return 0
    trajectory_figures(runs, out, args.smooth)
    written = [f"{k}.png" for k in PANELS] + ["summary.png"]
    if columns := families(runs):
        family_figure(columns, out / "families.png", args.smooth)
        written.append("families.png")
    first = lambda r: (r["loss"] != "grpo", r["seed"] if isinstance(r["seed"], int) else 1e9, str(r["dir"]))
    for r in sorted(runs, key=first):           # GRPO's lowest seed with stored groups, else the next
        samples = r["dir"] / "samples.jsonl"
        if samples.exists() and (records := read_jsonl(samples)):
            token_figure(pick_group(records), out / "token_weights.png",
                         tr_mean_one=bool(r["config"].get("tr_mean_one")))
            written.append("token_weights.png")
            break
    if args.table:
        from experiments.tables import results_tables
        table = results_tables(runs)
        (out / "results.md").write_text(table)
        print(table)
    print(f"wrote {', '.join(written)} to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
