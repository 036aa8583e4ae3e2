"""The answer key's experiments: a model answer and a rubric for every question of docs/experiments.md.

Instructor-only (assignment.INSTRUCTOR_ONLY): make_assignment.py writes ANSWERS.md into the answer
key from it, never into the student's copy. Each question's points are its ``weight`` scaled to
``assignment.EXPERIMENT_POINTS`` (30 by default: the weights below sum to 30, so they are the
points). A model answer quotes the shipped logs through course/targets.py's values ({name}), never
a typed number: tests/test_assignment.py checks that every number typed into a template is a
setting of the experiment or a derivation the answer shows. The rubric says what earns the
points; the experiments' points are the instructor's to give (grade.py scores only the code).
"""
import re
from dataclasses import dataclass

from course import assignment, targets


@dataclass(frozen=True)
class Question:
    experiment: str          # "1" .. "5": the "## N." section of docs/experiments.md
    label: str               # "plot", "(a)", "(b)", "(c)"
    weight: float            # points out of the default 30
    rubric: str              # what earns the points
    answer: str              # the model answer; {name}: a value of targets.values()


Q = Question
QUESTIONS = (
    # 1. On policy, the ratio is 1
    Q("1", "plot", 1, "Both runs on each of the three panels (`loss`, `grad_norm`, `entropy`); the curves "
      "lie on top of each other. Half a point if a panel is missing.",
      "Three panels, two curves each, indistinguishable: the same values at every step."),
    Q("1", "(a)", 2, "1 point: old_logp is the first update's own log-probs, detached "
      "(`train.py`, `update`: `old = logp.detach()` when `old_logp is None`; `grpo_step` step 4 "
      "leaves it None on policy). 1 point: `_log_ratio` is `logp - old_logp` of the same float "
      "numbers, so exactly 0.0, and `exp(0.0)` is exactly 1.0; the gradient still flows through "
      "`logp` (ratio × ∇log p).",
      "With one update per batch the weights that score the batch are the weights that sampled it. "
      "`grpo_step` (train.py, step 4) therefore computes no separate old log-probs: it passes "
      "`old_logp=None`, and `update` uses each micro-batch's own log-probs, detached, as the old "
      "ones (`old = logp.detach() if old_logp is None else ...`). In losses.py `_log_ratio` is "
      "`(logp - old_logp) * mask`: the same float numbers subtracted, which is exactly 0.0 in IEEE "
      "arithmetic, not a small number, and `torch.exp(0.0)` is exactly 1.0. The value is 1 by "
      "construction; the gradient is not 0, because `old_logp` is detached: d ratio / d logp = "
      "ratio = 1. (`check_ratio_is_one` in engine/scoring.py compares this with a plain, "
      "separate scoring pass, which agrees only to about 1e-5 in float32: that is why the ratio "
      "must not come from a second pass.)"),
    Q("1", "(b)", 2, "1 point: log s_i = mean of exact zeros = 0, so s = 1 in value and ∂s_i,t/∂logp_t = "
      "s_i = 1, the token ratio's gradient. 1 point: with the ratio 1 inside [1 − ε, 1 + ε] both "
      "surrogates are r·A with gradient A ∇log p_t, β = 0 removes both KL terms (TEPO's masked one "
      "too), and token-mean divides both by the same token count: the same loss, the same "
      "gradient, so the same update and the same samples afterwards.",
      "TEPO: log s_i = Σ_t (logp_t − old_logp_t) m_t / Σ_t m_t = 0 exactly (a mean of exact zeros), "
      "and s_i,t = exp(sg[log s_i] + logp_t − sg[logp_t]) = exp(0) = 1 in value, with "
      "∂s_i,t/∂logp_t = s_i = 1: the same value and gradient as GRPO's token ratio "
      "r_t = exp(logp_t − sg[logp_t]). The clipped surrogate min(r A, clip(r, 1 − ε, 1 + ε) A) at "
      "r = 1 is r A (1 is inside the range), so each token contributes A_i ∇logp_t in both losses. "
      "With β = 0 the KL terms vanish: GRPO's β·k3 and TEPO's β·M·k3 are both 0 whatever the mask. "
      "Both then aggregate with token-mean: J = Σ_i,t A_i r_i,t m_i,t / Σ m. Same loss value, same "
      "gradient, so the same optimizer step; the next batch is sampled from identical weights "
      "with the same random stream, and by induction every step agrees."),
    Q("1", "(c)", 1, "Two flags, each with a correct reason (half a point each): `--updates-per-batch 2` "
      "(off policy: token ratios differ, TEPO's geometric mean and its clip differ); `--beta` > 0 "
      "(GRPO's KL on every token against TEPO's on the masked tokens); GRPO with its default "
      "`--agg seq-mean-token-mean` (each answer normalised by its own length); `--lr` or another "
      "flag only if the reason shows it changes one loss and not the other.",
      "`--updates-per-batch 2`: in the second update old_logp is the first update's, the token "
      "ratios are no longer 1 and differ token by token, while TEPO uses one ratio per sequence, "
      "their geometric mean: the surrogates, the clip and the gradients differ. `--beta 0.04`: "
      "GRPO pays β·k3 on every token, TEPO only on the tokens of its mask (A > 0 and "
      "log p + H > 0), so the KL gradients differ. (Also: dropping `--agg token-mean` from the "
      "GRPO run, whose default seq-mean-token-mean weighs each answer by 1 / its own length.)"),

    # 2. Dr. GRPO
    Q("2", "plot", 1, "Four panels (`grad_norm`, `reward`, `completion_len`, `eval_accuracy` at the "
      "evaluation steps), both runs on each.",
      "Dr. GRPO's `grad_norm` curve sits at roughly a quarter of GRPO's over the whole run; the "
      "reward, length and accuracy curves overlap within the noise of one seed."),
    Q("2", "(a)", 2, "1 point: the std factor, worked out: rewards 1 and seven 0s give a mean of 1/8 "
      "and a sample std of √(1/8) ≈ 0.354, so GRPO's advantages are Dr. GRPO's × 2.83 (+2.47 and "
      "−0.35 against +0.875 and −0.125). 1 point: the length factor, each answer's own length L_i "
      "against `max_new_tokens` = 20, about L/20 ≈ 0.7 here, and the two combined (≈ 0.25) compared "
      "with the measured ratio.",
      "In a group of 8 with one right answer (reward 1, the others 0; the format bonus aside) the "
      "mean is 1/8 = 0.125 and the sample standard deviation is √((0.875² + 7 × 0.125²) / 7) = "
      "√(1/8) ≈ 0.354. GRPO divides by it: the right answer gets +0.875 / 0.354 ≈ +2.47 and each "
      "wrong one −0.125 / 0.354 ≈ −0.35. Dr. GRPO keeps +0.875 and −0.125: |A| is smaller by "
      "1 / 0.354 ≈ 2.83. (A group with 4 of 8 right has std ≈ 0.53, a factor of 1.9: the factor "
      "depends on the group.) The aggregation: seq-mean-token-mean divides each answer's token sum "
      "by its own length L_i, then averages over the B answers (a token weighs 1 / (B L_i)); "
      "seq-mean-token-sum-norm divides every sum by B × 20 (a token weighs 1 / (B × 20)). That is a "
      "factor L_i / 20, about {e2_len} / 20 ≈ 0.7 with GRPO's mean length of {e2_len} tokens. "
      "Together ≈ 0.7 / 2.83 ≈ 0.25, against the measured {dr_norm} / {dr_grpo_norm} = "
      "{dr_ratio}."),
    Q("2", "(b)", 1, "AdamW divides by the running RMS of the gradient, so a constant factor on the "
      "gradient cancels (up to ε); the clip at 1.0 rarely acts on either. Full point only with the "
      "caveat that the factor is not constant (per group, per answer), so the direction changes "
      "a little.",
      "AdamW's step is lr × m̂ / (√v̂ + ε): multiply every gradient by c and m̂ scales by c, √v̂ "
      "by c, and the step is unchanged as long as ε is small next to √v̂. Gradient clipping at "
      "`--max-grad-norm` 1.0 does not undo this either: GRPO's norm averages {e2_grad_norm}, so "
      "neither run is clipped much. What does change is the direction: the factor is not one "
      "constant but differs per group (its std) and per answer (its length), so the two runs "
      "weigh groups and tokens differently, and their accuracies differ by about what one seed's "
      "noise gives ({dr_acc} against {dr_grpo_acc})."),
    Q("2", "(c)", 2, "1 point: groups with a small std, nearly all right or nearly all wrong (too easy "
      "or too hard), get the largest advantages per answer. 1 point: why that is a bias: the "
      "objective then weighs questions by their difficulty, not their value (Dr. GRPO's "
      "'question-level difficulty bias'); also accept the length bias of per-answer normalisation "
      "if argued.",
      "Dividing by the group's std weighs up the groups whose rewards barely vary: those where "
      "nearly every answer is right (an easy question) or nearly every answer wrong (a hard one). "
      "One right answer in eight gets +2.47 where four right in eight get about +0.94 each. The "
      "questions the model already almost always solves, or almost never, then steer the update "
      "more than the ones in the middle, which is a bias in what is optimised: the objective is "
      "no longer the expected reward but a difficulty-weighted version of it (Liu et al. 2025, "
      "the Dr. GRPO paper). The per-answer length normalisation is the second bias Dr. GRPO "
      "removes: a long wrong answer spreads its penalty over more tokens, so each is punished "
      "less, which favours long wrong answers."),

    # 3. The clip
    Q("3", "plot", 1, "`reward` and `entropy` per step of both runs, and the benchmark's printed table.",
      "The two runs' curves are close (the second update adds a little off-policy movement); the "
      "table has one block per update, with update 1 all zeros."),
    Q("3", "(a)", 1, "Update 1 is on policy: the ratio is exactly 1 (experiment 1), so |log s| is 0. "
      "`clip_frac` in `metrics.jsonl` is a token mean over every update of the step (update 1's "
      "zeros included), so at most half of the second update's share.",
      "In the first update of a batch the weights are still the sampling weights, so every token "
      "ratio is exactly 1 and log s, their mean log, is exactly 0 (experiment 1). `clip_frac` in "
      "`metrics.jsonl` is `step_metrics`' token mean over the infos of every update of the step "
      "(`valid_every_update`): with one update per batch it is 0 by construction, and with two it "
      "averages the first update's zeros with the second's share."),
    Q("3", "(b)", 2, "1 point: the shares from the student's table (at ε = 0.2 none or nearly none; more "
      "at 0.05 and 0.01). 1 point: the geometric mean averages the token log-ratios, positive "
      "and negative ones cancel and the mean of many shrinks (about 1/√L of a token's), so "
      "|log s| is far smaller than the largest token's |log r|.",
      "From the table: ε = 0.2 clips none or nearly none of the second update's sequences (none "
      "of {e3_sequences} here, [LOG.md](LOG.md)), a smaller ε a larger share. A sequence's log s "
      "is the mean of its tokens' log-ratios: the tokens whose probability rose and those whose "
      "probability fell cancel, and the mean of L roughly independent deviations is about "
      "1/√L of one of them. So single tokens can move far while the sequence's s barely leaves "
      "1: a token-level range of 0.2 applied to a geometric mean almost never bites, which is "
      "why GSPO uses ranges of 3e-4 to 4e-4 for its sequence ratio."),
    Q("3", "(c)", 2, "1 point: a change that moves the policy more between the two updates (a larger "
      "`--lr`, more `--updates-per-batch`, shorter answers to average over), with the reason. "
      "1 point: the table of that run, read correctly (whether ε = 0.2 now clips).",
      "Anything that moves the policy further within a batch: a larger learning rate (`--lr 1e-3`, "
      "ten times the preset's), more updates per batch (`--updates-per-batch 4`: the third and "
      "fourth see a policy two and three steps away), or fewer tokens per sequence to average "
      "over. The student reports the table of their run: the second update's |log s| grows, and the "
      "smaller ranges clip a share first."),

    # 4. The four losses
    Q("4", "plot", 1, "`runs/compare/figures/summary.png` as written, four panels, four losses, both seeds.",
      "The figure `experiments.compare` writes: entropy, gradient norm, reward and held-out "
      "accuracy, a line per loss with its band over the two seeds."),
    Q("4", "(a)", 2, "1 point: not exploration: the answers switch from the wordy style (`We start "
      "with ...`) to the terse one (`7+5=12` then `#### 12`), seen in `samples.jsonl`. 1 point: "
      "terse answers are digits, less predictable token by token than the words of the wordy "
      "template, so the mean entropy per token rises; shorter answers and fewer cut off go with it.",
      "No. In `samples.jsonl` the wordy answers (`We start with 7 and then add 5, ...`), which cannot "
      "finish inside 20 tokens and always score 0, give way to terse ones (`7+5=12` then `#### 12`) "
      "within the first 25 steps: GRPO's completion length goes {e4_len} tokens and the share cut "
      "off {e4_cut}. The entropy is a mean over the tokens written: the wordy template is nearly "
      "deterministic once begun (its words follow each other), while a terse answer is almost "
      "all digits, each a real choice. Entropy rises ({e4_entropy_start} → {e4_entropy_end}) "
      "because what is written changed, not because the policy explores more: the same "
      "switch raises held-out accuracy from {e4_start} to {e4_heldout}."),
    Q("4", "(b)", 2, "1 point: the ranking at the end from the figure or the logs (CW-GRPO highest, "
      "TEPO lowest, GRPO and TR-GRPO between). 1 point: against the seed gaps: only CW-GRPO's gap "
      "is larger than the two seeds of one loss differ, and even that is a lead, not a ranking "
      "(two seeds against two allow no small p, experiment 5); the others are within it.",
      "Entropy over the last 5 steps, seeds 0 / 1: {e4_entropy_by_loss}. CW-GRPO is highest, TEPO "
      "lowest, GRPO and TR-GRPO between. CW-GRPO's lowest seed is {e4_cw_lead} above the highest "
      "seed of the other three, more than any loss's two seeds differ (at most {e4_seed_gap}), so "
      "its lead holds on both seeds. That is a lead to test, not a ranking: two seeds against two "
      "cannot reach a small permutation p even when they do not overlap (experiment 5 (b) works "
      "out how small). The gaps between the means of GRPO, TR-GRPO and TEPO ({e4_gaps}) are no "
      "larger than the gap between two seeds of one loss: two seeds cannot order them."),
    Q("4", "(c)", 1, "Half a point each: TR-GRPO's weights 1–1.4 grow with the token's probability "
      "(sharper updates on confident tokens, both ways, about GRPO's entropy here); TEPO's KL only "
      "on the masked tokens leaves most tokens without a leash, and on policy its ratio is 1, so "
      "it is token-mean GRPO with less KL: entropy a little lower.",
      "TR-GRPO multiplies each token's surrogate by a weight that grows with its probability, from "
      "1 to 1.4: it pushes confident tokens harder, up for a positive advantage (lowering entropy) "
      "and down for a negative one (raising it); with both signs in every group the effects "
      "roughly cancel, and its entropy ends with GRPO's. TEPO puts the KL leash only on its mask "
      "({e4_mask} of the tokens here): the tokens whose reinforcement would lower entropy "
      "(A > 0 and log p + H > 0). The other tokens lose the KL that GRPO keeps on every token, "
      "and with one update per batch its sequence ratio is 1 (experiment 1), so TEPO here is "
      "token-mean GRPO with most of its leash removed: its entropy ends the lowest of the four, "
      "the opposite of what the mask is meant to do."),

    # 5. Evidence
    Q("5", "table", 1, "The comparison table of the 4-seed runs (`results.md` of the figures folder, "
      "row tepo − grpo), or the same numbers from `experiments.stats`.",
      "The row `tepo − grpo | 4 vs 4 | ...` of `runs/compare/figures/results.md`."),
    Q("5", "(a)", 2, "1 point: the difference with its interval and p, from 2 and from 4 seeds, read off "
      "correctly. 1 point: 'not resolved' stated as the seeds cannot tell the arms apart, not as "
      "'TEPO equals GRPO'; and the two seeds' apparent lead (TEPO above GRPO on both) is not "
      "evidence by itself.",
      "From the shipped seeds {seeds}: TEPO − GRPO = {e5_heldout} in held-out accuracy at the end. "
      "The interval contains 0: two seeds cannot tell the arms apart, although TEPO is above "
      "GRPO on both seeds ({e5_tepo} against {e5_grpo}). That does not show they are equal: the "
      "interval also holds differences in GRPO's favour, and larger ones in TEPO's. With four seeds the "
      "interval narrows (about by √2 at the same spread, and the t multiplier drops from Welch's "
      "few degrees of freedom); it is resolved only if it excludes 0, which a difference of "
      "this size at this spread usually will not at 4 seeds."),
    Q("5", "(b)", 1, "C(4, 2) = 6 relabellings for 2 against 2, the observed split and its mirror the "
      "most extreme: p ≥ 2/6 ≈ 0.33; C(8, 4) = 70 for 4 against 4: p ≥ 2/70 ≈ 0.029. So no "
      "2-seed comparison can reach p < 0.05 by this test.",
      "Splitting 4 runs into two arms of 2 can be done in {splits_2} ways; the observed split and "
      "its mirror image (the arms swapped) always give the largest |difference| when the arms "
      "are fully separated, so p ≥ 2/{splits_2} = {p_min_2}, whatever the runs. With 4 against 4 "
      "there are {splits_4} splits, so p ≥ 2/{splits_4} = {p_min_4}. The 2-against-2 "
      "comparisons of docs/results.md can therefore never be 'significant' by the permutation "
      "test: every p there is at least {p_min_2}."),
    Q("5", "(c)", 2, "1 point: the seeds per arm from `seeds_needed` (the table's '~N seeds') for the "
      "observed difference, and the compute it would cost from the compute table. 1 point: why "
      "the number is itself uncertain (the difference and the spread are estimated from few "
      "seeds; a smaller true difference needs many more seeds: n grows as 1/d²).",
      "From the shipped 2 seeds: ~{e5_needed} seeds per arm for 80% power at the observed "
      "difference and spread (the table's last figure; `experiments.stats.seeds_needed`). That is "
      "{e5_runs} runs of 150 steps; at experiment 4's {e4_min} min for 8 "
      "runs on 2 cores, about {e5_cost_min} min. The estimate is rough: both the difference and "
      "the standard deviation come from a handful of seeds (with 2 seeds the spread is one "
      "number's worth of information), and n grows as (sd / d)²: if the true difference is half "
      "the observed one, four times as many seeds. A 4-seed estimate replaces it with a better "
      "one, and the student should report theirs."),
)


def points(q):
    """A question's points: its weight scaled to assignment.EXPERIMENT_POINTS."""
    total = sum(x.weight for x in QUESTIONS)
    value = round(q.weight * assignment.EXPERIMENT_POINTS / total, 1)
    return int(value) if float(value).is_integer() else value


def experiment_points(n):
    value = round(sum(points(q) for q in QUESTIONS if q.experiment == n), 1)
    return int(value) if float(value).is_integer() else value


def cell(text):
    """Text for a markdown table cell: its pipes (|log s|) escaped."""
    return text.replace("|", "\\|")


def plural(n):
    return f"{n} point" + ("" if n == 1 else "s")


def rubric_table():
    rows = ["| experiment | question | points | what earns them |", "|---|---|---|---|"]
    rows += [f"| {q.experiment} | {q.label} | {points(q)} | {cell(q.rubric)} |" for q in QUESTIONS]
    rows.append(f"| all | | {assignment.EXPERIMENT_POINTS} | the write-up; the code's "
                f"{assignment.CODE_POINTS} are grade.py's |")
    return "\n".join(rows)


def answers_md(root=targets.ROOT):
    """ANSWERS.md, the answer key's: the split, the rubric table, a model answer per question."""
    values = targets.values(root)
    titles = {n: s.split("\n", 1)[0] for n, s in targets.sections(
        (root / targets.EXPERIMENTS).read_text(encoding="utf-8")).items()}
    out = ["# The experiments: model answers and rubric (instructor's copy only)\n",
           f"The grade is {assignment.CODE_POINTS} points of code, scored by `python -m course.grade` "
           f"(its table's points, out of the parts' total, scaled to {assignment.CODE_POINTS}), and "
           f"{assignment.EXPERIMENT_POINTS} points of experiments, which are yours to give from the "
           "write-up with the rubric below. The split is set in one place, `CODE_POINTS` and "
           "`EXPERIMENT_POINTS` in `course/assignment.py`; a question's points are its weight in "
           "`course/answers.py` scaled to the experiments' total.\n",
           "Every number a model answer quotes is drawn from the shipped logs "
           f"([`{targets.TINY}`]({targets.TINY})) or from the document that records the measurement "
           "(course/targets.py). A student's runs draw other samples: grade the reasoning and the "
           "size of the numbers, not their digits.\n",
           "## Rubric\n", rubric_table(), ""]
    for n in sorted({q.experiment for q in QUESTIONS}):
        out.append(f"## {titles.get(n, n)} ({experiment_points(n)} points)\n")
        for q in (q for q in QUESTIONS if q.experiment == n):
            out.append(f"**{q.label}** ({plural(points(q))}). {q.answer.format(**values)}\n")
            out.append(f"*Rubric:* {q.rubric}\n")
    return "\n".join(out)


# The numbers a model answer's template may type: the derivations it shows (experiment 2's group
# of 8 with one right answer, AdamW's scaling) and the settings it names. Everything else is drawn.
DERIVED = {"1", "2", "3", "4", "5", "7", "8", "0", "0.0", "1.0", "1e-5", "0.125", "0.875", "0.354", "2.83",
           "2.47", "0.35", "0.53", "1.9", "0.7", "0.25", "20", "0.94", "0.2", "1e-3", "25",
           "3e-4", "4e-4", "1.4", "2025", "150", "80", "0.04"}


def typed_numbers():
    """{(experiment, label): numbers typed into its model answer that are not in DERIVED}."""
    out = {}
    for q in QUESTIONS:
        stray = targets.stray_numbers(q.answer, DERIVED)
        if stray:
            out[q.experiment, q.label] = stray
    return out


def questions_in(text):
    """{experiment: its question labels} as docs/experiments.md asks them: (a), (b), ..."""
    return {n: sorted(set(re.findall(r"\(([a-z])\) ", s.split("**Questions.**")[1].split("**Sanity")[0])))
            for n, s in targets.sections(text).items() if "**Questions.**" in s}
