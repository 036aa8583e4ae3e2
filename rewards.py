"""The GSM8K grader: find the model's final number, compare it exactly with the gold one.

A wrong reward teaches nothing, or the wrong thing, without any error message — and it is
the most common bug in GRPO code: ``1,250`` read as 1, a lost minus sign, ``\\boxed{}``
ignored, the *first* number taken instead of the last, "18" credited because "180" contains
it. Everything here is plain string work and exact rational arithmetic (``fractions``): no
``eval``/``exec`` of model text ever, and no regular expression that can backtrack
catastrophically, so even megabytes of hostile output are graded in milliseconds.
"""
import re
from fractions import Fraction

# A number as people write it: optional sign (a minus only when it is not a subtraction, i.e.
# not glued to a preceding word or digit), thousands commas, decimals, an optional "/ q" (3/4).
# Read whole or not at all: glued to what would continue it (a letter or digit: "12abc", "1.5e3",
# "x2"; more decimals, digit groups or "/ digits": "1.2.3", "1,2345", "1/2/3"), it is no number,
# never a piece of one (1e400 is not 1, 1,2345 not 2345). So no scientific notation (GSM8K has none).
_DECIMAL = r"(?:(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|\.\d+)"
NUMBER = (r"(?<![\w./])(?<!\d,)(?<!/ )[-+]?" + _DECIMAL + r"(?:[ \t]*/[ \t]*" + _DECIMAL + r")?"
          r"(?!\w|[.,]\d|[ \t]*/[ \t]*\d)")
_NUMBER = re.compile(NUMBER, re.ASCII)          # ASCII digits only: "٣" is not a 3 here
_FRAC = re.compile(r"\\[dt]?frac\{\s*(" + NUMBER + r")\s*\}\{\s*(" + NUMBER + r")\s*\}", re.ASCII)
_HASHES = re.compile(r"####[ \t]*(?:\\?\$)?[ \t]*(" + NUMBER + r")", re.ASCII)
_ANSWER_IS = re.compile(r"(?i)\banswer\b[^0-9\n-]{0,24}?(" + NUMBER + r")", re.ASCII)
MAX_DIGITS = 40          # longer "numbers" are not answers (and int() refuses > 4300 digits)
TAIL = 10_000            # the last-number fallback reads the last 10k characters only


def _clean(text):
    # Unicode minus and LaTeX spacing/escapes that sit inside numbers: "−5", "1{,}250", "\$18".
    return (text.replace("\u2212", "-").replace("{,}", ",").replace("\\!", "").replace("\\,", "")
            .replace("\\$", "$").replace("\\%", "%"))


def to_fraction(number):
    """'1,250' -> 1250, '-3.50' -> -7/2, '+2' -> 2, '3/4' -> 3/4; None if it is not a number."""
    s = number.replace(",", "").strip()
    if "/" in s:
        p, _, q = s.partition("/")
        p, q = to_fraction(p), to_fraction(q)
        return None if p is None or not q else p / q
    digits = sum(ch.isdigit() for ch in s)
    if digits == 0 or digits > MAX_DIGITS:
        return None
    try:
        return Fraction(s)
    except ValueError:
        return None


def normalise(value):
    """A Fraction as a canonical string: '1250', '-3.5', '1/3' (non-terminating decimals)."""
    if value.denominator == 1:
        return str(value.numerator)
    d = value.denominator
    while d % 2 == 0:
        d //= 2
    while d % 5 == 0:
        d //= 5
    if d != 1:
        return f"{value.numerator}/{value.denominator}"
    text = f"{value.numerator / value.denominator:.12f}" if abs(value) < 1e15 else str(value)
    return text.rstrip("0").rstrip(".")


def _span_number(span):
    """The value written in a short span such as a \\boxed{} body: a \\frac{p}{q}, else its last number."""
    span = _clean(span)
    for m in _FRAC.finditer(span):
        p, q = to_fraction(m.group(1)), to_fraction(m.group(2))
        if p is not None and q:
            return p / q
    numbers = _NUMBER.findall(span)
    return to_fraction(numbers[-1]) if numbers else None


def _last_match(pattern, text):
    """The last match of ``pattern`` in ``text``, or None (scans forward once: no backtracking)."""
    match = None
    for match in pattern.finditer(text):
        pass
    return match


def _last_boxed(text, tries=10):
    """Body of the last \\boxed{...} whose braces close (nested braces allowed), or None."""
    # BEGIN SOLUTION extract_answer
    end = len(text)
    for _ in range(tries):
        start = text.rfind("\\boxed{", 0, end)
        if start < 0:
            return None
        depth, i = 1, start + len("\\boxed{")
        limit = min(len(text), i + 500)
        while i < limit and depth:
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            i += 1
        if depth == 0:
            return text[start + len("\\boxed{"):i - 1]
        end = start
    return None
    # END SOLUTION


def extract_answer(text):
    """The model's final answer as a normalised number string, or None.

    Looked for in this order, the first that yields a number wins:
      1. the last ``#### N`` (the format our prompt asks for, and GSM8K's own);
      2. the last ``\\boxed{...}`` (LaTeX habit of math-tuned models; ``\\frac{a}{b}`` works);
      3. the last ``<answer>...</answer>`` block;
      4. the last "answer is N" / "Answer: N" phrase;
      5. the last number anywhere in the last 10,000 characters.
    Normalised: thousands commas, ``$``, ``%`` and units dropped, unicode minus, a leading
    ``+``, trailing ``.``/``.0``/``.00``; ``a/b`` and ``\\frac{a}{b}`` become exact fractions.
    A number is read whole or not at all ("12abc", "1.5e3" hold none), and one with more than
    40 digits is not an answer.
    """
    # BEGIN SOLUTION extract_answer
    if not text:
        return None
    text = _clean(text)
    hashes = _last_match(_HASHES, text)
    if hashes and (value := to_fraction(hashes.group(1))) is not None:
        return normalise(value)
    boxed = _last_boxed(text)
    if boxed is not None and (value := _span_number(boxed)) is not None:
        return normalise(value)
    start = text.rfind("<answer>")
    if start >= 0:
        stop = text.find("</answer>", start)
        body = text[start + len("<answer>"): stop if stop >= 0 else start + 500]
        if (value := _span_number(body[:500])) is not None:
            return normalise(value)
    phrase = _last_match(_ANSWER_IS, text)
    if phrase and (value := to_fraction(phrase.group(1))) is not None:
        return normalise(value)
    numbers = _NUMBER.findall(text[-TAIL:])
    for number in reversed(numbers[-5:]):
        if (value := to_fraction(number)) is not None:
            return normalise(value)
    return None
    # END SOLUTION


def gold_answer(gsm8k_answer):
    """The number on a GSM8K worked solution's last line, ``#### N``, normalised. ValueError if
    that line is anything else: no ####, a number not read whole ("#### 1e400"), words after it."""
    text = _clean(gsm8k_answer).rstrip()
    m = _HASHES.match(text, text.rfind("####")) if "####" in text else None
    value = to_fraction(m.group(1)) if m and m.end() == len(text) else None
    if value is None:
        raise ValueError(f"the answer's last line is not '#### <number>' (a number such as 18, -4, "
                         f"1,250 or 2.5, nothing after it): {gsm8k_answer[-80:]!r}")
    return normalise(value)


def correctness_reward(completion, gold):
    """1.0 when the extracted answer equals ``gold`` as an exact rational number, else 0.0.

    Exact: 12 == 12.0 == 12.00 and 1/2 == 0.5, but 0.333 != 1/3. No float tolerance to game.
    """
    answer = extract_answer(completion)
    if answer is None:
        return 0.0
    want = to_fraction(gold)
    return 1.0 if want is not None and to_fraction(answer) == want else 0.0


_FORMAT_LINE = re.compile(r"####[ \t]*(?:\$)?[ \t]*[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?[ \t]*", re.ASCII)


def format_reward(completion):
    """1.0 when the completion's last non-empty line is ``#### <number>`` (the prompt's format)."""
    last = completion.rstrip().rpartition("\n")[2].strip()
    return 1.0 if _FORMAT_LINE.fullmatch(_clean(last)) else 0.0


def reward(completion, gold):
    """The training reward: correctness + 0.1 * format.

    Correctness dominates: a right answer in the wrong format (1.0) always beats a wrong
    answer in the right format (0.1). The small format bonus gives a group of all-wrong
    answers some signal towards the format that makes answers easy to read.
    """
    return correctness_reward(completion, gold) + 0.1 * format_reward(completion)
