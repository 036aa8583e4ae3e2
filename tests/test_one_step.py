"""Tests for experiments/one_step.py on the tiny model: its update is train.py's, bit for bit; every
arm starts from the same bytes; each measurement on a case worked by hand; and the property that
motivates the lab (AdamW's first step does not see a constant factor on the loss)."""
import functools
import json
import math
from pathlib import Path

import pytest
import torch

import losses
import train
from engine import models
from experiments import one_step
from losses import LOSSES

FAST = ["--preset", "tiny", "--sft-steps", "30", "--eval-n", "40", "--eval-batch", "40",
        "--prompts-per-step", "4", "--group-size", "4", "--micro-batch", "16", "--max-new-tokens", "16",
        "--eval-every", "0", "--sample-every", "2"]               # test_train's: the same cached warm start
CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def warm(warm_starts):
    return models.warm_start(train.parse_config(FAST + ["--out", str(warm_starts / "x")]))


@pytest.fixture
def flags(warm, monkeypatch):
    """The tiny run's flags; and mixed rewards (the badly warmed-up model is never right, and a batch
    of all-equal rewards has no gradient to compare)."""
    monkeypatch.setattr(train.rewards, "reward", lambda text, gold: float(sum(map(ord, text)) % 2 == 0))
    return FAST + ["--init", warm, "--temperature", "0.7", "--lr", "1e-3"]


def config(flags, *more):
    return train.parse_config(flags + list(more))


def problems(cfg):
    return train.load_problems(cfg)[0][:cfg.prompts_per_step]


def timeless(record):
    """A record without its timings (the rest is deterministic)."""
    return {k: v for k, v in record.items() if "time" not in k}


def equal_state(a, b):
    """Parameters and optimizer state, bit for bit."""
    sa, sb = a.optimizer.state_dict()["state"], b.optimizer.state_dict()["state"]
    return (all(torch.equal(p, q) for p, q in zip(a.params, b.params)) and sa.keys() == sb.keys()
            and all(torch.equal(sa[i][k], sb[i][k]) for i in sa for k in sa[i]))


# ----------------------------------------------------------------------------------------
# (a) The script's update is train.py's update.

@pytest.mark.parametrize("loss", list(LOSSES) + ["cw_grpo-authors"])
def test_the_update_is_grpo_steps_bit_for_bit(flags, loss):
    """From the same state and random state, the script's sample + one_update leaves the same
    parameters and AdamW state as train.grpo_step (its rollout, reward, advantage, step 4 and
    update()); and the record's ||Δθ|| is that step's."""
    authors = ["--no-cw-detach", "--cw-normalise", "padded"]
    name, options = (loss, []) if loss in LOSSES else ("cw_grpo", authors)
    cfg = config(flags, "--loss", name, "--updates-per-batch", "1", *options)
    ours, theirs = one_step.Point(cfg, CPU), one_step.Point(cfg, CPU)
    start = [p.detach().clone() for p in theirs.params]
    torch.manual_seed(7)
    metrics, _ = train.grpo_step(theirs.policy, theirs.ref, theirs.tok, theirs.optimizer, theirs.scheduler,
                                 problems(cfg), cfg, CPU, theirs.scaler)
    assert 0 < metrics["reward"] < 1
    torch.manual_seed(7)
    batch, r, _, adv = one_step.sample(ours.policy, ours.tok, problems(cfg), cfg, CPU)
    assert r.mean().item() == metrics["reward"]
    (_, grad_norm, _), _, _ = one_step.one_update(ours, batch, adv, cfg)
    assert grad_norm == metrics["grad_norm"]
    assert equal_state(ours, theirs)
    assert not all(torch.equal(p, s) for p, s in zip(theirs.params, start))          # it moved
    # The lab's record of the same step, from the same start.
    lab = one_step.Point(cfg, CPU)
    torch.manual_seed(7)
    batch, _, _, adv = one_step.sample(lab.policy, lab.tok, problems(cfg), cfg, CPU)
    record, = one_step.arms_on_a_batch(lab, {"grpo": cfg}, batch, adv)
    delta = [p.detach() - s for p, s in zip(theirs.params, start)]
    assert record["update_norm"] == math.sqrt(one_step.dot(delta, delta))
    assert record["grad_norm_pre_clip"] == grad_norm


def test_the_trained_point_is_the_checkpoint_train_py_resumes_from(flags, tmp_path):
    """The trained point loads ckpt/last.pt as --resume does: the weights, the AdamW state and the
    random state the run would go on with; its next GRPO step is the run's next step."""
    cfg = config(flags, "--updates-per-batch", "1")
    run = tmp_path / "run"
    assert train.main(flags + ["--updates-per-batch", "1", "--steps", "3", "--out", str(run),
                               "--ckpt-every", "2", "--eval-n", "0", "--pass-n", "0"]) == 0
    uninterrupted = torch.load(run / "ckpt" / "last.pt", weights_only=True)
    assert train.main(flags + ["--updates-per-batch", "1", "--steps", "2", "--out", str(tmp_path / "two"),
                               "--eval-n", "0", "--pass-n", "0"]) == 0
    point = one_step.Point(cfg, CPU, tmp_path / "two")
    assert point.step == 2 and len(point.optimizer.state) > 0
    train.grpo_step(point.policy, point.ref, point.tok, point.optimizer, point.scheduler,
                    train.batch_of_prompts(train.load_problems(cfg)[0], cfg, 3), cfg, CPU, point.scaler)
    assert all(torch.equal(p, uninterrupted["model"][k]) for k, p in point.policy.state_dict().items())


# ----------------------------------------------------------------------------------------
# (b) Every arm starts from identical bytes.

def test_every_arm_starts_from_the_same_bytes_whatever_ran_before(flags):
    """A point one step into training (AdamW has state), then the arms in two orders: each arm's
    record is the same in both, every arm's start hash is the point's, and the point is left as
    found (parameters, optimizer, random state)."""
    cfg = config(flags, "--updates-per-batch", "1")
    point = one_step.Point(cfg, CPU)
    train.grpo_step(point.policy, point.ref, point.tok, point.optimizer, point.scheduler, problems(cfg), cfg,
                    CPU, point.scaler)
    arms = {name: config(flags, "--loss", name) for name in LOSSES}
    before, rng = point.fingerprint(), torch.get_rng_state()
    batch, _, _, adv = one_step.sample(point.policy, point.tok, problems(cfg), cfg, CPU)
    start = point.fingerprint()
    orders = [["grpo", "tr_grpo", "cw_grpo", "tepo"], ["grpo", "tepo", "cw_grpo", "tr_grpo"]]
    runs = [one_step.arms_on_a_batch(point, {n: arms[n] for n in order}, batch, adv) for order in orders]
    assert point.fingerprint() == start
    by_arm = [{r["arm"]: timeless(r) for r in records} for records in runs]
    assert by_arm[0] == by_arm[1]
    assert {r["start_sha"] for records in runs for r in records} == {start}
    assert len({r["update_norm"] for r in runs[0]}) == 4                    # the arms do differ
    # The hash sees a one-ulp change of a weight, of AdamW's state and of the random state.
    snap = point.snapshot()
    with torch.no_grad():
        point.params[0].view(-1)[0] = torch.nextafter(point.params[0].view(-1)[0], torch.tensor(1.0))
    assert point.fingerprint() != start
    point.restore(snap)
    second_moment = point.optimizer.state[point.params[1]]["exp_avg_sq"].view(-1)
    second_moment[0] = torch.nextafter(second_moment[0], torch.tensor(1.0))
    assert point.fingerprint() != start
    point.restore(snap)
    torch.rand(1)
    assert point.fingerprint() != start
    point.restore(snap)
    assert point.fingerprint() == start and start != before                  # sampling drew random numbers
    torch.set_rng_state(rng)


# ----------------------------------------------------------------------------------------
# (c) Each measurement on a case worked by hand.

def test_kl_and_entropy_by_hand():
    """p = (1/2, 1/2) -> q = (3/4, 1/4): KL(p||q) = 1/2 ln(1/2 / 3/4) + 1/2 ln(1/2 / 1/4) = 1/2 ln(4/3);
    H(p) = ln 2, H(q) = -(3/4 ln 3/4 + 1/4 ln 1/4). A masked position counts for nothing."""
    before = torch.tensor([[[0.5, 0.5], [0.9, 0.1]]]).log()
    after = torch.tensor([[[0.75, 0.25], [0.1, 0.9]]]).log()
    kl, h_before, h_after = one_step.token_kl_entropy(before, after)
    mask = torch.tensor([[1.0, 0.0]])
    assert one_step.token_mean(kl, mask) == pytest.approx(0.5 * math.log(4 / 3))
    assert one_step.token_mean(h_before, mask) == pytest.approx(math.log(2))
    assert one_step.token_mean(h_after - h_before, mask) == pytest.approx(
        -(0.75 * math.log(0.75) + 0.25 * math.log(0.25)) - math.log(2))
    assert one_step.token_kl_entropy(before, before)[0].abs().max() == 0
    assert one_step.token_mean(kl, torch.zeros(1, 2)) is None


def test_logp_change_by_the_sign_of_the_advantage_by_hand():
    """Row 0 (A > 0) gains ln 2 on its first token and ln 4 on its second, row 1 (A < 0) loses
    ln 2 on its one valid token, row 2 (A = 0) counts in neither."""
    change = torch.tensor([[math.log(2), math.log(4)], [-math.log(2), 5.0], [9.0, 9.0]])
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0], [1.0, 1.0]])
    pos, neg = one_step.mean_by_sign(change, torch.tensor([1.0, -1.0, 0.0]), mask)
    assert pos == pytest.approx(1.5 * math.log(2)) and neg == pytest.approx(-math.log(2))
    assert one_step.mean_by_sign(change, torch.tensor([1.0, 1.0, 1.0]), mask)[1] is None


def test_the_lab_reads_the_changes_of_the_sampled_tokens_on_the_tiny_model(flags):
    """changes() on a model moved by one step: its KL and entropies are token_kl_entropy of the
    two position_logprobs, and its log-prob change is that of score()'s log-probs."""
    cfg = config(flags)
    point = one_step.Point(cfg, CPU)
    torch.manual_seed(3)
    batch, _, _, adv = one_step.sample(point.policy, point.tok, problems(cfg), cfg, CPU)
    before_logp = train.score_no_grad(point.policy, batch, cfg)[0]
    before = one_step.position_logprobs(point.policy, batch, cfg)
    one_step.one_update(point, batch, adv, cfg)
    after_logp = train.score_no_grad(point.policy, batch, cfg)[0]
    kl, h_before, h_after, change = one_step.changes(before, point.policy, batch, cfg)
    after = one_step.position_logprobs(point.policy, batch, cfg)
    mask = batch.mask
    assert torch.allclose(change * mask, (after_logp - before_logp) * mask, atol=1e-5)
    width = before[0].shape[1]
    expected = one_step.token_kl_entropy(before[0], after[0])
    for ours, theirs in zip((kl, h_before, h_after), expected):
        assert torch.allclose(ours[:, :width], theirs)
    assert one_step.token_mean(kl, mask) > 0


def test_token_push_by_hand_and_against_autograd():
    """p = (1/2, 1/4, 1/4), token 0, ∂L/∂logp = -2, T = 1/2: ‖onehot − p‖ = sqrt(1/4 + 1/16 + 1/16),
    push = 2 · sqrt(3/8) / (1/2). And on random logits it is the norm of autograd's gradient on them."""
    before = torch.tensor([[[0.5, 0.25, 0.25]]]).log()
    distance = one_step.onehot_distance(before, torch.tensor([[0]]))
    assert distance.item() == pytest.approx(math.sqrt(3 / 8))
    push = one_step.token_push(torch.tensor([[-2.0]]), distance, 0.5)
    assert push.item() == pytest.approx(2 * math.sqrt(3 / 8) / 0.5)
    torch.manual_seed(0)
    logits = torch.randn(3, 5, 11, requires_grad=True)
    tokens, T = torch.randint(0, 11, (3, 5)), 0.7
    logp, _ = losses.token_logprobs(logits, tokens, T)
    coef = torch.randn(3, 5)
    (logp * coef).sum().backward()
    before = torch.log_softmax(logits.detach() / T, dim=-1)
    push = one_step.token_push(coef, one_step.onehot_distance(before, tokens), T)
    assert torch.allclose(push, logits.grad.norm(dim=-1), atol=1e-6)


def test_top_share_and_cosine_by_hand():
    values = torch.arange(1.0, 201.0)[None]                    # 200 valid tokens: the top 1% is 2 of them
    mask = torch.ones_like(values)
    assert one_step.top_share(values, mask) == pytest.approx((200 + 199) / 20100)
    values[0, 199], mask[0, 199] = 1e6, 0.0                     # a masked token counts for nothing
    assert one_step.top_share(values, mask) == pytest.approx((199 + 198) / (20100 - 200))
    assert one_step.top_share(torch.tensor([[3.0, 1.0]]), torch.ones(1, 2)) == pytest.approx(0.75)  # 1 token
    assert one_step.top_share(torch.zeros(1, 2), torch.ones(1, 2)) is None
    a, b = [torch.tensor([1.0, 0.0]), torch.tensor([2.0])], [torch.tensor([1.0, 1.0]), torch.tensor([0.0])]
    assert one_step.cosine(a, b) == pytest.approx(1 / (math.sqrt(5) * math.sqrt(2)))     # (1,0,2)·(1,1,0)
    assert one_step.cosine([torch.zeros(2)], [torch.ones(2)]) is None


def test_gradient_and_update_readings_on_the_tiny_model_by_hand(flags):
    """GRPO at the untouched model, its reference the model itself (the KL's gradient is 0 there):
    ∂L/∂logp is -A_i / (|o_i| B) on every valid token (seq-mean-token-mean); the norm before the
    clip is the unclipped gradient's, after it max_grad_norm, in the same direction; and AdamW's
    first step moves each coordinate by lr · g / (|g| + eps): by lr wherever |g| >> eps."""
    cfg = config(flags, "--max-grad-norm", "0.01")
    point = one_step.Point(cfg, CPU)
    torch.manual_seed(3)
    batch, _, _, adv = one_step.sample(point.policy, point.tok, problems(cfg), cfg, CPU)
    snap = point.snapshot()
    unclipped = config(flags, "--max-grad-norm", "1e9")
    (_, norm, _), grad, dlogp = one_step.one_update(point, batch, adv, unclipped)
    point.restore(snap)
    (_, clipped_norm, _), clipped, _ = one_step.one_update(point, batch, adv, cfg)
    grad, clipped = one_step.flat(grad), one_step.flat(clipped)
    assert clipped_norm == norm > 0.01 and clipped.norm().item() == pytest.approx(0.01, rel=1e-4)
    assert one_step.cosine([grad], [clipped]) == pytest.approx(1.0, abs=1e-9)
    B, lengths = batch.mask.shape[0], batch.mask.sum(1, keepdim=True)
    assert torch.allclose(dlogp, -adv[:, None] * batch.mask / (lengths * B), atol=1e-7)
    point.restore(snap)
    record = one_step.arms_on_a_batch(point, {"grpo": cfg}, batch, adv)[0]
    adam_first_step = cfg.lr * clipped / (clipped.abs() + 1e-8)     # m̂ = g, v̂ = g², eps = 1e-8
    assert record["update_norm"] == pytest.approx(adam_first_step.norm().item(), rel=1e-4)
    assert record["grad_norm_post_clip"] == pytest.approx(0.01, rel=1e-4)
    assert record["grad_cos_grpo"] == pytest.approx(1.0, abs=1e-9)
    assert record["kl"] > 0 and None not in (record["logp_change_pos"], record["logp_change_neg"])


# ----------------------------------------------------------------------------------------
# (d) Why the lab needs the optimizer in the loop.

def scaled(loss_fn, factor):
    @functools.wraps(loss_fn)                 # update() reads the default aggregation from the signature
    def loss_times_factor(*args, **kwargs):
        loss, info = loss_fn(*args, **kwargs)
        return loss * factor, info
    return loss_times_factor


@pytest.mark.parametrize("factor", [10.0, 1000.0])
def test_a_constant_factor_on_the_loss_leaves_adamws_first_step_unchanged(flags, monkeypatch, factor):
    """AdamW's first step is -lr · m / (sqrt(v) + eps) with m = (1 - b1) g and v = (1 - b2) g², bias
    corrected to g and g²: -lr · g / (|g| + eps), blind to a factor on the loss wherever |g| >> eps
    (1e-8), up to rounding.
    SGD's step grows with the factor; so does the gradient norm the logs show."""
    cfg = config(flags, "--max-grad-norm", "1e9")
    point = one_step.Point(cfg, CPU)
    torch.manual_seed(3)
    batch, _, _, adv = one_step.sample(point.policy, point.tok, problems(cfg), cfg, CPU)
    snap, adamw, schedule = point.snapshot(), point.optimizer, point.scheduler
    steps, norms, grads = {}, {}, {}
    for scale, optimizer in ((1.0, "adamw"), (factor, "adamw"), (1.0, "sgd"), (factor, "sgd")):
        point.optimizer, point.scheduler = adamw, schedule
        point.restore(snap)
        if optimizer == "sgd":
            point.optimizer = torch.optim.SGD(point.params, lr=cfg.lr)
            point.scheduler = torch.optim.lr_scheduler.LambdaLR(point.optimizer, lambda s: 1.0)
        monkeypatch.setitem(LOSSES, "grpo", scaled(losses.grpo_loss, scale))
        (_, norm, _), grad, _ = one_step.one_update(point, batch, adv, cfg)
        norms[scale, optimizer], grads[scale, optimizer] = norm, one_step.flat(grad)
        steps[scale, optimizer] = one_step.flat([p - s for p, s in zip(point.params, snap["params"])])
    g, a, b = grads[1.0, "adamw"], steps[1.0, "adamw"], steps[factor, "adamw"]
    for scale in (1.0, factor):                     # -lr · g / (|g| + eps), coordinate by coordinate
        g_s = grads[scale, "adamw"]
        assert torch.allclose(steps[scale, "adamw"], -cfg.lr * g_s / (g_s.abs() + 1e-8), rtol=1e-4, atol=1e-9)
        assert torch.allclose(g_s, scale * g, rtol=1e-4, atol=1e-6 * scale * g.abs().max().item())
    big = g.abs() > 1e-8 * 1e4                            # where eps is < 1e-4 of |g|: most coordinates
    assert big.float().mean() > 0.5 and torch.allclose(a[big], b[big], rtol=2e-4, atol=0)
    assert (a - b).norm() < 0.01 * a.norm()                       # and over all of them, to eps
    assert norms[factor, "adamw"] == pytest.approx(factor * norms[1.0, "adamw"], rel=1e-4)
    sgd_ratio = steps[factor, "sgd"].norm() / steps[1.0, "sgd"].norm()   # float32 weights round small steps
    assert sgd_ratio.item() == pytest.approx(factor, rel=0.01)


# ----------------------------------------------------------------------------------------
# The script end to end.

def test_the_lab_writes_a_line_per_point_batch_and_arm_and_goes_on_where_it_stopped(flags, tmp_path, capsys):
    out = tmp_path / "lab"
    argv = ["--preset", "tiny", "--batches", "2", "--arms", "losses", "grpo-beta0", "--train-steps", "2",
            "--held-out", "4", "--out", str(out), "--", *flags[2:]]
    assert one_step.main(argv) == 0
    lines = [json.loads(line) for line in (out / "one_step.jsonl").read_text().splitlines()]
    assert [(r["point"], r["batch"]) for r in lines][::5] == [("start", 0), ("start", 1), ("trained", 0),
                                                               ("trained", 1)]
    assert [r["arm"] for r in lines[:5]] == ["grpo", "tr_grpo", "cw_grpo", "tepo", "grpo-beta0"]
    assert {r["step"] for r in lines if r["point"] == "trained"} == {2}
    for r in lines:
        assert r["kl"] >= 0 and 0 < r["push_top1pct_share"] <= 1 and r["held_out_kl"] >= 0
        assert r["grad_norm_post_clip"] <= r["max_grad_norm"] * (1 + 1e-5)
        assert r["grad_norm_post_clip"] == pytest.approx(min(r["grad_norm_pre_clip"], 1.0), rel=1e-4)
    for key in {(r["point"], r["batch"]) for r in lines}:
        same = [r for r in lines if (r["point"], r["batch"]) == key]
        assert len({r["start_sha"] for r in same}) == 1 and len({r["reward"] for r in same}) == 1
        assert same[0]["grad_cos_grpo"] == pytest.approx(1.0)
        assert same[0]["update_cos_grpo"] == pytest.approx(1.0)
    # Run again: the finished batches are kept, a half-written one is done again.
    text = (out / "one_step.jsonl").read_text()
    (out / "one_step.jsonl").write_text("".join(text.splitlines(keepends=True)[:-2]))
    assert one_step.main(argv) == 0
    again = [json.loads(line) for line in (out / "one_step.jsonl").read_text().splitlines()]
    assert [timeless(r) for r in again] == [timeless(r) for r in lines]
    with pytest.raises(SystemExit, match="other settings"):           # not on top of another lab's lines
        one_step.main([a if a != "grpo-beta0" else "tepo-tokratio" for a in argv])


def test_the_report_pairs_each_arm_with_grpo_batch_by_batch(tmp_path):
    """experiments/one_step_report.py by hand: three batches, TEPO against GRPO. ‖Δθ‖ differs by
    0.1, 0.2, 0.3: mean 0.2, sd 0.1, t(0.975, 2) = 4.303, so ± 0.248: (−0.048 to +0.448), not
    resolved. The KL differs by 0.02, 0.03, 0.04: ± 0.0248, (+0.0052 to +0.055), bold. A cosine is
    the arm's own mean; a field no record has is a dash."""
    from experiments import one_step_report as report
    rows = []
    for b in range(3):
        rows.append(dict(point="start", batch=b, arm="grpo", update_norm=1.0, kl=0.01, update_cos_grpo=1.0))
        rows.append(dict(point="start", batch=b, arm="tepo", update_norm=1.1 + 0.1 * b, kl=0.03 + 0.01 * b,
                         update_cos_grpo=0.5))
    (tmp_path / "one_step.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    text = report.table(report.read_records(tmp_path))
    header = "| arm − grpo | " + " | ".join(h for _, h, _ in report.METRICS) + " |"
    row = text.split(header)[1].splitlines()[2]
    cells = [c.strip() for c in row.strip("|").split("|")]
    values = dict(zip([f for f, _, _ in report.METRICS], cells[1:]))
    assert cells[0] == "tepo"
    assert values["update_norm"] == "+0.200 (\u22120.048 to +0.448)"
    assert values["kl"] == "**+0.030 (+5.2e\u221203 to +0.055)**"
    assert values["update_cos_grpo"] == "0.500 (0.500 to 0.500)"
    assert report.number(-3.4e-5, sign=True) == "\u22123.4e\u221205" and report.number(0.0123) == "0.012"
    assert values["held_out_entropy_change"] == "–"
    assert report.main([str(tmp_path), "--out", str(tmp_path / "f")]) == 0
    assert (tmp_path / "f" / "one_step.png").stat().st_size > 10_000


def test_the_report_says_identical_or_rounding_and_pairs_a_control_with_its_loss(tmp_path):
    """Arms equal to another at a point read '0 (identical)' (every difference exactly 0) or '0 (to
    rounding)' (none above ROUNDING of the reference's value: float32 noise is not an effect), never a
    bold 'resolved' 1e-8. A control is also paired with the loss it varies: tepo-fullkl's KL is
    0.054 above GRPO's (±4.303·0.001/√3) but 0.013 above TEPO's (its own loss), by hand."""
    from experiments import one_step_report as report
    rows = []
    for b in range(3):
        rows += [dict(point="start", batch=b, arm="grpo", update_norm=0.311, kl=0.01),
                 dict(point="start", batch=b, arm="tepo", update_norm=0.311, kl=0.05 + 0.001 * b),
                 dict(point="start", batch=b, arm="tepo-fullkl", update_norm=0.311 * (1 + 1e-7 * (b - 1)),
                      kl=0.063 + 0.001 * b)]
    (tmp_path / "one_step.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    text = report.table(report.read_records(tmp_path))
    fields = [f for f, _, _ in report.METRICS]

    def row(name):
        line = next(l for l in text.splitlines() if l.startswith(f"| {name} |"))
        return dict(zip(fields, [c.strip() for c in line.strip("|").split("|")][1:]))
    assert row("tepo")["update_norm"] == "0 (identical)"
    assert row("tepo-fullkl")["update_norm"] == "0 (to rounding)"
    assert row("tepo-fullkl")["kl"] == "**+0.054 (+0.052 to +0.056)**"
    assert row("tepo-fullkl − tepo")["kl"] == "**+0.013 (+0.013 to +0.013)**"
    assert row("tepo-fullkl − tepo")["update_norm"] == "0 (to rounding)"
    assert "| tepo − grpo |" not in text and report.reference_of("tepo") == "grpo"
    assert report.reference_of("tr_grpo-inclip") == "tr_grpo" and report.reference_of("grpo-beta0") == "grpo"


SHIPPED = Path(__file__).resolve().parents[1]      # the repo


def test_the_shipped_lab_is_whole_and_its_figures_are_what_make_figures_draws():
    """logs/one-step-smol-active: K = 16 batches at both points, every arm on every batch, all arms of a
    batch from the same bytes; docs/figures/one-step/results.md is the report of these logs now. And
    the identities the lab must show: at the untouched model π = π_ref, so the KL term is 0 and
    grpo-beta0 is GRPO; a first update is on policy, so the token ratio is the sequence ratio
    (tepo-tokratio is TEPO at both points); AdamW + clipping: every arm's ‖Δθ‖ within 2% of GRPO's
    on every batch."""
    from experiments import one_step_report as report
    lab = SHIPPED / "logs" / "one-step-smol-active"
    if not (lab / "one_step.jsonl").exists():
        pytest.skip("no shipped lab logs")
    records = report.read_records(lab)
    arms = json.loads((lab / "config.json").read_text())["arms"]
    assert len(arms) == 10
    for point in ("start", "trained"):
        for b in range(16):
            batch = [r for r in records if r["point"] == point and r["batch"] == b]
            assert sorted(r["arm"] for r in batch) == sorted(arms), (point, b)
            assert len({r["start_sha"] for r in batch}) == 1
    assert (SHIPPED / "docs" / "figures" / "one-step" / "results.md").read_text() == report.table(records)
    for field in ("update_norm", "grad_norm_pre_clip", "grad_norm_post_clip"):
        assert report.cell(report.paired(records, "start", "grpo-beta0", field), "diff").startswith("0 (")
        for point in ("start", "trained"):
            same = report.paired(records, point, "tepo-tokratio", field, "tepo")
            assert report.cell(same, "diff").startswith("0 (")
    steps = [a / b for point in ("start", "trained") for arm in arms
             for a, b in report.paired(records, point, arm, "update_norm")]
    assert max(abs(s - 1) for s in steps) < 0.02


def test_the_results_page_quotes_the_lab_as_it_is():
    """docs/results.md's one-step section: every number in it is a cell of the tables make figures
    writes from the shipped lab, or one derived here from the same logs (GRPO's updates above
    max_grad_norm, the share of all arms', n = (‖Δθ‖ / lr)², the range of gradient ratios, the
    lab's time in its console log), or a setting (β, the clip, lr, hours, steps, float32, H200)."""
    import re
    from experiments import one_step_report as report
    lab = SHIPPED / "logs" / "one-step-smol-active"
    if not (lab / "one_step.jsonl").exists():
        pytest.skip("no shipped lab logs")
    records = report.read_records(lab)
    text = (SHIPPED / "docs" / "results.md").read_text(encoding="utf-8")
    section = text[text.index("## What one update does"):text.index("## Over 200 steps on one GPU")]
    section = re.sub(r"(?m)^\|.*\n", "", section)       # the embedded table: test_docs checks it whole
    number = r"[+−]?\d+(?:\.\d+)?(?:e[−+]\d+)?"
    written = set(re.findall(number, (SHIPPED / "docs" / "figures" / "one-step" / "results.md").read_text()))
    grpo = {p: [r for r in records if r["point"] == p and r["arm"] == "grpo"] for p in ("start", "trained")}
    over = {p: [r["grad_norm_pre_clip"] > r["max_grad_norm"] for r in records if r["point"] == p]
            for p in ("start", "trained")}
    by = {(r["point"], r["batch"], r["arm"]): r for r in records}
    ratios = [r["grad_norm_pre_clip"] / by[p, b, "grpo"]["grad_norm_pre_clip"] for (p, b, _), r in by.items()]
    n = sum((r["update_norm"] / r["lr"]) ** 2 for r in grpo["start"]) / len(grpo["start"])
    seconds = re.search(r"one_step.jsonl  \[(\d+)s\]", (lab / "console.txt").read_text()).group(1)
    derived = {str(sum(r["grad_norm_pre_clip"] > 1 for r in grpo["start"])),           # 14 of 16
               f"{100 * sum(over['start']) / len(over['start']):.0f}",
               f"{100 * sum(over['trained']) / len(over['trained']):.0f}",
               f"{min(ratios):.2f}", f"{max(ratios):.2f}", f"{n / 1e8:.2f}", seconds}
    settings = {"0.04", "1.0", "1.4", "2", "3", "5", "7", "8", "10", "32", "200"}
    quoted = set(re.findall(number, section))
    assert {"14", "80", "100", "0.36", "4.25", "1.08", "473"} <= quoted & derived
    assert not quoted - written - derived - settings, quoted - written - derived - settings
    readme = (SHIPPED / "README.md").read_text(encoding="utf-8")
    paragraph = readme[readme.index("**One update, paired**"):].split("\n\n")[0]
    assert set(re.findall(number, paragraph)) == {"0.36", "4.25", "2", "16", "1", "8"}
    assert {"0.36", "4.25"} <= derived
