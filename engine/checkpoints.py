"""checkpoints.py — what a run leaves on disk, written so that a crash or Ctrl-C loses at most
the current step, and a resumed run continues exactly where the checkpoint left it.

A run directory holds config.json, metrics.jsonl and samples.jsonl (one JSON object per line,
flushed at once), ckpt/last.pt (weights, optimizer, scheduler, fp16's loss scale, step and
every random state) and, at the end, final/ (a plain save_pretrained directory).
"""
import contextlib
import dataclasses
import json
import math
import os
import random
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
    """Refuse to overwrite: an existing run continues only with --resume and the same config."""
    run = Path(cfg.out)
    saved = run / "config.json"
    if saved.exists() and not cfg.resume:
        same = not config_changes(json.loads(saved.read_text()), cfg)
        raise SystemExit(f"error: {run} already holds a run" + ("" if same else " with a different config")
                         + ". Pass --resume to continue it, or choose another --out.")
    if cfg.resume and not (run / "ckpt" / "last.pt").exists():
        raise SystemExit(f"error: --resume but there is no checkpoint at {run}/ckpt/last.pt")
    run.mkdir(parents=True, exist_ok=True)
    return run


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


def write_config(run, cfg, start, machine):
    """config.json: the resolved config, and under "machine" the machines the run ran on: an entry
    (with the step it went on from) each time it starts on a machine unlike the last one's."""
    path, history = run / "config.json", []
    if start and path.exists():
        history = json.loads(path.read_text()).get("machine", [])
    if not history or {k: v for k, v in history[-1].items() if k != "from_step"} != machine:
        history.append({**machine, "from_step": start})
    path.write_text(json.dumps({**dataclasses.asdict(cfg), "machine": history}, indent=2))


def config_changes(saved, cfg):
    """{field: (saved value, current value)} for every non-resumable field that differs. A field
    the saved config lacks (it was added later) counts as its default."""
    now, default = dataclasses.asdict(cfg), dataclasses.asdict(type(cfg)())
    saved = {**{k: v for k, v in default.items() if k not in saved}, **saved}
    return {k: (saved.get(k), now.get(k)) for k in sorted(saved.keys() | now.keys())
            if k not in RESUMABLE and saved.get(k) != now.get(k)}


def save_checkpoint(run, policy, optimizer, scheduler, scaler, step, cfg):
    state = dict(model=policy.state_dict(), optimizer=optimizer.state_dict(),
                 scheduler=scheduler.state_dict(), scaler=scaler.state_dict(),
                 step=step, data_position=step * cfg.prompts_per_step, config=dataclasses.asdict(cfg),
                 rng=dict(python=random.getstate(), torch=torch.get_rng_state(),
                          cuda=torch.cuda.get_rng_state_all() if torch.cuda.is_available() else []))
    (run / "ckpt").mkdir(exist_ok=True)
    tmp = run / "ckpt" / "last.pt.tmp"
    torch.save(state, tmp)
    os.replace(tmp, run / "ckpt" / "last.pt")          # atomic: the old checkpoint survives a crash


def resume(run, policy, optimizer, scheduler, scaler, cfg):
    """Load ckpt/last.pt (refusing one written with another config), drop the log lines written
    after it, and return its step."""
    state = torch.load(run / "ckpt" / "last.pt", map_location="cpu", weights_only=True)
    differs = config_changes(state["config"], cfg)
    if differs:
        raise SystemExit(f"error: {run}/ckpt/last.pt was written with another config: "
                         + ", ".join(f"{k}={a!r} there vs {b!r} now" for k, (a, b) in differs.items()))
    policy.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    if state.get("scaler"):            # fp16's loss scale ({} from a run without one)
        scaler.load_state_dict(state["scaler"])
    random.setstate(state["rng"]["python"])
    torch.set_rng_state(state["rng"]["torch"])
    if state["rng"]["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["rng"]["cuda"])
    for name in ("metrics.jsonl", "samples.jsonl"):
        truncate_log(run / name, state["step"])
    print(f"resumed {run} at step {state['step']}")
    return state["step"]


def truncate_log(path, last_step):
    """Drop lines logged after the checkpoint (and a half-written last line), so a resumed
    run logs every step exactly once."""
    if not path.exists():
        return
    keep = []
    for line in path.read_text().splitlines():
        try:
            if json.loads(line)["step"] <= last_step:
                keep.append(line)
        except (json.JSONDecodeError, KeyError):
            pass
    path.write_text("".join(line + "\n" for line in keep))


def save_final(path, policy, tok, cfg):
    """The trained policy as a plain save_pretrained directory (model + tokenizer): it loads
    with AutoModelForCausalLM.from_pretrained, TRL or vLLM unchanged (LoRA runs: the adapters,
    which transformers loads on top of the base with peft installed). Its generation config
    is greedy decoding with every knob written out, not our sampling settings."""
    policy.generation_config = generation_config(policy, tok, cfg, greedy=True)
    models.save_atomically(path, policy, tok, overwrite=True)


class Log:
    """metrics.jsonl / samples.jsonl: one JSON object per line, flushed at once."""
    def __init__(self, path):
        self.f = open(path, "a", encoding="utf-8")

    def write(self, **record):
        self.f.write(json.dumps(record) + "\n")
        self.f.flush()


@contextlib.contextmanager
def ctrl_c_stops_after_the_step():
    """Inside, a first Ctrl-C only sets ``stop["requested"]`` (the loop finishes its step, saves a
    checkpoint and exits); a second one aborts at once. The previous handler is restored on exit."""
    stop = {"requested": False}

    def on_sigint(signum, frame):
        if stop["requested"]:
            raise KeyboardInterrupt
        stop["requested"] = True
        print("\nCtrl-C: stopping after this step and saving a checkpoint (Ctrl-C again to abort now).")
    previous_handler = signal.signal(signal.SIGINT, on_sigint)
    try:
        yield stop
    finally:
        signal.signal(signal.SIGINT, previous_handler)
