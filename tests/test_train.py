"""Tests for train.py: end-to-end runs of the tiny preset, exact resume, bad inputs, and the
GRPO traps (pad == eos masks, hidden sampling defaults, scoring vs sampling, micro-batching)."""
import copy
import dataclasses
import functools
import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from engine import checkpoints
import data
import losses
from engine import models
from engine import sampling
from engine import scoring
import train
from losses import LOSSES

REPO = Path(__file__).resolve().parents[1]
FIXTURE = Path(__file__).parent / "fixtures" / "tiny_gsm8k.jsonl"
FAST = ["--preset", "tiny", "--sft-steps", "30", "--eval-n", "40", "--eval-batch", "40",
        "--prompts-per-step", "4", "--group-size", "4", "--micro-batch", "16", "--max-new-tokens", "16",
        "--eval-every", "0", "--sample-every", "2"]


@pytest.fixture(scope="module")
def warm(warm_starts):
    """A (badly) warmed-up tiny model, built once for the whole session (tests/conftest.py)."""
    path = models.warm_start(train.parse_config(FAST + ["--out", str(warm_starts / "x")]))
    assert (Path(path) / "config.json").exists() and (Path(path) / "tokenizer.json").exists()
    _, tok = train.load_model(train.parse_config(FAST + ["--init", path]), torch.device("cpu"))
    text = "Q: Mia has 7 pens.\nA: 7+5=12\n#### 12"
    assert tok(text)["input_ids"] == models.tiny_tokenizer()(text)["input_ids"]   # loads exactly as saved
    return path


def read(path):
    return [json.loads(line) for line in Path(path).read_text().splitlines()]


def run(args, warm):
    return train.main(FAST + ["--init", warm] + args)


# ----------------------------------------------------------------------------------------
# End to end

def test_eval_n_0_logs_no_accuracy_of_nothing(tmp_path, warm):
    """--eval-n 0 evaluates nothing: no eval line (0.0 accuracy on 0 problems would read as a number)."""
    out = tmp_path / "run"
    assert run(["--out", str(out), "--steps", "1", "--eval-n", "0", "--pass-n", "0"], warm) == 0
    lines = read(out / "metrics.jsonl")
    assert [l["step"] for l in lines] == [1] and not any("eval_accuracy" in l for l in lines)


def test_tiny_run_end_to_end(tmp_path, warm):
    out = tmp_path / "run"
    assert run(["--out", str(out), "--steps", "4", "--loss", "cw_grpo"], warm) == 0
    lines = read(out / "metrics.jsonl")
    train_lines = [l for l in lines if "loss" in l]
    evals = [l for l in lines if "eval_accuracy" in l]
    assert [l["step"] for l in train_lines] == [1, 2, 3, 4]
    assert [l["step"] for l in evals] == [0, 4] and all(l["eval_n"] == 40 for l in evals)
    assert all(0 <= l["eval_strict"] <= l["eval_accuracy"] for l in evals)
    required = {"step", "loss", "reward", "reward_std", "frac_zero_std", "entropy", "grad_norm", "kl",
                "clip_frac", "weight_mean", "completion_len", "truncated_frac", "step_time", "gen_time",
                "peak_mem_gb"}
    assert all(required <= set(l) for l in train_lines)
    assert all(torch.isfinite(torch.tensor(l["loss"])) and l["entropy"] > 0 for l in train_lines)
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["loss"] == "cw_grpo" and cfg["preset"] == "tiny" and cfg["group_size"] == 4
    samples = read(out / "samples.jsonl")
    assert [s["step"] for s in samples] == [2, 4]
    s = samples[0]
    assert len(s["completions"]) == len(s["tokens"]) == len(s["logp"]) == len(s["mask"]) == 4
    assert all(len(t) == len(m) == len(lp) == len(e)
               for t, m, lp, e in zip(s["tokens"], s["mask"], s["logp"], s["entropy"]))
    assert (out / "ckpt" / "last.pt").exists()


def test_the_seed_alone_fixes_a_run_whether_or_not_its_model_was_cached(tmp_path):
    """The first run builds the warm start (drawing random numbers for it); the second finds it
    cached. Same seed, so the same samples and the same numbers (a fresh clone must reproduce
    the README). This failed when the seed was set before the model was built. (beta = 0: with
    a KL term, an all-zero-advantage step leaves a 1e-8 gradient of rounding noise that AdamW
    scales up to full-size steps, so bit-level differences between runs would grow.)"""
    runs = [tmp_path / "first", tmp_path / "second"]
    for out in runs:
        assert train.main(FAST + ["--out", str(out), "--steps", "2", "--beta", "0"]) == 0
    assert len(list(tmp_path.glob("warmstart-tiny-*"))) == 1          # built once, then reused
    drop = ("time", "tokens_per_s", "mfu", "peak_mem_gb")
    first, second = ([{k: v for k, v in l.items() if not any(d in k for d in drop)}
                      for l in read(out / "metrics.jsonl")]
                     for out in runs)
    assert first == second and len(first) == 4                        # eval, 2 steps, eval
    assert read(runs[0] / "samples.jsonl") == read(runs[1] / "samples.jsonl")


def test_final_model_loads_as_a_plain_hf_directory(tmp_path, warm):
    from transformers import AutoModelForCausalLM
    out = tmp_path / "run"
    assert run(["--out", str(out), "--steps", "2", "--lr", "1e-2"], warm) == 0
    final = AutoModelForCausalLM.from_pretrained(out / "final")
    trained = torch.load(out / "ckpt" / "last.pt", weights_only=True)["model"]
    assert all(torch.equal(final.state_dict()[k], v) for k, v in trained.items())
    base = AutoModelForCausalLM.from_pretrained(warm)
    assert not all(torch.equal(base.state_dict()[k], v) for k, v in trained.items())   # it trained
    _, tok = models.load(str(out / "final"))
    assert tok("7+5=12")["input_ids"] == models.tiny_tokenizer()("7+5=12")["input_ids"]
    assert final.generation_config.do_sample is False                                  # greedy, written out

@pytest.mark.slow
def test_tiny_preset_learns(tmp_path):
    """The headline claim, shortened: the default warm start (built here, ~70 s) answers
    wordily and scores ~0 greedy; 30 GRPO steps make it answer tersely and score >= 0.15."""
    out = tmp_path / "run"
    assert train.main(["--preset", "tiny", "--out", str(out), "--steps", "30", "--eval-every", "0",
                       "--eval-n", "200", "--ckpt-every", "100"]) == 0
    evals = [l["eval_accuracy"] for l in read(out / "metrics.jsonl") if "eval_accuracy" in l]
    assert evals[0] < 0.05 and evals[-1] >= evals[0] + 0.15, evals


def test_each_loss_runs_a_step(tmp_path, warm):
    for name in LOSSES:
        out = tmp_path / name
        assert run(["--out", str(out), "--steps", "1", "--loss", name, "--eval-n", "4"], warm) == 0
        step = [l for l in read(out / "metrics.jsonl") if "loss" in l][0]
        if name == "tepo":
            assert 0 <= step["kl_mask_frac"] <= 1


def test_two_updates_per_batch_log_the_clip_of_every_update(tmp_path, warm):
    """The first update of a step is on policy (ratio 1, nothing clipped); the second is not.
    clip_frac, its two sides and abs_log_ratio are logged over every update, so a run with
    --updates-per-batch 2 shows the clip acting (lr 1e-3: the tiny model moves enough)."""
    out = tmp_path / "tepo"
    assert run(["--out", str(out), "--steps", "3", "--loss", "tepo", "--updates-per-batch", "2",
                "--lr", "1e-3", "--beta", "0.04", "--eval-n", "4"], warm) == 0
    steps = [l for l in read(out / "metrics.jsonl") if "loss" in l]
    assert any(l["clip_frac"] > 0 for l in steps), steps
    for l in steps:
        assert l["clip_frac"] == pytest.approx(l["clip_low_frac"] + l["clip_high_frac"])
    assert any(l["abs_log_ratio"] > 0 for l in steps)
    assert all(0 <= l["kl_mask_frac"] <= 1 for l in steps) and any(l["kl_mask_frac"] > 0 for l in steps)


def test_kl_mask_frac_is_logged_only_where_beta_gives_the_mask_something_to_multiply(tmp_path, warm):
    for beta in ("0", "0.04"):
        out = tmp_path / f"beta-{beta}"
        args = ["--out", str(out), "--steps", "1", "--loss", "tepo", "--beta", beta, "--eval-n", "4"]
        assert run(args, warm) == 0
        step = [l for l in read(out / "metrics.jsonl") if "loss" in l][0]
        assert ("kl_mask_frac" in step) == (beta != "0"), beta


def test_the_controls_reach_the_loss(tmp_path, warm, monkeypatch):
    """--tr-mean-one and --tepo-full-kl-beta arrive in the loss as its options (docs/METHODS.md): TR-GRPO's
    logged weights average exactly 1 (each row's do), and TEPO's loss is called with the coefficient."""
    means = {}
    for flags in ([], ["--tr-mean-one"]):
        out = tmp_path / f"tr{len(flags)}"
        assert run(["--out", str(out), "--steps", "1", "--loss", "tr_grpo", "--eval-n", "4", *flags],
                   warm) == 0
        means[bool(flags)] = [l for l in read(out / "metrics.jsonl") if "loss" in l][0]["weight_mean"]
    assert means[True] == pytest.approx(1.0, abs=1e-6) and means[False] > 1.0
    seen = []
    real = LOSSES["tepo"]
    spy = functools.wraps(real)(lambda *a, **k: seen.append(k.get("full_kl_beta")) or real(*a, **k))
    monkeypatch.setitem(LOSSES, "tepo", spy)
    out = tmp_path / "tepo"
    assert run(["--out", str(out), "--steps", "1", "--loss", "tepo", "--eval-n", "4",
                "--tepo-full-kl-beta", "0.02"], warm) == 0
    assert seen and set(seen) == {0.02}


@pytest.mark.parametrize("loss, flag, option", [("tr_grpo", "--tr-inside-clip", "inside_clip"),
                                                ("tepo", "--tepo-token-ratio", "token_ratio")])
def test_the_other_readings_reach_the_loss(tmp_path, warm, monkeypatch, loss, flag, option):
    """--tr-inside-clip and --tepo-token-ratio arrive in the loss as its options; without the flag
    the loss is called as before (no option passed at all)."""
    seen = []
    real = LOSSES[loss]
    spy = functools.wraps(real)(lambda *a, **k: seen.append(k.get(option, "not passed")) or real(*a, **k))
    monkeypatch.setitem(LOSSES, loss, spy)
    for flags in ([], [flag]):
        seen.clear()
        assert run(["--out", str(tmp_path / f"{loss}{len(flags)}"), "--steps", "1", "--loss", loss,
                    "--eval-n", "4", *flags], warm) == 0
        assert seen and set(seen) == ({True} if flags else {"not passed"})


def losses_and_rewards(path):
    return [(l["step"], l["loss"], l["reward"]) for l in read(path) if "loss" in l]


def test_resume_after_a_crash_reproduces_the_uninterrupted_run(tmp_path, warm, monkeypatch):
    args = ["--steps", "6", "--ckpt-every", "2", "--seed", "3"]
    assert run(args + ["--out", str(tmp_path / "a")], warm) == 0
    real_step = train.grpo_step
    calls = {"n": 0}

    def crash_at_step_4(*a, **k):          # steps 1-3 run (3 is logged, never checkpointed)
        calls["n"] += 1
        if calls["n"] == 4:
            raise RuntimeError("simulated crash")
        return real_step(*a, **k)
    monkeypatch.setattr(train, "grpo_step", crash_at_step_4)
    with pytest.raises(RuntimeError, match="simulated crash"):
        run(args + ["--out", str(tmp_path / "b")], warm)
    assert [s for s, _, _ in losses_and_rewards(tmp_path / "b" / "metrics.jsonl")] == [1, 2, 3]
    monkeypatch.setattr(train, "grpo_step", real_step)
    assert run(args + ["--out", str(tmp_path / "b"), "--resume"], warm) == 0
    a = losses_and_rewards(tmp_path / "a" / "metrics.jsonl")
    b = losses_and_rewards(tmp_path / "b" / "metrics.jsonl")
    assert [s for s, _, _ in b] == [1, 2, 3, 4, 5, 6]       # step 3 re-run once, not logged twice
    assert a == b                                            # bit-for-bit on CPU


def test_ckpt_every_0_saves_only_at_the_end(tmp_path, warm, monkeypatch):
    """As --eval-every 0 evaluates only at the start and the end, --ckpt-every 0 checkpoints only
    after the last step (a ZeroDivisionError after step 1, once)."""
    saved = []
    real = train.checkpoints.save_checkpoint
    monkeypatch.setattr(train.checkpoints, "save_checkpoint", lambda *a: saved.append(a[5]) or real(*a))
    assert run(["--out", str(tmp_path / "r"), "--steps", "3", "--ckpt-every", "0"], warm) == 0
    assert saved == [3]
    assert torch.load(tmp_path / "r" / "ckpt" / "last.pt", weights_only=True)["step"] == 3


def test_ctrl_c_saves_a_checkpoint_and_resume_continues(tmp_path, warm, monkeypatch, capsys):
    args = ["--steps", "5", "--ckpt-every", "100", "--seed", "4"]
    assert run(args + ["--out", str(tmp_path / "a")], warm) == 0
    real_step = train.grpo_step
    calls = {"n": 0}

    def ctrl_c_during_step_2(*a, **k):
        calls["n"] += 1
        if calls["n"] == 2:
            os.kill(os.getpid(), signal.SIGINT)      # the handler lets step 2 finish
        return real_step(*a, **k)
    monkeypatch.setattr(train, "grpo_step", ctrl_c_during_step_2)
    assert run(args + ["--out", str(tmp_path / "b")], warm) == 130
    assert "--resume" in capsys.readouterr().out
    assert torch.load(tmp_path / "b" / "ckpt" / "last.pt", weights_only=True)["step"] == 2
    monkeypatch.setattr(train, "grpo_step", real_step)
    assert run(args + ["--out", str(tmp_path / "b"), "--resume"], warm) == 0
    assert (losses_and_rewards(tmp_path / "a" / "metrics.jsonl")
            == losses_and_rewards(tmp_path / "b" / "metrics.jsonl"))


def test_non_finite_loss_stops_and_keeps_the_checkpoint(tmp_path, warm, monkeypatch):
    out = tmp_path / "run"
    assert run(["--out", str(out), "--steps", "2", "--ckpt-every", "1"], warm) == 0
    before = (out / "ckpt" / "last.pt").read_bytes()
    original = LOSSES["grpo"]

    @functools.wraps(original)
    def nan_loss(*a, **k):
        loss, info = original(*a, **k)
        return loss * float("nan"), info
    monkeypatch.setitem(LOSSES, "grpo", nan_loss)
    with pytest.raises(SystemExit, match="non-finite"):
        run(["--out", str(out), "--steps", "4", "--ckpt-every", "1", "--resume"], warm)
    assert (out / "ckpt" / "last.pt").read_bytes() == before


# ----------------------------------------------------------------------------------------
# Bad input: a clear message, a non-zero exit, nothing overwritten

@pytest.mark.parametrize("args,message", [
    (["--loss", "ppo"], "invalid choice"),
    (["--preset", "huge"], "invalid choice"),
    (["--group-size", "1"], "group-size must be >= 2"),
    (["--micro-batch", "5"], "divisible"),
    (["--cw-normalise", "tokens"], "invalid choice"),
    (["--loss", "cw_grpo", "--no-cw-detach", "--micro-batch", "2"], "multiple of 4 (whole groups)"),
    (["--loss", "cw_grpo", "--no-cw-detach", "--cw-scope", "batch", "--micro-batch", "8"], "multiple of 16"),
    (["--ckpt-every", "-1"], "--ckpt-every must be >= 0"),
    (["--loss", "grpo", "--tr-mean-one"], "an option of another loss"),
    (["--loss", "tr_grpo", "--tepo-full-kl-beta", "0.04"], "an option of another loss"),
    (["--loss", "tepo", "--tepo-full-kl-beta", "0.04", "--beta", "0"], "only with --beta > 0"),
    (["--loss", "tepo", "--tepo-full-kl-beta", "-1"], "must be >= 0"),
])
def test_bad_flags(args, message, capsys):
    with pytest.raises(SystemExit) as e:
        train.parse_config(FAST + args)
    assert e.value.code != 0 and message in capsys.readouterr().err


def test_malformed_data_file_names_the_line(tmp_path, warm):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(FIXTURE.read_text().splitlines()[0] + "\n{not json\n")
    with pytest.raises(SystemExit, match=r"bad.jsonl, line 2"):
        run(["--out", str(tmp_path / "run"), "--data", str(bad)], warm)


def test_refuses_to_overwrite_a_run_with_another_config(tmp_path, warm):
    out = tmp_path / "run"
    assert run(["--out", str(out), "--steps", "1"], warm) == 0
    before = (out / "metrics.jsonl").read_text(), (out / "config.json").read_text()
    with pytest.raises(SystemExit, match="different config"):
        run(["--out", str(out), "--steps", "1", "--lr", "0.5"], warm)
    with pytest.raises(SystemExit, match="--resume"):
        run(["--out", str(out), "--steps", "1"], warm)
    with pytest.raises(SystemExit, match="another config"):           # resuming with another loss
        run(["--out", str(out), "--steps", "2", "--resume", "--loss", "tepo"], warm)
    assert ((out / "metrics.jsonl").read_text(), (out / "config.json").read_text()) == before


def test_model_that_cannot_be_loaded_offline_points_to_tiny(tmp_path):
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    for split in ("train", "test"):
        (tmp_path / f"{split}.jsonl").write_text(FIXTURE.read_text())
    p = subprocess.run([sys.executable, "train.py", "--preset", "qwen-0.5b",
                        "--model", "no-such-org/no-such-model",
                        "--data", str(tmp_path), "--out", str(tmp_path / "q")],
                       cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode != 0 and "--preset tiny" in p.stderr, p.stderr[-2000:]


# ----------------------------------------------------------------------------------------
# The traps

# The completion mask from positions (pad == eos) is graded in tests/graded/test_completion_mask.py.


def test_tiny_tokenizer_pad_is_eos():
    tok = models.tiny_tokenizer()
    assert tok.pad_token_id == tok.eos_token_id and tok.padding_side == "left"
    assert tok.decode(tok("A: 7+5=12\n#### 12")["input_ids"]) == "A: 7+5=12\n#### 12"


@pytest.fixture
def tiny(warm):
    cfg = train.parse_config(FAST + ["--init", warm, "--temperature", "0.7"])
    model, tok = train.load_model(cfg, torch.device("cpu"))
    return cfg, model, tok


def test_checkpoint_sampling_defaults_cannot_leak(tiny):
    from transformers import GenerationConfig
    cfg, model, tok = tiny
    model.generation_config = GenerationConfig(do_sample=True, top_k=20, top_p=0.8, repetition_penalty=1.05,
                                               temperature=0.3)          # what Qwen2.5-Instruct ships
    enc = tok(["Q: Mia has 3 pens.\nA: ", "Q: 1+1?\nA: "], return_tensors="pt", padding=True,
              add_special_tokens=False)
    gen = sampling.generation_config(model, tok, cfg)
    gen.update(output_scores=True, output_logits=True, return_dict_in_generate=True)
    model.generation_config = gen
    out = model.generate(**enc, generation_config=gen)
    for scores, logits in zip(out.scores, out.logits):
        assert torch.allclose(scores, logits / 0.7)   # nothing but the temperature touched them


def test_scoring_matches_the_sampling_distribution(tiny):
    """The log-probs we score (old_logp) must be those of the distribution generate() sampled
    from: same temperature, same positions under left padding, mask up to the first EOS."""
    cfg, model, tok = tiny
    torch.manual_seed(0)
    questions = ["Mia has 3 pens and buys 12 more. How many pens does Mia have?", "Tom has 5 cups."] * 2
    enc = tok([data.render_prompt(tok, q) for q in questions], return_tensors="pt", padding=True,
              add_special_tokens=False)
    assert (enc["attention_mask"] == 0).any()           # the short prompts really are left-padded
    gen = sampling.generation_config(model, tok, cfg)
    gen.update(output_logits=True, return_dict_in_generate=True)
    model.generation_config = gen
    out = model.generate(**enc, generation_config=gen)
    completions = out.sequences[:, enc["input_ids"].shape[1]:]
    vocab_logp = torch.log_softmax(torch.stack(out.logits, 1) / 0.7, -1)
    sampled = vocab_logp.gather(-1, completions[..., None])[..., 0]
    mask, truncated = train.completion_mask(completions, sampling.eos_ids(model, tok))
    batch = train.Rollout(enc["input_ids"], enc["attention_mask"], completions, mask, truncated)
    logp, entropy = scoring.score_no_grad(model, batch, cfg)
    assert torch.allclose(logp * mask, sampled * mask, atol=1e-4)
    cfg.temperature = 1.0                                # scoring without the temperature: wrong
    assert not torch.allclose(scoring.score_no_grad(model, batch, cfg)[0] * mask, sampled * mask, atol=1e-2)
    assert (entropy[mask > 0] > 0).all()


def test_ratio_is_one_before_the_first_update_and_warns_otherwise(tiny, capsys):
    cfg, model, tok = tiny
    problems = train.load_problems(cfg)[0][:4]
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    metrics, _ = train.grpo_step(model, None, tok, opt, sched, problems, cfg, torch.device("cpu"))
    assert "ratio is not 1" not in capsys.readouterr().err
    assert metrics["clip_frac"] == 0.0
    for module in model.modules():                      # dropout at scoring time: a mismatch
        if hasattr(module, "attention_dropout"):
            module.attention_dropout = 0.5
    train.grpo_step(model, None, tok, opt, sched, problems, cfg, torch.device("cpu"))
    assert "ratio is not 1" in capsys.readouterr().err


def test_the_ratio_check_bound_follows_the_precision_computed_in(capsys):
    """A drift of 0.01 is bf16's or fp16's rounding, but a bug in float32. The bound comes from
    scoring.compute_dtype, so a T4 asked for bf16 (computing in float32, tests/test_cuda.py)
    keeps float32's."""
    logp, mask = torch.zeros(1, 3), torch.ones(1, 3)
    for dtype, warns in [("float32", True), ("bfloat16", False), ("float16", False)]:
        scoring.check_ratio_is_one(logp + 0.01, logp, mask, train.parse_config(["--dtype", dtype]))
        assert ("ratio is not 1" in capsys.readouterr().err) == warns, dtype


CW_OPTIONS = {
    "cw_grpo, theirs": dict(cw_normalise="padded", cw_detach=False),     # weights in each micro-batch
    "cw_grpo, batch scope": dict(cw_scope="batch")}


@pytest.mark.parametrize("loss", list(LOSSES) + list(CW_OPTIONS))
def test_micro_batching_inside_the_loop_gives_the_full_batch_gradient(tiny, loss, monkeypatch):
    cfg, model, tok = tiny
    # micro-batch 4 = one group of 4: the weights of --no-cw-detach are exact
    if loss in CW_OPTIONS:
        cfg, loss = dataclasses.replace(cfg, **CW_OPTIONS[loss]), "cw_grpo"
    problems = train.load_problems(cfg)[0][:4]
    # mixed rewards
    monkeypatch.setattr(train.rewards, "reward", lambda text, gold: float(len(text) % 3 == 0))
    ref = copy.deepcopy(model).requires_grad_(False)
    with torch.no_grad():
        for p in ref.parameters():
            p.add_(0.01 * torch.randn_like(p))         # a reference that differs: the KL term counts too
    grads = []
    for micro in (16, 4):
        cfg.micro_batch, cfg.loss, cfg.max_grad_norm = micro, loss, 1e9
        opt = torch.optim.SGD(model.parameters(), lr=0.0)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
        torch.manual_seed(5)                            # the same samples both times
        metrics, _ = train.grpo_step(model, ref, tok, opt, sched, problems, cfg, torch.device("cpu"))
        assert 0 < metrics["reward"] < 1 and metrics["kl"] > 0
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters()]))
    assert grads[0].abs().sum() > 0
    assert torch.allclose(grads[0], grads[1], rtol=1e-4, atol=1e-7)


def test_cw_grpo_weights_are_per_group_of_the_step(tiny, monkeypatch):
    """The weights the loss applies are cw_grpo_weights of each group of G rows, from the sampling
    policy's log-probs; with --no-cw-detach, the loss computes the same from the live log-probs."""
    cfg, model, tok = tiny
    problems = train.load_problems(cfg)[0][:4]
    # mixed rewards
    monkeypatch.setattr(train.rewards, "reward", lambda text, gold: float(len(text) % 3 == 0))
    calls, real = [], LOSSES["cw_grpo"]

    @functools.wraps(real)
    def spy(logp, old_logp, ref_logp, adv, mask, entropy=None, **kw):
        loss, info = real(logp, old_logp, ref_logp, adv, mask, entropy, **kw)
        calls.append(dict(old=old_logp.detach(), adv=adv, mask=mask, weights=info["weights"], kw=kw))
        return loss, info
    monkeypatch.setitem(train.LOSSES, "cw_grpo", spy)
    for detach in (True, False):
        calls.clear()
        opt = torch.optim.SGD(model.parameters(), lr=0.0)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
        torch.manual_seed(5)
        run_cfg = dataclasses.replace(cfg, loss="cw_grpo", cw_detach=detach, micro_batch=16)
        train.grpo_step(model, None, tok, opt, sched, problems, run_cfg, torch.device("cpu"))
        (call,) = calls
        assert ("weights" in call["kw"]) == detach and call["kw"]["group_size"] == 4
        want = losses.cw_grpo_weights(call["old"], call["adv"], call["mask"], 4)
        assert torch.allclose(call["weights"], want, atol=1e-6)
        one_group = losses.cw_grpo_weights(call["old"], call["adv"], call["mask"])
        assert not torch.allclose(call["weights"], one_group, atol=1e-3)      # G matters: the check can fail


UNPATCHED_LOSSES = dict(LOSSES)


def fp16_step(model, tok, cfg, opt, sched, scaler, monkeypatch, loss_times=1.0, batch=None):
    """One grpo_step of the tiny model (CPU autocast computes in fp16 too), with mixed rewards,
    the loss multiplied by ``loss_times`` and, if given, ``batch`` instead of a new rollout;
    returns (metrics, gradient)."""
    if batch is not None:
        monkeypatch.setattr(train, "rollout", lambda *a, **k: batch)
    real = UNPATCHED_LOSSES[cfg.loss]

    @functools.wraps(real)
    def scaled(*a, **k):
        loss, info = real(*a, **k)
        return loss * loss_times, info
    monkeypatch.setitem(train.LOSSES, cfg.loss, scaled)
    monkeypatch.setattr(train.rewards, "reward", lambda text, gold: float(len(text) % 3 == 0))
    torch.manual_seed(5)
    problems = train.load_problems(cfg)[0][:4]
    metrics, _ = train.grpo_step(model, None, tok, opt, sched, problems, cfg, torch.device("cpu"), scaler)
    return metrics, torch.cat([p.grad.flatten() for p in model.parameters()])


def test_fp16_gradients_are_unscaled_before_the_clip_and_equal_float32_ones(tiny, monkeypatch):
    """--dtype float16 scales the loss by 65536 before the backward pass (grad_scaler), and divides
    the gradients back before they are clipped, logged and stepped: the gradient is float32's,
    up to fp16's rounding, not 65536 times it."""
    cfg, model, tok = tiny
    grads, norms = {}, {}
    torch.manual_seed(0)
    batch = train.rollout(model, tok, [p["question"] for p in train.load_problems(cfg)[0][:4]], cfg,
                          group_size=cfg.group_size)                  # the same samples for both
    for dtype in ("float32", "float16"):
        run_cfg = dataclasses.replace(cfg, dtype=dtype, max_grad_norm=1e9, beta=0.0)
        opt = torch.optim.SGD(model.parameters(), lr=0.0)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
        scaler = models.grad_scaler(run_cfg, torch.device("cpu"))
        assert scaler.is_enabled() == (dtype == "float16")
        metrics, grads[dtype] = fp16_step(model, tok, run_cfg, opt, sched, scaler, monkeypatch, batch=batch)
        assert ("grad_scale" in metrics) == (dtype == "float16")
        norms[dtype] = metrics["grad_norm"]                             # what the clip saw
    assert metrics["grad_scale"] == 65536 and metrics["skipped_updates"] == 0
    a, b = grads["float32"], grads["float16"]
    assert a.norm() > 0 and (a - b).norm() / a.norm() < 0.01, ((a - b).norm() / a.norm()).item()
    assert norms["float16"] == pytest.approx(norms["float32"], rel=0.01)


def test_fp16_skips_an_update_whose_gradients_overflow_halves_the_scale_and_resumes_it(tiny, tmp_path,
                                                                                        monkeypatch):
    """Gradients that overflow fp16 (here: a loss 1e8 times too large) skip the optimizer step
    and halve the scale, the logs say so, and the next step updates again. The scale is in the
    checkpoint: a resumed run starts from the halved one."""
    cfg, model, tok = tiny
    cfg = dataclasses.replace(cfg, dtype="float16", beta=0.0, lr=1e-3, out=str(tmp_path / "run"))
    opt, device = train.make_optimizer(model, cfg), torch.device("cpu")
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    scaler = models.grad_scaler(cfg, device)
    before = [p.detach().clone() for p in model.parameters()]
    metrics, _ = fp16_step(model, tok, cfg, opt, sched, scaler, monkeypatch, loss_times=1e8)
    assert metrics["skipped_updates"] == 1 and metrics["grad_scale"] == 32768
    assert not torch.isfinite(torch.tensor(metrics["grad_norm"]))
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), before))          # no step taken
    metrics, _ = fp16_step(model, tok, cfg, opt, sched, scaler, monkeypatch)
    assert metrics["skipped_updates"] == 0 and metrics["grad_scale"] == 32768
    assert not all(torch.equal(p, q) for p, q in zip(model.parameters(), before))      # this one stepped
    run = checkpoints.prepare_run_dir(cfg)
    checkpoints.save_checkpoint(run, model, opt, sched, scaler, 2, cfg)
    resumed = models.grad_scaler(cfg, device)
    checkpoints.resume(run, model, opt, sched, resumed, dataclasses.replace(cfg, resume=True))
    assert resumed.get_scale() == 32768


def test_the_fp16_benchmark_compares_with_float32_and_says_ok(warm, capsys):
    import experiments.benchmarks.fp16_vs_float32 as bench
    assert bench.main(["--model", warm, "--rows", "4", "--tokens", "12"]) == 0
    out = capsys.readouterr().out
    assert "float16:" in out and "loss scale 65536" in out and "fp16: ok" in out
    relative = float(re.search(r"\|g16 - g32\| / \|g32\| = ([\d.]+)", out).group(1))
    assert 0 < relative < 0.05


def test_the_reference_computes_in_the_runs_precision(warm):
    for dtype, want in [("float32", torch.float32), ("bfloat16", torch.bfloat16), ("float16", torch.float16)]:
        cfg = train.parse_config(FAST + ["--init", warm, "--beta", "0.04", "--dtype", dtype])
        policy, _ = train.load_model(cfg, torch.device("cpu"))
        assert next(models.reference_model(policy, cfg).parameters()).dtype == want
        assert next(policy.parameters()).dtype == torch.float32          # master weights stay float32


def test_lora_reference_is_the_base_with_adapters_disabled(warm, monkeypatch):
    """qwen-1.5b trains LoRA adapters; its KL reference is the same model with the adapters
    switched off (no second copy). Only adapter weights may change, and the reference must
    stay exactly the starting model."""
    pytest.importorskip("peft")
    cfg = train.parse_config(FAST + ["--init", warm, "--lora-rank", "4", "--lr", "1e-2"])
    policy, tok = train.load_model(cfg, torch.device("cpu"))
    base, _ = train.load_model(train.parse_config(FAST + ["--init", warm]), torch.device("cpu"))
    trainable = {n for n, p in policy.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in n for n in trainable)
    frozen = {n: p.detach().clone() for n, p in policy.named_parameters() if not p.requires_grad}
    params = [p for p in policy.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg.lr)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    problems = train.load_problems(cfg)[0][:4]
    # mixed rewards
    monkeypatch.setattr(train.rewards, "reward", lambda text, gold: float(len(text) % 3 == 0))
    torch.manual_seed(1)
    for _ in range(2):                                   # LoRA's B starts at 0: step twice
        metrics, _ = train.grpo_step(policy, None, tok, opt, sched, problems, cfg, torch.device("cpu"))
    assert metrics["kl"] > 0                             # the adapters moved away from the base
    assert all(torch.equal(p, frozen[n]) for n, p in policy.named_parameters() if not p.requires_grad)
    torch.manual_seed(0)
    batch = train.rollout(base, tok, [p["question"] for p in problems], cfg)
    mask = batch.mask
    want = scoring.score_no_grad(base, batch, cfg)[0] * mask
    with policy.disable_adapter():
        assert torch.allclose(scoring.score_no_grad(policy, batch, cfg)[0] * mask, want, atol=1e-5)
    assert not torch.allclose(scoring.score_no_grad(policy, batch, cfg)[0] * mask, want, atol=1e-3)


GSM8K = REPO.parent / "shared" / "data" / "gsm8k"


def test_qwen_preset_reads_local_gsm8k():
    if not (GSM8K / "train.jsonl").exists():
        pytest.skip(f"GSM8K not found at {GSM8K}")
    cfg = train.parse_config(["--preset", "qwen-0.5b", "--data", str(GSM8K)])
    train_set, held_out = train.load_problems(cfg)
    assert len(train_set) == 7473 and len(held_out) == cfg.eval_n == 500
    assert all(train.rewards.gold_answer(p["answer"]) is not None for p in train_set[:50] + held_out[:50])
    assert train.batch_of_prompts(train_set, cfg, 1) != train.batch_of_prompts(train_set, cfg, 2)


# ----------------------------------------------------------------------------------------
# Full size: one GRPO step of the real Qwen2.5-0.5B-Instruct architecture on CPU, in bf16 where
# the CPU computes bf16 natively, else in float32, as docs/performance.md advises for such a CPU
# (emulated bf16 takes 6-7 minutes for this one step; float32 about one).

def cpu_has_native_bf16():
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


SMOKE = r"""
import sys, time, torch
sys.path.insert(0, sys.argv[1])
dtype = sys.argv[2]
import train
from engine import mfu, models
from transformers import Qwen2Config, Qwen2ForCausalLM
torch.manual_seed(0)
# Qwen2.5-0.5B-Instruct's published config.json, with random weights.
config = Qwen2Config(vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                     num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=32768,
                     rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=True,
                     bos_token_id=151643, eos_token_id=151645, pad_token_id=151643)
policy = Qwen2ForCausalLM(config)
tok = models.tiny_tokenizer()        # ids 0..96 exist in the big vocabulary as well
cfg = train.parse_config(["--preset", "qwen-0.5b", "--prompts-per-step", "2", "--group-size", "2",
                          "--micro-batch", "2", "--max-new-tokens", "16", "--device", "cpu",
                          "--dtype", dtype])
policy.activation_checkpointing_enable()
ref = models.reference_model(policy, cfg)
with torch.no_grad():     # one small step away from the reference, so the KL term has a gradient
    policy.model.norm.weight.mul_(1.01)
opt = train.make_optimizer(policy, cfg)
sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
problems = [{"question": "Mia has 3 pens and buys 4 more. How many pens?", "answer": "3+4=7\n#### 7"},
            {"question": "Tom had 9 cups and broke 2. How many are left?", "answer": "9-2=7\n#### 7"}]
before = policy.model.layers[0].mlp.up_proj.weight.detach().clone()
t = time.time()
m, _ = train.grpo_step(policy, ref, tok, opt, sched, problems, cfg, torch.device("cpu"))
changed = not torch.equal(before, policy.model.layers[0].mlp.up_proj.weight)
peak = mfu.peak_mem_gb(torch.device("cpu"))
print(f"RESULT peak_rss_gib={peak:.2f} step_s={time.time() - t:.1f} "
      f"params={sum(p.numel() for p in policy.parameters())} "
      f"loss={m['loss']:.4f} grad_norm={m['grad_norm']:.3f} entropy={m['entropy']:.3f} changed={changed}")
"""


@pytest.mark.slow
def test_full_size_qwen_step_on_cpu():
    dtype = "bfloat16" if cpu_has_native_bf16() else "float32"
    p = subprocess.run([sys.executable, "-c", SMOKE, str(REPO), dtype], capture_output=True, text=True,
                       timeout=900)
    assert p.returncode == 0, p.stderr[-3000:]
    line = [l for l in p.stdout.splitlines() if l.startswith("RESULT")][0]
    print(line)
    fields = dict(kv.split("=") for kv in line.split()[1:])
    assert fields["changed"] == "True" and float(fields["grad_norm"]) > 0
    assert int(fields["params"]) == 494_032_768
    assert float(fields["entropy"]) > 5                 # random weights: near-uniform over 152k words
    # bf16: 9.28 GiB measured (an unfused AdamW needed 10.23); float32: 9.76 (a float32 reference)
    assert float(fields["peak_rss_gib"]) < (10 if dtype == "bfloat16" else 10.5)


def test_tepo_clip_records_ratio_one_then_moved_ratios(warm, tmp_path):
    import experiments.benchmarks.tepo_clip as bench
    assert bench.main(FAST + ["--init", warm, "--steps", "2", "--out", str(tmp_path / "run")]) == 0
    # restored after the benchmark patched them
    assert train.LOSSES["tepo"] is bench.losses.tepo_loss and train.grpo_step.__name__ == "grpo_step"
    first, second = json.loads((tmp_path / "run" / "tepo_clip.json").read_text())["updates"]
    assert first["sequences"] == second["sequences"] == 2 * 4 * 4           # steps x prompts x group
    # on policy: s is exactly 1
    assert first["max_abs_log_s"] == 0.0 and set(first["clipped"].values()) == {0.0}
    assert second["max_abs_log_s"] > 0.0                                    # after one update it moved
    shares = list(second["clipped"].values())                               # ranges from wide to narrow
    assert shares == sorted(shares) and shares[-1] > 0.0
    with pytest.raises(SystemExit, match="--loss can only be tepo"):            # not silently ignored
        bench.main(FAST + ["--init", warm, "--loss", "grpo", "--out", str(tmp_path / "other")])


def test_tepo_parts_runs_train_with_the_swapped_loss_and_restores_tepo(warm, tmp_path, capsys):
    import experiments.benchmarks.tepo_parts as bench
    out = tmp_path / "run"
    assert bench.main(FAST + ["--init", warm, "--steps", "2", "--updates-per-batch", "2", "--swap", "kl",
                              "--out", str(out)]) == 0
    assert train.LOSSES["tepo"] is losses.tepo_loss                        # restored after the run
    steps = [m for m in read(out / "metrics.jsonl") if "kl_mask_frac" in m]
    assert len(steps) == 2 and {m["kl_mask_frac"] for m in steps} == {1.0}   # the KL on every token
    assert json.loads((out / "config.json").read_text())["loss"] == "tepo"
    for args in ([], ["--swap", "entropy"]):                      # a clear usage error, no traceback
        with pytest.raises(SystemExit):
            bench.main(FAST + args)
        assert "--swap" in capsys.readouterr().err


def test_pass_at_k_cost_times_the_parts_and_adds_them_up(warm, capsys):
    import re
    import experiments.benchmarks.pass_at_k_cost as bench
    assert bench.main(FAST + ["--init", warm, "--steps", "10", "--pass-n", "4", "--pass-k", "2",
                              "--timed-steps", "2", "--threads", "1"]) == 0
    out = capsys.readouterr().out
    number = r"([0-9.]+)"
    t_eval = float(re.search(rf"held-out evaluation, 40 problems greedy: {number} s", out)[1])
    t_pass = float(re.search(rf"pass@2, 4 problems x 2 samples: {number} s", out)[1])
    t_step = float(re.search(rf"training step: [0-9.]+, [0-9.]+ s \(mean {number} s\)", out)[1])
    rest, added, share = map(float, re.search(rf"a 10-step run: {number} s without pass@k; the two "
                                              rf"pass@k add {number} s, {number}%", out).groups())
    assert abs(rest - (2 * t_eval + 10 * t_step)) <= 1 + 12 * 0.05       # the parts, rounded
    assert abs(added - 2 * t_pass) <= 1 + 0.1 and abs(share - 100 * added / rest) <= 1 + 100 * 2 / rest
    with pytest.raises(SystemExit, match="add --pass-n N"):              # nothing to time: said, not 0%
        bench.main(FAST + ["--init", warm])


def test_evaluate_counts_right_answers_and_strictly_right_ones(monkeypatch):
    texts = ["5 + 0 = 5\n#### 5", "The answer is 5.", "#### 4", "2 + 3 = 5"]     # strict, right, wrong, right
    problems = [{"question": f"q{i}", "answer": "... #### 5"} for i in range(4)]
    monkeypatch.setattr(train, "rollout",
                        lambda model, tok, questions, cfg, greedy: train.Rollout(*[None] * 5))
    monkeypatch.setattr(train, "decode", lambda tok, completions, mask: texts)
    cfg = train.parse_config(["--preset", "tiny", "--eval-batch", "4"])
    assert train.evaluate(None, None, problems, cfg) == (0.75, 0.25)


def test_pass_at_k_counts_problems_with_a_right_sample_and_right_samples(monkeypatch):
    """pass@k = share of problems with at least one right answer among k; pass@1 = share of right
    answers. 3 problems x k = 2, right = [1 0 | 0 0 | 1 1]: pass@2 = 2/3, pass@1 = 3/6; in batches
    of eval_batch // k prompts, each asked for k samples."""
    texts = ["#### 5", "#### 4", "#### 4", "#### 1", "#### 5", "5 + 0 = 5"]
    problems = [{"question": f"q{i}", "answer": "... #### 5"} for i in range(3)]
    calls = []

    def fake_rollout(model, tok, questions, cfg, group_size):
        calls.append((list(questions), group_size))
        return train.Rollout(*[None] * 5)
    served = iter([texts[:4], texts[4:]])                      # two batches: 2 prompts, then 1
    monkeypatch.setattr(train, "rollout", fake_rollout)
    monkeypatch.setattr(train, "decode", lambda tok, completions, mask: next(served))
    cfg = train.parse_config(["--preset", "tiny", "--eval-batch", "4", "--pass-k", "2", "--pass-n", "3"])
    model = torch.nn.Linear(1, 1)                              # only its device is read
    model.device = torch.device("cpu")
    assert train.pass_at_k(model, None, problems, cfg) == (pytest.approx(2 / 3), pytest.approx(0.5))
    assert calls == [(["q0", "q1"], 2), (["q2"], 2)]


def test_pass_at_k_is_logged_at_the_first_and_last_evaluation_and_leaves_training_alone(tmp_path, warm):
    """--pass-n adds pass@k to the evaluations at step 0 and at the end, not in between, and draws its
    samples from a random stream of its own: every training number equals a run's without it."""
    common = ["--steps", "2", "--eval-every", "1", "--seed", "4"]
    assert run(common + ["--out", str(tmp_path / "without")], warm) == 0
    assert run(common + ["--out", str(tmp_path / "with"), "--pass-n", "6", "--pass-k", "3"], warm) == 0
    records = read(tmp_path / "with" / "metrics.jsonl")
    evals = [r for r in records if "eval_accuracy" in r]
    assert [(r["step"], "eval_pass_at_k" in r) for r in evals] == [(0, True), (1, False), (2, True)]
    for r in (evals[0], evals[2]):
        assert (r["eval_pass_k"], r["eval_pass_n"]) == (3, 6)
        assert 0 <= r["eval_pass_at_1"] <= r["eval_pass_at_k"] <= 1
        assert r["eval_pass_at_k"] * 6 == pytest.approx(round(r["eval_pass_at_k"] * 6))   # a share of 6
    timed = ("time", "mfu", "tokens_per_s", "peak_mem_gb")               # timings differ from run to run
    strip = lambda rs: [{k: v for k, v in r.items()
                         if not k.startswith("eval_pass") and not k.endswith(timed)} for r in rs]
    assert strip(records) == strip(read(tmp_path / "without" / "metrics.jsonl"))


def test_config_records_the_machine_and_each_machine_a_resumed_run_moves_to(tmp_path, warm, monkeypatch):
    """config.json says which CPU (and torch's vector instructions on it) a run ran on: the same seed
    samples other completions on another. A run resumed on another machine lists both, with the step."""
    out = tmp_path / "run"
    assert run(["--out", str(out), "--steps", "2", "--ckpt-every", "1"], warm) == 0
    first = json.loads((out / "config.json").read_text())["machine"]
    assert len(first) == 1 and first[0]["from_step"] == 0
    assert first[0]["cpu"] and first[0]["cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    assert first[0]["torch"] == torch.__version__ and first[0]["cores"] == os.cpu_count()
    (out / "metrics.jsonl").write_text("\n".join((out / "metrics.jsonl").read_text().splitlines()[:2]) + "\n")
    other = dict(first[0], cpu="Another CPU", cpu_capability="AVX512")
    other.pop("from_step")
    monkeypatch.setattr(train.mfu, "machine", lambda device: other)
    assert run(["--out", str(out), "--steps", "3", "--ckpt-every", "1", "--resume"], warm) == 0
    machines = json.loads((out / "config.json").read_text())["machine"]
    assert machines == [first[0], dict(other, from_step=2)]
