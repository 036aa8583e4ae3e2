"""Time one GRPO step of TRL's GRPOTrainer against ours, same model, batch and lengths.

TRL is not a dependency of this repo; install it in a separate environment that reuses
the CPU torch, then run from the repository root:

    python -m venv --system-site-packages /tmp/trlvenv && /tmp/trlvenv/bin/pip install trl
    /tmp/trlvenv/bin/python benchmarks/trl_grpo_step.py --init runs/warmstart-tiny-XXXX

Both sides: the tiny preset's model and character tokenizer (loaded from the warm start),
16 prompts x 8 completions, 20 new tokens, temperature 1.0, beta 0.04 (reference model),
lr 1e-4, one update per batch, float32 on the CPU. A step is everything from sampling to
the optimizer update. Reported: the median over steps 3..N (the first two warm up).
"""
import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(HERE))

import torch  # noqa: E402

import data  # noqa: E402
import rewards  # noqa: E402
import train  # noqa: E402


def trl_step_times(init, steps, threads):
    import trl
    from datasets import Dataset
    from transformers import TrainerCallback
    torch.set_num_threads(threads)
    cfg = train.parse_config(["--preset", "tiny", "--init", init])
    model, tok = train.load_model(cfg, torch.device("cpu"))
    problems = data.make_synthetic(16 * (steps + 2), level=1, seed=0)
    ds = Dataset.from_list([{"prompt": data.render_prompt(tok, p["question"]), "answer": p["answer"]}
                            for p in problems])

    def reward_fn(completions, answer, **kwargs):
        return [rewards.reward(c, rewards.gold_answer(a)) for c, a in zip(completions, answer)]

    times = []

    class Timer(TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):
            self.t = time.perf_counter()

        def on_step_end(self, args, state, control, **kw):
            times.append(time.perf_counter() - self.t)

    wanted = dict(output_dir=tempfile.mkdtemp(), per_device_train_batch_size=128, gradient_accumulation_steps=1,
                  num_generations=8, max_completion_length=cfg.max_new_tokens, temperature=1.0, top_p=1.0,
                  top_k=0, repetition_penalty=1.0, beta=0.04, learning_rate=1e-4, max_steps=steps,
                  num_iterations=1, logging_steps=1000, save_strategy="no", report_to="none", use_cpu=True,
                  bf16=False, fp16=False, dataloader_num_workers=0, seed=0, shuffle_dataset=False)
    fields = set(trl.GRPOConfig.__dataclass_fields__)
    config = trl.GRPOConfig(**{k: v for k, v in wanted.items() if k in fields})
    trainer = trl.GRPOTrainer(model=model, processing_class=tok, reward_funcs=reward_fn, args=config,
                              train_dataset=ds, callbacks=[Timer()])
    trainer.train()
    return times, trl.__version__, sorted(set(wanted) - fields)


def our_step_times(init, steps, threads):
    out = Path(tempfile.mkdtemp()) / "run"
    subprocess.run([sys.executable, str(HERE / "train.py"), "--preset", "tiny", "--init", init, "--steps", str(steps),
                    "--eval-every", "0", "--eval-n", "8", "--sample-every", "0", "--threads", str(threads),
                    "--out", str(out)], check=True, capture_output=True)
    return [json.loads(line)["step_time"] for line in (out / "metrics.jsonl").read_text().splitlines()
            if "step_time" in line]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--init", required=True, help="the tiny warm start directory (runs/warmstart-tiny-*)")
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    ours = our_step_times(args.init, args.steps, args.threads)
    theirs, version, ignored = trl_step_times(args.init, args.steps, args.threads)
    med = lambda xs: statistics.median(xs[2:])
    print(f"TRL {version}; settings TRL does not have: {ignored or 'none'}")
    print(f"ours : median step {med(ours):.3f} s over steps 3..{len(ours)}  ({', '.join(f'{t:.2f}' for t in ours)})")
    print(f"TRL  : median step {med(theirs):.3f} s over steps 3..{len(theirs)}  ({', '.join(f'{t:.2f}' for t in theirs)})")
    print(f"ratio ours / TRL = {med(ours) / med(theirs):.2f}")


if __name__ == "__main__":
    main()
