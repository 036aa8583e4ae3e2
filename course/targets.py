"""The numbers the handout gives a student to compare with, drawn from the shipped logs.

    python -m course.targets            # check docs/experiments.md against logs/ (exit 1: stale)
    python -m course.targets --write    # rewrite its sanity targets and compute table from logs/

docs/experiments.md states each experiment's sanity target and the compute each costs. Those
paragraphs are generated here: every number in them is one of
  * a value computed from a shipped run (``logs/compare-tiny``) with plots.py's reader and
    experiments/stats.py, the code that draws docs/results.md's tables (``values``);
  * a measurement quoted from the document that records it (docs/results.md, docs/performance.md,
    docs/LOG.md), read out of that document by a pattern, so a document that changes its number
    changes the target (``QUOTED``);
  * a setting of the experiment (its seed, its step count: ``SETTINGS``), checked by
    ``stray_numbers`` to be the only other numbers there.
``check`` compares docs/experiments.md with what this module writes: a number that disagrees
with its source turns tests/test_assignment.py red, and make_assignment.py refuses to write a
handout from it. course/answers.py (the answer key's model answers) quotes the same values.
"""
import argparse
import math
import re
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]                # the repo root
EXPERIMENTS = "docs/experiments.md"
TINY = "logs/compare-tiny"                                # python -m experiments.compare --seeds 0 1
NUMBER = re.compile(r"(?<![\w.-])\d+(?:,\d{3})*(?:\.\d+)?(?:e-?\d+)?")

# Measurements that ship as a sentence, not as a log: (name, document, a pattern whose groups are
# the numbers). The values are read out of the document.
QUOTED = [
    ("e4_minutes", "docs/results.md", r"CPU: (\d+) min in all, warm-up included\)"),
    ("demo_tiny_avx512", "docs/performance.md", r"\| AMD EPYC, AVX-512 and bf16 \|.*?\| "
                                                r"(0\.\d+ → 0\.\d+) \| ([\d.]+–[\d.]+) min \|"),
    ("demo_tiny_avx2", "docs/performance.md", r"\| AMD EPYC, AVX2, no bf16 \|.*?\| "
                                              r"(0\.\d+ → 0\.\d+) \| ([\d.]+–[\d.]+) min \|"),
    ("demo_tiny_xeon", "docs/performance.md", r"\| Intel Xeon, AVX-512, bf16 and AMX \|.*?\| "
                                              r"(0\.\d+ → 0\.\d+) \| ([\d.]+–[\d.]+) min \|"),
    ("dr_grpo", "docs/LOG.md", r"ends at (0\.\d+) against GRPO's (0\.\d+), mean\s+`grad_norm` (0\.\d+) "
                               r"against (0\.\d+)\."),
    ("tiny_clip", "docs/LOG.md", r"On the tiny model \(`--preset tiny\s+--steps 30`\) ε = 0\.2 clips none "
                                 r"of ([\d,]+)\."),
]
# The settings each paragraph may state besides its drawn values: seeds, steps, flags' values.
SETTINGS = {
    "1": {"10", "0"},
    "2": {"0", "150", "20", "2026-11-24"},
    "3": {"0", "1", "2", "0.2", "2026-11-24", "30"},             # a date: the LOG.md entry it quotes
    "4": {"1", "5", "0"},
    "5": {"0", "1", "2", "3", "4"},
    "compute": {"1", "2", "3", "4", "5", "10", "30", "150", "8", "14", "18", "2.5"},
}


class StaleTarget(Exception):
    """docs/experiments.md disagrees with the shipped logs (or with the document a number is from)."""


# ----------------------------------------------------------------------------------------
# The values

def quoted(root=ROOT):
    """{name: the numbers (a tuple of strings)} read out of the documents of QUOTED."""
    out = {}
    for name, doc, pattern in QUOTED:
        m = re.search(pattern, (root / doc).read_text(encoding="utf-8"))
        if not m:
            raise StaleTarget(f"{doc} no longer says what course/targets.py quotes from it ({name}: "
                              f"/{pattern}/): update QUOTED and the target")
        out[name] = m.groups()
    return out


def runs_losses(runs):
    return sorted({loss for loss, _ in runs})


def span(values, digits=2):
    """'0.39–0.48': min–max at ``digits``; one number where both ends round alike."""
    lo, hi = f"{min(values):.{digits}f}", f"{max(values):.{digits}f}"
    return lo if lo == hi else f"{lo}–{hi}"


def _runs(root):
    import plots                        # the reader docs/results.md's tables are drawn with
    runs = [plots.read_run(d) for d in sorted((root / TINY).iterdir()) if (d / "metrics.jsonl").exists()]
    if not runs:
        raise StaleTarget(f"no runs in {root / TINY}")
    return {(r["loss"], r["seed"]): r for r in runs}


def values(root=ROOT):
    """{name: text} of every number a target or a model answer quotes from the shipped logs."""
    from experiments import stats
    root = Path(root)
    runs = _runs(root)
    seeds = sorted({s for _, s in runs})

    def final(loss):                  # held-out accuracy at the last evaluation, one per seed
        return [runs[loss, s]["eval"][-1]["eval_accuracy"] for s in seeds]

    def steps(r, key):                # a metric over a run's steps
        return [x[key] for x in r["train"] if key in x]

    def at_end(loss):                 # entropy at the end: the mean of the last 5 steps, one per seed
        return [statistics.fmean(steps(runs[loss, s], "entropy")[-5:]) for s in seeds]
    three = ("grpo", "tr_grpo", "tepo")
    grpo0 = runs["grpo", 0]
    mask_fracs = [m for s in seeds for m in steps(runs["tepo", s], "kl_mask_frac")]
    q = quoted(root)
    medians = [statistics.median(steps(r, "step_time")) for r in runs.values()]
    out = {
        "seeds": " and ".join(map(str, seeds)),
        # experiment 2: the GRPO arm is compare-tiny's grpo-s0 (the same preset and seed)
        "e2_grad_norm": f"{statistics.fmean(steps(grpo0, 'grad_norm')):.2f}",
        "e2_heldout": f"{grpo0['eval'][-1]['eval_accuracy']:.3f}",
        "e2_len": f"{statistics.fmean(steps(grpo0, 'completion_len')):.1f}",
        "e2_steps": str(grpo0["eval"][-1]["step"]),
        "dr_acc": q["dr_grpo"][0], "dr_grpo_acc": q["dr_grpo"][1],
        "dr_norm": q["dr_grpo"][2], "dr_grpo_norm": q["dr_grpo"][3],
        "dr_ratio": f"{float(q['dr_grpo'][2]) / float(q['dr_grpo'][3]):.2f}",
        "e3_sequences": q["tiny_clip"][0],
        # experiment 4
        "e4_heldout": span([a for loss in three for a in final(loss)]),
        "e4_entropy_start": span([steps(r, "entropy")[0] for r in runs.values()]),
        "e4_entropy_end": span([e for loss in three for e in at_end(loss)]),
        "e4_cw_heldout": span(final("cw_grpo")),
        "e4_cw_entropy_end": span(at_end("cw_grpo")),
        "e4_start": span([r["eval"][0]["eval_accuracy"] for r in runs.values()], 3),
        "e4_mask": f"{statistics.fmean(mask_fracs):.0%}",
        "e4_len": (f"{statistics.fmean(steps(grpo0, 'completion_len')[:1]):.0f} → "
                   f"{statistics.fmean(steps(grpo0, 'completion_len')[-5:]):.0f}"),
        "e4_cut": (f"{steps(grpo0, 'truncated_frac')[0]:.0%} → "
                   f"{statistics.fmean(steps(grpo0, 'truncated_frac')[-5:]):.0%}"),
        "e4_entropy_by_loss": "; ".join(f"{loss} " + " / ".join(f"{e:.3f}" for e in at_end(loss))
                                        for loss in ("grpo", "tr_grpo", "cw_grpo", "tepo")),
        "e4_cw_lead": f"{min(at_end('cw_grpo')) - max(e for loss in three for e in at_end(loss)):.2f}",
        "e4_seed_gap": f"{max(max(at_end(loss)) - min(at_end(loss)) for loss in runs_losses(runs)):.2f}",
        "e4_gaps": span([abs(statistics.fmean(at_end(a)) - statistics.fmean(at_end(b)))
                         for a in three for b in three if a < b]),
        # experiment 5: TEPO against GRPO over the shipped seeds, with experiments/stats.py
        "e5_grpo": " and ".join(f"{a:.3f}" for a in final("grpo")),
        "e5_tepo": " and ".join(f"{a:.3f}" for a in final("tepo")),
        "e5_heldout": stats.format_comparison(stats.compare(final("tepo"), final("grpo"))),
        "e5_entropy": stats.format_comparison(stats.compare(at_end("tepo"), at_end("grpo"))),
        "e5_needed": str(stats.seeds_needed(final("tepo"), final("grpo"))),
        "p_min_2": f"{2 / math.comb(4, 2):.2g}",         # the observed split and its mirror, of C(4, 2)
        "p_min_4": f"{2 / math.comb(8, 4):.2g}",
        "splits_2": str(math.comb(4, 2)), "splits_4": str(math.comb(8, 4)),
        # compute: measured where a document records it, estimated from the logs' step_time otherwise
        "step_s": span(medians, 1),
        "e1_s": f"{10 * 2 * min(medians):.0f}–{10 * 2 * max(medians):.0f}",
        "e3_s": f"{30 * 2.5 * min(medians):.0f}–{30 * 2.5 * max(medians):.0f}",
        "e4_min": q["e4_minutes"][0],
        "e5_min": f"{int(q['e4_minutes'][0]) * 4 / 8:.0f}",
        "demo_avx512": q["demo_tiny_avx512"][1], "demo_avx2": q["demo_tiny_avx2"][1],
        "demo_xeon": q["demo_tiny_xeon"][1],
        "demo_acc": "{}, {} and {}".format(*(q[k][0] for k in ("demo_tiny_avx2", "demo_tiny_avx512",
                                                                 "demo_tiny_xeon"))),
    }
    ends = lambda r: [float(x) for x in r.split("–")]                   # noqa: E731
    runs_min = [ends(out["demo_avx512"])[0], ends(out["demo_avx2"])[-1]]  # a run: fastest, slowest CPU
    out["e2_min"] = f"{2 * runs_min[0]:.0f}–{2 * runs_min[1]:.0f}"
    measured = int(out["e4_min"]) + int(out["e5_min"])
    total_lo = (10 * 2 + 30 * 2.5) * min(medians) / 60 + 2 * runs_min[0] + measured
    total_hi = (10 * 2 + 30 * 2.5) * max(medians) / 60 + 2 * runs_min[1] + measured
    out["total_min"] = f"{total_lo:.0f}–{total_hi:.0f}"
    out["e5_runs"] = str(2 * int(out["e5_needed"]))
    out["e5_cost_min"] = f"{int(out['e4_min']) / 8 * 2 * int(out['e5_needed']):.0f}"
    return out


# ----------------------------------------------------------------------------------------
# The paragraphs of docs/experiments.md

TARGETS = {
    "1": ("**Sanity target:** the two `metrics.jsonl` files agree at every step in every column but "
          "the timings and memory (`*_time`, `tokens_per_s`, `*mfu`, `peak_mem_gb`), to the last digit: "
          "the equality is exact, not approximate. `clip_frac` is 0 throughout, in both."),
    "2": ("**Sanity target** (seed 0, one run each): your GRPO run is the one in "
          "[logs/compare-tiny/grpo-s0](../logs/compare-tiny/grpo-s0) (`experiments.compare` ran the same "
          "preset and seed): mean `grad_norm` {e2_grad_norm}, held-out accuracy {e2_heldout} at step "
          "{e2_steps}, mean completion length {e2_len} tokens (the tiny preset caps completions at 20 "
          "tokens, so length effects are small here). No Dr. GRPO log ships with the repo: measured "
          "once on another CPU ([LOG.md](LOG.md), 2026-11-24), Dr. GRPO ended at {dr_acc} against "
          "GRPO's {dr_grpo_acc} there, its mean `grad_norm` {dr_norm} against {dr_grpo_norm}: "
          "{dr_ratio} of GRPO's, for about the same accuracy."),
    "3": ("**Sanity target** (seed 0): update 1 has every |log s| exactly 0; in update 2 the ratios "
          "move, but little: on the tiny model ε = 0.2 clipped none of the {e3_sequences} sequences of "
          "update 2 over 30 steps ([LOG.md](LOG.md), 2026-11-24), and a smaller ε clips a larger "
          "share. No log of this benchmark ships with the repo, so no other digits are given: "
          "your table is the measurement."),
    "4": ("**Sanity target** ([docs/results.md](results.md#the-tiny-model-four-losses-two-seeds), drawn "
          "from [logs/compare-tiny](../logs/compare-tiny), seeds {seeds}): GRPO, TR-GRPO and TEPO end "
          "at {e4_heldout} held-out accuracy, from {e4_start} at step 0, with entropy rising from "
          "{e4_entropy_start} at step 1 to {e4_entropy_end} over the last 5 steps. CW-GRPO ends "
          "lower, at {e4_cw_heldout}, with the highest entropy, {e4_cw_entropy_end}."),
    "5": ("**Sanity target** (the shipped seeds {seeds}, [logs/compare-tiny](../logs/compare-tiny)): "
          "held-out accuracy at the end, TEPO {e5_tepo} against GRPO {e5_grpo}: TEPO − GRPO = "
          "{e5_heldout}; entropy at the end, {e5_entropy}. Your seeds 0 and 1 should look like "
          "these; seeds 2 and 3 are new draws. With 2 seeds per arm the permutation p cannot go "
          "below {p_min_2}, with 4 against 4 not below {p_min_4}."),
}

COMPUTE = "\n".join([
    "| experiment | what runs | 2 CPU cores | one GPU |",
    "|---|---|---|---|",
    "| 1. On policy | 2 tiny runs of 10 steps | {e1_s} s of steps, and the warm start once "
    "(**estimate**: 10 steps × 2 runs × the median step, {step_s} s, of the shipped tiny runs) "
    "| not measured: about the CPU's time (**estimate**) |",
    "| 2. Dr. GRPO | 2 tiny runs of 150 steps | {e2_min} min: `make demo-tiny`, the same run, "
    "takes {demo_avx512} min on an AVX-512 CPU and {demo_avx2} min on an AVX2 one "
    "(**measured**, [performance.md](performance.md#the-quickstarts-time-per-cpu)) | not "
    "measured: about the CPU's time (**estimate**) |",
    "| 3. The clip | 2 tiny TEPO runs of 30 steps, one with 2 updates per batch | {e3_s} s of "
    "steps (**estimate**: 2.5 runs' worth of 30 median steps) | not measured: about the CPU's "
    "time (**estimate**) |",
    "| 4. The four losses | 8 tiny runs of 150 steps, 2 at a time | {e4_min} min (**measured**, "
    "[results.md](results.md#the-tiny-model-four-losses-two-seeds), AVX2 CPU) | not measured: "
    "about the CPU's time (**estimate**) |",
    "| 5. Evidence | 4 more tiny runs of 150 steps (seeds 2 and 3 of two losses), 2 at a time | "
    "{e5_min} min (**estimate**: half of experiment 4) | not measured: about the CPU's time "
    "(**estimate**) |",
    "| all five | 18 runs: 14 of 150 steps, 2 of 30, 2 of 10 | {total_min} min | not measured: "
    "about the CPU's time (**estimate**) |",
])

def target(n, root=ROOT, drawn=None):
    """Experiment n's sanity-target paragraph, its values drawn (``drawn``: values(root), if given)."""
    return TARGETS[n].format(**(drawn or values(root)))


def compute_table(root=ROOT, drawn=None):
    return COMPUTE.format(**(drawn or values(root)))


def stray_numbers(template, settings):
    """The numbers typed into a paragraph's template (outside its ``{placeholders}``, link targets
    and code) that are not among its settings: a number a target states must be drawn."""
    text = re.sub(r"\{\w+\}", " ", template)
    text = re.sub(r"\]\([^)]*\)", "]", text)                 # link targets: paths and anchors
    text = re.sub(r"`[^`]*`", " ", text)                    # code: flags and column names
    dates = re.findall(r"\b\d{4}-\d{2}-\d{2}\b", text)    # the LOG.md entry a number is quoted from
    text = re.sub(r"\b\d{4}-\d{2}-\d{2}\b", " ", text)
    return [n for n in dates + NUMBER.findall(text) if n not in settings]


# ----------------------------------------------------------------------------------------
# Checking and writing docs/experiments.md

def sections(text):
    """{experiment number: its text} of docs/experiments.md's "## N." sections."""
    parts = re.split(r"(?m)^## (?=\d+\. )", text)
    return {p.split(".", 1)[0]: p for p in parts[1:]}


def paragraph(section):
    """The sanity-target paragraph of a section (from "**Sanity target" to the blank line)."""
    m = re.search(r"(?ms)^\*\*Sanity target.*?(?=\n\n|\Z)", section)
    return " ".join(m[0].split()) if m else None


def compute_block(text):
    m = re.search(r"(?ms)^\| experiment \| what runs .*?(?=\n\n|\Z)", text)
    return m[0] if m else None


def problems(text, root=ROOT):
    """What is stale in ``text`` (docs/experiments.md) against the logs and the documents: a list of
    messages, empty when every target is drawn from its source."""
    found, secs, drawn = [], sections(text), values(root)
    for n in TARGETS:
        if n not in secs:
            found.append(f"experiment {n}: no '## {n}.' section")
            continue
        have, want = paragraph(secs[n]), " ".join(target(n, root, drawn).split())
        if have != want:
            found.append(f"experiment {n}: its sanity target is not the one drawn from the logs.\n"
                         f"    it says:   {have}\n    the logs:  {want}")
        stray = stray_numbers(TARGETS[n], SETTINGS[n])
        if stray:
            found.append(f"experiment {n}: numbers neither drawn nor settings: {stray} (course/targets.py)")
    if compute_block(text) != compute_table(root, drawn):
        found.append("the compute table is not the one drawn from the logs and the documents:\n"
                     + compute_table(root, drawn))
    stray = stray_numbers(COMPUTE, SETTINGS["compute"])
    if stray:
        found.append(f"the compute table: numbers neither drawn nor settings: {stray}")
    return found


def check(root=ROOT):
    """Raise StaleTarget listing every stale number of docs/experiments.md."""
    found = problems((Path(root) / EXPERIMENTS).read_text(encoding="utf-8"), root)
    if found:
        raise StaleTarget("docs/experiments.md disagrees with its sources (python -m course.targets --write "
                          "rewrites it):\n" + "\n".join(found))


def rewrite(text, root=ROOT):
    """``text`` with each sanity target and the compute table replaced by the drawn ones."""
    drawn = values(root)
    for n in TARGETS:
        text = re.sub(rf"(?ms)(^## {n}\. .*?)^\*\*Sanity target.*?(?=\n\n|\Z)",
                      lambda m: m[1] + _wrap(target(n, root, drawn)), text, count=1)
    old = compute_block(text)
    text = text.replace(old, compute_table(root, drawn)) if old else text
    return text if text.endswith("\n") else text + "\n"


def _wrap(text, width=96):
    import textwrap
    return textwrap.fill(text, width=width, break_long_words=False, break_on_hyphens=False)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--write", action="store_true", help="rewrite docs/experiments.md's targets")
    args = parser.parse_args(argv)
    path = ROOT / EXPERIMENTS
    if args.write:
        path.write_text(rewrite(path.read_text(encoding="utf-8")), encoding="utf-8")
    try:
        check()
    except StaleTarget as e:
        print(e, file=sys.stderr)
        return 1
    print(f"{EXPERIMENTS}: every sanity target is drawn from {TINY} and the documents it names")
    return 0


if __name__ == "__main__":
    sys.exit(main())
