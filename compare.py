"""compare.py — the four losses from the same warm start, then the figures and the table.

    # 4 losses, seed 0, tiny preset, 2 runs at a time (~11 min on 2 cores)
    python compare.py
    # and seed 1 (finished runs are reused): docs/results.md, tiny model
    python compare.py --seeds 0 1
    # quicker
    python compare.py --steps 60
    # the real model (SmolLM2-135M-Instruct), one run at a time
    python compare.py --preset smol --seeds 0 1 2
    # the same with a KL term and 2 updates per batch
    python compare.py --preset smol-active --seeds 0 1 2
    # that for 200 steps on harder problems: one GPU (4-10 min a run on an H200)
    python compare.py --preset smol-long --seeds 0 1 2 -- --cuda-graphs --micro-batch 128

Runs ``train.py --preset <tiny|smol|smol-active|smol-long>`` for every loss and seed (in parallel,
splitting the CPU threads between jobs), then ``plots.py --table`` on all of them. Outputs go
to ``<out>/<loss>-s<seed>/`` and ``<out>/figures/``; each run's console output is in
``<out>/<loss>-s<seed>.log``. Extra arguments after ``--`` are passed to every train.py run.
Run it again to go on: a finished run (its metrics.jsonl logs the evaluation after the last
step) is skipped, an interrupted one resumes from its checkpoint. If a run fails, the figures
and the table hold the runs that finished, and the exit status is 1.
"""
import argparse
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import models
import plots
import train
from losses import LOSSES

HERE = Path(__file__).resolve().parent


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--preset", default="tiny", choices=["tiny", "smol", "smol-active", "smol-long"])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--losses", nargs="+", default=list(LOSSES), choices=list(LOSSES))
    parser.add_argument("--jobs", type=int, default=None,
                        help="runs at the same time; default 2 for tiny, 1 for smol "
                             "(a smol run wants both cores and 6 GiB)")
    parser.add_argument("--steps", type=int, default=None, help="override the preset's --steps")
    parser.add_argument("--out", default=None, help="default runs/compare (tiny) or runs/compare-<preset>")
    parser.add_argument("extra", nargs="*", help="more train.py flags, after --")
    args = parser.parse_args(argv)
    args.steps_each = args.steps or train.PRESETS[args.preset].get("steps", train.Config.steps)
    return args


def main(argv=None):
    args = parse_args(argv)
    out = Path(args.out or ("runs/compare" if args.preset == "tiny" else f"runs/compare-{args.preset}"))
    out.mkdir(parents=True, exist_ok=True)
    args.jobs = args.jobs or (2 if args.preset == "tiny" else 1)
    threads = max(1, (os.cpu_count() or 2) // args.jobs)
    common = ["--preset", args.preset, "--threads", str(threads)]
    common += ["--steps", str(args.steps)] if args.steps else []
    common += args.extra
    start = time.time()

    # The shared starting weights, built once before the parallel runs so they never race for them.
    if args.preset == "tiny":
        print("building (or reusing) the warm start ...", flush=True)
        subprocess.run([sys.executable, str(HERE / "train.py"), *common, "--out", str(out / "warm"),
                        "--warmup-only", "--threads", str(os.cpu_count() or 2)], check=True)
    else:
        print(f"converting (or reusing) the packaged model: {models.smollm2_dir()}", flush=True)

    def one(job):
        loss, seed = job
        run = out / f"{loss}-s{seed}"
        if finished(run, args.steps_each):
            print(f"  {loss:8s} seed {seed}: finished before, skipped", flush=True)
            return run
        flags = ["--resume"] if (run / "ckpt" / "last.pt").exists() else []
        log_path = out / f"{loss}-s{seed}.log"
        with open(log_path, "a") as log:
            p = subprocess.run([sys.executable, str(HERE / "train.py"), *common, "--loss", loss,
                                "--seed", str(seed), "--out", str(run), *flags],
                               stdout=log, stderr=subprocess.STDOUT)
        status = "ok" if p.returncode == 0 else f"FAILED (exit {p.returncode}, see {log_path})"
        print(f"  {loss:8s} seed {seed}: {status}  [{time.time() - start:.0f}s]", flush=True)
        return run if p.returncode == 0 else None

    jobs = [(loss, seed) for seed in args.seeds for loss in args.losses]
    print(f"{len(jobs)} runs, {args.jobs} at a time, {threads} thread(s) each ...", flush=True)
    with ThreadPoolExecutor(args.jobs) as pool:
        done = [r for r in pool.map(one, jobs) if r is not None]
    if not done:
        raise SystemExit("error: every run failed; see the logs above")
    plots.main([str(r) for r in done] + ["--out", str(out / "figures"), "--table"])
    print(f"total {time.time() - start:.0f}s")
    if len(done) < len(jobs):          # the figures hold the runs that finished; the status says not all did
        print(f"error: {len(jobs) - len(done)} of {len(jobs)} runs failed; see their logs above",
              file=sys.stderr)
        return 1
    return 0


def finished(run, steps):
    """Whether a run got to its end: its metrics.jsonl holds the evaluation after step ``steps``."""
    metrics = run / "metrics.jsonl"
    if not metrics.exists():
        return False
    return any(r["step"] == steps and "eval_accuracy" in r for r in plots.read_jsonl(metrics))


if __name__ == "__main__":
    sys.exit(main())
