"""Nothing lost, nothing half-written (issue 109): a run directory can be continued whatever
stopped the run (a crash before the first checkpoint, SIGTERM, a damaged checkpoint, a cut-off
log line); a damaged file gets one sentence naming it and what to do; every number in the config
is range-checked before anything is written."""
import dataclasses
import functools
import json
import math
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import data
import train
from engine import checkpoints, models
from losses import LOSSES

REPO = Path(__file__).resolve().parents[1]
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
# A run directory is always continuable

def test_a_run_that_crashed_before_its_first_checkpoint_continues_by_rerun_or_resume(tmp_path, warm,
                                                                                     monkeypatch, capsys):
    """config.json is written first; a crash before the first --ckpt-every checkpoint used to leave
    a directory that a re-run refused ("already holds a run") and --resume refused ("no
    checkpoint"). Now both start it again from step 0, and the log holds each step once."""
    args = ["--steps", "2", "--ckpt-every", "100", "--seed", "5"]
    assert run(args + ["--out", str(tmp_path / "a")], warm) == 0
    for flags in ([], ["--resume"]):
        out = tmp_path / f"b{len(flags)}"
        real = crash_at_call(monkeypatch, 2)
        with pytest.raises(RuntimeError, match="simulated crash"):
            run(args + ["--out", str(out)], warm)
        assert (out / "config.json").exists() and checkpoints.latest(out) is None
        assert steps_logged(out) == [1]
        monkeypatch.setattr(train, "grpo_step", real)
        assert run(args + ["--out", str(out)] + flags, warm) == 0
        assert "no checkpoint yet" in capsys.readouterr().out
        assert comparable(out) == comparable(tmp_path / "a")                  # as if never interrupted


def test_a_run_whose_checkpoints_were_deleted_is_not_started_over(tmp_path, warm):
    """As shipped in logs/: config.json and a finished log, no checkpoint. Starting it again from
    step 0 would replace the logs; it is refused, and nothing changes."""
    out = tmp_path / "run"
    assert run(["--out", str(out), "--steps", "2", "--ckpt-every", "1"], warm) == 0
    for gone in (out / "ckpt", out / "final"):
        shutil.rmtree(gone)
    before = (out / "metrics.jsonl").read_bytes()
    for flags in ([], ["--resume"]):
        with pytest.raises(SystemExit, match="logged past its first checkpoint, and no checkpoint"):
            run(["--out", str(out), "--steps", "2", "--ckpt-every", "1"] + flags, warm)
    assert (out / "metrics.jsonl").read_bytes() == before


def test_the_previous_checkpoint_is_kept_and_used_when_the_last_is_damaged(tmp_path, warm, capsys):
    out = tmp_path / "run"
    args = ["--ckpt-every", "1", "--seed", "6", "--out", str(out)]
    assert run(args + ["--steps", "3"], warm) == 0
    assert torch.load(out / "ckpt" / "prev.pt", weights_only=True)["step"] == 2
    assert torch.load(out / "ckpt" / "last.pt", weights_only=True)["step"] == 3
    last = (out / "ckpt" / "last.pt").read_bytes()
    (out / "ckpt" / "last.pt").write_bytes(last[:len(last) // 2])             # cut off
    assert run(args + ["--steps", "4", "--resume"], warm) == 0
    said = capsys.readouterr().out
    assert "cut off or corrupt" in said and "prev.pt (step 2)" in said and "weights_only" not in said
    assert steps_logged(out) == [1, 2, 3, 4]                                 # step 3 again, logged once
    assert torch.load(out / "ckpt" / "last.pt", weights_only=True)["step"] == 4
    assert torch.load(out / "ckpt" / "prev.pt", weights_only=True)["step"] == 3
    assert (out / "ckpt" / "last.pt.corrupt").read_bytes() == last[:len(last) // 2]
    assert not list((out / "ckpt").glob("*.tmp"))


def test_a_damaged_checkpoint_with_nothing_to_fall_back_to_is_one_sentence(tmp_path, warm):
    """Random bytes used to give torch's traceback, advising weights_only=False."""
    out = tmp_path / "run"
    assert run(["--out", str(out), "--steps", "1"], warm) == 0
    assert not (out / "ckpt" / "prev.pt").exists()
    (out / "ckpt" / "last.pt").write_bytes(os.urandom(4096))
    with pytest.raises(SystemExit) as e:
        run(["--out", str(out), "--steps", "2", "--resume"], warm)
    message = str(e.value.code)
    assert f"checkpoint {out}/ckpt/last.pt is cut off or corrupt" in message
    assert f"delete {out}/ckpt" in message
    assert "weights_only" not in message and "\n" not in message
    assert len((out / "ckpt" / "last.pt").read_bytes()) == 4096              # left for the user to see


@pytest.mark.parametrize("damage", [lambda b: b[:100], lambda b: b"", lambda b: os.urandom(len(b)),
                                    lambda b: None])
def test_load_checkpoint_reads_only_whole_checkpoints_and_never_unpickles_code(tmp_path, damage):
    path = tmp_path / "c.pt"
    torch.save(dict(model={}, optimizer={}, scheduler={}, step=1, config={}, rng={}), path)
    assert checkpoints.load_checkpoint(path)["step"] == 1
    if damage(b"") is None:                    # a whole file that is not a checkpoint (a plain object)
        torch.save(functools.partial(print, "code"), path)
    else:
        path.write_bytes(damage(path.read_bytes()))
    assert checkpoints.load_checkpoint(path) is None


@pytest.mark.parametrize("resume", [False, True])
def test_a_cut_off_config_json_is_one_sentence(tmp_path, warm, resume):
    """It used to be a raw JSONDecodeError."""
    out = tmp_path / "run"
    out.mkdir()
    (out / "config.json").write_text('{"preset": "tiny", "lo')
    with pytest.raises(SystemExit) as e:
        run(["--out", str(out), "--steps", "1"] + (["--resume"] if resume else []), warm)
    message = str(e.value.code)
    assert f"{out}/config.json is cut off or corrupt" in message and "delete it" in message
    assert "\n" not in message and "JSONDecodeError" not in message


def test_resume_of_a_directory_holding_no_run_says_so(tmp_path, warm):
    with pytest.raises(SystemExit, match="holds no run to continue; leave out --resume"):
        run(["--out", str(tmp_path / "typo"), "--steps", "1", "--resume"], warm)
    assert not (tmp_path / "typo").exists()


def test_non_finite_loss_before_any_checkpoint_names_none(tmp_path, warm, monkeypatch):
    """The error used to name ckpt/last.pt, which did not exist yet."""
    original = LOSSES["grpo"]

    @functools.wraps(original)
    def nan_loss(*a, **k):
        loss, info = original(*a, **k)
        return loss * float("nan"), info
    monkeypatch.setitem(LOSSES, "grpo", nan_loss)
    out = tmp_path / "run"
    with pytest.raises(SystemExit) as e:
        run(["--out", str(out), "--steps", "2"], warm)
    assert "non-finite" in str(e.value.code) and "last.pt" not in str(e.value.code)
    assert "none yet" in str(e.value.code)
    monkeypatch.setitem(LOSSES, "grpo", original)
    assert run(["--out", str(out), "--steps", "2"], warm) == 0                 # and the directory continues


def test_sigterm_is_handled_as_ctrl_c(tmp_path, warm, monkeypatch, capsys):
    """A scheduler's (or `kill`'s) SIGTERM finishes the step, saves a checkpoint and the logs, and
    exits 143; it used to kill the run where it stood."""
    args = ["--steps", "3", "--ckpt-every", "100", "--seed", "7"]
    assert run(args + ["--out", str(tmp_path / "a")], warm) == 0
    real, calls = train.grpo_step, {"n": 0}

    def sigterm_during_step_2(*a, **k):
        calls["n"] += 1
        if calls["n"] == 2:
            os.kill(os.getpid(), signal.SIGTERM)
        return real(*a, **k)
    monkeypatch.setattr(train, "grpo_step", sigterm_during_step_2)
    previous = signal.getsignal(signal.SIGTERM)
    assert run(args + ["--out", str(tmp_path / "b")], warm) == 143
    assert signal.getsignal(signal.SIGTERM) == previous                       # restored
    assert "SIGTERM" in capsys.readouterr().out
    assert torch.load(tmp_path / "b" / "ckpt" / "last.pt", weights_only=True)["step"] == 2
    monkeypatch.setattr(train, "grpo_step", real)
    assert run(args + ["--out", str(tmp_path / "b"), "--resume"], warm) == 0
    assert comparable(tmp_path / "a") == comparable(tmp_path / "b")


def test_a_data_error_leaves_no_run_directory(tmp_path, warm):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(FIXTURE.read_text().splitlines()[0] + "\n{not json\n")
    out = tmp_path / "run"
    with pytest.raises(SystemExit, match=r"bad.jsonl, line 2"):
        run(["--out", str(out), "--data", str(bad)], warm)
    assert not out.exists()


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


# ----------------------------------------------------------------------------------------
# The log reader drops only a cut-off last line

def write_log(path, lines):
    path.write_text("".join(line + "\n" for line in lines))


def test_a_bad_line_in_the_middle_of_a_log_is_an_error_naming_it(tmp_path):
    """--resume used to delete every unparsable line silently."""
    path = tmp_path / "metrics.jsonl"
    lines = ['{"step": 0, "eval_accuracy": 0.1}', '{"step": 1, "lo', '{"step": 2, "loss": 0.5}']
    write_log(path, lines)
    before = path.read_bytes()
    with pytest.raises(SystemExit, match=rf"{path}, line 2 is not a JSON log line"):
        checkpoints.truncate_log(path, 2)
    write_log(path, [lines[0], '{"loss": 1}', lines[2]])
    with pytest.raises(SystemExit, match=rf"{path}, line 2 has no numeric step"):
        checkpoints.truncate_log(path, 2)
    write_log(path, [lines[0], '{"step": "<img>"}', lines[2]])
    with pytest.raises(SystemExit, match=rf"{path}, line 2 has no numeric step"):
        checkpoints.truncate_log(path, 2)
    write_log(path, lines)
    assert path.read_bytes() == before                                        # left as it was


def test_a_cut_off_last_line_is_dropped_and_said(tmp_path, capsys):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1, "loss": 0.5}\n{"step": 2, "loss": 0.4}\n{"step": 3, "lo')
    checkpoints.truncate_log(path, 2)
    assert path.read_text() == '{"step": 1, "loss": 0.5}\n{"step": 2, "loss": 0.4}\n'
    assert "dropped its cut-off last line (line 3)" in capsys.readouterr().out
    path.write_bytes(b'{"step": 1, "loss": 0.5}\n\xff\xfe{"step"')                # not even UTF-8
    checkpoints.truncate_log(path, 2)
    assert path.read_text() == '{"step": 1, "loss": 0.5}\n'


def test_a_crash_while_the_log_is_rewritten_leaves_it_whole(tmp_path, monkeypatch):
    path = tmp_path / "metrics.jsonl"
    write_log(path, ['{"step": 1, "loss": 0.5}', '{"step": 2, "loss": 0.4}', '{"step": 3, "loss": 0.3}'])
    before = path.read_bytes()

    def disk_full(self, text, **kwargs):          # half written, then the write fails
        open(self, "w").write(text[:len(text) // 2])
        raise OSError("No space left on device")
    monkeypatch.setattr(Path, "write_text", disk_full)
    with pytest.raises(OSError):
        checkpoints.truncate_log(path, 2)
    assert path.read_bytes() == before


def test_the_checkpoints_own_step_is_relogged_when_its_line_was_cut_off(tmp_path, warm, capsys):
    """The checkpoint carries its step's own log lines: a resume restores them when the log lost
    them, and a cut-off line of that step no longer leaves it missing for good."""
    out = tmp_path / "run"
    args = ["--out", str(out), "--steps", "2", "--ckpt-every", "1"]
    assert run(args, warm) == 0
    metrics, samples = (out / "metrics.jsonl").read_text(), (out / "samples.jsonl").read_text()
    lines = metrics.splitlines()
    assert [line["step"] for line in map(json.loads, lines[-2:])] == [2, 2]     # the step, its evaluation
    (out / "metrics.jsonl").write_text("\n".join(lines[:-2] + [lines[-2][:30]]))   # cut off inside step 2
    (out / "samples.jsonl").write_text(samples[:-40])
    assert run(args + ["--resume"], warm) == 0                                # nothing left to train
    assert "cut-off last line" in capsys.readouterr().out
    assert (out / "metrics.jsonl").read_text() == metrics                     # step 2 whole again
    assert (out / "samples.jsonl").read_text() == samples


# ----------------------------------------------------------------------------------------
# The same, from outside: a real process, a real signal, what the user reads

def test_a_process_sent_sigterm_keeps_its_checkpoint_and_a_damaged_one_reads_as_one_line(tmp_path, warm):
    out = tmp_path / "run"
    args = [sys.executable, "train.py", *FAST, "--init", warm, "--out", str(out), "--steps", "500",
            "--ckpt-every", "1000", "--threads", "1"]
    with open(tmp_path / "stderr", "w+") as err:   # a file: tqdm's bar never fills a pipe nobody reads
        p = subprocess.Popen(args, cwd=REPO, stdout=subprocess.PIPE, stderr=err, text=True)
        for line in p.stdout:                  # the first step's sample is printed: training is under way
            if line.startswith("--- step 1 sample"):
                p.send_signal(signal.SIGTERM)
                break
        stdout = p.communicate(timeout=600)[0]
    stderr = (tmp_path / "stderr").read_text()
    assert p.returncode == 143, stderr[-2000:]
    assert "SIGTERM" in stdout and "--resume" in stdout and "Traceback" not in stderr
    step = torch.load(out / "ckpt" / "last.pt", weights_only=True)["step"]
    assert 1 <= step < 500 and steps_logged(out) == list(range(1, step + 1))
    (out / "ckpt" / "last.pt").write_bytes(os.urandom(4096))
    p = subprocess.run(args + ["--resume"], cwd=REPO, capture_output=True, text=True, timeout=600)
    assert p.returncode == 1 and "Traceback" not in p.stderr and "weights_only" not in p.stderr
    last = p.stderr.strip().splitlines()[-1]
    assert last.startswith(f"error: the checkpoint {out}/ckpt/last.pt is cut off")
