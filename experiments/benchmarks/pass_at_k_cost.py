"""What pass@k adds to a run: train.py's own evaluation, pass@k and training steps, timed apart.

    # smol-active as the evidence runs use it (one thread; about 6 minutes on a quiet machine)
    python -m experiments.benchmarks.pass_at_k_cost --preset smol-active --threads 1

A run evaluates twice (step 0 and the last step) and, with ``--pass-n``, measures pass@k at both;
between them it takes ``--steps`` training steps. This times, at the untouched model, one
held-out evaluation (greedy, ``--eval-n`` problems), one pass@k (k samples of each of the first
``--pass-n`` problems, at the sampling temperature) and ``--timed-steps`` training steps, and
prints what the two pass@k measurements add to the rest of the run:

    added = 2 * pass@k / (2 * evaluation + steps * mean step)

It leaves out loading the model and writing checkpoints (both small), and that steps and answers
get shorter or longer as the model learns. Time it alone on the machine: another heavy job
beside it changes every number. Every other flag goes to train.py's config.
"""
import argparse
import sys
import time

import torch

import train
from data import batch_of_prompts, load_problems
from engine.models import grad_scaler, load_model, make_optimizer, pick_device, reference_model


def main(argv=None):
    parser = argparse.ArgumentParser(description="what pass@k adds to a run; other flags go to train.py")
    parser.add_argument("--timed-steps", type=int, default=2,
                        help="training steps to time (their mean is used)")
    args, rest = parser.parse_known_args(sys.argv[1:] if argv is None else argv)
    if args.timed_steps < 1:
        parser.error("--timed-steps must be at least 1")
    cfg = train.parse_config(rest)
    if not cfg.pass_n:
        raise SystemExit(f"error: the {cfg.preset} preset measures no pass@k (pass_n = 0); add --pass-n N")
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    device = pick_device(cfg)
    problems, held_out = load_problems(cfg)
    policy, tok = load_model(cfg, device)
    ref = reference_model(policy, cfg)
    torch.manual_seed(cfg.seed)
    optimizer = make_optimizer(policy, cfg)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0)
    scaler = grad_scaler(cfg, device)

    def timed(f):
        t = time.perf_counter()
        f()
        return time.perf_counter() - t

    t_eval = timed(lambda: train.evaluate(policy, tok, held_out, cfg))
    print(f"held-out evaluation, {len(held_out)} problems greedy: {t_eval:.1f} s", flush=True)
    t_pass = timed(lambda: train.pass_at_k(policy, tok, held_out[:cfg.pass_n], cfg))
    print(f"pass@{cfg.pass_k}, {min(cfg.pass_n, len(held_out))} problems x {cfg.pass_k} samples: "
          f"{t_pass:.1f} s", flush=True)
    t_steps = [timed(lambda s=s: train.grpo_step(policy, ref, tok, optimizer, scheduler,
                                                 batch_of_prompts(problems, cfg, s), cfg, device, scaler))
               for s in range(1, args.timed_steps + 1)]
    t_step = sum(t_steps) / len(t_steps)
    print(f"training step: {', '.join(f'{t:.1f}' for t in t_steps)} s (mean {t_step:.1f} s)", flush=True)
    rest_of_run = 2 * t_eval + cfg.steps * t_step
    print(f"a {cfg.steps}-step run: {rest_of_run:.0f} s without pass@k; the two pass@k add "
          f"{2 * t_pass:.0f} s, {100 * 2 * t_pass / rest_of_run:.0f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main())
