"""On a CUDA GPU: whole tiny runs (float32, bf16 and fp16 autocast, CUDA graphs), exact resume, and what a
card without native bf16 is told. tests/test_speed.py runs its exactness tests on the GPU too (its
fixtures take a device). Without a GPU the CUDA tests skip; the last one runs anywhere.

    pytest tests/test_cuda.py tests/test_speed.py -k cuda       # on a machine with a GPU
"""
import json
from pathlib import Path

import pytest
import torch

from engine import models
import train

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
FAST = ["--preset", "tiny", "--sft-steps", "30", "--eval-n", "40", "--eval-batch", "40",
        "--prompts-per-step", "4", "--group-size", "4", "--micro-batch", "8", "--max-new-tokens", "16",
        "--eval-every", "0", "--sample-every", "2", "--beta", "0.04", "--updates-per-batch", "2"]


@pytest.fixture(scope="module")
def warm(warm_starts):
    return models.warm_start(train.parse_config(FAST + ["--out", str(warm_starts / "x")]))


def steps(out):
    return [json.loads(line) for line in (Path(out) / "metrics.jsonl").read_text().splitlines()
            if '"loss"' in line]


RUNS = [pytest.param("cuda", dtype, loss, graphs, marks=needs_cuda)
        for dtype in ("float32", "bfloat16", "float16") for loss in ("grpo", "cw_grpo", "tepo")
        for graphs in ([False, True] if loss == "tepo" else [False])]


@pytest.mark.parametrize("device,dtype,loss,graphs", RUNS + [("cpu", "bfloat16", "grpo", False),
                                                             ("cpu", "bfloat16", "grpo", True),
                                                             ("cpu", "float16", "grpo", False)])
def test_a_tiny_run_on_the_gpu(tmp_path, warm, capsys, device, dtype, loss, graphs):
    """Every phase on the GPU, in the three precisions, with and without CUDA graphs (and bf16 and
    fp16 autocast on the CPU, whose sampling layers add their bias in bf16 as F.linear does): the
    loss is finite, the clip acts on the second update, memory is reported, the ratio check stays
    quiet (sampling, scoring and the update compute in the same precision), and fp16 logs its
    gradient scale. The clip acts only where a group's rewards differ, and TEPO's only where a
    whole sequence's mean log-ratio leaves 0.2: with FAST's 4 prompts and lr 1e-4 that happened in
    1 of 12 tiny TEPO runs on the CPU (and not in a bf16 one on an H200); with 8 prompts and 1e-3,
    in every one of 24 (GRPO and TEPO, float32 and bf16, seeds 0-5), from the first step."""
    out = tmp_path / "run"
    args = ["--init", warm, "--device", device, "--dtype", dtype, "--loss", loss, "--steps", "3",
            "--lr", "1e-3", "--prompts-per-step", "8", "--out", str(out)] + ["--cuda-graphs"] * graphs
    assert train.main(FAST + args) == 0
    lines = steps(out)
    assert [line["step"] for line in lines] == [1, 2, 3]
    assert all(torch.isfinite(torch.tensor(line["loss"])) for line in lines)
    assert max(line["clip_frac"] for line in lines) > 0
    assert all(line["peak_mem_gb"] > 0 for line in lines)
    assert all(("grad_scale" in line) == (dtype == "float16") for line in lines)
    assert "importance ratio is not 1" not in capsys.readouterr().err
    assert (out / "final" / "config.json").exists()


@needs_cuda
@pytest.mark.parametrize("graphs", [False, True])
def test_resume_on_the_gpu_restores_the_sampling_stream(tmp_path, warm, graphs):
    """Stopped after step 2 and resumed, a run samples at steps 3-4 what the uninterrupted run
    sampled: the CUDA generator's state is in the checkpoint (with CUDA graphs too: the draw
    runs outside the graph)."""
    args = FAST + ["--init", warm, "--device", "cuda", "--ckpt-every", "2", "--seed", "5"]
    args += ["--cuda-graphs"] * graphs
    assert train.main(args + ["--steps", "4", "--out", str(tmp_path / "a")]) == 0
    assert train.main(args + ["--steps", "2", "--out", str(tmp_path / "b")]) == 0
    assert train.main(args + ["--steps", "4", "--out", str(tmp_path / "b"), "--resume"]) == 0
    a, b = steps(tmp_path / "a"), steps(tmp_path / "b")
    assert [line["step"] for line in b] == [1, 2, 3, 4]
    for x, y in zip(a, b):
        assert x["reward"] == y["reward"] and x["completion_len"] == y["completion_len"], x["step"]
        assert x["loss"] == pytest.approx(y["loss"], rel=1e-4, abs=1e-6), x["step"]


def test_a_gpu_without_native_bf16_is_told_it_computes_in_float32(monkeypatch, capsys):
    """A T4 (compute capability 7.5) emulates bf16, slowly: --dtype bfloat16 computes in float32
    there, and says so, once however often the device is picked."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (7, 5))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Tesla T4")
    cfg = train.parse_config(["--preset", "qwen-0.5b", "--device", "cuda"])
    models.note_no_native_bf16.cache_clear()
    assert models.pick_device(cfg) == torch.device("cuda")
    assert models.pick_device(cfg) == torch.device("cuda")
    err = capsys.readouterr().err
    assert err.count("Tesla T4 has no native bf16") == 1 and "--dtype float16" in err
    from engine import scoring
    assert isinstance(scoring.autocast(cfg, torch.device("cuda")), type(scoring.contextlib.nullcontext()))
    assert scoring.compute_dtype(cfg, torch.device("cuda")) is None           # the reference too: float32
    fp16 = train.parse_config(["--preset", "qwen-0.5b", "--device", "cuda", "--dtype", "float16"])
    assert scoring.compute_dtype(fp16, torch.device("cuda")) == torch.float16    # the T4's fast path
