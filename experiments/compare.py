"""compare.py — the four losses from the same warm start, then the figures and the table.

    # 4 losses, seed 0, tiny preset, 2 runs at a time (~11 min on 2 cores)
    python -m experiments.compare
    # and seed 1 (finished runs are reused): docs/results.md, tiny model
    python -m experiments.compare --seeds 0 1
    # quicker
    python -m experiments.compare --steps 60
    # the real model (SmolLM2-135M-Instruct), one run at a time
    python -m experiments.compare --preset smol --seeds 0 1 2
    # the same with a KL term and 2 updates per batch
    python -m experiments.compare --preset smol-active --seeds 0 1 2
    # that for 200 steps on harder problems: one GPU (4-10 min a run on an H200)
    python -m experiments.compare --preset smol-long --seeds 0 1 2 -- --cuda-graphs --micro-batch 128
    # the three controls of our readings (docs/METHODS.md) instead of the four losses
    python -m experiments.compare --preset smol-active --seeds 0 1 2 --controls
    # every arm (4 losses, 3 controls, 3 other readings), every arm of a seed before the next seed
    python -m experiments.compare --preset smol-active --seeds 0 1 2 3 4 --arms all

Runs ``train.py --preset <tiny|smol|smol-active|smol-long>`` for every loss (or, with
``--controls``/``--arms``, every control or arm in ARMS) and seed (in parallel,
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

import plots
import train
from engine import models
from losses import LOSSES

HERE = Path(__file__).resolve().parents[1]                # the repo root

# The controls and the other readings (docs/METHODS.md, "Controls"): name -> (loss, train.py flags),
# run as <name>-s<seed>. "{beta}" is the preset's KL coefficient, the one GRPO pays on every token.
CONTROLS = {
    "grpo-beta0": ("grpo", ["--beta", "0"]),                        # the KL-free baseline
    "tepo-fullkl": ("tepo", ["--tepo-full-kl-beta", "{beta}"]),     # GRPO's KL on every token, + TEPO's mask
    "tr_grpo-mean1": ("tr_grpo", ["--tr-mean-one"]),                # GRPO's step size, TR-GRPO's shape
}
READINGS = {
    "cw_grpo-authors": ("cw_grpo", ["--no-cw-detach", "--cw-normalise", "padded"]),   # as its authors run it
    "tr_grpo-inclip": ("tr_grpo", ["--tr-inside-clip"]),           # w inside the clip and the KL
    "tepo-tokratio": ("tepo", ["--tepo-token-ratio"]),             # GRPO's ratio, TEPO's KL mask
}
ARMS = {**{loss: (loss, []) for loss in LOSSES}, **CONTROLS, **READINGS}
ARM_SETS = {"losses": list(LOSSES), "controls": list(CONTROLS), "readings": list(READINGS), "all": list(ARMS)}


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--preset", default="tiny", choices=["tiny", "smol", "smol-active", "smol-long"])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--losses", nargs="+", default=list(LOSSES), choices=list(LOSSES))
    parser.add_argument("--controls", action="store_true",
                        help="run the controls (" + ", ".join(CONTROLS) + ") instead of the losses; "
                             "they need a preset with a KL term (tiny, smol-active, smol-long)")
    parser.add_argument("--arms", nargs="+", default=None, choices=list(ARMS) + list(ARM_SETS),
                        help="run these arms instead: losses, controls, readings of docs/METHODS.md ("
                             + ", ".join(READINGS) + "), or all (every arm of one seed before the next seed)")
    parser.add_argument("--jobs", type=int, default=None,
                        help="runs at the same time; default 2 for tiny, 1 for smol "
                             "(a smol run wants both cores and 6 GiB)")
    parser.add_argument("--steps", type=int, default=None, help="override the preset's --steps")
    parser.add_argument("--out", default=None, help="default runs/compare (tiny) or runs/compare-<preset>")
    parser.add_argument("extra", nargs="*", help="more train.py flags, after --")
    args = parser.parse_args(argv)
    args.steps_each = args.steps or train.PRESETS[args.preset].get("steps", train.Config.steps)
    args.beta = train.PRESETS[args.preset].get("beta", train.Config.beta)
    if args.arms and args.controls:
        parser.error("--controls is --arms controls: pass one of them")
    if args.controls:
        args.arms = ["controls"]
    if args.arms:
        args.arms = list(dict.fromkeys(a for name in args.arms for a in ARM_SETS.get(name, [name])))
    needs_kl = [a for a in args.arms or [] if a in CONTROLS or a == "tepo-tokratio"]
    if needs_kl and args.beta == 0 and not args.controls:
        parser.error(f"{', '.join(needs_kl)} compare against a KL term, and the {args.preset} preset has "
                     f"none (beta = 0); use tiny, smol-active or smol-long")
    if args.controls and args.beta == 0:
        parser.error(f"--controls compares against a KL term, and the {args.preset} preset has none "
                     f"(beta = 0); use tiny, smol-active or smol-long")
    return args


def runs_of(args):
    """(name, loss, extra train.py flags) of every run but the seed: the losses, or the arms."""
    if not args.arms:
        return [(loss, loss, []) for loss in args.losses]
    return [(name, ARMS[name][0], [f.format(beta=args.beta) for f in ARMS[name][1]]) for name in args.arms]


def main(argv=None):
    args = parse_args(argv)
    out = Path(args.out or ("runs/compare" if args.preset == "tiny" else f"runs/compare-{args.preset}")
               + ("-controls" if args.controls and not args.out else ""))
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
        (name, loss, extra), seed = job
        run = out / f"{name}-s{seed}"
        if finished(run, args.steps_each):
            print(f"  {name:8s} seed {seed}: finished before, skipped", flush=True)
            return run
        flags = extra + (["--resume"] if (run / "ckpt" / "last.pt").exists() else [])
        log_path = out / f"{name}-s{seed}.log"
        with open(log_path, "a") as log:
            p = subprocess.run([sys.executable, str(HERE / "train.py"), *common, "--loss", loss,
                                "--seed", str(seed), "--out", str(run), *flags],
                               stdout=log, stderr=subprocess.STDOUT)
        status = "ok" if p.returncode == 0 else f"FAILED (exit {p.returncode}, see {log_path})"
        print(f"  {name:8s} seed {seed}: {status}  [{time.time() - start:.0f}s]", flush=True)
        return run if p.returncode == 0 else None

    jobs = [(run, seed) for seed in args.seeds for run in runs_of(args)]
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
