"""fp16 against float32 on a real model: train.update on one GRPO micro-batch both ways, on the
same sampled rows (float32; --dtype float16: fp16 autocast and the gradient scaler), with an
optimizer that does not move the weights. Prints how far fp16 moves the log-probs and the
gradient, whether anything overflowed, and the time of each. Exit status 1 when fp16 is not
finite or its gradient is more than 5% away from float32's.

    python -m experiments.benchmarks.fp16_vs_float32                     # SmolLM2-135M on this machine's CPU
    python -m experiments.benchmarks.fp16_vs_float32 --device cuda       # on a GPU: the check a T4 user needs
    python -m experiments.benchmarks.fp16_vs_float32 --model DIR  # another model (save_pretrained dir)

On most CPUs fp16 has no matrix instructions and the fp16 pass is slow (docs/performance.md).
"""
import argparse
import dataclasses
import sys
import time


import torch

from engine import models
import train


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=models.SMOLLM2)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--rows", type=int, default=4, help="sampled completions of one problem")
    parser.add_argument("--tokens", type=int, default=24, help="their token budget")
    parser.add_argument("--threads", type=int, default=0)
    a = parser.parse_args(argv)
    if a.threads:
        torch.set_num_threads(a.threads)
    device = torch.device(a.device)
    cfg = train.parse_config(["--preset", "smol", "--model", a.model, "--group-size", str(a.rows),
                              "--micro-batch", str(a.rows), "--max-new-tokens", str(a.tokens),
                              "--temperature", "1.0", "--device", a.device])
    policy, tok = train.load_model(cfg, device)
    torch.manual_seed(0)
    problem = train.load_problems(cfg)[0][0]
    batch = train.rollout(policy, tok, [problem["question"]], cfg, group_size=a.rows)     # in float32
    adv = torch.linspace(1, -1, a.rows, device=device)                      # any advantages, not all 0
    sync = torch.cuda.synchronize if device.type == "cuda" else lambda: None
    out = {}
    for dtype in ("float32", "float16"):
        # train.update itself, with an optimizer that does not move the weights and no clip
        run_cfg = dataclasses.replace(cfg, dtype=dtype, beta=0.0, max_grad_norm=float("inf"))
        scaler = models.grad_scaler(run_cfg, device)
        optimizer = torch.optim.SGD(policy.parameters(), lr=0.0)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0)
        sync()
        t = time.perf_counter()
        _, (logp, _) = train.update(policy, optimizer, scheduler, batch, adv, None, None, None, None,
                                    run_cfg, scaler)
        sync()
        seconds = time.perf_counter() - t
        grad = torch.cat([p.grad.flatten() for p in policy.parameters() if p.grad is not None]).double()
        out[dtype] = logp.double(), grad
        print(f"{dtype}: {seconds:.1f} s, log-probs finite: {torch.isfinite(logp).all().item()}, "
              f"gradient norm {grad.norm():.4f}, finite: {torch.isfinite(grad).all().item()}"
              + (f", loss scale {scaler.get_scale():.0f}" if scaler.is_enabled() else ""))
    (l32, g32), (l16, g16) = out["float32"], out["float16"]
    real = batch.mask > 0
    gap = (l16 - l32)[real].abs()
    relative = ((g16 - g32).norm() / g32.norm()).item()
    print(f"log-probs, fp16 - float32 over {real.sum().item()} tokens: max {gap.max():.4f}, "
          f"mean {gap.mean():.4f}")
    print(f"gradient: |g16 - g32| / |g32| = {relative:.4f}")
    ok = bool(torch.isfinite(l16).all() and torch.isfinite(g16).all() and relative < 0.05)
    print(f"fp16: {'ok' if ok else 'NOT ok'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
