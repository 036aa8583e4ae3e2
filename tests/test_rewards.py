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
    ("commas", "1," * 1_000_000, "1", 0.0),
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
