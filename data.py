"""Datasets and the prompt: GSM8K (Hub or local JSONL) and synthetic GSM8K-style problems.

Every problem is a dict ``{"question": str, "answer": str}`` in GSM8K's own format: the
answer is a worked solution whose last line is ``#### <number>`` (``rewards.gold_answer``
reads it). The prompt is built in one place, ``render_prompt``, used by training,
evaluation and the tests alike, so they can never drift apart.
"""
import functools
import json
import random
import re
from pathlib import Path

from rewards import gold_answer

# The longest question or worked answer a data file may hold, in characters: 8x GSM8K's longest
# (985 and 1,228), ~2.5k tokens. Longer is no word problem but a broken file, and would fill the
# model's context (or its memory, G answers at a time) instead of failing here with its line.
MAX_CHARS = 10_000

SYSTEM_PROMPT = ("You are a careful math tutor. Solve the problem step by step, briefly, "
                 "then give the final answer on its own last line as '#### <number>'.")


def build_messages(question):
    """The chat for one problem: a system message with the answer format, then the question."""
    return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": question}]


def render_prompt(tokenizer, question):
    """The exact text the model continues: the tokenizer's chat template + generation prompt."""
    return tokenizer.apply_chat_template(build_messages(question), tokenize=False,
                                         add_generation_prompt=True)


# ----------------------------------------------------------------------------------------
# GSM8K

def load_gsm8k(split, path=None):
    """GSM8K's ``split`` ("train" or "test") as a list of {"question", "answer"} dicts.

    ``path`` may be a JSONL file or a directory holding ``{split}.jsonl`` (GSM8K's format:
    one JSON object per line with "question" and "answer"). Without ``path`` the Hub copy
    (``openai/gsm8k``, config ``main``) is loaded with ``datasets``.
    """
    if path is None:
        try:
            import datasets
            ds = datasets.load_dataset("openai/gsm8k", "main", split=split)
        except Exception as e:  # no network and no cache, most often
            raise RuntimeError(
                f"could not load GSM8K '{split}' from the Hugging Face Hub ({type(e).__name__}: {e}). "
                "Offline? Pass a local copy with --data path/to/gsm8k_dir_or_file.jsonl, or run the "
                "offline demo with --preset tiny.") from e
        return [{"question": r["question"], "answer": r["answer"]} for r in ds]
    path = Path(path)
    if path.is_dir():
        path = path / f"{split}.jsonl"
    if not path.is_file():
        raise FileNotFoundError(f"GSM8K file not found: {path}")
    rows = []
    with open(path, "rb") as f:
        for lineno, raw in enumerate(f, 1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise ValueError(f"{path}, line {lineno}: not UTF-8 text (byte {e.start + 1}: "
                                 f"{raw[e.start:e.start + 1]!r}); save the file as UTF-8") from None
            if line.strip():
                rows.append(_parse_row(line, path, lineno))
    if not rows:
        raise ValueError(f"{path}: no problems in the file (it is empty)")
    return rows


def _parse_row(line, path, lineno):
    where = f"{path}, line {lineno}"
    try:
        row = json.loads(line)
    except json.JSONDecodeError as e:
        raise ValueError(f"{where}: not valid JSON ({e.msg})") from None
    if not isinstance(row, dict):
        raise ValueError(f"{where}: expected a JSON object with 'question' and 'answer'")
    for key in ("question", "answer"):
        if not isinstance(row.get(key), str) or not row[key].strip():
            raise ValueError(f"{where}: field '{key}' is missing or not a non-empty string")
        if len(row[key]) > MAX_CHARS:
            raise ValueError(f"{where}: field '{key}' is {len(row[key]):,} characters long; "
                             f"a problem may have {MAX_CHARS:,} at most (data.MAX_CHARS)")
    try:
        gold_answer(row["answer"])
    except ValueError as e:
        raise ValueError(f"{where}: {e}") from None
    return {"question": row["question"], "answer": row["answer"]}


# ----------------------------------------------------------------------------------------
# Synthetic GSM8K-style problems (offline, for the tiny preset and the tests)

NAMES = ["Mia", "Tom", "Ava", "Leo", "Zoe", "Sam", "Ivy", "Max", "Eli", "Ana", "Ben", "Kim"]
ITEMS = ["apples", "pens", "cards", "shells", "books", "coins", "eggs", "stamps", "cups", "toys"]

# Level 1: one addition or subtraction of one-digit numbers. Short on purpose: the tiny model
# reads characters, so every character of the question is a step of attention. (Operands 1-20
# were the first plan; measured: 400 SFT steps bring the 0.5M-parameter model only to ~20%
# there, against ~80% after 200 steps with operands 1-9, so the demo would be all warm-up.)
LEVEL1_MAX = 9
LEVEL1 = [
    ("{n} has {a} {i}. {n} buys {b} more. How many {i} does {n} have?", "+"),
    ("{n} picks {a} {i} and then {b} more. How many {i} in all?", "+"),
    ("A box has {a} {i}. {n} adds {b}. How many {i} are in the box?", "+"),
    ("{n} has {a} {i} and finds {b}. How many {i} now?", "+"),
    ("{n} had {a} {i} and gave away {b}. How many {i} are left?", "-"),
    ("A box has {a} {i}. {n} takes {b} out. How many {i} are left?", "-"),
    ("{n} had {a} {i} and lost {b}. How many {i} does {n} have?", "-"),
    ("{n} has {a} {i} and sells {b}. How many {i} remain?", "-"),
]

# Levels 2-3: several steps with multiplication and exact division.
LEVEL2 = [
    ("{n} buys {a} bags with {b} {i} each, then gets {c} more {i}. How many {i} does {n} have?",
     lambda a, b, c: [(f"{a}*{b}", a * b), (f"{a * b}+{c}", a * b + c)]),
    ("{n} has {a} {i}, gives {c} away, then doubles the rest. How many {i} now?",
     lambda a, b, c: [(f"{a}-{c}", a - c), (f"{a - c}*2", 2 * (a - c))]),
    ("{n} has {a} boxes of {b} {i} and uses {c} of them. How many {i} are left?",
     lambda a, b, c: [(f"{a}*{b}", a * b), (f"{a * b}-{c}", a * b - c)]),
]
LEVEL3 = [
    ("{n} shares {ab} {i} equally among {b} friends, then each friend gets {c} more. "
     "How many {i} does each friend have?",
     lambda a, b, c: [(f"{a * b}/{b}", a), (f"{a}+{c}", a + c)]),
    ("{n} earns ${a} a day for {b} days, spends ${c}, and splits the rest with a sister. "
     "How many dollars does each get?",
     lambda a, b, c: [(f"{a}*{b}", a * b), (f"{a * b}-{c}", a * b - c),
                      (f"{a * b - c}/2", (a * b - c) // 2)]),
]


def make_synthetic(n, level=1, seed=0, exclude=None):
    """``n`` GSM8K-style problems with integer answers, deterministic for ``seed``.

    Level 1: one addition or subtraction of numbers 1-9 (answers never negative) — what a
    0.5M-parameter character-level model learns in minutes. Level 2: two steps with
    multiplication, numbers up to 50. Level 3: division with exact results and three steps.
    Several templates, names and items per level, so the model must read the numbers rather
    than memorise sentences. The level-1 space is small (~60k questions), so problems from two
    seeds can coincide: pass the training questions as ``exclude`` when building a held-out set.
    Level 12: levels 1 and 2 alternating (SmolLM2-135M solves ~30% of level 1, ~2% of level 2).
    """
    if level not in (1, 2, 3, 12):
        raise ValueError(f"level must be 1, 2, 3 or 12 (1 and 2 alternating), got {level}")
    rng = random.Random(f"synthetic-{level}-{seed}")
    exclude = set(exclude or ())
    out, seen, attempts = [], set(), 0
    while len(out) < n:
        attempts += 1
        if attempts > 100 * n + 1000:
            raise ValueError(f"could not make {n} distinct level-{level} problems outside `exclude`")
        problem = _one_problem(rng, level if level != 12 else 1 + len(out) % 2)
        if problem["question"] in exclude or problem["question"] in seen:
            continue
        seen.add(problem["question"])
        out.append(problem)
    return out


def _one_problem(rng, level):
    name, item = rng.choice(NAMES), rng.choice(ITEMS)
    if level == 1:
        template, op = rng.choice(LEVEL1)
        a, b = rng.randint(1, LEVEL1_MAX), rng.randint(1, LEVEL1_MAX)
        if op == "-" and b > a:
            a, b = b, a
        result = a + b if op == "+" else a - b
        question = template.format(n=name, i=item, a=a, b=b)
        return {"question": question, "answer": f"{a}{op}{b}={result}\n#### {result}"}
    template, steps = rng.choice(LEVEL2 if level == 2 else LEVEL3)
    top = 50 if level == 2 else 30
    while True:
        a, b, c = rng.randint(2, top), rng.randint(2, 12), rng.randint(1, top)
        worked = steps(a, b, c)
        if all(v >= 0 for _, v in worked) and (level == 2 or (a * b - c) % 2 == 0 or len(worked) < 3):
            break
    question = template.format(n=name, i=item, a=a, b=b, c=c, ab=a * b)
    lines = [f"{expr}={value}" for expr, value in worked]
    return {"question": question, "answer": "\n".join(lines) + f"\n#### {worked[-1][1]}"}


VERBS = {"+": "add", "-": "take away", "*": "multiply by", "/": "divide by"}


def wordy_solution(problem):
    """The same worked solution, written the long way round:

        "7+5=12\n#### 12"  ->  "We start with 7 and then add 5, so 7+5=12\n#### 12"

    The tiny preset's warm-up mixes both styles, the way real SFT data mixes terse and chatty
    answers. Within the tiny preset's 20-token budget the wordy one is cut off before its first
    "=", so it can never earn a reward: the warm-up leaves a behaviour for GRPO to discover (see
    docs/results.md, "The tiny model: what it can show").
    """
    first, _, _ = problem["answer"].partition("\n")
    m = re.match(r"(\d+)([-+*/])(\d+)=", first)
    if not m:
        raise ValueError(f"not a synthetic worked solution: {problem['answer']!r}")
    a, op, b = m.groups()
    return {"question": problem["question"],
            "answer": f"We start with {a} and then {VERBS[op]} {b}, so {problem['answer']}"}


# ----------------------------------------------------------------------------------------
# What train.py trains and evaluates on, in a fixed order per seed.

def load_problems(cfg):
    """(train, held_out) lists of {"question", "answer"}; answers end with '#### N'."""
    if cfg.data == "synthetic":
        train = make_synthetic(20_000, level=cfg.level, seed=0)
        held_out = make_synthetic(cfg.eval_n, level=cfg.level, seed=1, exclude={p["question"] for p in train})
        return train, held_out
    try:
        train, test = load_gsm8k("train", cfg.data or None), load_gsm8k("test", cfg.data or None)
    except (ValueError, FileNotFoundError, RuntimeError) as e:
        raise SystemExit(f"error: {e}") from None
    return train, test[:cfg.eval_n]


@functools.lru_cache(maxsize=4)
def prompt_order(seed, n):
    """The fixed shuffled order of the n training problems for a seed (computed once per run)."""
    return random.Random(f"order-{seed}").sample(range(n), n)


def batch_of_prompts(train, cfg, step):
    """The prompts of step ``step`` (1-based): a fixed shuffled order, so resume is exact."""
    order, start = prompt_order(cfg.seed, len(train)), (step - 1) * cfg.prompts_per_step
    return [train[order[(start + k) % len(train)]] for k in range(cfg.prompts_per_step)]
