"""The one-step lab's results: a table of paired differences against GRPO, and one figure.

    python -m experiments.one_step_report logs/one-step-smol-active --out docs/figures/one-step

reads <run>/one_step.jsonl (experiments/one_step.py) and writes <out>/results.md and
<out>/one_step.png. The unit here is the batch, not the seed: every arm met the same K batches
from the same bytes, so for each batch the arm's number minus GRPO's is one paired difference,
and the table gives their mean with a 95% Student t interval over the K batches. Batches are
independent draws from one policy; the interval says how surely the *mechanism* acts at this
point of training, not how a whole run would end (that is what the seeds of compare.py are for).
"""
import argparse
import json
import sys
from pathlib import Path

from experiments import stats

# (field, header, how to read it): a difference against GRPO, or the arm's own value for a cosine
METRICS = [("grad_norm_pre_clip", "grad norm before clipping", "diff"),
           ("grad_norm_post_clip", "grad norm after clipping", "diff"),
           ("update_norm", "‖Δθ‖", "diff"),
           ("update_cos_grpo", "cos(Δθ, GRPO's)", "value"),
           ("kl", "KL(before ‖ after), batch", "diff"),
           ("entropy_change", "entropy change, batch", "diff"),
           ("held_out_entropy_change", "entropy change, held out", "diff"),
           ("push_top1pct_share", "top-1% share of the push", "diff")]


def read_records(run):
    """The lab's records: one dict per (point, batch, arm)."""
    path = Path(run) / "one_step.jsonl"
    if not path.exists():
        raise SystemExit(f"error: {path} does not exist (run python -m experiments.one_step first)")
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def paired(records, point, arm, field):
    """[(arm's value, GRPO's value)] over the batches where both logged ``field`` at ``point``."""
    by = {(r["batch"], r["arm"]): r.get(field) for r in records if r["point"] == point}
    return [(by[b, arm], by[b, "grpo"]) for b, a in sorted(by) if a == arm
            and by.get((b, "grpo")) is not None and by[b, arm] is not None]


def number(x, sign=False):
    """3 decimals, or 2 significant digits in scientific notation below 0.01 (a KL of one step is
    often 1e-4): '+0.012', '−3.4e−05'; a typographic minus."""
    text = f"{x:+.3f}" if abs(x) >= 0.01 or x == 0 else f"{x:+.1e}"
    text = text.replace("-", stats.MINUS)
    return text if sign or text[0] == stats.MINUS else text[1:]


def mean_and_interval(values, sign=False):
    """'0.651 (0.364 to 0.938)': the mean over batches and its 95% t interval; the mean alone for one."""
    m = stats.mean_ci(values)
    if m.lo is None:
        return number(m.value, sign)
    return f"{number(m.value, sign)} ({number(m.lo, sign)} to {number(m.hi, sign)})"


def cell(pairs, kind):
    """'+0.012 (+0.004 to +0.020)' for a mean paired difference and its interval over batches
    (bold where it excludes 0); for a cosine, the arm's own mean and interval. '–' without data."""
    if not pairs:
        return "–"
    if kind == "value":
        return mean_and_interval([a for a, _ in pairs])
    differences = [a - b for a, b in pairs]
    m = stats.mean_ci(differences)
    text = mean_and_interval(differences, sign=True)
    return f"**{text}**" if m.lo is not None and (m.lo > 0 or m.hi < 0) else text


def table(records):
    """results.md: per point of training, GRPO's own means, then each arm against GRPO."""
    out = []
    for point in dict.fromkeys(r["point"] for r in records):
        arms = list(dict.fromkeys(r["arm"] for r in records if r["point"] == point))
        batches = len({r["batch"] for r in records if r["point"] == point})
        mine = {f: [r[f] for r in records if r["point"] == point and r["arm"] == "grpo"
                    and r.get(f) is not None] for f, _, _ in METRICS}
        out += [f"At the {point} point, {batches} batches. GRPO's own values, the mean over batches "
                "and its 95% interval:", "",
                "| arm | " + " | ".join(h for _, h, _ in METRICS) + " |", "|---|" + "---|" * len(METRICS),
                "| grpo | " + " | ".join(mean_and_interval(mine[f]) if mine[f] else "–"
                                         for f, _, _ in METRICS) + " |", "",
                "Each arm against GRPO on the same batches (arm − GRPO, the mean over batches and its 95% "
                "interval; **bold**: it excludes 0; a cosine is the arm's own):", "",
                "| arm − grpo | " + " | ".join(h for _, h, _ in METRICS) + " |",
                "|---|" + "---|" * len(METRICS)]
        out += [f"| {arm} | " + " | ".join(cell(paired(records, point, arm, f), kind)
                                          for f, _, kind in METRICS) + " |" for arm in arms if arm != "grpo"]
        out.append("")
    return "\n".join(out)


def figure(records, path):
    """One panel per question a learner asks of an update: how large was the step (‖Δθ‖; AdamW
    makes it nearly the same for every arm), where did it point (its cosine with GRPO's), and, paired
    with GRPO on the same batch, how much further the policy moved (KL) and what it did to the
    entropy where exploration happens (held out). Each arm: the mean over batches with a 95%
    interval, a row per arm, a colour per point of training."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    panels = [("update_norm", "‖Δθ‖ of the step", False),
              ("update_cos_grpo", "cosine of the step with GRPO's", False),
              ("kl", "KL(before ‖ after), arm − GRPO", True),
              ("held_out_entropy_change", "entropy change held out, arm − GRPO", True)]
    points = list(dict.fromkeys(r["point"] for r in records))
    arms = list(dict.fromkeys(r["arm"] for r in records))
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 0.38 * len(arms) + 1.8),
                             dpi=110, sharey=True)
    for ax, (field, title, against_grpo) in zip(axes, panels):
        for k, point in enumerate(points):
            for i, arm in enumerate(arms):
                pairs = paired(records, point, arm, field)
                values = [a - b for a, b in pairs] if against_grpo else [a for a, _ in pairs]
                if not values or (against_grpo and arm == "grpo"):
                    continue
                m = stats.mean_ci(values)
                err = [[m.value - m.lo], [m.hi - m.value]] if m.lo is not None else None
                ax.errorbar(m.value, i + 0.2 * (k - (len(points) - 1) / 2), xerr=err, fmt="o", markersize=4,
                            capsize=2, color=f"C{k}", label=point if i == 1 else None)
        ax.set_title(title, fontsize=10)
        ax.grid(alpha=0.3)
        ax.ticklabel_format(axis="x", style="sci", scilimits=(-2, 3))
        if against_grpo:
            ax.axvline(0, color="gray", linewidth=0.8)
    axes[0].set_yticks(range(len(arms)), arms)
    axes[0].invert_yaxis()
    axes[0].legend(fontsize=8, frameon=False, title="point of training", title_fontsize=8)
    fig.suptitle("One update, arm by arm, on the same batches (mean over batches, 95% interval)", fontsize=11)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("run", help="the lab's output directory (with one_step.jsonl)")
    parser.add_argument("--out", default=None, help="default: <run>/figures")
    args = parser.parse_args(argv)
    records = read_records(args.run)
    out = Path(args.out or Path(args.run) / "figures")
    out.mkdir(parents=True, exist_ok=True)
    text = table(records)
    (out / "results.md").write_text(text)
    figure(records, out / "one_step.png")
    print(text)
    print(f"wrote results.md and one_step.png to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
