"""The course kit's parts: what a student writes, where, and for how many points.

One table, read by ``make_assignment.py`` (which blanks the parts and writes HANDOUT.md)
and by ``grade.py`` (which scores them). A part's solution is marked in its source file,
inside each listed function, right after the docstring, with comment lines only:

    # BEGIN SOLUTION <part>
    ...
    # END SOLUTION

In the student's copy those lines become ``raise NotImplementedError("<part>: ...")``.
A part's graded tests are ``tests/graded/test_<part>.py``, every test marked
``@pytest.mark.part("<part>")``; they use literal inputs and their own expected values and
never call another part's function, so a part that is not written costs its own points
and nothing else (``tests/test_assignment.py`` checks this for every part).
"""
from dataclasses import dataclass


@dataclass(frozen=True)
class Part:
    name: str
    file: str
    functions: tuple        # the functions whose bodies are blanked ("Class.method" for a method)
    points: int
    goal: str               # what the student writes and what it is for, in a few sentences
    info: str = ""          # what the returned ``info`` dict must hold
    errors: str = ""        # the errors to raise, and words their messages must contain
    notes: str = ""         # what is given, what is optional, how the tests isolate the part
    optional: tuple = ()    # functions of ``functions`` that are blanked but not required (not graded)


PARTS = (
    Part("group_advantages", "losses.py", ("group_advantages",), 10,
         "Group-relative advantages: each completion's reward relative to the other completions "
         "of the same prompt, divided by the group's sample std; a group with equal rewards gets "
         "exactly 0.",
         errors="`ValueError` mentioning `>= 2` when `group_size < 2`; `ValueError` mentioning "
                "`multiple` when `rewards` is not 1-D or its length is not a multiple of `group_size`."),
    Part("aggregation", "losses.py", ("aggregate", "microbatch_scale"), 10,
         "The three ways to reduce a per-token quantity to the scalar loss (seq-mean-token-mean, "
         "token-mean, seq-mean-token-sum-norm), and the factor that makes micro-batch losses add "
         "up to the full-batch loss (exact gradient accumulation).",
         errors="`ValueError` mentioning `unknown aggregation` for any other `agg`, in both functions."),
    Part("grpo_loss", "losses.py", ("clipped_surrogate", "k3", "grpo_loss"), 15,
         "PPO's clipped surrogate, Schulman's k3 KL estimator, and the GRPO loss built from them: "
         "the ratio from log-probs, the surrogate, minus beta times k3 against the reference, "
         "reduced by `aggregate` and negated (a loss to minimise).",
         info="`weights` (ones, `[B, C]`), `clip_frac`, `clip_low_frac`, `clip_high_frac`, "
              "`abs_log_ratio`, `kl` and `ratio_mean` (means over valid tokens, detached): "
              "`_info(mask, torch.ones_like(logp), ratio, clipped, kl)` builds them.",
         errors="`ValueError` mentioning `ref_logp` when `beta > 0` and `ref_logp is None` "
                "(`_kl_term` raises it).",
         notes="Given helpers you may use: `_log_ratio` (log ratio zeroed at padding: padded positions "
               "may hold any finite garbage, and the loss and its gradient must stay finite), "
               "`_kl_term` and `_info`. Reduce with `aggregate(objective, mask, agg, max_tokens)` "
               "and return its negative: the graded tests replace `aggregate` with a stand-in that "
               "sums over valid tokens, so this part is graded without the aggregation part. "
               "`tr_grpo_loss`, `cw_grpo_loss` and `tepo_loss` are built the same way."),
    Part("tr_grpo_weights", "losses.py", ("tr_grpo_weights",), 10,
         "TR-GRPO's per-token weight, a clamped sigmoid of the token's probability: confident "
         "tokens weigh more. The weight carries no gradient.",
         notes="`tr_grpo_loss` (given) multiplies the clipped surrogate by it."),
    Part("cw_grpo_weights", "losses.py", ("cw_grpo_weights",), 15,
         "CW-GRPO's Gaussian-kernel weights on the covariance of log-prob and advantage, as its "
         "authors compute them: per group of `group_size` rows, log-probs centred on their own "
         "sequence, advantages on the group's plain mean, the bandwidth the group's std + 1e-8; "
         "normalised to mean 1 over valid tokens (`normalise=\"padded\"`: to rows x the group's "
         "longest completion). `scope=\"batch\"` is our other, batch-wide reading.",
         errors="`ValueError` mentioning `scope` for a scope other than `group`/`batch`; "
                "`ValueError` mentioning `normalise` for other than `valid`/`padded`; "
                "`ValueError` mentioning `group_size` when it does not divide the rows.",
         notes="`cw_grpo_loss` (given) multiplies the clipped surrogate by these weights, computed "
               "from `logp.detach()` (or, with `detach=False`, from `logp` itself). The weights must "
               "be differentiable in `logp`: a graded test runs `gradcheck` on them, so use torch "
               "operations, no `.detach()` and no in-place changes to tensors autograd needs. "
               "Weights at padding are 0."),
    Part("tepo", "losses.py", ("tepo_sequence_ratio", "tepo_kl_mask"), 15,
         "The two pieces TEPO adds to GRPO: the sequence-level likelihood ratio in token form "
         "(value of the sequence, gradient per token) and the KL mask on the tokens whose "
         "reinforcement would lower entropy.",
         notes="`tepo_loss` (given) assembles them with `clipped_surrogate`, `_kl_term` and "
               "`aggregate`, exactly as `grpo_loss` does."),
    Part("token_logprobs", "losses.py",
         ("token_logprobs", "token_logprobs_plain", "_TokenLogprobs.forward", "_TokenLogprobs.backward"),
         10,
         "Log-probability of each sampled token and the entropy of the whole next-token "
         "distribution, from logits divided by the sampling temperature.",
         notes="Only `token_logprobs` is graded: values, temperature, dtypes (bf16 logits give "
               "float32 results), an entropy without gradient, and the gradient of the "
               "log-probs. `token_logprobs_plain` (what `--plain` scores with) is blanked too: "
               "write it with a float32 `log_softmax` and `gather`, and a `token_logprobs` that "
               "calls it is a complete answer. Optional: the solution's speed device, the "
               "autograd Function `_TokenLogprobs` with the gradient written out and rows in "
               "chunks, whose `forward` and `backward` are blanked too.",
         optional=("_TokenLogprobs.forward", "_TokenLogprobs.backward")),
    Part("extract_answer", "rewards.py", ("extract_answer", "_last_boxed"), 10,
         "The GSM8K grader's answer extraction: find the model's final number in free text "
         "(`#### N`, `\\boxed{}`, `<answer>`, \"the answer is\", the last number) and "
         "normalise it, never evaluating the text.",
         notes="Given helpers: `_clean`, `to_fraction`, `normalise`, `_span_number`, "
               "`_last_match` and the regular expressions. `_last_boxed` is blanked too: write "
               "it or replace it with your own."),
    Part("completion_mask", "train.py", ("completion_mask",), 5,
         "The loss mask from positions, not token ids: 1 up to and including the first EOS, 0 "
         "after it, and which rows never stopped. On Qwen the pad token is an EOS token.",
         notes="`completions` are token ids `[B, C]` and `eos` a list of EOS ids. The graded "
               "tests import it as `from train import completion_mask`."),
)

# Tests that would give answers away (an independent re-implementation of every loss, the
# plain log-prob formula, expected gradients) or that only make sense with the solutions:
# left out of the student's copy, kept in the answer key.
HIDDEN_TESTS = ("tests/test_losses.py", "tests/test_assignment.py")
GRADED_TESTS = "tests/graded"              # visible: the student runs them, for feedback
HIDDEN_GRADED_TESTS = "tests/hidden"       # the instructor's: randomized, against independent computations
HIDDEN_SHARE = 0.75                        # with hidden tests present, the share of a part's points they give
# Left out of the student's copy (a folder: everything in it).
INSTRUCTOR_ONLY = ("course/make_assignment.py", "course/answers.py", "docs/course.md",
                   HIDDEN_GRADED_TESTS) + HIDDEN_TESTS
MAX_POINTS = sum(p.points for p in PARTS)

# The grade's split, set here only: the code (the parts, scored by grade.py: its points out of the
# parts' total, scaled to CODE_POINTS) and the experiments (the write-up, scored by the instructor
# with the rubric of the answer key's ANSWERS.md, course/answers.py).
CODE_POINTS = 70
EXPERIMENT_POINTS = 30


def course_points(got, top):
    """The code's share of the grade: ``got`` of ``top`` part points, scaled to CODE_POINTS."""
    value = round(CODE_POINTS * got / top, 1) if top else 0
    return int(value) if float(value).is_integer() else value


def required(p):
    """The functions of a part the student must write (its optional ones left out)."""
    return tuple(f for f in p.functions if f not in p.optional)

# The parts this copy is graded on: None means every part. make_assignment.py writes the
# chosen parts here in the student's copy and the answer key.
ASSIGNED = None


def part(name):
    """The Part called ``name``; ValueError listing the parts otherwise."""
    for p in PARTS:
        if p.name == name:
            return p
    raise ValueError(f"unknown part {name!r}; the parts are: {', '.join(p.name for p in PARTS)}")


def graded_tests_of(p):
    """Where a part's graded tests live."""
    return f"{GRADED_TESTS}/test_{p.name}.py"
