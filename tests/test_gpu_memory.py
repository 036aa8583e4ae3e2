"""Tests for experiments/benchmarks/gpu_memory.py, on the CPU: the stand-in tokenizer has Qwen's 151,936 ids
and its special tokens where Qwen has them, a scaled-down model goes through every phase of a
real train.py step (sample, score, update, eval), and the per-phase wrapper keeps each phase's
largest peak over its calls. The memory columns themselves need a GPU (see the script)."""
import json
from pathlib import Path

import pytest
import torch

import experiments.benchmarks.gpu_memory as bench
import data
from engine import models

REPO = Path(__file__).resolve().parents[1]
GSM8K = REPO.parent / "shared" / "data" / "gsm8k"
needs_gsm8k = pytest.mark.skipif(not (GSM8K / "train.jsonl").exists(),
                                 reason="../shared/data/gsm8k not present (the shared data folder)")
TOKENS = 8
TINY = ["--preset", "qwen-0.5b", "--prompts-per-step", "2", "--group-size", "2", "--micro-batch", "2",
        "--max-new-tokens", str(TOKENS), "--eval-n", "2", "--eval-batch", "2", "--dtype", "float32",
        "--no-grad-checkpointing", "--device", "cpu", "--beta", "0.04", "--data", str(GSM8K)]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """One scaled-down run of the script (built into a temporary cache): (exit code, JSON, model dir)."""
    root = tmp_path_factory.mktemp("gpu_memory")
    code = bench.main(["--arch", "qwen2.5-0.5b", "--scale-down", "--steps", "1", "--cache", str(root),
                       "--json", str(root / "result.json"), "--"] + TINY)
    return code, json.loads((root / "result.json").read_text()), root / "random-qwen2.5-0.5b-scaled-down"


@needs_gsm8k
def test_the_stand_in_tokenizer_has_qwens_ids(run):
    _, _, model_dir = run
    tok = models.load_tokenizer(str(model_dir))
    assert json.loads((model_dir / "tokenizer_config.json").read_text())["tokenizer_class"] == \
        "PreTrainedTokenizerFast"
    assert len(tok) == bench.VOCAB_SIZE == 151936
    assert tok.pad_token_id == 151643 and tok.eos_token_id == 151645
    special = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    assert tok.convert_tokens_to_ids(special) == [151643, 151644, 151645]
    every = tok.convert_ids_to_tokens(list(range(len(tok))))
    assert None not in every and len(set(every)) == len(every)            # every id decodes, once
    assert isinstance(tok.decode(list(range(0, len(tok), 997))), str)
    prompt = data.render_prompt(tok, "Natalia sold 48 clips.")
    assert prompt.startswith("<|im_start|>system\n") and prompt.endswith("<|im_start|>assistant\n")
    ids = tok(prompt, add_special_tokens=False)["input_ids"]
    assert ids[0] == 151644 and tok.unk_token_id not in ids        # GSM8K's words are in the vocabulary
    assert tok.convert_ids_to_tokens(tok("48", add_special_tokens=False)["input_ids"]) == ["4", "8"]
    model_config = json.loads((model_dir / "config.json").read_text())
    assert model_config["vocab_size"] == 151936 and model_config["eos_token_id"] == 151645
    generation = json.loads((model_dir / "generation_config.json").read_text())
    assert sorted(generation["eos_token_id"]) == [151643, 151645]


@needs_gsm8k
def test_a_scaled_down_run_measures_every_phase(run):
    code, result, _ = run
    assert code == 0 and result["oom"] is None and result["exit_code"] == 0
    assert {"device", "device_name", "cap_gb", "arch", "arch_config", "train_flags", "phases",
            "at_rest_allocated_gib", "prompt_lengths", "completions", "tokens_per_s", "oom"} <= set(result)
    phases = result["phases"]
    assert set(phases) == {"load", "sample", "score", "update", "eval"}
    assert phases["sample"]["calls"] == 1 and phases["update"]["calls"] == 1
    assert phases["eval"]["calls"] == 2                    # before step 1 and after the last step
    assert phases["score"]["calls"] == 2                   # the reference pass and the one-row ratio check
    for r in phases.values():
        assert r["median_s"] > 0 and len(r["seconds"]) == r["calls"]
        assert r["peak_allocated_gib"] is None and r["peak_reserved_gib"] is None     # CPU: not faked
    assert result["cap_gb"] is None and result["arch_config"]["num_hidden_layers"] == 2
    assert result["arch_config"]["vocab_size"] == 151936
    flags = result["train_flags"]
    assert flags[flags.index("--steps") + 1] == "1" and flags[flags.index("--eval-n") + 1] == "2"
    assert flags[flags.index("--ckpt-every") + 1] == "1000000" and "--model" in flags
    # Random weights ramble: every completion runs to the token budget.
    completions = result["completions"]
    assert completions["step"] == [1]
    assert completions["completion_len"][0] >= TOKENS - 1 and completions["truncated_frac"][0] >= 0.5
    lengths = result["prompt_lengths"]["sample"]
    assert lengths["prompts"] == 2 and 50 < lengths["mean_tokens"] <= lengths["max_tokens"]
    assert 1.0 < lengths["tokens_per_word"] < 2.0
    assert result["tokens_per_s"]["sample"] > 0


def test_the_phase_wrapper_keeps_the_max_over_calls():
    phases = bench.Phases(cuda=False)
    phases.record("update", 2.0, 5.0, 6.0)
    phases.record("update", 1.0, 7.0, 6.5)
    phases.record("update", 3.0, 4.0, 8.0)
    phases.record("sample", 0.5)
    table = phases.table()
    assert table["update"]["calls"] == 3 and table["update"]["median_s"] == 2.0
    assert table["update"]["peak_allocated_gib"] == 7.0 and table["update"]["peak_reserved_gib"] == 8.0
    assert table["sample"]["peak_allocated_gib"] is None and list(table) == ["sample", "update"]
    assert phases.measure("score", lambda x, y=0: x + y, 1, y=2) == 3
    assert phases.measure("score", lambda: "again") == "again"
    assert phases.table()["score"]["calls"] == 2


def test_an_out_of_memory_is_reported_with_its_phase_and_step():
    phases = bench.Phases(cuda=False)
    phases.step = 2

    def too_big():
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 1.16 GiB.\nmore text")
    with pytest.raises(torch.OutOfMemoryError):
        phases.measure("update", too_big)
    assert phases.oom == dict(phase="update", step=2, allocated_gib=None, reserved_gib=None,
                              message="CUDA out of memory. Tried to allocate 1.16 GiB.")
    assert "update" not in phases.stats                  # a failed call is not a measurement
    text = bench.report(dict(device="cuda", device_name="GPU", cap_gb=12.0, cap_fraction=0.15,
                             total_memory_gib=79.2, arch="qwen2.5-0.5b", scaled_down=False, parameters=1,
                             train_flags=[], phases=phases.table(),
                             at_rest_allocated_gib={"after_load": None, "after_update": None},
                             prompt_lengths={}, completions={}, tokens_per_s={}, oom=phases.oom))
    assert "OUT OF MEMORY in phase 'update' at step 2" in text


def test_train_flags_add_defaults_only_where_missing():
    args = bench.argparse.Namespace(steps=3)
    flags = bench.train_flags(args, ["--preset", "qwen-0.5b", "--eval-n=8"], "M", "O")
    assert flags[-4:] == ["--model", "M", "--out", "O"]
    assert "--eval-batch" in flags and flags.count("--eval-n") == 0 and "--eval-n=8" in flags
    assert flags[flags.index("--steps") + 1] == "3"
    with pytest.raises(SystemExit):                      # the model is the script's
        bench.main(["--arch", "qwen2.5-0.5b", "--", "--model", "x"])
