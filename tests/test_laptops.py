"""The laptops students have: Windows (no ``resource`` module), macOS (``ru_maxrss`` in
bytes, Apple's GPU), simulated on Linux: a missing module through sys.modules, another
platform through sys.platform, a GPU through mocked availability."""
import ast
import runpy
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from engine import mfu
from engine import models
import train
from losses import LOSSES

REPO = Path(__file__).resolve().parents[1]
CPU = torch.device("cpu")


# ----------------------------------------------------------------------------------------
# No `resource` module (native Windows)

def test_train_imports_and_parses_without_the_resource_module():
    """Third-party packages first (they are not ours to fix), then `resource` made unimportable
    and every module of this repo imported fresh."""
    script = ("import sys, torch, transformers, tqdm\n"
              "sys.modules['resource'] = None\n"                 # `import resource` now raises ImportError
              "import train\nfrom course import grade\nfrom engine import mfu\n"
              "cfg = train.parse_config(['--preset', 'tiny', '--device', 'cpu'])\n"
              "print('peak', mfu.peak_mem_gb(torch.device('cpu')))\n")
    run = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.strip() == "peak None"


def test_no_module_or_test_imports_resource_at_import_time():
    """A module-level `import resource` anywhere in the repo breaks it on Windows."""
    folders = ("tests", "engine", "experiments", "course", "multigpu")
    for path in sorted(REPO.glob("*.py")) + sorted(p for f in folders for p in REPO.glob(f"{f}/**/*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in tree.body:
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module] if isinstance(node, ast.ImportFrom) else [])
            assert "resource" not in names, (f"{path.relative_to(REPO)}:{node.lineno} imports resource "
                                             "at module level")


# ----------------------------------------------------------------------------------------
# Peak memory: the unit of ru_maxrss depends on the platform

def fake_resource(maxrss):
    usage = types.SimpleNamespace(ru_maxrss=maxrss)
    return types.SimpleNamespace(RUSAGE_SELF=0, getrusage=lambda who: usage)


@pytest.mark.parametrize("platform,maxrss", [("linux", 3 * 2 ** 20),       # KiB
                                             ("darwin", 3 * 2 ** 30)])     # bytes
def test_peak_memory_reads_ru_maxrss_in_the_platforms_unit(monkeypatch, platform, maxrss):
    monkeypatch.setitem(sys.modules, "resource", fake_resource(maxrss))
    monkeypatch.setattr(sys, "platform", platform)
    assert mfu.peak_mem_gb(CPU) == pytest.approx(3.0)
    assert mfu.peak_mem_gb(torch.device("mps")) == pytest.approx(3.0)     # unified memory: the process's


def test_peak_memory_is_none_without_resource_and_gpu_memory_on_cuda(monkeypatch):
    monkeypatch.setitem(sys.modules, "resource", None)
    assert mfu.peak_mem_gb(CPU) is None
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device=None: 5 * 2 ** 30)
    assert mfu.peak_mem_gb(torch.device("cuda")) == pytest.approx(5.0)


def test_the_real_peak_memory_here_is_plausible():
    peak = mfu.peak_mem_gb(CPU)                    # this process: torch alone is 0.1-10 GiB
    assert peak is None if sys.platform == "win32" else 0.05 < peak < 64


# ----------------------------------------------------------------------------------------
# --device auto: CUDA, then Apple's GPU (MPS), then the CPU

def available(monkeypatch, cuda, mps, macos14=True):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: mps)
    monkeypatch.setattr(torch.backends.mps, "is_macos_or_newer", lambda major, minor: macos14)


@pytest.mark.parametrize("cuda,mps,expected",
                         [(True, True, "cuda"), (False, True, "mps"), (False, False, "cpu")])
def test_auto_picks_cuda_then_mps_then_cpu(monkeypatch, cuda, mps, expected):
    available(monkeypatch, cuda, mps)
    assert models.pick_device(train.parse_config(["--preset", "tiny"])) == torch.device(expected)
    assert models.pick_device(train.parse_config(["--device", "cpu"])) == CPU        # asked for: kept


def test_a_device_that_is_not_there_is_refused_with_advice(monkeypatch):
    available(monkeypatch, cuda=False, mps=False)
    with pytest.raises(SystemExit, match="no CUDA GPU"):
        models.pick_device(train.parse_config(["--device", "cuda"]))
    with pytest.raises(SystemExit, match="MPS.*--device cpu"):
        models.pick_device(train.parse_config(["--device", "mps"]))


def test_fp16_on_the_cpu_runs_and_says_it_is_for_gpus(monkeypatch, capsys):
    """A CPU without fp16 instructions computes fp16 several times slower than float32
    (docs/performance.md): --dtype float16 still runs there (the tests use it), with a note, once."""
    available(monkeypatch, cuda=False, mps=False)
    models.note_fp16_on_the_cpu.cache_clear()
    for _ in range(2):
        assert models.pick_device(train.parse_config(["--dtype", "float16"])) == torch.device("cpu")
    assert capsys.readouterr().err.count("--dtype float16 is for GPUs") == 1
    models.pick_device(train.parse_config(["--dtype", "bfloat16"]))
    assert "float16" not in capsys.readouterr().err


def test_bf16_on_mps_needs_macos_14(monkeypatch):
    available(monkeypatch, cuda=False, mps=True, macos14=False)
    # float32 on MPS: fine
    assert models.pick_device(train.parse_config(["--device", "mps"])) == torch.device("mps")
    with pytest.raises(SystemExit, match="macOS 14.*--dtype float32"):
        models.pick_device(train.parse_config(["--device", "mps", "--dtype", "bfloat16"]))
    available(monkeypatch, cuda=False, mps=True, macos14=True)
    assert models.pick_device(train.parse_config(["--device", "mps", "--dtype", "bfloat16"])).type == "mps"


class Dtypes(TorchDispatchMode):
    """Records the dtype of every tensor every torch op returns."""

    def __init__(self):
        super().__init__()
        self.seen = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else [out]:
            if isinstance(t, torch.Tensor):
                self.seen.add(t.dtype)
        return out


@pytest.mark.parametrize("loss", list(LOSSES))
def test_a_training_step_computes_nothing_in_float64(monkeypatch, loss):
    """Apple's GPU has no float64: a step on the CPU that never makes a float64 tensor would
    not make one on MPS either (a random tiny model, mixed rewards, the KL term on)."""
    cfg = train.parse_config(["--preset", "tiny", "--loss", loss, "--prompts-per-step", "2",
                              "--group-size", "4", "--micro-batch", "4", "--max-new-tokens", "8",
                              "--device", "cpu"])
    tok = models.tiny_tokenizer()
    torch.manual_seed(0)
    policy = models.tiny_model(tok)
    ref = models.reference_model(policy, cfg)
    monkeypatch.setattr(train.rewards, "reward", lambda text, gold: float(len(text) % 2))
    monkeypatch.setattr(mfu, "peak_flops", lambda device, cfg: 1e12)     # not this machine's matmul benchmark
    problems = [{"question": "Mia has 3 pens and buys 4 more. How many pens?", "answer": "#### 7"}] * 2
    opt = torch.optim.SGD(policy.parameters(), lr=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    with Dtypes() as mode:
        train.grpo_step(policy, ref, tok, opt, sched, problems, cfg, CPU)
    assert torch.float32 in mode.seen and torch.float64 not in mode.seen


# ----------------------------------------------------------------------------------------
# An op Apple's GPU lacks

MPS_ERROR = ("The operator 'aten::_some_op' is not currently implemented for the MPS device. "
             "If you want this op to be added in priority during the prototype phase of this feature, "
             "please comment on ...")


def test_an_op_mps_lacks_gets_the_fallback_advice(monkeypatch):
    """`python train.py` (its __main__ block, run here) stops with the advice, not a traceback."""
    def missing_op(cfg):
        raise NotImplementedError(MPS_ERROR)
    monkeypatch.setattr(models, "pick_device", missing_op)
    monkeypatch.setattr(sys, "argv", ["train.py", "--preset", "tiny"])
    with pytest.raises(SystemExit) as exit_:
        runpy.run_path(str(REPO / "train.py"), run_name="__main__")
    message = str(exit_.value.code)
    assert ("PYTORCH_ENABLE_MPS_FALLBACK=1" in message and "--device cpu" in message
            and "aten::_some_op" in message)


def test_other_not_implemented_errors_are_left_alone():
    """An unwritten part of the assignment raises NotImplementedError too: no MPS advice for it."""
    with pytest.raises(NotImplementedError, match="tepo: write this part"), models.mps_advice():
        raise NotImplementedError("tepo: write this part (see HANDOUT.md)")
    assert models.mps_fallback_advice(ValueError("MPS")) is None
