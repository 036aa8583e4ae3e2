"""checkpoints.py — what a run leaves on disk, written so that a crash or Ctrl-C loses at most
the current step, and a resumed run continues exactly where the checkpoint left it.

A run directory holds config.json, metrics.jsonl and samples.jsonl (one JSON object per line,
flushed at once), ckpt/last.pt (weights, optimizer, scheduler, fp16's loss scale, step, every
random state and the step's own log lines), ckpt/prev.pt (the one before, until the next is safely
written) and, at the end, final/ (a plain save_pretrained directory). Whatever stops a run (a
crash, Ctrl-C, SIGTERM, a kill), the directory can be continued: --resume, or before the first
checkpoint the same command again. Nothing is written before the config's numbers are checked
against train.RANGES (out_of_range) and the data and the model have loaded.
"""
import contextlib
import dataclasses
import json
import math
import os
import random
import shutil
import signal
from pathlib import Path

import torch

from engine import models
from engine.sampling import generation_config

# Fields that may differ when resuming (everything else must match the checkpoint's config).
RESUMABLE = {"resume", "steps", "eval_every", "eval_n", "eval_batch", "sample_every", "ckpt_every",
             "device", "threads", "out", "micro_batch", "warmup_only", "share_prompts", "pass_k", "pass_n",
             "machine"}


def prepare_run_dir(cfg):
    """Check the run directory, writing nothing (bad input leaves no trace). A new directory starts
    a run; one with a checkpoint continues only with --resume and the same config; one whose run
    stopped before its first checkpoint (config.json, logs, no checkpoint) starts again from step
    0 with or without --resume, as long as the config is the same. One whose logs go past its
    first checkpoint but whose checkpoints are gone (a run as shipped in logs/) is refused: starting
    it again would replace those logs."""
    run = Path(cfg.out)
    saved = read_config(run / "config.json")
    if latest(run) is None and (past_first_checkpoint(run, saved or dataclasses.asdict(cfg))
                                or (run / "final").exists()):
        raise SystemExit(f"error: {run} holds a run logged past its first checkpoint, and no checkpoint "
                         "(were they deleted?); it cannot be continued: choose another --out.")
    differs = config_changes(saved, cfg) if saved is not None else {}
    if differs and not (cfg.resume and latest(run)):     # (resume() compares with the checkpoint's own)
        raise SystemExit(f"error: {run} already holds a run with a different config ({describe(differs)}). "
                         "Continue it with the same flags, or choose another --out.")
    if latest(run) is not None and not cfg.resume:
        raise SystemExit(f"error: {run} already holds a run. Pass --resume to continue it, or choose another "
                         "--out.")
    if cfg.resume and saved is None and latest(run) is None and not any(map(Path.exists, logs_of(run))):
        raise SystemExit(f"error: --resume but {run} holds no run to continue; leave out --resume to start "
                         "it.")
    return run


def past_first_checkpoint(run, config):
    """Whether metrics.jsonl logs a step after the run's first checkpoint (the log a run that
    stopped before it cannot hold). Unreadable lines are left to truncate_log."""
    every, steps = config.get("ckpt_every", 0), config.get("steps", 0)
    first = min(every, steps) if every else steps
    path = run / "metrics.jsonl"
    for line in path.read_bytes().splitlines() if path.exists() else []:
        with contextlib.suppress(ValueError, KeyError, TypeError, IndexError):
            if json.loads(line)["step"] > first:
                return True
    return False


def out_of_range(cfg, ranges):
    """A message for each number of ``cfg`` outside its range (train.RANGES: {rule: field names})."""
    return [f"--{name.replace('_', '-')} must be {rule}, got {getattr(cfg, name)}"
            for rule, names in ranges.items() for name in names if not within(getattr(cfg, name), rule)]


def within(value, rule):
    """Whether a number is finite and obeys a rule: "> 0", ">= 0 and <= 1", "one of 1, 2, 3"."""
    if rule.startswith("one of "):
        return value in [int(v) for v in rule.removeprefix("one of ").split(",")]
    compare = {">=": float.__ge__, ">": float.__gt__, "<=": float.__le__, "<": float.__lt__}
    return math.isfinite(value) and all(compare[op](float(value), float(bound))
                                        for op, bound in map(str.split, rule.split(" and ")))


def read_config(path):
    """The saved config.json as a dict (None if there is none); a cut-off or corrupt one stops
    the run with a sentence saying what to do, not a traceback."""
    if not path.exists():
        return None
    try:
        saved = json.loads(path.read_text(encoding="utf-8"))
        if isinstance(saved, dict):
            return saved
    except (ValueError, OSError):          # JSONDecodeError and UnicodeDecodeError are ValueErrors
        pass
    raise SystemExit(f"error: {path} is cut off or corrupt (not a JSON config); delete it and run the same "
                     "command again (with --resume if the run has a checkpoint, which holds the config), or "
                     "choose another --out.")


def write_config(run, cfg, start, machine):
    """config.json: the resolved config, and under "machine" the machines the run ran on: an entry
    (with the step it went on from) each time it starts on a machine unlike the last one's.
    Written atomically, so a crash never leaves half a config."""
    path, history = run / "config.json", []
    if start:
        history = (read_config(path) or {}).get("machine", [])
    if not history or {k: v for k, v in history[-1].items() if k != "from_step"} != machine:
        history.append({**machine, "from_step": start})
    run.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps({**dataclasses.asdict(cfg), "machine": history}, indent=2), encoding="utf-8")
    os.replace(tmp, path)


def config_changes(saved, cfg):
    """{field: (saved value, current value)} for every non-resumable field that differs. A field
    the saved config lacks (it was added later) counts as its default."""
    now, default = dataclasses.asdict(cfg), dataclasses.asdict(type(cfg)())
    saved = {**{k: v for k, v in default.items() if k not in saved}, **saved}
    return {k: (saved.get(k), now.get(k)) for k in sorted(saved.keys() | now.keys())
            if k not in RESUMABLE and saved.get(k) != now.get(k)}


def describe(changes):
    return ", ".join(f"{k}={a!r} there vs {b!r} now" for k, (a, b) in changes.items())


def logs_of(run):
    return run / "metrics.jsonl", run / "samples.jsonl"


def latest(run):
    """The newest checkpoint on disk (ckpt/last.pt, else ckpt/prev.pt), or None."""
    return next((p for p in (run / "ckpt" / "last.pt", run / "ckpt" / "prev.pt") if p.exists()), None)


def save_checkpoint(run, policy, optimizer, scheduler, scaler, step, cfg, logs=()):
    """ckpt/last.pt, written atomically; the one it replaces stays as ckpt/prev.pt, so a checkpoint
    damaged later still leaves one to fall back to. ``logs`` (the Log objects) put this step's own
    log lines in the checkpoint too: a resume restores them if the log lost them."""
    state = dict(model=policy.state_dict(), optimizer=optimizer.state_dict(),
                 scheduler=scheduler.state_dict(), scaler=scaler.state_dict(),
                 step=step, data_position=step * cfg.prompts_per_step, config=dataclasses.asdict(cfg),
                 rng=dict(python=random.getstate(), torch=torch.get_rng_state(),
                          cuda=torch.cuda.get_rng_state_all() if torch.cuda.is_available() else []),
                 logs={log.path.name: log.lines_of(step) for log in logs})
    ckpt = run / "ckpt"
    ckpt.mkdir(parents=True, exist_ok=True)
    tmp = ckpt / "last.pt.tmp"
    with open(tmp, "wb") as f:
        torch.save(state, f)
        f.flush()
        os.fsync(f.fileno())           # on disk before it takes the name
    if (ckpt / "last.pt").exists():
        link_or_copy(ckpt / "last.pt", ckpt / "prev.pt")
    os.replace(tmp, ckpt / "last.pt")  # atomic: last.pt is always a whole checkpoint


def link_or_copy(src, dst):
    """dst becomes src's content, atomically: a hard link (free), or a copy where links fail."""
    tmp = dst.with_name(dst.name + ".tmp")
    tmp.unlink(missing_ok=True)
    try:
        os.link(src, tmp)
    except OSError:
        shutil.copyfile(src, tmp)
    os.replace(tmp, dst)
    tmp.unlink(missing_ok=True)        # rename() between two links of one file does nothing


KEYS = {"model", "optimizer", "scheduler", "step", "config", "rng"}


def load_checkpoint(path):
    """The checkpoint's state, or None if the file is cut off or corrupt (weights_only, always)."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception:                  # torch raises many kinds, and its message suggests weights_only=False
        return None
    return state if isinstance(state, dict) and KEYS <= state.keys() else None


def resume(run, policy, optimizer, scheduler, scaler, cfg):
    """Load the newest readable checkpoint (refusing one written with another config), drop the
    log lines written after it, and return its step. A run that stopped before its first
    checkpoint starts again: its logs are removed and the step is 0."""
    path = latest(run)
    if path is None:
        stale = [p for p in logs_of(run) if p.exists()]
        for p in stale:
            p.unlink()
        if stale:
            print(f"{run} has no checkpoint yet (the run stopped before its first): starting it again "
                  "from step 0")
        return 0
    state = load_checkpoint(path)
    if state is None and path.name == "last.pt" and (run / "ckpt" / "prev.pt").exists():
        state = load_checkpoint(run / "ckpt" / "prev.pt")
        if state is not None:
            print(f"{path} is cut off or corrupt: resuming from the previous checkpoint, ckpt/prev.pt "
                  f"(step {state['step']}); the damaged file is kept as last.pt.corrupt")
            os.replace(path, path.with_name("last.pt.corrupt"))
            link_or_copy(run / "ckpt" / "prev.pt", path)
    if state is None:
        raise SystemExit(f"error: the checkpoint {path} is cut off or corrupt and there is no readable "
                         f"earlier one; delete {run / 'ckpt'} to start this run again from step 0, or "
                         "choose another --out.")
    differs = config_changes(state["config"], cfg)
    if differs:
        raise SystemExit(f"error: {path} was written with another config: {describe(differs)}")
    policy.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    if state.get("scaler"):            # fp16's loss scale ({} from a run without one)
        scaler.load_state_dict(state["scaler"])
    random.setstate(state["rng"]["python"])
    torch.set_rng_state(state["rng"]["torch"])
    if state["rng"]["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["rng"]["cuda"])
    for log in logs_of(run):
        truncate_log(log, state["step"], state.get("logs", {}).get(log.name))
    print(f"resumed {run} at step {state['step']}")
    return state["step"]


def truncate_log(path, last_step, own_lines=None):
    """Drop the lines logged after the checkpoint, so a resumed run logs every step exactly once.
    A cut-off last line (a write the crash interrupted) is dropped, and said so; an unreadable
    line anywhere else is an error naming it. ``own_lines``, the checkpoint's copy of its own
    step's lines, replaces that step's lines in the log (the same bytes, unless the log lost them)."""
    if not path.exists():
        return
    lines = path.read_bytes().split(b"\n")
    if lines[-1] == b"":
        lines.pop()                    # the newline that ends the file
    keep = []
    for number, line in enumerate(lines, 1):
        try:
            text = line.decode("utf-8")
            if not text.strip():
                continue               # an empty line holds nothing to lose
            step = json.loads(text)["step"]
            logged_before = step < last_step if own_lines is not None else step <= last_step
        except ValueError:             # cut off, or not JSON at all (JSONDecodeError, UnicodeDecodeError)
            if number == len(lines):
                print(f"{path}: dropped its cut-off last line (line {number})")
                continue
            raise SystemExit(f"error: {path}, line {number} is not a JSON log line; repair or delete that "
                             "line, then run again with --resume.") from None
        except (KeyError, TypeError, IndexError):
            raise SystemExit(f"error: {path}, line {number} has no numeric step; repair or delete that line, "
                             "then run again with --resume.") from None
        if logged_before:
            keep.append(text)
    if own_lines is not None:
        keep += own_lines
    tmp = path.with_name(path.name + ".tmp")           # a crash while rewriting leaves the log whole
    tmp.write_text("".join(line + "\n" for line in keep), encoding="utf-8")
    os.replace(tmp, path)


def save_final(path, policy, tok, cfg):
    """The trained policy as a plain save_pretrained directory (model + tokenizer): it loads
    with AutoModelForCausalLM.from_pretrained, TRL or vLLM unchanged (LoRA runs: the adapters,
    which transformers loads on top of the base with peft installed). Its generation config
    is greedy decoding with every knob written out, not our sampling settings."""
    policy.generation_config = generation_config(policy, tok, cfg, greedy=True)
    models.save_atomically(path, policy, tok, overwrite=True)


class Log:
    """metrics.jsonl / samples.jsonl: one JSON object per line, flushed at once. It remembers the
    lines of the latest step, for the checkpoint of that step (save_checkpoint)."""
    def __init__(self, path):
        self.path, self.recent = Path(path), []
        self.f = open(path, "a", encoding="utf-8")

    def write(self, **record):
        line = json.dumps(record)
        self.f.write(line + "\n")
        self.f.flush()
        self.recent = [(s, text) for s, text in self.recent if s == record["step"]] + [(record["step"], line)]

    def lines_of(self, step):
        return [line for s, line in self.recent if s == step]


SIGNALS = {signal.SIGINT: "Ctrl-C", signal.SIGTERM: "SIGTERM"}


@contextlib.contextmanager
def ctrl_c_stops_after_the_step():
    """Inside, a first Ctrl-C (or SIGTERM, as a scheduler or `kill` sends) only sets
    ``stop["requested"]`` to the signal's number (the loop finishes its step, saves a checkpoint
    and exits with 128 + it); a second one aborts at once. The previous handlers are restored on exit."""
    stop = {"requested": 0}

    def on_signal(signum, frame):
        if stop["requested"]:
            raise KeyboardInterrupt
        stop["requested"] = signum
        print(f"\n{SIGNALS[signum]}: stopping after this step and saving a checkpoint (again to abort now).")
    previous = {sig: signal.signal(sig, on_signal) for sig in SIGNALS}
    try:
        yield stop
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
