"""Which of TEPO's two parts lowers its entropy? TEPO with one part put back to GRPO's.

    python -m experiments.benchmarks.tepo_parts --swap ratio --preset tiny --steps 3      # seconds
    python -m experiments.benchmarks.tepo_parts --swap ratio --preset smol-long --steps 3 \\
        --eval-n 1 --eval-batch 1
    python -m experiments.benchmarks.tepo_parts --swap kl --preset smol-long --steps 3 \\
        --eval-n 1 --eval-batch 1

(The two smol-long runs: about half an hour on 2 CPU cores, side by side with --threads 1 each.)

Under the same aggregation (token-mean), TEPO differs from GRPO in two parts. (1) Every token of
sequence i carries the sequence's ratio s_i, the geometric mean of its token ratios, so the clip
acts on the sequence as a whole. (2) The KL to the reference is kept only on the masked tokens
(positive advantage, entropy-lowering). ``--swap ratio`` gives each token its own ratio
pi / pi_old back and keeps the mask; ``--swap kl`` puts the KL back on every token and keeps
the sequence ratio. Each runs train.py with ``--loss tepo`` and that one line changed; every
other flag passes through, and the run's metrics.jsonl is train.py's own. docs/LOG.md has what
the runs showed on three seeds, against TEPO and GRPO.
"""
import argparse
import sys


import torch

import losses
import train
from losses import _info, _kl_term, _log_ratio, aggregate, clipped_surrogate

SWAPS = ("ratio", "kl")


def tepo_with(swap):
    """losses.tepo_loss with one of its parts swapped for GRPO's (see the module docstring)."""
    if swap not in SWAPS:
        raise ValueError(f"--swap must be one of {SWAPS}, got {swap!r}")

    def tepo_swapped(logp, old_logp, ref_logp, advantages, mask, entropy=None, *,
                     clip_eps=0.2, beta=0.04, agg="token-mean", max_tokens=None):
        if swap == "ratio":
            ratio = torch.exp(_log_ratio(logp, old_logp, mask))                     # <- GRPO's
        else:
            ratio = losses.tepo_sequence_ratio(logp, old_logp, mask)
        surrogate, clipped = clipped_surrogate(ratio, advantages[:, None], clip_eps)
        if swap == "kl":
            kl_mask = mask.to(logp.dtype)                                            # <- every token
        else:
            kl_mask = losses.tepo_kl_mask(logp, entropy, advantages, mask)
        kl = _kl_term(logp, ref_logp, mask, beta)
        loss = -aggregate(surrogate - beta * kl_mask * kl, mask, agg, max_tokens)
        return loss, _info(mask, torch.ones_like(logp), ratio, clipped, kl, kl_mask=kl_mask)
    return tepo_swapped


def main(argv=None):
    parser = argparse.ArgumentParser(description="TEPO with one part swapped for GRPO's; "
                                     "every other flag goes to train.py")
    parser.add_argument("--swap", choices=SWAPS, required=True)
    args, argv = parser.parse_known_args(sys.argv[1:] if argv is None else argv)
    if "--out" not in argv:
        argv += ["--out", f"runs/tepo-swap-{args.swap}"]
    train.LOSSES["tepo"] = tepo_with(args.swap)             # train.LOSSES is losses.LOSSES
    try:
        return train.main(argv + ["--loss", "tepo"])
    finally:
        train.LOSSES["tepo"] = losses.tepo_loss


if __name__ == "__main__":
    sys.exit(main())
