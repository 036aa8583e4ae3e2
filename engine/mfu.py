"""mfu.py — what a step costs: model FLOPs against this machine's own matmul peak, and memory.

MFU (model FLOPs utilisation) = the FLOPs the model needs for a phase / the phase's time / the
peak FLOP/s of a large matmul on the same device. It says how much of the hardware a phase
uses: 0.5 in the update is good on a CPU; sampling, one token at a time, is far lower.
train.grpo_step logs it per phase with one call to ``phase_mfu``; docs/performance.md explains
how to read it.

    python -m engine.mfu                  # this machine's matmul peak, the denominator of MFU
    python -m engine.mfu --threads 1
"""
import argparse
import functools
import os
import platform
import sys
import time

import torch

from engine.scoring import can_share_prompts, compute_dtype


def machine(device):
    """What a run's numbers depend on besides its config: the CPU (its name and the vector
    instructions torch uses on it, e.g. AVX2 or AVX512: the same seed samples other completions
    on another), its cores, the torch version and the GPU if any. Recorded in config.json."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), cpu)
    except OSError:
        pass
    return dict(cpu=cpu, cpu_capability=torch.backends.cpu.get_cpu_capability(), cores=os.cpu_count(),
                torch=torch.__version__,
                gpu=torch.cuda.get_device_name(device) if torch.device(device).type == "cuda" else None)


def forward_flops_per_token(model):
    """(body, head): FLOPs per token of one forward pass, 2 per weight (a multiply and an add).

    body = every weight but the embedding table (a lookup, no FLOPs); head = the LM head,
    paid only at positions whose logits are computed. Forward + backward costs 3x a forward.
    Attention's score and value products (4 x layers x context x width per token) are left
    out, as in the usual MFU estimate: about 5% for SmolLM2 at 150 tokens of context.
    """
    embed, head = model.get_input_embeddings().weight, model.get_output_embeddings().weight
    n = sum(p.numel() for p in model.parameters())             # tied weights are counted once
    body = n - embed.numel() - (0 if head is embed else head.numel())
    return 2 * body, 2 * head.numel()


@functools.lru_cache(maxsize=None)
def matmul_peak(device_type, dtype=torch.float32, n=None, repeats=5):
    """FLOP/s of the best of a few n x n matmuls on this device: the ceiling MFU is measured
    against (CPU: the 2n^3 FLOPs of float32 GEMM with torch's threads; CUDA: bf16 or fp32).
    n = 8192 on a GPU, whose matmul units a 2048 x 2048 product leaves partly idle."""
    n = n or (8192 if device_type == "cuda" else 2048)
    # Its own generator: drawing from the global one would shift the sampling stream of every
    # run after step 1, and that of a resumed run differently from an uninterrupted one.
    gen = torch.Generator(device=device_type).manual_seed(0)
    a, b = (torch.randn(n, n, device=device_type, dtype=dtype, generator=gen) for _ in range(2))
    sync = {"cuda": torch.cuda.synchronize, "mps": torch.mps.synchronize}.get(device_type, lambda: None)
    best = float("inf")
    for i in range(repeats + 2):
        sync()
        t = time.perf_counter()
        a @ b
        sync()
        best = min(best, time.perf_counter() - t) if i >= 2 else best    # two warm-up rounds
    return 2 * n ** 3 / best


def peak_flops(device, cfg):
    """The matmul peak in the dtype the model computes in on a GPU (bf16 or fp16 under autocast);
    float32's on the CPU, whose bf16 and fp16 products run no faster where the CPU lacks them."""
    dtype = compute_dtype(cfg, device) if device.type == "cuda" else None
    return matmul_peak(device.type, dtype or torch.float32)


def step_flops(model, prompt_attn, mask, cfg):
    """Model FLOPs of one step, by phase: {gen, score, update}. Real tokens only (padding is
    work the hardware does but the model does not need, so it lowers MFU, as it should)."""
    body, head = forward_flops_per_token(model)
    prompt, completion = prompt_attn.sum().item(), mask.sum().item()
    forward = lambda prompt_tokens: body * (prompt_tokens + completion) + head * completion
    shared = prompt / cfg.group_size                  # each prompt once per group
    no_grad_passes = (cfg.loss == "cw_grpo") + (cfg.beta > 0)
    return dict(gen=forward(prompt if cfg.plain or not cfg.share_prompts else shared),
                score=no_grad_passes * forward(prompt),
                update=3 * forward(shared if can_share_prompts(cfg) else prompt) * cfg.updates_per_batch)


def phase_mfu(model, batch, cfg, times, device):
    """{flops, gen_mfu, update_mfu} of one step from its phase times (seconds)."""
    flops, peak = step_flops(model, batch.prompt_attn, batch.mask, cfg), peak_flops(device, cfg)
    return dict(flops=sum(flops.values()), gen_mfu=flops["gen"] / times["gen"] / peak,
                update_mfu=flops["update"] / times["update"] / peak)


def peak_mem_gb(device):
    """Peak memory so far, in GiB: allocated on a CUDA GPU; elsewhere the process's peak
    resident set (Apple's GPU shares the process's memory, so on MPS too). None where the
    platform cannot say: native Windows has no ``resource`` module."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2 ** 30
    try:
        import resource
    except ImportError:
        return None
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2 ** (30 if sys.platform == "darwin" else 20)     # bytes on macOS, KiB on Linux


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="This machine's matmul peak, against which MFU is measured.")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else
                        "mps" if torch.backends.mps.is_available() else "cpu")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--threads", type=int, default=0, help="CPU threads; 0 = torch's default")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    peak = matmul_peak(args.device, getattr(torch, args.dtype))
    print(f"matmul peak on {args.device} ({args.dtype}, {torch.get_num_threads()} threads): "
          f"{peak / 1e9:.1f} GFLOP/s")
