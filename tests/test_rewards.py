"""Tests for rewards.py: a table of the classic grading pitfalls, every GSM8K gold solution,
hand-written completions in the styles instruct models use, and hostile inputs."""
import json
import time
from pathlib import Path

import pytest

from rewards import correctness_reward, extract_answer, format_reward, gold_answer, reward

GSM8K = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "gsm8k"
FIXTURES = Path(__file__).parent / "fixtures"

# (completion, what extract_answer must return)
CASES = [
    ("#### 18", "18"),
    ("She makes 9 * 2 = $18 every day.\n#### 18", "18"),
    ("#### 1,250", "1250"),                                   # thousands comma
    ("#### 1,234,567", "1234567"),
    ("#### $1,250.00", "1250"),                               # currency and cents
    ("#### -5", "-5"),                                        # minus sign kept
    ("#### \u22125", "-5"),                                   # unicode minus
    ("#### +7", "7"),                                         # leading plus
    ("#### 12.", "12"),                                       # trailing full stop
    ("#### 12.0", "12"),
    ("#### 12.50", "12.5"),
    ("#### 0.25", "0.25"),
    ("#### 3/4", "0.75"),                                     # plain fraction
    ("#### 25%", "25"),                                       # percent sign dropped
    ("#### 18 dollars", "18"),                                # units dropped
    ("16 - 3 - 4 = 9 eggs. 9 * 2 = 18.\n#### 18\nCheck: 16 > 9", "18"),   # last ####, not last number
    ("#### 5\n#### 7", "7"),                                  # the last #### wins
    ("The answer is \\boxed{18}.", "18"),
    ("\\boxed{1,250}", "1250"),
    ("\\boxed{\\frac{3}{4}}", "0.75"),
    ("\\boxed{\\dfrac{10}{4}}", "2.5"),
    ("\\boxed{\\$18.00}", "18"),
    ("\\boxed{x = 5}", "5"),
    ("First \\boxed{3}, no wait: \\boxed{4}", "4"),            # last box
    ("\\boxed{18} because 16-3-4=9 and 9*2=18", "18"),        # box beats trailing numbers
    ("<answer>42</answer>", "42"),
    ("<answer> The total is 1,000 </answer> (7 steps)", "1000"),
    ("The answer is 18.", "18"),
    ("The final answer is: **$1,250**", "1250"),
    ("Answer: 72", "72"),
    ("So the answer is -3 degrees.", "-3"),
    ("Janet has 16 - 3 - 4 = 9 eggs, so she makes 18 dollars.", "18"),   # last number
    ("10-5=5", "5"),                                          # subtraction, not -5
    ("It costs $2.50.", "2.5"),
    ("There were 100 apples and 20 were eaten, leaving 80", "80"),
    ("I cannot solve this.", None),                           # no number
    ("", None),                                               # empty
    ("#### ", None),                                          # marker but no number
    ("The number is 123456789012345678901234567890123456789012345", None),  # not an answer
    ("Result: 1.5e3", "1.5"),                                 # no scientific notation
    ("x\u00a0=\u00a0٣", None),                                # Arabic-Indic digit is not ASCII
    ("\u0032\u0030 pens", "20"),
    ("The answer is 0.", "0"),
    ("#### 007", "7"),
    ("Total: 5 + 5 = 10.\n\n**Final answer:** 10", "10"),
]


@pytest.mark.parametrize("text,expected", CASES)
def test_extract_answer_table(text, expected):
    assert extract_answer(text) == expected


@pytest.mark.parametrize("completion,gold,expected", [
    ("#### 18", "18", 1.0),
    ("#### 18.00", "18", 1.0),                 # exact rational comparison
    ("#### 0.5", "1/2", 1.0),
    ("#### 1,800", "1800", 1.0),
    ("#### 180", "18", 0.0),                   # no substring credit
    ("#### 18", "180", 0.0),
    ("#### 0.333", "1/3", 0.0),                # no float tolerance to game
    ("#### -18", "18", 0.0),                   # the sign matters
    ("no answer at all", "18", 0.0),
    ("", "0", 0.0),
])
def test_correctness_reward(completion, gold, expected):
    assert correctness_reward(completion, gold) == expected


def test_gold_answer():
    assert gold_answer("Janet sells 16 - 3 - 4 = <<16-3-4=9>>9 duck eggs.\n#### 9") == "9"
    assert gold_answer("... = 1,200\n#### 1,200") == "1200"
    assert gold_answer("#### -4") == "-4"
    with pytest.raises(ValueError, match="####"):
        gold_answer("no final line here: 42")


def test_format_and_combined_reward():
    assert format_reward("5+7=12\n#### 12") == 1.0
    assert format_reward("5+7=12\n#### 12\n\n") == 1.0
    assert format_reward("#### 1,250") == 1.0
    assert format_reward("The answer is 12.") == 0.0
    assert format_reward("#### 12\nHope this helps!") == 0.0      # not the last line
    assert format_reward("#### twelve") == 0.0
    # Correctness dominates: right-but-unformatted beats wrong-but-formatted.
    assert reward("The answer is 12.", "12") == 1.0
    assert reward("#### 13", "12") == pytest.approx(0.1)
    assert reward("5+7=12\n#### 12", "12") == pytest.approx(1.1)
    assert reward("The answer is 12.", "12") > reward("#### 13", "12")


def test_never_evaluates_model_text(tmp_path):
    marker = tmp_path / "pwned"
    for text in (f"#### __import__('pathlib').Path('{marker}').touch()",
                 f"\\boxed{{__import__('os').system('touch {marker}')}}", "<answer>2**10</answer>"):
        answer = extract_answer(text)
        assert answer is None or answer.lstrip("-").replace(".", "").replace("/", "").isdigit()
    assert extract_answer("<answer>2**10</answer>") == "10"         # read, never computed
    assert not marker.exists()


@pytest.mark.parametrize("name,text", [
    ("a million digits", "1" * 1_000_000),
    ("a million digits after ####", "#### " + "9" * 1_000_000),
    ("\\boxed{ x 100k", "\\boxed{" * 100_000),
    ("#### x 100k", "####" * 100_000),
    ("'answer is' x 100k", "the answer is " * 100_000),
    ("<answer> x 100k", "<answer>" * 100_000),
    ("commas", "1," * 1_000_000),
    ("minus signs", "-" * 1_000_000 + "5"),
    ("nested braces", "\\boxed{" + "{" * 1_000_000),
    ("4 MB of prose", "The farmer counts the sheep again. " * 120_000),
])
def test_hostile_inputs_are_graded_fast(name, text):
    start = time.perf_counter()
    correctness_reward(text, "5")
    format_reward(text)
    assert time.perf_counter() - start < 1.0, name


@pytest.mark.parametrize("split", ["train", "test"])
def test_every_gsm8k_gold_solution_grades_as_correct(split):
    path = GSM8K / f"{split}.jsonl"
    if not path.exists():
        pytest.skip(f"{path} not present (the shared data folder sits beside the repo)")
    rows = [json.loads(line) for line in path.open(encoding="utf-8") if line.strip()]
    wrong = [r["answer"][-60:] for r in rows if correctness_reward(r["answer"], gold_answer(r["answer"])) != 1.0]
    assert len(rows) == {"train": 7473, "test": 1319}[split]
    assert wrong == []


def test_hand_labelled_model_style_completions():
    """Completions written by us in the styles instruct models produce on GSM8K (markdown,
    boxed, 'The answer is', units, checks after the answer, wrong and truncated answers), each
    with a hand-assigned label: is the final answer right as a human reads it?"""
    rows = [json.loads(line) for line in (FIXTURES / "model_style_completions.jsonl").open(encoding="utf-8")]
    assert len(rows) >= 60
    disagree = [(r["completion"][-70:], r["gold"], r["label"]) for r in rows
                if correctness_reward(r["completion"], r["gold"]) != float(r["label"])]
    known = [(r["completion"][-70:], r["gold"], r["label"]) for r in rows if r.get("known_limitation")]
    # The one known disagreement: a truncated "Step 2:" whose step number happens to equal the
    # gold answer gets credit from the last-number fallback. Everything else must agree.
    assert disagree == known and len(known) == 1
