"""Hidden: extract_answer (rewards.py) on randomly written completions whose answer is known
by construction: a number written the ways people write it, put where the docstring says it
is found (``#### N``, ``\\boxed{}``, ``<answer>``, "the answer is", the last number), among
other numbers. Never the same texts as the visible table.

The no-``eval`` test weighs 5 of this file's 12 (7 tests of weight 1 beside it): 3.1 of the
part's 10 points, about a third, as the README names it one of the grader's three duties
(extract the final number, compare it exactly, never ``eval`` model text).
"""
import builtins
from decimal import Decimal
from fractions import Fraction

import pytest

from rewards import extract_answer

from . import rng

pytestmark = pytest.mark.part("extract_answer")
NAMES = ["Mia", "Tom", "Ana", "Raj", "Li", "Sam"]
THINGS = ["apples", "pens", "cups", "eggs", "marbles", "books", "coins", "stickers"]
SHAPES = ("plain", "commas", "dollars", "negative", "decimal", "cents")
HASH_ONLY = ("unicode minus", "plus", "percent", "fraction")


def decimal_string(value):
    """A Fraction with a terminating decimal as the normalised answer string: 12, -5, 12.5, 0.75."""
    d = Decimal(value.numerator) / Decimal(value.denominator)
    return format(d.normalize(), "f")


def number(r, shapes=SHAPES):
    """(the number as written, the string extract_answer must return)."""
    shape = r.choice(shapes)
    n = r.choice([r.randint(0, 99), r.randint(100, 9_999), r.randint(10_000, 50_000_000)])
    cents = r.randint(1, 99)
    written = {
        "plain": str(n),
        "commas": f"{n + 1000:,}",
        "dollars": f"${n:,}" + r.choice(["", ".00"]),
        "negative": f"-{n + 1}",
        "decimal": f"{n % 1000}.{cents:02d}",
        "cents": f"${n % 1000}.{cents:02d}",
        "unicode minus": f"\u2212{n + 1}",
        "plus": f"+{n}",
        "percent": f"{n % 101}%",
    }.get(shape)
    if shape == "fraction":
        top, bottom = r.randint(1, 99), r.choice([2, 4, 5, 8, 10, 20, 25, 50])
        return f"{top}/{bottom}", decimal_string(Fraction(top, bottom))
    value = Fraction(written.replace(",", "").replace("$", "").replace("%", "").replace("\u2212", "-"))
    return written, decimal_string(value)


def filler(r, sentences=None):
    """Word-problem text full of numbers and free of answer markers."""
    templates = ["{n} has {a} {w}.", "{n} buys {b} more {w} at ${c} each.", "{a} + {b} = {s}.",
                 "Then {a} * {c} = {p}.", "After {c} days {n} gives away {b} {w},", "It takes {a} minutes.",
                 "{n} counts {a} {w} and {b} {w}."]
    out = []
    for _ in range(sentences if sentences is not None else r.randint(1, 4)):
        a, b, c = r.randint(1, 99), r.randint(1, 99), r.randint(2, 12)
        out.append(r.choice(templates).format(n=r.choice(NAMES), w=r.choice(THINGS), a=a, b=b, c=c,
                                              s=a + b, p=a * c))
    return " ".join(out)


def hashes(r, value):
    line = f"#### {value}" + r.choice(["", "", " dollars", " " + r.choice(THINGS)]
                                      + ["."] * ("/" not in value))
    earlier = f"#### {number(r)[0]}\n" if r.random() < 0.3 else ""             # the last #### wins
    after = r.choice(["", f"\nCheck: {r.randint(1, 99)} > {r.randint(1, 99)}"])
    return earlier + filler(r) + "\n" + line + after


def boxed(r, value):
    value = value.replace("$", "\\$")
    body = r.choice([value, f"x = {value}", f"{value} \\text{{ {r.choice(THINGS)}}}"])
    earlier = f"First \\boxed{{{number(r)[0]}}}, no: " if r.random() < 0.3 else ""  # the last box wins
    return (filler(r) + " " + earlier + f"So \\boxed{{{body}}}"
            + r.choice(["", ".", f" because {filler(r, 1)}"]))


def answer_tag(r, value):
    body = r.choice(["{v}", " {v} ", "The total is {v}", "{n} ends with {v} " + r.choice(THINGS)])
    body = body.format(v=value, n=r.choice(NAMES))
    after = r.choice(["", f" so the answer is {number(r)[0]}", f" ({r.randint(2, 9)} steps)"])
    return filler(r) + f"\n<answer>{body}</answer>" + after


def answer_phrase(r, value):
    phrase = r.choice(["The answer is {v}.", "So the answer is {v} " + r.choice(THINGS) + ".",
                       "The final answer is: **{v}**", "Answer: {v}"]).format(v=value)
    return filler(r) + " " + phrase + r.choice(["", f" That took {r.randint(2, 9)} steps."])


def last_number(r, value):
    templates = ["So {n} has {v} {w} left.", "In all: {v}", "{n} ends with {v}"]
    return filler(r) + " " + r.choice(templates).format(n=r.choice(NAMES), v=value, w=r.choice(THINGS))


FORMS = [hashes, boxed, answer_tag, answer_phrase, last_number]      # the docstring's order of precedence


@pytest.mark.parametrize("form", FORMS[:2], ids=lambda f: f.__name__)
def test_markers_with_numbers_written_every_way(form):
    r = rng(form.__name__)
    shapes = SHAPES + HASH_ONLY if form is hashes else SHAPES
    for _ in range(60):
        written, want = number(r, shapes)
        text = form(r, written)
        assert extract_answer(text) == want, text


@pytest.mark.parametrize("form", FORMS[2:], ids=lambda f: f.__name__)
def test_tags_phrases_and_the_last_number(form):
    r = rng(form.__name__)
    for _ in range(60):
        written, want = number(r)
        text = form(r, written)
        assert extract_answer(text) == want, text


def test_precedence_whatever_the_order_in_the_text():
    """#### beats \\boxed{} beats <answer> beats "the answer is" beats the last number."""
    r = rng("precedence")
    for _ in range(60):
        chosen = sorted(r.sample(range(len(FORMS)), r.randint(2, len(FORMS))))
        values = [number(r) for _ in chosen]
        while len({v[1] for v in values}) < len(values):
            values = [number(r) for _ in chosen]
        segments = [FORMS[k](r, written) for k, (written, _) in zip(chosen, values)]
        r.shuffle(segments)
        if 4 in chosen:
            segments.append(last_number(r, values[chosen.index(4)][0]))           # the last number stays last
        text = "\n".join(segments)
        assert extract_answer(text) == values[0][1], text


def test_no_answer_gives_none():
    r = rng("none")
    for _ in range(30):
        words = " ".join(r.choice(NAMES + THINGS + ["has", "and", "the", "some"])
                         for _ in range(r.randint(0, 12)))
        long_number = "".join(r.choice("123456789") for _ in range(r.randint(41, 60)))
        for text in [words, f"{words}\n#### ", f"\\boxed{{{words}}}", f"<answer>{words}</answer>",
                     f"The answer is {long_number}"]:
            assert extract_answer(text) is None, text
        written, want = number(r)
        assert extract_answer(f"{words} #### {written}") == want


@pytest.mark.weight(5)
def test_never_evaluates_model_text(tmp_path, monkeypatch):
    """No eval or exec of the text, ever (here they record the attempt and refuse), and an
    expression is read, never computed: its last number in a box or an <answer> block."""
    attempts = []

    def refuse(name):
        def spy(*args, **kwargs):
            attempts.append(name)
            raise RuntimeError(f"{name} called on model text")
        return spy

    monkeypatch.setattr(builtins, "eval", refuse("eval"))
    monkeypatch.setattr(builtins, "exec", refuse("exec"))
    r = rng("security")
    marker = tmp_path / "pwned"
    payloads = [f"__import__('os').system('touch {marker}')", f"open('{marker}', 'w').write('x')",
                f"__import__('pathlib').Path('{marker}').touch()", f"exec(\"open('{marker}','w')\")"]
    for payload in payloads:
        for text in [f"#### {payload}", f"\\boxed{{{payload}}}", f"<answer>{payload}</answer>",
                     f"The answer is {payload}", payload]:
            answer = extract_answer(text)
            assert answer is None or isinstance(answer, str)
    for _ in range(40):
        a, b = r.randint(2, 30), r.randint(2, 30)
        expression = r.choice([f"{a}*{b}", f"{a}**{b}", f"{a} * {b}", f"{a}+{b}", f"({a}+1)*{b}"])
        after = f" so {r.randint(100, 999)} in all."
        assert extract_answer(f"<answer>{expression}</answer>{after}") == str(b)
        assert extract_answer(f"{filler(r)} \\boxed{{{expression}}}{after}") == str(b)
    assert attempts == [] and not marker.exists()
