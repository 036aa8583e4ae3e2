"""Tests for data.py: GSM8K loading (local JSONL), clear errors on broken files, the
synthetic generator (answers recomputed), and the one prompt builder."""
import json
import operator
import re
from pathlib import Path

import pytest

from data import (MAX_CHARS, SYSTEM_PROMPT, build_messages, load_gsm8k, make_synthetic, render_prompt,
                  wordy_solution)
from rewards import correctness_reward, gold_answer

FIXTURE = Path(__file__).parent / "fixtures" / "tiny_gsm8k.jsonl"
GSM8K = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "gsm8k"


def test_load_local_jsonl_skips_blank_lines():
    rows = load_gsm8k("train", FIXTURE)
    assert [gold_answer(r["answer"]) for r in rows] == ["7", "300", "-5"]
    assert set(rows[0]) == {"question", "answer"}


def test_load_from_a_directory(tmp_path):
    (tmp_path / "test.jsonl").write_text(FIXTURE.read_text())
    assert len(load_gsm8k("test", tmp_path)) == 3
    with pytest.raises(FileNotFoundError, match="train.jsonl"):
        load_gsm8k("train", tmp_path)


@pytest.mark.parametrize("split,n", [("train", 7473), ("test", 1319)])
def test_load_real_gsm8k(split, n):
    if not GSM8K.exists():
        pytest.skip("../shared/data/gsm8k not present")
    rows = load_gsm8k(split, GSM8K)
    assert len(rows) == n
    assert all(correctness_reward(r["answer"], gold_answer(r["answer"])) == 1.0 for r in rows[:50])


@pytest.mark.parametrize("line,message", [
    ('{"question": "q", "answer": "#### 1"', "not valid JSON"),
    ('["question", "answer"]', "JSON object"),
    ('{"question": "q"}', "'answer'"),
    ('{"question": "", "answer": "#### 1"}', "'question'"),
    ('{"question": "q", "answer": 5}', "'answer'"),
    ('{"question": "q", "answer": "the answer is five"}', "####"),
    ('{"question": "q", "answer": "#### 1e400"}', "'#### <number>'"),       # not read as 1
    ('{"question": "q", "answer": "#### -1.5e3"}', "'#### <number>'"),
    ('{"question": "q", "answer": "#### 12abc"}', "'#### <number>'"),
    ('{"question": "q", "answer": "#### 12\\nand more"}', "'#### <number>'"),
])
def test_malformed_rows_name_file_and_line(tmp_path, line, message):
    path = tmp_path / "broken.jsonl"
    good = json.dumps({"question": "q", "answer": "#### 1"})
    path.write_text(f"{good}\n{good}\n{line}\n{good}\n")
    with pytest.raises(ValueError) as err:
        load_gsm8k("train", path)
    assert "broken.jsonl, line 3" in str(err.value) and message in str(err.value)


def test_bytes_that_are_not_utf8_name_file_and_line(tmp_path):
    path = tmp_path / "latin1.jsonl"
    good = json.dumps({"question": "q", "answer": "#### 1"}).encode()
    path.write_bytes(good + b"\n" + '{"question": "Jos\u00e9 has 3", "answer": "#### 3"}\n'.encode("latin-1"))
    with pytest.raises(ValueError, match=r"latin1.jsonl, line 2: not UTF-8 text \(byte 18: b'\\xe9'\)"):
        load_gsm8k("train", path)


@pytest.mark.parametrize("key", ["question", "answer"])
def test_an_absurdly_long_field_is_refused_at_load(tmp_path, key):
    """A question (or worked answer) past MAX_CHARS names the file and line at load, before any
    tokenizer or run directory sees it; GSM8K's longest fit with room to spare."""
    path = tmp_path / "long.jsonl"
    row = {"question": "q", "answer": "#### 1"}
    row[key] = "x" * MAX_CHARS + "\n#### 1"
    path.write_text(json.dumps({"question": "q", "answer": "#### 1"}) + "\n" + json.dumps(row) + "\n")
    message = f"long.jsonl, line 2: field '{key}' is {MAX_CHARS + 7:,} characters"
    with pytest.raises(ValueError, match=message):
        load_gsm8k("train", path)
    row[key] = "x" * (MAX_CHARS - 7) + "\n#### 1"
    path.write_text(json.dumps(row) + "\n")
    assert load_gsm8k("train", path)[0][key] == row[key]


def test_empty_file_is_an_error(tmp_path):
    path = tmp_path / "empty.jsonl"
    path.write_text("\n\n")
    with pytest.raises(ValueError, match="empty"):
        load_gsm8k("train", path)


def test_hub_failure_points_to_offline_options(monkeypatch):
    import datasets
    def offline(*args, **kwargs):
        raise ConnectionError("no network")
    monkeypatch.setattr(datasets, "load_dataset", offline)
    with pytest.raises(RuntimeError, match="--preset tiny"):
        load_gsm8k("train")


OPS = {"+": operator.add, "-": operator.sub, "*": operator.mul, "/": operator.floordiv}


@pytest.mark.parametrize("level", [1, 2, 3, 12])
def test_synthetic_answers_are_correct(level):
    problems = make_synthetic(300, level=level, seed=1)
    assert len({p["question"] for p in problems}) == 300
    for p in problems:
        lines = p["answer"].split("\n")
        value = None
        for line in lines[:-1]:                      # recompute every worked step
            a, op, b, result = re.fullmatch(r"(\d+)([-+*/])(\d+)=(-?\d+)", line).groups()
            if op == "/":
                assert int(a) % int(b) == 0
            value = OPS[op](int(a), int(b))
            assert value == int(result) and value >= 0
        assert lines[-1] == f"#### {value}" and gold_answer(p["answer"]) == str(value)
        if level == 1:
            a, b = re.fullmatch(r"(\d+)[-+](\d+)=\d+", lines[0]).groups()
            assert sorted([int(a), int(b)]) == sorted(map(int, re.findall(r"\d+", p["question"])))
            assert 1 <= int(a) <= 9 and 1 <= int(b) <= 9 and len(p["question"]) <= 90


def test_synthetic_is_deterministic_and_seeds_differ():
    assert make_synthetic(50, 1, seed=3) == make_synthetic(50, 1, seed=3)
    assert make_synthetic(50, 1, seed=3) != make_synthetic(50, 1, seed=4)
    train = make_synthetic(500, 1, seed=0)
    held_out = make_synthetic(500, 1, seed=1, exclude={p["question"] for p in train})
    assert not {p["question"] for p in train} & {p["question"] for p in held_out}
    templates = {re.sub(r"\d+|Mia|Tom|Ava|Leo|Zoe|Sam|Ivy|Max|Eli|Ana|Ben|Kim", "", p["question"])
                 for p in train}
    assert len(templates) > 20                       # many sentence shapes, not one
    with pytest.raises(ValueError, match="level"):
        make_synthetic(5, level=4)


def test_level_12_alternates_one_step_and_two_step_problems():
    steps = [len(p["answer"].split("\n")) - 1 for p in make_synthetic(40, 12, seed=2)]
    assert steps == [1, 2] * 20


def test_render_prompt_uses_the_chat_template():
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast
    tok = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer(models.WordLevel({"<unk>": 0}, unk_token="<unk>")))
    tok.chat_template = ("{% for m in messages %}<{{ m.role }}>{{ m.content }}</{{ m.role }}>{% endfor %}"
                         "{% if add_generation_prompt %}<assistant>{% endif %}")
    text = render_prompt(tok, "What is 2+2?")
    assert text == f"<system>{SYSTEM_PROMPT}</system><user>What is 2+2?</user><assistant>"
    assert build_messages("q")[1] == {"role": "user", "content": "q"}
    assert "####" in SYSTEM_PROMPT


@pytest.mark.parametrize("level", [1, 2, 3])
def test_wordy_solution_is_the_same_solution_written_long(level):
    for p in make_synthetic(200, level, seed=5):
        w = wordy_solution(p)
        assert w["question"] == p["question"] and w["answer"].endswith(p["answer"])
        assert w["answer"].startswith("We start with ")
        assert gold_answer(w["answer"]) == gold_answer(p["answer"])
        assert correctness_reward(w["answer"], gold_answer(p["answer"])) == 1.0


def test_wordy_level1_solution_never_scores_when_cut_to_the_tiny_budget():
    # The tiny preset samples 20 new tokens (characters): the wordy style must then score 0,
    # never by luck (the cut text's last number is the first operand, never the answer).
    for p in make_synthetic(2000, 1, seed=6):
        cut = wordy_solution(p)["answer"][:20]
        assert "=" not in cut and correctness_reward(cut, gold_answer(p["answer"])) == 0.0


def test_wordy_solution_rejects_other_answers():
    with pytest.raises(ValueError, match="not a synthetic worked solution"):
        wordy_solution({"question": "q", "answer": "Natalia sold 48/2 = 24 clips.\n#### 72"})
