"""The one-step lab's results: a table of paired differences against GRPO, and one figure.

    python -m experiments.one_step_report logs/one-step-smol-active --out docs/figures/one-step

reads <run>/one_step.jsonl (experiments/one_step.py) and writes <out>/results.md and
<out>/one_step.png. The unit here is the batch, not the seed: every arm met the same K batches
from the same bytes, so for each batch the arm's number minus GRPO's is one paired difference,
and the table gives their mean with a 95% Student t interval over the K batches. Batches are
independent draws from one policy; the interval says how surely the *mechanism* acts at this
point of training, not how a whole run would end (that is what the seeds of compare.py are for).
A second table pairs each control and reading with the loss it varies (tepo-fullkl with TEPO, ...).

Some arms are the same computation as another at a point, and the table says so instead of printing
noise: at the untouched model π = π_ref, so the KL term and its gradient are 0 (grpo-beta0 is GRPO,
tepo-fullkl is TEPO), and a first update on policy gives the sequence ratio and the token ratios
the value 1 and the same gradient (tepo-tokratio is TEPO). "0 (identical)": every paired
difference is exactly 0; "0 (to rounding)": none exceeds ROUNDING of the reference's value.
"""
import argparse
import json
import sys
from pathlib import Path

from experiments import stats
from experiments.compare import ARMS

# float32 carries about 7 significant digits, so two computations that are equal in exact arithmetic
# differ by up to ~1e-7 of their value after a step's sums (seen: 6e-8 on ‖Δθ‖); a paired difference
# no larger than this share of the reference's value is rounding, not an effect
ROUNDING = 1e-6

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


def paired(records, point, arm, field, reference="grpo"):
    """[(arm's value, the reference's value)] over the batches where both logged ``field`` at ``point``."""
    by = {(r["batch"], r["arm"]): r.get(field) for r in records if r["point"] == point}
    return [(by[b, arm], by[b, reference]) for b, a in sorted(by) if a == arm
            and by.get((b, reference)) is not None and by[b, arm] is not None]


def reference_of(arm):
    """The loss a control or reading varies (compare.ARMS), GRPO for a loss."""
    loss = ARMS[arm][0] if arm in ARMS else "grpo"
    return loss if loss != arm else "grpo"


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
    (bold where it excludes 0; '0 (identical)' or '0 (to rounding)', module docstring); for a
    cosine, the arm's own mean and interval. '–' without data."""
    if not pairs:
        return "–"
    if kind == "value":
        return mean_and_interval([a for a, _ in pairs])
    differences = [a - b for a, b in pairs]
    if all(d == 0 for d in differences):
        return "0 (identical)"
    if max(abs(d) for d in differences) <= ROUNDING * max(abs(b) for _, b in pairs):
        return "0 (to rounding)"
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
        varied = [arm for arm in arms if reference_of(arm) not in ("grpo", arm) and reference_of(arm) in arms]
        if varied:
            out += ["", "Each control or reading against the loss it varies, on the same batches (arm − that "
                    "loss; a cosine is still with GRPO's step):", "",
                    "| arm − its loss | " + " | ".join(h for _, h, _ in METRICS) + " |",
                    "|---|" + "---|" * len(METRICS)]
            out += [f"| {arm} − {reference_of(arm)} | " + " | ".join(
                cell(paired(records, point, arm, f, reference_of(arm)), kind) for f, _, kind in METRICS)
                + " |" for arm in varied]
        out.append("")
    return "\n".join(out)


def figure(records, path):
    """One panel per question a learner asks of an update, each arm paired with GRPO on the same
    batch: how much larger was its gradient (the norm before clipping, ÷ GRPO's), and how much larger
    its step (‖Δθ‖ ÷ GRPO's, on the same axis: clipping and AdamW make it ~1 for every arm); where did
    the step point (its cosine with GRPO's); how much further did the policy move (KL, arm − GRPO) and
    what did the step do to the entropy where exploration happens (held out, arm − GRPO). Each arm: the
    mean over batches with a 95% interval, a row per arm, a colour per point of training."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    panels = [("grad_norm_pre_clip", "gradient norm before clipping\n÷ GRPO's", "ratio"),
              ("update_norm", "‖Δθ‖ of the step\n÷ GRPO's", "ratio"),
              ("update_cos_grpo", "cosine of the step\nwith GRPO's", "value"),
              ("kl", "KL(before ‖ after)\narm − GRPO", "diff"),
              ("held_out_entropy_change", "entropy change, held out\narm − GRPO", "diff")]
    points = list(dict.fromkeys(r["point"] for r in records))
    arms = list(dict.fromkeys(r["arm"] for r in records))
    fig, axes = plt.subplots(1, len(panels), figsize=(3.3 * len(panels), 0.38 * len(arms) + 2.0),
                             dpi=110, sharey=True)
    for ax, (field, title, mode) in zip(axes, panels):
        for k, point in enumerate(points):
            labelled = False                           # one legend entry per point of training
            for i, arm in enumerate(arms):
                pairs = paired(records, point, arm, field)
                values = {"ratio": [a / b for a, b in pairs if b], "diff": [a - b for a, b in pairs],
                          "value": [a for a, _ in pairs]}[mode]
                if not values or (mode == "diff" and arm == "grpo"):
                    continue
                m = stats.mean_ci(values)
                err = [[m.value - m.lo], [m.hi - m.value]] if m.lo is not None else None
                ax.errorbar(m.value, i + 0.2 * (k - (len(points) - 1) / 2), xerr=err, fmt="o", markersize=4,
                            capsize=2, color=f"C{k}", label=None if labelled else point)
                labelled = True
        ax.set_title(title, fontsize=9.5)
        ax.grid(alpha=0.3)
        if mode == "diff":
            ax.ticklabel_format(axis="x", style="sci", scilimits=(-2, 3))
        ax.axvline({"ratio": 1, "diff": 0, "value": 1}[mode], color="gray", linewidth=0.8)
    axes[1].set_xlim(axes[0].get_xlim())           # the step on the gradient's scale: flat at 1
    axes[0].set_yticks(range(len(arms)), arms)
    axes[0].invert_yaxis()
    handles = {label: h for ax in axes for h, label in zip(*ax.get_legend_handles_labels())}
    axes[0].legend(handles.values(), handles.keys(), fontsize=8, frameon=False, title="point of training",
                   title_fontsize=8)
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
