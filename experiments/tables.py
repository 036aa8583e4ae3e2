"""The results tables of `plots.py --table` (written to results.md beside the figures): per loss, the
mean over seeds with a 95% interval over seeds; each variant against GRPO and each control against
the loss it controls, with the difference, its interval and a permutation p over seeds; every
run's final accuracy and dynamics; accuracy and entropy at each evaluation.

For the reader who compares runs; plots.py calls it, the statistics are experiments/stats.py's.
"""
import statistics
from collections import Counter

from experiments import stats
from plots import by_loss, largest_over_median, moved, variant


def spread(values, digits=3):
    """'mean (lo–hi)': the mean over seeds and its 95% Student t interval over seeds (stats.py);
    the mean alone for one seed, '–' for none."""
    return stats.format_mean(values, digits=digits)


def summary_table(runs, last=5):
    """A row per loss: the mean over its seeds and its 95% interval over seeds. 'At the end' means
    the mean over the last `last` steps; the gradient norm is before clipping; clip_frac,
    abs_log_ratio and kl_mask_frac are means over all steps (each step's over every update). The
    abs_log_ratio and kl_mask_frac columns appear only when some run logged them (kl_mask_frac:
    TEPO with beta > 0)."""
    mean = lambda xs: sum(xs) / len(xs)
    at_end = lambda values: mean(values[-last:])
    columns = [("entropy at the end", "entropy", at_end), ("grad norm, mean", "grad_norm", mean),
               ("grad norm, max", "grad_norm", max), ("cut off at the end", "truncated_frac", at_end),
               ("clip_frac", "clip_frac", mean), ("abs_log_ratio", "abs_log_ratio", mean),
               ("kl_mask_frac", "kl_mask_frac", mean)]          # (header, metric, reduction over steps)

    def per_run(group, key, f):
        return [f([x[key] for x in r["train"] if key in x]) for r in group
                if r["train"] and key in r["train"][0] and not masks_nothing(r, key)]

    columns = [c for c in columns if c[1] not in ("abs_log_ratio", "kl_mask_frac") or per_run(runs, *c[1:])]
    k = pass_k(runs)
    sampled = ([("pass@1 at the end", "eval_pass_at_1"), (f"pass@{k} at the end", "eval_pass_at_k")]
               if k else [])
    rows = ["| loss | seeds | held-out acc. | strict acc. | "
            + " | ".join([h for h, _ in sampled] + [c[0] for c in columns]) + " |",
            "|" + "---|" * (4 + len(sampled) + len(columns))]
    for loss, group in by_loss(runs):
        ends = [r["eval"][-1] for r in group if len(r["eval"]) > 1]
        rows.append(f"| {loss} | {len(group)} | {spread([e['eval_accuracy'] for e in ends])} "
                    f"| {spread([e['eval_strict'] for e in ends if 'eval_strict' in e])} | "
                    + "".join(spread([e[key] for e in ends if key in e]) + " | " for _, key in sampled)
                    + " | ".join(spread(per_run(group, key, f)) for _, key, f in columns) + " |")
    starts = sorted({(r["eval"][0]["eval_accuracy"], r["eval"][0].get("eval_strict"))
                     for r in runs if r["eval"]}, key=str)
    start = "; ".join(f"{a:.3f}" + (f" (strict {s:.3f})" if s is not None else "") for a, s in starts)
    if k:      # sampled, so it differs from seed to seed even at step 0: a mean over all runs
        at_0 = lambda key: spread([r["eval"][0][key] for r in runs if r["eval"] and key in r["eval"][0]])
        start += (f"; pass@1 {at_0('eval_pass_at_1')} and pass@{k} {at_0('eval_pass_at_k')} (the mean over "
                  f"all runs: sampled, so they differ from seed to seed). pass@1 and pass@{k}: at the "
                  f"sampling temperature, {k} answers to each of the first {pass_n(runs)} held-out problems")
    return ("\n".join(rows) + f"\n\nHeld-out accuracy at step 0: {start or '–'}.\n"
            + "\nMean over seeds, and in brackets its 95% interval over seeds (Student t, n − 1 degrees of "
            "freedom; one digit fewer): a run is one sample, never a step. " + t_note(runs)
            + "One seed: the mean alone.\n")


def pass_k(runs):
    """The k of pass@k the runs' evaluations logged (None where none did; an error for two)."""
    ks = {e["eval_pass_k"] for r in runs for e in r["eval"] if "eval_pass_k" in e}
    if len(ks) > 1:
        raise SystemExit(f"error: these runs logged pass@k with different k ({sorted(ks)}): table them apart")
    return next(iter(ks), None)


def pass_n(runs):
    """How many held-out problems pass@k was measured on ('32', or '16 to 32' where runs differ)."""
    ns = sorted({e["eval_pass_n"] for r in runs for e in r["eval"] if "eval_pass_n" in e})
    return str(ns[0]) if len(ns) == 1 else f"{ns[0]} to {ns[-1]}"


def seed_counts(runs):
    """The distinct numbers of seeds the arms have, ascending ([3], or [1, 2, 3] mid-way)."""
    return sorted({len(group) for _, group in by_loss(runs)})


def t_note(runs):
    """What the summary's interval means at the seed counts present: 'With 3 seeds the interval is
    4.30 standard errors wide each way and can reach past ... ' ('' where no arm has two seeds)."""
    ns = [n for n in seed_counts(runs) if n >= 2]
    if not ns:
        return ""
    widths = [f"{stats.t_quantile(0.975, n - 1):.2f}" for n in ns]
    text = f"With {ns[0]} seeds the interval is {widths[0]} standard errors wide each way"
    text += "".join(f", with {n} seeds {w}" for n, w in zip(ns[1:], widths[1:]))
    return text + "," * (len(ns) > 1) + " and can reach past what the number can take (below 0, above 1). "


def comparison_note(sizes):
    """What a comparison can show at the seed counts it compares: for each (n, m), the smallest
    two-sided permutation p (arms fully apart) and the range of Welch's t multiplier (its degrees
    of freedom lie between min(n, m) − 1 and n + m − 2, as the two spreads compare)."""
    parts = []
    for n, m in sorted({tuple(sorted(pair, reverse=True)) for pair in sizes}):
        floor = stats.permutation_p([10.0 + i for i in range(n)], [float(i) for i in range(m)])
        lo, hi = (stats.t_quantile(0.975, df) for df in (n + m - 2, min(n, m) - 1))
        parts.append(f"with {n} seeds against {m} the permutation p cannot go below {stats.format_p(floor)}, "
                     f"and Welch's t multiplier is {lo:.2f} to {hi:.2f} standard errors")
    if not parts:
        return ""
    text = "; ".join(parts)
    return text[0].upper() + text[1:] + ", so an interval can reach past what the number can take (below 0)."


def multiplicity_note(cells, resolved, level=0.05):
    """How many of a table's comparisons are resolved, against how many chance alone would give:
    each interval excludes 0 with probability 5% when the arms do not differ, so of 30 cells about
    1.5 would be bold with no difference anywhere ('' where no cell has a comparison)."""
    if not cells:
        return ""
    return (f"{resolved} of the {cells} comparisons in this table {'is' if resolved == 1 else 'are'} "
            f"resolved; if no arm differed from its reference in anything, about {cells * level:.1f} "
            f"would be by chance ({level:.0%} each), so a lone bold cell is a lead to run again, "
            "not a finding. ")


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


# ----------------------------------------------------------------------------------------
# Differences: each variant against GRPO, each control (or other reading) against its loss

COMPARED = [   # (header, the one number of a run; None where the run has not logged it)
    ("held-out acc. at the end",
     lambda r, last: r["eval"][-1]["eval_accuracy"] if len(r["eval"]) > 1 else None),
    ("entropy at the end", lambda r, last: _at_end(r, "entropy", last)),
    ("grad norm before clipping, mean", lambda r, last: _over_steps(r, "grad_norm")),
    ("pass@k at the end", lambda r, last: next((e["eval_pass_at_k"] for e in r["eval"][1:][-1:]
                                                if "eval_pass_at_k" in e), None)),
]


def _at_end(run, key, last):
    values = [x[key] for x in run["train"] if key in x]
    return sum(values[-last:]) / len(values[-last:]) if values else None


def _over_steps(run, key):
    values = [x[key] for x in run["train"] if key in x]
    return sum(values) / len(values) if values else None


def reference_of(label, group, groups):
    """The label of the arm a row is compared with: a control or another reading against its own
    loss (the same loss with no option on; a KL-free run against the loss with its KL), a variant
    against GRPO, GRPO against nothing (None)."""
    loss, beta = group[0]["loss"], group[0]["config"].get("beta")
    plain = {lab: g for lab, g in groups.items() if g[0]["loss"] == loss and variant(g[0]) == loss}
    main = max(plain, key=lambda lab: plain[lab][0]["config"].get("beta") or 0, default=None)
    if label != main:
        return main if main != label else None
    if loss == "grpo":
        return None
    grpo = {lab: g for lab, g in groups.items() if g[0]["loss"] == "grpo" and variant(g[0]) == "grpo"}
    same_beta = [lab for lab, g in grpo.items() if g[0]["config"].get("beta") == beta]
    return (same_beta or [None])[0]


def is_loss_against_grpo(label, ref, groups):
    """Whether a pair is one of the losses against GRPO (tr_grpo − grpo), not a control or another
    reading against the arm it changes (tr_grpo mean-1 w − tr_grpo, grpo β=0 − grpo β=0.04)."""
    run = groups[label][0]
    return run["loss"] != "grpo" and variant(run) == run["loss"] and groups[ref][0]["loss"] == "grpo"


def comparisons(runs, last=5, losses=None):
    """The pairs comparison_table draws, the columns it draws, and each cell's numbers:
    (pairs, headers, cells), cells[(label, ref, header)] a stats.Comparison, or None where either
    arm has fewer than two seeds with the number. losses: as in comparison_table."""
    groups = dict(by_loss(runs))
    pairs = [(label, ref) for label, group in groups.items()
             if (ref := reference_of(label, group, groups)) is not None
             and losses in (None, is_loss_against_grpo(label, ref, groups))]
    values = {label: {h: [v for r in g if (v := f(r, last)) is not None] for h, f in COMPARED}
              for label, g in groups.items()}
    headers = [h for h, _ in COMPARED if any(values[lab][h] for pair in pairs for lab in pair)]
    cells = {(label, ref, h): stats.compare(a, b) if len(a) >= 2 and len(b) >= 2 else None
             for label, ref in pairs for h in headers
             for a, b in [(values[label][h], values[ref][h])]}
    return pairs, headers, cells


def comparison_table(runs, last=5, losses=None, explain=True):
    """A row per arm against its reference (reference_of): for each number of COMPARED, the
    difference of the means over seeds (arm − reference), its 95% interval (Welch), the exact
    two-sided permutation p over seeds, and the seeds per arm that 80% power at this difference
    would need. Bold where the interval excludes 0 (resolved); '–' where either arm has fewer than
    two seeds with the number. The pass@k column appears only where runs logged it.
    losses: True, only the losses against GRPO; False, only the controls and other readings;
    None, every pair. explain: the note says what a cell holds (else it points at the table above).
    "" where there is no such pair."""
    pairs, headers, cells = comparisons(runs, last, losses)
    if not pairs:
        return ""
    groups = dict(by_loss(runs))
    counted = [c.resolved for c in cells.values() if c is not None]

    def cell(c):
        if c is None:
            return "–"
        text = stats.format_comparison(c)
        return f"**{text}**" if c.resolved else text
    rows = ["| arm − reference | seeds | " + " | ".join(headers) + " |", "|" + "---|" * (2 + len(headers))]
    sizes = [(len(groups[label]), len(groups[ref])) for label, ref in pairs
             if len(groups[label]) >= 2 and len(groups[ref]) >= 2]
    for label, ref in pairs:
        n = f"{len(groups[label])} vs {len(groups[ref])}"
        rows.append(f"| {label} − {ref} | {n} | "
                    + " | ".join(cell(cells[label, ref, h]) for h in headers) + " |")
    k = pass_k(runs)
    note = f" pass@k: k = {k}, at the sampling temperature." if k else ""
    explained = ("Each cell: the difference of the means over seeds, its 95% interval (Welch's t), the "
                 "exact two-sided permutation p over seeds, and the seeds per arm that 80% power at this "
                 "difference and spread would need. **Bold**: resolved (the interval excludes 0); otherwise "
                 "the seeds cannot tell the arms apart, which does not show them equal. " if explain else
                 "Each cell as in the table above; **bold**: resolved. ")
    return ("\n".join(rows) + "\n\n" + explained + multiplicity_note(len(counted), sum(counted))
            + comparison_note(sizes) + note + "\n")


def machine_of(run):
    """The machine a run ended on, from config.json's record (older runs have none):
    'AMD EPYC (AVX512, 2 cores)', a GPU's name, or 'not recorded'."""
    record = (run["config"].get("machine") or [None])[-1]
    return ("not recorded" if not record else record["gpu"] or
            f"{record['cpu']} ({record['cpu_capability']}, {record['cores']} cores)")


def machines(runs):
    """Which CPUs (or GPUs) the runs ran on, from the machine record config.json keeps (older runs
    have none): 'AMD EPYC (AVX512, 2 cores): 10 runs; not recorded: 12 runs'."""
    seen = Counter(machine_of(r) for r in runs)
    return "; ".join(f"{name}: {n} run{'s' * (n > 1)}" for name, n in seen.items())


def machine_check(runs, last=5):
    """Whether the comparisons' verdicts lean on the runs of a less common machine: where the runs
    ran on more than one, the cells resolved with every run against those resolved with the most
    common machine's runs alone (its arms then have fewer seeds, so a cell can also drop for want
    of them). '' where one machine ran them all."""
    kinds = Counter(machine_of(r) for r in runs)
    if len(kinds) < 2:
        return ""
    main, n = kinds.most_common(1)[0]

    def resolved(some):
        return {key for key, c in comparisons(some, last)[2].items() if c is not None and c.resolved}

    def named(keys):
        return "; ".join(f"{label} − {ref}, {header}" for label, ref, header in sorted(keys))
    every, alone = resolved(runs), resolved([r for r in runs if machine_of(r) == main])
    text = (f"With only the {n} runs on {main}, the other {len(runs) - n} left out "
            "(and their seeds with them), ")
    if every == alone:
        k = len(every)
        return text + f"the same {k} comparison{'s' * (k != 1)} {'is' if k == 1 else 'are'} resolved."
    return (text + f"{len(every & alone)} of the {len(every)} comparisons resolved with every run "
            "stay resolved"
            + (f"; no longer resolved: {named(every - alone)}" if every - alone else "")
            + (f"; resolved only then: {named(alone - every)}" if alone - every else "") + ".")


def results_tables(runs):
    """The text of results.md: the summary per loss, every run's final accuracy, every run's
    dynamics, and (runs evaluated along the way) the table at each evaluation."""
    against_grpo = comparison_table(runs, losses=True)
    controls = comparison_table(runs, losses=False, explain=not against_grpo)
    check = machine_check(runs)
    table = (summary_table(runs) + f"\nMachines: {machines(runs)}.{' ' + check if check else ''}\n"
             + ("\nEach loss against GRPO:\n\n" + against_grpo if against_grpo else "")
             + ("\nEach control and other reading against the arm it changes:\n\n" + controls
                if controls else "")
             + "\nHeld-out accuracy at the end, strict in brackets, seed by seed:\n\n"
             + per_seed_table(runs)
             + "\nRun by run (the gradient norm's smoothness: its mean step-to-step change over its mean,"
             + "\nand its largest value over its median, over the steps with a gradient):\n\n"
             + dynamics_table(runs))
    if any(len(r["eval"]) > 2 for r in runs):                 # evaluated along the way
        table += "\n" + over_time_table(runs)
    return table
