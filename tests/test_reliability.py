"""Nothing lost, nothing half-written (issue 109): a run directory can be continued whatever
stopped the run (a crash before the first checkpoint, SIGTERM, a damaged checkpoint, a cut-off
log line); a damaged file gets one sentence naming it and what to do; every number in the config
is range-checked before anything is written."""
import dataclasses
import json
import math
from pathlib import Path

import pytest

import data
import train
from engine import checkpoints, models

FIXTURE = Path(__file__).parent / "fixtures" / "tiny_gsm8k.jsonl"
FAST = ["--preset", "tiny", "--sft-steps", "30", "--eval-n", "40", "--eval-batch", "40",
        "--prompts-per-step", "4", "--group-size", "4", "--micro-batch", "16", "--max-new-tokens", "16",
        "--eval-every", "0", "--sample-every", "1"]


@pytest.fixture(scope="module")
def warm(warm_starts):
    """The tiny warm start test_train.py uses (built once per session, tests/conftest.py)."""
    return models.warm_start(train.parse_config(FAST + ["--out", str(warm_starts / "x")]))


def run(args, warm):
    return train.main(FAST + ["--init", warm] + args)


def read(path):
    return [json.loads(line) for line in Path(path).read_text().splitlines()]


def steps_logged(out):
    return [line["step"] for line in read(out / "metrics.jsonl") if "loss" in line]


def crash_at_call(monkeypatch, n):
    """grpo_step raises on its n-th call (steps before it run and are logged)."""
    real, calls = train.grpo_step, {"n": 0}

    def crashing(*a, **k):
        calls["n"] += 1
        if calls["n"] == n:
            raise RuntimeError("simulated crash")
        return real(*a, **k)
    monkeypatch.setattr(train, "grpo_step", crashing)
    return real


def comparable(out):
    """What each line of the log says happened (the timings differ from run to run)."""
    keys = ("step", "loss", "reward", "accuracy", "eval_accuracy")
    return [tuple(line.get(k) for k in keys) for line in read(out / "metrics.jsonl")]


# ----------------------------------------------------------------------------------------
# Every number is range-checked before anything is written

NUMERIC = [f.name for f in dataclasses.fields(train.Config) if f.type in (int, float, "int", "float")]


def test_every_number_in_the_config_has_a_range():
    named = [name for names in train.RANGES.values() for name in names]
    assert sorted(named) == sorted(NUMERIC)                   # each once, and none left out
    assert not checkpoints.out_of_range(train.Config(), train.RANGES)
    for preset in train.PRESETS:                             # the shipped values are all in range
        assert not checkpoints.out_of_range(train.parse_config(["--preset", preset]), train.RANGES), preset


@pytest.mark.parametrize("level", [1, 2, 3, 12])
def test_every_level_allowed_is_one_data_makes(level):
    assert train.parse_config(["--level", str(level)]).level == level
    assert len(data.make_synthetic(3, level=level)) == 3


@pytest.mark.parametrize("args,message", [
    (["--max-grad-norm", "-1"], "--max-grad-norm must be > 0, got -1.0"),      # flipped the gradient
    (["--max-grad-norm", "0"], "--max-grad-norm must be > 0"),
    (["--lr", "-1"], "--lr must be > 0"),
    (["--lr", "nan"], "--lr must be > 0, got nan"),
    (["--beta", "-0.1"], "--beta must be >= 0"),
    (["--beta", "inf"], "--beta must be >= 0, got inf"),
    (["--clip-eps", "-0.2"], "--clip-eps must be > 0"),
    (["--temperature", "nan"], "--temperature must be > 0"),
    (["--weight-decay", "-1"], "--weight-decay must be >= 0"),
    (["--eval-n", "-1"], "--eval-n must be >= 0"),
    (["--prompts-per-step", "0"], "--prompts-per-step must be >= 1"),
    (["--eval-batch", "0"], "--eval-batch must be >= 1"),
    (["--micro-batch", "0"], "--micro-batch must be >= 1"),
    (["--level", "5"], "--level must be one of 1, 2, 3, 12"),
    (["--group-size", "1"], "--group-size must be >= 2"),
    (["--sft-steps", "0"], "--sft-steps must be >= 1"),
    (["--sft-wordy", "1.5"], "--sft-wordy must be >= 0 and <= 1"),
    (["--sft-batch", "0"], "--sft-batch must be >= 1 and <= 20000"),
    (["--seed", "-1"], "--seed must be >= 0"),
    (["--threads", "-2"], "--threads must be >= 0"),
    (["--lora-rank", "-4"], "--lora-rank must be >= 0"),
    (["--pass-k", "0"], "--pass-k must be >= 1"),
    (["--lr", "-1", "--beta", "-1"], "--beta must be >= 0, got -1.0; --lr must be > 0, got -1.0"),
])
def test_a_number_out_of_range_stops_before_anything_is_written(tmp_path, args, message, capsys):
    out = tmp_path / "run"
    with pytest.raises(SystemExit) as e:
        train.main(FAST + ["--out", str(out), "--steps", "0"] + args)       # (were it accepted: no training)
    assert e.value.code == 2 and message in capsys.readouterr().err           # argparse's usage error
    assert not out.exists()


def test_the_edges_of_the_ranges_are_accepted():
    cfg = train.parse_config(FAST + ["--beta", "0", "--eval-n", "0", "--steps", "0", "--seed", "0",
                                     "--sft-wordy", "1", "--weight-decay", "0", "--group-size", "2",
                                     "--micro-batch", "8"])
    assert (cfg.beta, cfg.eval_n, cfg.steps, cfg.sft_wordy, cfg.group_size) == (0, 0, 0, 1, 2)
    assert not checkpoints.within(math.inf, ">= 0") and not checkpoints.within(math.nan, "> 0")
