"""Tests for rewards.py: every GSM8K gold solution, hand-written completions in the styles
instruct models use, and hostile inputs. The table of the classic grading pitfalls is
extract_answer's graded test, tests/graded/test_extract_answer.py."""
import json
from pathlib import Path

import pytest

from rewards import correctness_reward, extract_answer, format_reward, gold_answer, reward

GSM8K = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "gsm8k"
FIXTURES = Path(__file__).parent / "fixtures"

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


@pytest.mark.parametrize("name,text,answer,formatted", [
    ("a million digits", "1" * 1_000_000, None, 0.0),                       # > 40 digits: no answer
    ("a million digits after ####", "#### " + "9" * 1_000_000, None, 1.0),
    ("\\boxed{ x 100k", "\\boxed{" * 100_000, None, 0.0),
    ("#### x 100k", "####" * 100_000, None, 0.0),
    ("'answer is' x 100k", "the answer is " * 100_000, None, 0.0),
    ("<answer> x 100k", "<answer>" * 100_000, None, 0.0),
    ("commas", "1," * 1_000_000, None, 0.0),                     # "1,1": no number read whole
    ("minus signs", "-" * 1_000_000 + "5", "-5", 0.0),
    ("nested braces", "\\boxed{" + "{" * 1_000_000, None, 0.0),
    ("4 MB of prose", "The farmer counts the sheep again. " * 120_000, None, 0.0),
    ("\\boxed{ x 100k, then the answer", "\\boxed{" * 100_000 + "\n#### 5", "5", 1.0),
    ("'answer is' x 100k, then 5", "the answer is " * 100_000 + "5", "5", 0.0),
    ("4 MB of prose, then the answer",
     "The farmer counts the sheep again. " * 120_000 + "\n#### 5", "5", 1.0),
])
def test_hostile_inputs_get_the_right_grade(name, text, answer, formatted):
    """Megabytes of adversarial output: no exception, no catastrophic backtracking (each case
    takes well under a second; no time is asserted, a busy grading machine must not fail it),
    and the right grade."""
    assert extract_answer(text) == answer, name
    assert correctness_reward(text, "5") == (1.0 if answer == "5" else 0.0), name
    assert format_reward(text) == formatted, name


@pytest.mark.parametrize("split", ["train", "test"])
def test_every_gsm8k_gold_solution_grades_as_correct(split):
    path = GSM8K / f"{split}.jsonl"
    if not path.exists():
        pytest.skip(f"{path} not present (the shared data folder sits beside the repo)")
    rows = [json.loads(line) for line in path.open(encoding="utf-8") if line.strip()]
    wrong = [r["answer"][-60:] for r in rows
             if correctness_reward(r["answer"], gold_answer(r["answer"])) != 1.0]
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


@pytest.mark.parametrize("text", [
    "#### 1e400", "#### -1.5e3", "#### 12abc", "Result: 1.5e3", "The answer is 12abc", "#### 0x1F",
    "#### 1.2.3", "#### 1,2345", "#### 1,250,00", "#### 3/4e5", "#### 1/2/3", "#### 1 / 2 / 3",
    "\\boxed{2e5}", "<answer>7x</answer>", "so x2 = 5y",
])
def test_a_number_is_read_whole_or_not_at_all(text):
    """A number glued to what would continue it (a letter or digit, more decimals or digit groups,
    another / and digits) is no number: never its prefix, nor its tail ("1.5e3" is not 1.5 or 3)."""
    assert extract_answer(text) is None, text


@pytest.mark.parametrize("text,answer", [
    ("#### $18/hour", "18"),                      # a unit after a slash: the number is whole
    ("#### 3 / 4", "0.75"), ("Each gets 3/4 of a pie", "0.75"), ("The answer is 1/8.", "0.125"),
    ("#### 1,250.", "1250"), ("It is 12abc or 5", "5"), ("The 3rd box holds 12", "12"),
    ("#### 7\n#### 12abc", "7"),                  # a #### without a whole number is skipped
    ("1,000/4 = 250 each, so \\boxed{1,000/4}", "250"), ("\\boxed{\\frac{1,000}{8}}", "125"),
])
def test_whole_numbers_next_to_such_tokens_are_still_read(text, answer):
    assert extract_answer(text) == answer, text


def test_no_credit_for_the_prefix_of_a_longer_token():
    assert correctness_reward("#### 1.5e3", "1.5") == 0.0 and correctness_reward("#### 12abc", "12") == 0.0
    assert correctness_reward("#### 1e400", "1") == 0.0 and correctness_reward("#### -1.5e3", "-1.5") == 0.0


@pytest.mark.parametrize("answer", [
    "#### 1e400", "#### -1.5e3", "#### 12abc", "x = 5\n#### 5 apples", "#### 5\n#### x", "#### 1,2345",
    "#### 5\nThat is all.", "#### 3/4/5", "#### 1" + "0" * 40,
])
def test_a_malformed_gold_answer_is_an_error(answer):
    """The gold answer is the whole number on the last line '#### N'; anything else is refused."""
    with pytest.raises(ValueError, match="####"):
        gold_answer(answer)


def test_gold_answers_read_whole():
    assert gold_answer("12 - 5 = 7\n#### 7\n") == "7" and gold_answer("#### 3/4") == "0.75"
    assert gold_answer("#### $1,250.50") == "1250.5" and gold_answer("#### \u22123") == "-3"
