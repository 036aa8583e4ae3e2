"""sampling.sample() (what train.rollout calls) against transformers' generate(): same prompts,
seed and knobs, back to back.

    # the four settings in the README (about 5 min on 2 cores)
    python -m experiments.benchmarks.sample_vs_generate
    # on a GPU, at the qwen presets' size (a random-weight Qwen from benchmarks/gpu_memory.py)
    python -m experiments.benchmarks.sample_vs_generate --device cuda --qwen-size \\
        --model runs/models/random-qwen2.5-0.5b
    # and sample_in_place with a CUDA graph per token (--cuda-graphs), timed beside them
    python -m experiments.benchmarks.sample_vs_generate --device cuda --cuda-graphs

"generate()" is what rollout() ran before sample(): each prompt prefilled once into a
DynamicCache, repeated for its group, then `model.generate()`. Prints the seconds of each,
their ratio and the completion lengths (sample() gains where lengths differ, because finished
rows leave the batch). Greedy, the tokens must be identical; sampled, the two draw different
random numbers (generate() one per vocabulary entry, sample() one per row), so their samples
differ: compare their lengths too. "trained" is a run's final/
(default: the GRPO run of `python -m experiments.compare --preset smol`); settings whose model is missing
are skipped.
"""
import argparse
import sys
import time
from pathlib import Path


import torch

import data
from engine import models
from engine import sampling
import train


@torch.no_grad()
def with_generate(model, tok, questions, cfg, greedy, group_size):
    from transformers import DynamicCache
    enc = tok([data.render_prompt(tok, q) for q in questions], return_tensors="pt", padding=True,
              add_special_tokens=False)
    gen = sampling.generation_config(model, tok, cfg, greedy)
    model.generation_config = gen
    cache = DynamicCache(config=model.config)
    enc = {k: v.to(model.device) for k, v in enc.items()}
    ids, attn = enc["input_ids"][:, :-1], enc["attention_mask"][:, :-1]
    model(input_ids=ids, attention_mask=attn, position_ids=(attn.cumsum(1) - 1).clamp(min=0),
          cache=cache, use_cache=True, logits_to_keep=1)
    cache.batch_repeat_interleave(group_size)
    enc = {k: v.repeat_interleave(group_size, 0).to(model.device) for k, v in enc.items()}
    out = model.generate(**enc, cache=cache, generation_config=gen)[:, enc["input_ids"].shape[1]:]
    return torch.nn.functional.pad(out, (0, cfg.max_new_tokens - out.shape[1]), value=tok.pad_token_id)


def compare(name, model_dir, prompts, group_size, tokens, temperature, greedy, repeats, device="cpu",
            graphs=False):
    cfg = train.parse_config(["--preset", "tiny", "--model", model_dir, "--max-new-tokens", str(tokens),
                              "--temperature", str(temperature)])
    model, tok = models.load(model_dir)
    tok.padding_side = "left"
    model.to(device).eval()
    sync = torch.cuda.synchronize if model.device.type == "cuda" else lambda: None
    questions = [p["question"] for p in data.make_synthetic(prompts, level=1, seed=0)]
    for r in range(repeats):
        torch.manual_seed(r)
        sync()
        t = time.perf_counter()
        a = with_generate(model, tok, questions, cfg, greedy, group_size)
        sync()
        t_generate = time.perf_counter() - t
        torch.manual_seed(r)
        t = time.perf_counter()
        sampled = train.rollout(model, tok, questions, cfg, greedy=greedy, group_size=group_size)
        b, mask = sampled.completions, sampled.mask
        sync()
        t_sample = time.perf_counter() - t
        in_place = ""
        if graphs:                     # sample_in_place: fixed shapes, a CUDA graph on a GPU
            torch.manual_seed(r)
            cfg.cuda_graphs, t = True, time.perf_counter()
            c = train.rollout(model, tok, questions, cfg, greedy=greedy, group_size=group_size).completions
            sync()
            cfg.cuda_graphs, t_graphs = False, time.perf_counter() - t
            same_c = f" (same: {torch.equal(a, c)})" if greedy else ""
            in_place = f"in place {t_graphs:6.2f} s{same_c}   "
        lengths = lambda m: f"mean {m.sum(1).mean():.1f} max {m.sum(1).max():.0f}"
        same = f"same tokens: {torch.equal(a, b)}" if greedy else \
            f"lengths: generate {lengths(train.completion_mask(a, sampling.eos_ids(model, tok))[0])}, sample"
        mode = "greedy" if greedy else f"T = {temperature}"
        print(f"{name:9s} {prompts} x {group_size}, {mode}, {tokens} tokens: "
              f"generate {t_generate:6.2f} s   sample {t_sample:6.2f} s   {in_place}"
              f"ratio {t_sample / t_generate:.2f}   {same} {lengths(mask)}", flush=True)


def main(argv=None):
    # The first paragraph of the docstring (argparse joins its lines).
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=models.SMOLLM2,
                   help="the untouched model (default: the packaged SmolLM2)")
    p.add_argument("--trained", default="runs/compare-smol/grpo-s0/final", help="a trained model's directory")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--quick", action="store_true", help="one small setting (a smoke test)")
    p.add_argument("--device", default="cpu", help="cpu | cuda (the model and both loops there)")
    p.add_argument("--cuda-graphs", action="store_true",
                   help="also time sample_in_place (train.py --cuda-graphs): a CUDA graph per token on a GPU")
    p.add_argument("--qwen-size", action="store_true",
                   help="the qwen presets' batch and length instead: 8 x 8, 400 tokens, T = 1.0")
    a = p.parse_args(argv)
    torch.set_num_threads(a.threads)
    untouched, dev = a.model, dict(device=a.device, graphs=a.cuda_graphs)
    if a.quick:
        compare("untouched", untouched, 2, 2, 8, 1.0, True, repeats=1, **dev)
        return 0
    if a.qwen_size:
        compare("untouched", untouched, 8, 8, 400, 1.0, False, repeats=2, **dev)
        return 0
    compare("untouched", untouched, 4, 8, 96, 1.0, False, repeats=2, **dev)   # the speed benchmark's
    compare("untouched", untouched, 4, 8, 80, 0.7, False, repeats=2, **dev)   # the smol preset, step 1
    if a.device != "cpu":
        compare("untouched", untouched, 16, 8, 128, 0.7, False, repeats=2, **dev)  # smol-long, step 1
    if (Path(a.trained) / "config.json").exists():
        compare("trained", a.trained, 4, 8, 80, 0.7, False, repeats=2, **dev)  # smol, late steps
        compare("trained", a.trained, 50, 1, 80, 0.7, True, repeats=1, **dev)  # evaluation
    else:
        print(f"skipped the trained model: no {a.trained}/config.json "
              "(run `python -m experiments.compare --preset smol`)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
