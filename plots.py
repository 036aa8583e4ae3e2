"""plots.py — figures from the runs' plain JSONL logs (no training, works on partial logs).

    python plots.py runs/compare/*-s* --out runs/compare/figures --table

writes entropy.png, grad_norm.png, reward.png, eval_accuracy.png, summary.png (the four in
one), token_weights.png (which tokens each loss trusts, on one stored group) and, with
--table, results.md: a table per loss over seeds, every run's final held-out accuracy, and
every run's dynamics (first and last step, KL, the gradient norm's smoothness) and, for runs
evaluated along the way, held-out accuracy at every evaluation and the entropy, the share cut
off and the completion length around it.
The gradient-norm panel goes to a log axis when one step is over 10x the median (a spike).
The README's figures and table come from the shipped logs: `make figures`.
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


def by_loss(runs):
    groups = defaultdict(list)
    for r in runs:
        groups[r["loss"]].append(r)
    return sorted(groups.items(), key=lambda kv: ORDER.index(kv[0]) if kv[0] in ORDER else 99)


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
        color = COLORS.get(loss, "gray")
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
        ax.plot(series[0][0][:n], mean, color=color, linewidth=2.2, label=label)
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

def token_weights(sample):
    """Per-token weights (and TEPO's KL mask) the four losses give a stored group,
    recomputed with losses.LOSSES on its log-probs, entropies and advantages. beta = 0: no
    reference log-probs are stored, and the weights do not depend on them."""
    logp = torch.tensor(sample["logp"], dtype=torch.float32)
    mask = torch.tensor(sample["mask"], dtype=torch.float32)
    entropy = torch.tensor(sample["entropy"], dtype=torch.float32)
    adv = torch.tensor(sample["advantages"], dtype=torch.float32)
    out = {}
    for name, fn in LOSSES.items():
        _, info = fn(logp, logp, None, adv, mask, entropy, beta=0.0)
        out[name] = (info["weights"], info.get("kl_mask", torch.zeros_like(mask)))
    return out


def show(token):
    return token.replace("\n", "⏎").replace("\t", "⇥").replace("\r", "␍") or "∅"


def token_figure(sample, path, max_chars=48):
    weights = token_weights(sample)
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
    args = parser.parse_args(argv)
    runs = [read_run(d) for d in args.runs]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    trajectory_figures(runs, out, args.smooth)
    written = [f"{k}.png" for k in PANELS] + ["summary.png"]
    first = lambda r: (r["loss"] != "grpo", r["seed"] if isinstance(r["seed"], int) else 1e9, str(r["dir"]))
    for r in sorted(runs, key=first):           # GRPO's lowest seed with stored groups, else the next
        samples = r["dir"] / "samples.jsonl"
        if samples.exists() and (records := read_jsonl(samples)):
            token_figure(pick_group(records), out / "token_weights.png")
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


if __name__ == "__main__":
    sys.exit(main())
