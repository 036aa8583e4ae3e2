"""Does TEPO's sequence ratio ever clip? One run, every ratio recorded.

    python -m experiments.benchmarks.tepo_clip  # smol, 15 steps, two updates per batch
    python -m experiments.benchmarks.tepo_clip --preset tiny --steps 3    # seconds

TEPO gives every token of sequence i one ratio, the geometric mean of its token ratios:
s_i = exp(mean_t log(pi / pi_old)). With one update per batch (the presets' default) the policy
that is scored is the one that sampled, so s_i is exactly 1 and no clip range ever acts. So this
runs train.py with ``--updates-per-batch 2`` (any other flag passes through) and records s_i for
every sequence of every update. It prints, per update, how far s moves from 1 and which share
of sequences each range would clip: TEPO's token-level 0.2, and the GSPO paper's 4e-4 / 3e-4
for a sequence-level ratio. Writes <out>/tepo_clip.json.
"""
import functools
import json
import sys
from pathlib import Path


import torch

import losses
import train

RANGES = [0.2, 0.05, 0.01, 4e-4, 3e-4]


def recording(loss_fn, calls):
    """loss_fn, also appending (log s_i, A_i) of each call's valid rows to the current step's list."""
    @functools.wraps(loss_fn)                # train.py reads the loss's default aggregation off its signature
    def wrapped(logp, old_logp, ref_logp, advantages, mask, entropy=None, **kw):
        log_s = losses.tepo_sequence_ratio(logp.detach(), old_logp, mask)[:, 0].log()
        valid = mask.sum(-1) > 0
        calls[-1].append((log_s[valid], advantages[valid].detach()))
        return loss_fn(logp, old_logp, ref_logp, advantages, mask, entropy, **kw)
    return wrapped


def starting_a_list(step_fn, calls):
    """step_fn, opening a new list in ``calls`` for the loss calls of each step."""
    def wrapped(*args, **kw):
        calls.append([])
        return step_fn(*args, **kw)
    return wrapped


def clipped_share(log_s, adv, eps):
    """Share of sequences whose surrogate takes the clipped, gradient-free branch at range eps."""
    _, clipped = losses.clipped_surrogate(log_s.exp(), adv, eps)
    return clipped.float().mean().item()


def summarise(calls, updates):
    """Per update u: |log s| quantiles and the clipped share at each range. A step's loss calls
    are its updates one after the other, each over the same micro-batches."""
    out = []
    for u in range(updates):
        mine = [c for step in calls for c in step[u * len(step) // updates:(u + 1) * len(step) // updates]]
        log_s, adv = torch.cat([c[0] for c in mine]), torch.cat([c[1] for c in mine])
        dev = log_s.abs()
        out.append(dict(update=u + 1, sequences=len(dev), max_abs_log_s=dev.max().item(),
                        median_abs_log_s=dev.median().item(), p90_abs_log_s=dev.quantile(0.9).item(),
                        clipped={str(e): clipped_share(log_s, adv, e) for e in RANGES}))
    return out


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--loss" in argv and argv[argv.index("--loss") + 1:][:1] != ["tepo"]:
        raise SystemExit("error: tepo_clip measures TEPO's clip of whole answers: --loss can only be tepo")
    defaults = {"--preset": "smol", "--updates-per-batch": "2", "--out": "runs/tepo-clip"}
    argv += [x for k, v in defaults.items() if k not in argv for x in (k, v)] + ["--loss", "tepo"]
    cfg = train.parse_config(argv)
    calls = []
    step_fn = train.grpo_step
    train.LOSSES["tepo"] = recording(losses.tepo_loss, calls)     # train.LOSSES is losses.LOSSES
    train.grpo_step = starting_a_list(step_fn, calls)
    try:
        rc = train.main(argv)
    finally:
        train.LOSSES["tepo"], train.grpo_step = losses.tepo_loss, step_fn
    result = dict(config=dict(preset=cfg.preset, steps=cfg.steps, updates_per_batch=cfg.updates_per_batch,
                              clip_eps=cfg.clip_eps, lr=cfg.lr, seed=cfg.seed),
                  updates=summarise(calls, cfg.updates_per_batch))
    Path(cfg.out, "tepo_clip.json").write_text(json.dumps(result, indent=2))
    print(f"\nTEPO's sequence ratio s over {len(calls)} steps, {cfg.updates_per_batch} updates per batch:")
    print("update | sequences | median |log s| | 90% |log s| | max |log s| | "
          "share clipped at " + " / ".join(map(str, RANGES)))
    for u in result["updates"]:
        print(f"{u['update']:>6} | {u['sequences']:>9} | {u['median_abs_log_s']:.2e} | "
              f"{u['p90_abs_log_s']:.2e} | {u['max_abs_log_s']:.2e} | "
              + " / ".join(f"{v:.3f}" for v in u["clipped"].values()))
    return rc


if __name__ == "__main__":
    sys.exit(main())
