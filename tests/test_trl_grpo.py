"""Tests for trl_grpo.py: our losses inside TRL's GRPOTrainer compute what train.py computes.

CPU, offline: a tiny randomly initialised Qwen2 saved to a temporary directory. Skipped when
TRL (an optional dependency) is not installed. This file is also the worker script of the
two-process test: `accelerate launch ... tests/test_trl_grpo.py worker ...`.
"""
import faulthandler
import functools
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import TrainerCallback

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

trl = pytest.importorskip("trl")

from engine import models  # noqa: E402
from multigpu import trl_grpo  # noqa: E402
from losses import cw_grpo_weights  # noqa: E402


def tiny_dir(path):
    """A 2-layer Qwen2 over our character tokenizer, saved with save_pretrained (TRL loads models by path)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM
    tok = models.tiny_tokenizer()
    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                         tie_word_embeddings=True, eos_token_id=tok.eos_token_id,
                         pad_token_id=tok.pad_token_id, bos_token_id=None)
    Qwen2ForCausalLM(config).save_pretrained(path)
    tok.save_pretrained(path)
    return str(path)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """The tiny model's directory; one thread meanwhile (the 2-process test starts more processes)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield tiny_dir(tmp_path_factory.mktemp("tiny"))
    torch.set_num_threads(threads)


def digit_reward(completions, **kwargs):
    """A dense reward (share of digits) so that every group has mixed rewards: the tests need gradients."""
    texts = [c[-1]["content"] for c in completions]
    return [sum(ch.isdigit() for ch in t) / max(len(t), 1) for t in texts]


def config(tmp_path, **overrides):
    """A small GRPOConfig: 4 prompts x 4 completions = 16 rows per step, 12 new tokens."""
    values = dict(output_dir=str(tmp_path / "out"), per_device_train_batch_size=16,
                  gradient_accumulation_steps=1, num_generations=4, max_completion_length=12, max_steps=1,
                  learning_rate=1e-3, beta=0.04, use_bias_correction_kl=False, max_grad_norm=0.0,
                  logging_steps=1, save_strategy="no", report_to="none", use_cpu=True, seed=0,
                  disable_dropout=True, dataloader_num_workers=0)
    values.update(overrides)
    return trl.GRPOConfig(**values)


def make_trainer(model_dir, tmp_path, loss="grpo", loss_kwargs=None, reward=digit_reward, trainer_cls=None,
                 callbacks=None, **overrides):
    kwargs = dict(model=model_dir, reward_funcs=reward, args=config(tmp_path, **overrides),
                  processing_class=models.load_tokenizer(model_dir),
                  train_dataset=trl_grpo.load_dataset("synthetic", 32), callbacks=callbacks)
    if trainer_cls is None:
        return trl_grpo.TokenRegGRPOTrainer(**kwargs, loss=loss, loss_kwargs=loss_kwargs)
    return trainer_cls(**kwargs)


class GradCapture(TrainerCallback):
    """The accumulated gradient of the first optimizer step, flattened, before the update."""
    grad = None

    def on_pre_optimizer_step(self, args, state, control, model=None, **kwargs):
        if self.grad is None:
            self.grad = torch.cat([p.grad.flatten().clone() for p in model.parameters()
                                   if p.grad is not None])


def spy_on(monkeypatch, name):
    """Wrap LOSSES[name] so that every call's micro-batch tensors and weights are recorded."""
    calls, real = [], trl_grpo.LOSSES[name]

    @functools.wraps(real)                # keeps the signature (the trainer reads its defaults)
    def spy(logp, old_logp, ref_logp, adv, mask, entropy=None, **kwargs):
        loss, info = real(logp, old_logp, ref_logp, adv, mask, entropy, **kwargs)
        calls.append(dict(old_logp=old_logp.detach().clone(), adv=adv.clone(), mask=mask.clone(),
                          weights=info["weights"].clone()))
        return loss, info
    monkeypatch.setitem(trl_grpo.LOSSES, name, spy)
    return calls


def cat_rows(tensors, width=None):
    """Concatenate [rows, T_i] tensors, right-padding each with zeros to the widest T."""
    width = width or max(t.shape[1] for t in tensors)
    return torch.cat([torch.nn.functional.pad(t, (0, width - t.shape[1])) for t in tensors])


# ----------------------------------------------------------------------------------------
# Refusals: clear errors before any model is loaded.

def test_bad_loss_name_and_kwargs(model_dir, tmp_path):
    with pytest.raises(ValueError, match=r"loss='ppo' is not one of losses.LOSSES"):
        make_trainer(model_dir, tmp_path, loss="ppo")
    with pytest.raises(ValueError, match=r"tr_grpo has no keyword argument 'scope'"):
        make_trainer(model_dir, tmp_path, loss="tr_grpo", loss_kwargs={"scope": "group"})
    with pytest.raises(ValueError, match=r"'clip_eps'.*GRPOConfig.epsilon"):
        make_trainer(model_dir, tmp_path, loss_kwargs={"clip_eps": 0.3})
    with pytest.raises(ValueError, match=r"unknown aggregation 'mean'"):
        make_trainer(model_dir, tmp_path, loss_kwargs={"agg": "mean"})
    with pytest.raises(ValueError, match=r"'group_size'.*GRPOConfig.num_generations"):
        make_trainer(model_dir, tmp_path, loss="cw_grpo", loss_kwargs={"group_size": 8})
    with pytest.raises(ValueError, match=r"detach=False.*whole groups"):
        make_trainer(model_dir, tmp_path, loss="cw_grpo", loss_kwargs={"detach": False})


@pytest.mark.parametrize("overrides, message", [
    (dict(loss_type="grpo"), "loss_type='grpo'"),
    (dict(use_bias_correction_kl=True), "use_bias_correction_kl=True"),
    (dict(epsilon_high=0.28), "epsilon_high"),
    (dict(importance_sampling_level="sequence"), "importance_sampling_level"),
    (dict(top_entropy_quantile=0.2), "top_entropy_quantile"),
    (dict(entropy_coef=0.01), "entropy_coef"),
    (dict(steps_per_generation=2), "steps_per_generation=2"),
])
def test_unsupported_trl_options(model_dir, tmp_path, overrides, message):
    with pytest.raises(ValueError, match=message):
        make_trainer(model_dir, tmp_path, **overrides)


def test_vllm_importance_sampling_is_refused(tmp_path):
    args = config(tmp_path)
    # no vLLM here: check the config only
    args.use_vllm, args.vllm_importance_sampling_correction = True, True
    with pytest.raises(ValueError, match="vllm_importance_sampling_correction=False"):
        trl_grpo.check_config(args)


# ----------------------------------------------------------------------------------------
# Training through TRL.

@pytest.mark.slow
@pytest.mark.parametrize("loss", ["grpo", "tr_grpo", "cw_grpo", "tepo"])
def test_each_loss_trains_two_steps(model_dir, tmp_path, loss):
    """Our grader and prompt, 2 steps, beta > 0: finite loss, our diagnostics in TRL's logs."""
    trainer = make_trainer(model_dir, tmp_path, loss=loss, reward=trl_grpo.gsm8k_reward, max_steps=2,
                           per_device_train_batch_size=8, gradient_accumulation_steps=2, max_grad_norm=1.0)
    trainer.train()
    steps = [log for log in trainer.state.log_history if "loss" in log]
    assert len(steps) == 2
    expected = {"entropy", "weight_mean", "clip_frac", "kl", "ratio_mean", "accuracy", "reward", "grad_norm"}
    expected |= {"kl_mask_frac"} if loss == "tepo" else set()
    for log in steps:
        assert expected <= set(log), expected - set(log)
        assert all(torch.isfinite(torch.tensor(float(log[k]))) for k in expected | {"loss"})
        assert 0 <= log["clip_frac"] <= 1 and log["entropy"] > 0


@pytest.mark.slow
@pytest.mark.parametrize("loss_type, agg", [("grpo", "seq-mean-token-mean"), ("dapo", "token-mean"),
                                            ("dr_grpo", "seq-mean-token-sum-norm")])
def test_grpo_equals_trl_own_loss(model_dir, tmp_path, loss_type, agg):
    """loss='grpo' equals TRL's loss_type (beta 0.04, bias correction off, same seed): first-step
    loss, gradient norm and gradient, with 2 accumulation steps."""
    ours, theirs = GradCapture(), GradCapture()
    common = dict(per_device_train_batch_size=8, gradient_accumulation_steps=2)
    a = make_trainer(model_dir, tmp_path, loss="grpo", loss_kwargs={"agg": agg}, callbacks=[ours], **common)
    a.train()
    b = make_trainer(model_dir, tmp_path, trainer_cls=trl.GRPOTrainer, callbacks=[theirs],
                     loss_type=loss_type, **common)
    b.train()
    la, lb = a.state.log_history[0], b.state.log_history[0]
    assert la["num_tokens"] == lb["num_tokens"] and la["reward"] == lb["reward"]     # the same samples
    d_loss, d_norm = abs(la["loss"] - lb["loss"]), abs(la["grad_norm"] - lb["grad_norm"])
    d_grad = (ours.grad - theirs.grad).abs().max().item()
    print(f"\n{loss_type} vs ours ({agg}): loss {la['loss']:.6g} vs {lb['loss']:.6g} (diff {d_loss:.2e}); "
          f"grad norm {la['grad_norm']:.6g} vs {lb['grad_norm']:.6g} (diff {d_norm:.2e}); "
          f"max |grad diff| {d_grad:.2e}")
    assert la["grad_norm"] > 1e-3
    assert d_loss < 1e-6 and d_norm < 1e-5 * la["grad_norm"] and d_grad < 1e-6


@pytest.mark.slow
@pytest.mark.parametrize("agg", ["seq-mean-token-mean", "token-mean", "seq-mean-token-sum-norm"])
def test_accumulation_gives_the_whole_batch_gradient(model_dir, tmp_path, agg):
    """The same 16-row generation batch, 1 x 16 rows or 4 x 4 rows: the same gradient (CW-GRPO,
    whose weights are group statistics, so that both the scale and the weights are checked).

    In float64: in float32 the two differ by ~1e-4 (max |grad| ~0.1) for TRL's own loss_type="grpo"
    too, because the gradient is a sum of large per-row terms that cancel (advantages sum to 0
    per group), so summation order shows; in float64 the difference is ~1e-8."""
    grads, samples = {}, {}
    for accum in (1, 4):
        capture = GradCapture()
        trainer = make_trainer(model_dir, tmp_path, loss="cw_grpo", loss_kwargs={"agg": agg},
                               callbacks=[capture], per_device_train_batch_size=16 // accum,
                               gradient_accumulation_steps=accum, model_init_kwargs={"dtype": torch.float64})
        trainer.train()
        grads[accum], samples[accum] = capture.grad, trainer.state.log_history[0]["num_tokens"]
    assert samples[1] == samples[4]
    diff = (grads[1] - grads[4]).abs().max().item()
    print(f"\n{agg}: |grad| {grads[1].norm():.4g}, max |grad(accum 1) - grad(accum 4)| = {diff:.2e}")
    assert grads[1].dtype == torch.float64 and grads[1].norm() > 1e-3 and diff < 1e-6


@pytest.mark.slow
@pytest.mark.parametrize("iterations", [1, 2])
def test_cw_weights_are_whole_batch_statistics(model_dir, tmp_path, monkeypatch, iterations):
    """With scope="batch" (statistics of every row, the widest case), the weights each micro-batch
    uses are cw_grpo_weights of the whole generation batch, from the sampling policy's log-probs:
    computed once, reused by a second update on the same batch (num_iterations=2, off-policy: TRL
    then stores old log-probs and the ratio moves off 1)."""
    calls = spy_on(monkeypatch, "cw_grpo")
    trainer = make_trainer(model_dir, tmp_path, loss="cw_grpo", loss_kwargs={"scope": "batch"},
                           per_device_train_batch_size=4, gradient_accumulation_steps=4,
                           num_iterations=iterations, max_steps=iterations)
    trainer.train()
    assert len(calls) == 4 * iterations
    cat = lambda key, part: torch.cat([c[key] for c in part])
    first, last = calls[:4], calls[-4:]
    used, mask = cat("weights", last), cat("mask", last)
    batch = dict(scope="batch")                                     # row order is irrelevant
    whole = cw_grpo_weights(cat("old_logp", first), cat("adv", first), cat("mask", first), **batch)
    per_micro = torch.cat([cw_grpo_weights(c["old_logp"], c["adv"], c["mask"], **batch) for c in first])
    if iterations == 2:     # the second update saw the same rows (reshuffled): align them by sorting
        key = lambda part: torch.argsort(cat("adv", part) * 1e3 + cat("old_logp", part).sum(1))
        a, b = key(first), key(last)
        assert torch.equal(cat("old_logp", first)[a], cat("old_logp", last)[b])
        used, mask = used[b], mask[b]
        whole, per_micro = whole[a], per_micro[a]
        assert abs(trainer.state.log_history[1]["ratio_mean"] - 1) > 1e-6       # really off-policy
    d_whole = ((used - whole) * mask).abs().max().item()
    d_micro = ((per_micro - whole) * mask).abs().max().item()
    print(f"\nCW weights used (update {iterations}) vs whole batch: {d_whole:.2e}; "
          f"per-micro-batch vs whole batch: {d_micro:.3f}")
    assert d_whole < 1e-4 and d_micro > 1e-2
    # mean 1 over the batch, not per micro-batch
    assert abs((used * mask).sum() / mask.sum() - 1) < 1e-5


@pytest.mark.slow
def test_cw_weights_are_per_group_of_the_generation_batch(model_dir, tmp_path, monkeypatch):
    """The default: cw_grpo_weights of each group of num_generations consecutive rows of the
    gathered generation batch (before TRL shuffles it); each micro-batch's loss then uses its
    rows' weights. Shuffled micro-batches cut groups, so computing them there would differ."""
    seen, real = [], trl_grpo.cw_grpo_weights

    def spy(logp, adv, mask, group_size=None, **kw):
        w = real(logp, adv, mask, group_size, **kw)
        seen.append(dict(logp=logp.clone(), adv=adv.clone(), mask=mask.clone(), group_size=group_size,
                         kw=kw, w=w))
        return w
    monkeypatch.setattr(trl_grpo, "cw_grpo_weights", spy)
    calls = spy_on(monkeypatch, "cw_grpo")
    make_trainer(model_dir, tmp_path, loss="cw_grpo", per_device_train_batch_size=4,
                 gradient_accumulation_steps=4).train()
    (batch,) = seen
    assert batch["group_size"] == 4 and batch["kw"] == {}
    # TRL's groups: 4 consecutive rows, advantages sum to 0
    groups = batch["adv"].view(-1, 4)
    assert groups.sum(1).abs().max() < 1e-5 and groups.abs().sum() > 1
    used = 0
    for c in calls:                                          # each row used carries its own row's weights
        for logp, adv, mask, w in zip(c["old_logp"], c["adv"], c["mask"], c["weights"]):
            width = mask.shape[0]
            rows = [i for i in range(16) if batch["adv"][i] == adv
                    and torch.allclose(batch["logp"][i, :width] * mask, logp * mask, atol=1e-5)]
            assert len(rows) == 1 and torch.allclose(batch["w"][rows[0], :width] * mask, w * mask, atol=1e-5)
            used += 1
    assert used == 16
    per_micro = torch.cat([cat_rows([real(c["old_logp"], c["adv"], c["mask"], 4)], batch["w"].shape[1])
                           for c in calls])
    used_w = torch.cat([cat_rows([c["weights"]], batch["w"].shape[1]) for c in calls])
    assert (per_micro - used_w).abs().max() > 1e-2


# ----------------------------------------------------------------------------------------
# Two processes (gloo on the CPU): the weights are the same as one process computes on the same batch.

def worker(model_dir, out):
    """Run under `accelerate launch --multi_gpu --num_processes 2` (CPU, gloo): one CW-GRPO step, then
    save what each rank generated and which weights its loss calls used."""
    # A rank that hangs prints every thread's stack and exits before the test's 300-s timeout, so the
    # failure says where it waits rather than only that the launcher timed out.
    faulthandler.dump_traceback_later(240, exit=True)
    torch.set_num_threads(1)
    patcher = pytest.MonkeyPatch()
    calls = spy_on(patcher, "cw_grpo")
    batches = []

    class Recording(trl_grpo.TokenRegGRPOTrainer):
        def _generate_and_score_completions(self, inputs):
            batch = super()._generate_and_score_completions(inputs)
            batches.append({k: v.clone() for k, v in batch.items() if isinstance(v, torch.Tensor)})
            return batch

    trainer = Recording(model=model_dir, reward_funcs=digit_reward,
                        args=config(Path(out), per_device_train_batch_size=4, gradient_accumulation_steps=2),
                        processing_class=models.load_tokenizer(model_dir),
                        train_dataset=trl_grpo.load_dataset("synthetic", 32), loss="cw_grpo",
                        loss_kwargs={"scope": "batch"})     # statistics across both processes
    assert trainer.accelerator.num_processes == 2
    trainer.train()
    torch.save(dict(batch=batches[0], calls=calls), Path(out) / f"rank{trainer.accelerator.process_index}.pt")
    trainer.end()                       # as trl_grpo.main does: the process group is left before exit
    assert not torch.distributed.is_initialized()
    # Leave without freeing the trainer. Freeing its DDP model frees torch's gloo process group, whose
    # destructor joins its worker thread while holding the GIL; a worker thread still freeing a finished
    # all-gather's tensors waits for the GIL: a deadlock, rare (stacks in docs/LOG.md). All is saved above.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def left_pad(tensors):
    width = max(t.shape[1] for t in tensors)
    return torch.cat([torch.nn.functional.pad(t, (width - t.shape[1], 0)) for t in tensors])


@pytest.mark.slow
def test_cw_weights_two_processes_equal_one_process(model_dir, tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO),
           "CUDA_VISIBLE_DEVICES": ""}
    # Not `accelerate launch --cpu`: with --cpu accelerate starts ONE process whatever --num_processes says
    # (its multi-CPU mode needs mpirun). --multi_gpu starts 2 processes (torch elastic, like torchrun), and
    # without a visible GPU they join a gloo process group on the CPU.
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
           "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
           "--main_process_port", str(port), __file__, "worker", model_dir, str(tmp_path)]
    run = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300, cwd=REPO)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    ranks = [torch.load(tmp_path / f"rank{i}.pt") for i in range(2)]

    # 1. The weights the loss calls of both ranks used = cw_grpo_weights over both ranks' rows.
    calls = [c for r in ranks for c in r["calls"]]
    width = max(c["mask"].shape[1] for c in calls)
    used, mask = cat_rows([c["weights"] for c in calls], width), cat_rows([c["mask"] for c in calls], width)
    whole = cw_grpo_weights(cat_rows([c["old_logp"] for c in calls], width),
                            torch.cat([c["adv"] for c in calls]), mask, scope="batch")
    d_used = ((used - whole) * mask).abs().max().item()

    # 2. One process, same batch: the trainer's own cw_weights() on both ranks' rows, as one batch.
    batches = [r["batch"] for r in ranks]
    merged = dict(prompt_ids=left_pad([b["prompt_ids"] for b in batches]),
                  prompt_mask=left_pad([b["prompt_mask"] for b in batches]),
                  completion_ids=cat_rows([b["completion_ids"] for b in batches]),
                  completion_mask=cat_rows([b["completion_mask"] for b in batches]),
                  advantages=torch.cat([b["advantages"] for b in batches]))
    one = make_trainer(model_dir, tmp_path, loss="cw_grpo", loss_kwargs={"scope": "batch"},
                       per_device_train_batch_size=8)
    single = one.cw_weights(merged)
    two = cat_rows([b["cw_weights"] for b in batches], single.shape[1])
    m = merged["completion_mask"].float()
    d_one = ((two - single) * m).abs().max().item()
    # What a per-process computation would have given instead (so the check can fail).
    n0 = batches[0]["advantages"].shape[0]
    own = one.cw_weights({k: v[:n0] for k, v in merged.items()})
    d_own = ((own - single[:n0]) * m[:n0]).abs().max().item()
    print(f"\n2 processes: weights used vs whole batch {d_used:.2e}; "
          f"vs one process on the same batch {d_one:.2e}; "
          f"(rank 0's rows alone would differ by {d_own:.3f})")
    assert d_used < 1e-4 and d_one < 1e-4 and d_own > 1e-2


if __name__ == "__main__" and sys.argv[1:2] == ["worker"]:
    worker(*sys.argv[2:4])
