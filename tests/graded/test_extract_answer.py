"""Graded: extract_answer (rewards.py). A table of the classic grading pitfalls: each
completion with the answer extract_answer must return (a normalised number string, or None).
More checks of the whole grader (every GSM8K gold solution, model-style completions, hostile
inputs) are in tests/test_rewards.py; they are not graded."""
import pytest

from rewards import extract_answer

pytestmark = pytest.mark.part("extract_answer")

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
    ("\\boxed{3}, then a cut-off \\boxed{4", "3"),            # the last box whose braces close
    ("\\boxed{\\text{{12} apples}}", "12"),                   # nested braces
    ("so \\boxed{7} #### nothing", "7"),                      # a #### without a number is skipped
    ("<answer>5</answer> so the answer is 6", "5"),           # <answer> beats "the answer is"
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
    ("Result: 1.5e3 = 1500", "1500"),                         # 1.5e3 is no number (never 1.5)
    ("x\u00a0=\u00a0٣", None),                                # Arabic-Indic digit is not ASCII
    ("\u0032\u0030 pens", "20"),
    ("The answer is 0.", "0"),
    ("#### 007", "7"),
    ("Total: 5 + 5 = 10.\n\n**Final answer:** 10", "10"),
]


@pytest.mark.parametrize("text,expected", [case for case in CASES if case[1] is not None])
def test_extract_answer_table(text, expected):
    assert extract_answer(text) == expected


def test_no_answer_gives_none():
    # one test for all of them, so that a stub returning None scores nothing
    assert [extract_answer(text) for text, expected in CASES if expected is None] == [None] * 5
    assert extract_answer("#### 18") == "18"


def test_never_evaluates_model_text(tmp_path):
    marker = tmp_path / "pwned"
    for text in (f"#### __import__('pathlib').Path('{marker}').touch()",
                 f"\\boxed{{__import__('os').system('touch {marker}')}}", "<answer>2**10</answer>"):
        answer = extract_answer(text)
        assert answer is None or answer.lstrip("-").replace(".", "").replace("/", "").isdigit()
    assert extract_answer("<answer>2**10</answer>") == "10"         # read, never computed
    assert not marker.exists()
