"""one_step.py — what one update does, arm by arm, on the same batch.

    python -m experiments.one_step --preset smol-active --batches 16 --out logs/one-step-smol-active
    python -m experiments.one_step --preset tiny --batches 2 --arms losses      # minutes: a look

Multi-step runs compare losses across seeds, whose spread swamps most differences. Here every
arm meets the *same* sampled batch from the *same* bytes, so the differences are paired. At each
point of training (``start``: the untouched model; ``trained``: a GRPO run's checkpoint after
--train-steps steps, its AdamW state included, loaded as train.py resumes) the script samples K
batches once each with train.py's own rollout, reward and advantage, and for every arm (the four
losses, the controls and readings of compare.ARMS; GRPO first) restores the parameters, the
optimizer, scheduler and scaler state and the random state byte for byte, and applies exactly
one train.update(), the first (on-policy) update grpo_step makes. One JSON line per
(point, batch, arm) in <out>/one_step.jsonl:

- grad_norm_pre_clip: what update() returns (the norm clip_grad_norm_ saw); grad_norm_post_clip:
  the gradient AdamW received (taken by an optimizer step pre-hook); grad_cos_grpo: its cosine
  with GRPO's on the batch (clipping scales, so the cosine is the pre-clip gradients' too);
- update_norm, update_cos_grpo: ||Δθ|| of the step and its cosine with GRPO's Δθ;
- kl: KL(π_before ‖ π_after), full vocabulary at the sampling temperature, mean over the batch's
  valid tokens (each position conditioned on the sampled prefix); entropy_change: the mean
  change of the full-vocabulary entropy at those positions (entropy_before: its value before);
- logp_change_pos / logp_change_neg: the mean change of the sampled tokens' log-probs in
  answers of positive / negative advantage (token means; null where the batch has none);
- push_top1pct_share: how concentrated the push is. A token's push is the norm of the arm's
  loss gradient on that position's logits, |∂L/∂logp_t| · ‖onehot(o_t) − p_t‖ / T (with a
  ratio of 1 and weights held fixed, |∂L/∂logp_t| is |weight · A| over the aggregation's
  normaliser, plus the KL term's share), ∂L/∂logp_t taken from the loss update() computes. The
  share is that of the top 1% of valid tokens (at least one) in the summed push. It leaves out
  the network behind the logits (per-token gradients meet in the parameters through different
  Jacobians and partly cancel: a large push need not move the weights much), the optimizer
  (clipping, AdamW's per-coordinate scaling), and any gradient through the entropy (none of the
  losses has one: TEPO's mask is a 0/1 selection);
- held_out_entropy_change, held_out_kl: the same on completions of --held-out held-out prompts
  sampled once per point from π_before (where exploration happens);
- start_sha: a hash of the bytes every arm starts from (parameters, optimizer state, random
  state): equal across the arms of a batch; kl_to_ref: the loss's own k3 against the reference
  (0 at the untouched model); and the batch's reward, tokens, the lr, the loss, timings.

train.py is not changed for this: update() returns the norm before the clip, an optimizer step
pre-hook reads the clipped gradient AdamW gets, and for the call LOSSES[loss] is wrapped
(functools.wraps; values untouched) to read ∂L/∂logp. tests/test_one_step.py checks that the
parameters and AdamW state after the script's update equal grpo_step's bit for bit.

Cost, measured with one thread on a 2-core machine shared with other jobs: smol-active, one batch
x 10 arms at the untouched model, 15 min (826 s of CPU; 35-57 s of each arm is update(), the rest
the after-step passes and the hash), 9.1 GB at the peak; the trained point adds AdamW's state
(+1 GB) and its 8 GRPO steps, once. K = 16 at both points: some 7-8 hours on one such thread; on
one H200 GPU (float32, as the preset), 473 s, 204 s of it at the untouched model (logs/README.md).

Run it again to go on: finished (point, batch) pairs are kept and their arms skipped (the batches
are still sampled, in order, so the random stream is the same). Extra train.py flags go after
``--`` (``-- --threads 2``; the tests: ``--init <warm start> --sft-steps 30 ...``).
"""
import argparse
import concurrent.futures
import contextlib
import copy
import functools
import hashlib
import json
import math
import random
import sys
import time
from pathlib import Path

import torch

import rewards
import train
from data import batch_of_prompts, load_problems
from engine import checkpoints, mfu
from engine.models import grad_scaler, load_model, make_optimizer, pick_device, reference_model
from engine.scoring import autocast, micro_batches, score_no_grad
from experiments.compare import ARM_SETS, ARMS, CONTROLS
from losses import LOSSES, cw_grpo_weights, group_advantages

POINTS = ("start", "trained")


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--preset", default="smol-active", choices=list(train.PRESETS))
    parser.add_argument("--batches", type=int, default=16, help="K: batches sampled at each point")
    parser.add_argument("--arms", nargs="+", default=["all"], choices=list(ARMS) + list(ARM_SETS),
                        help="arms or sets of them (GRPO always runs, first: the others are compared to it)")
    parser.add_argument("--points", nargs="+", default=list(POINTS), choices=POINTS)
    parser.add_argument("--train-steps", type=int, default=8,
                        help="the trained point: GRPO steps of the run whose checkpoint is loaded")
    parser.add_argument("--from-run", default=None,
                        help="the trained point from this run's ckpt/last.pt (a GRPO run of the same "
                             "config), instead of training <out>/trained-grpo-s<seed>")
    parser.add_argument("--held-out", type=int, default=16,
                        help="held-out prompts sampled once per point, for the held-out entropy (0: none)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=None, help="default runs/one-step-<preset>")
    parser.add_argument("extra", nargs="*", help="more train.py flags, after --")
    args = parser.parse_args(argv)
    args.out = Path(args.out or f"runs/one-step-{args.preset}")
    base = train.parse_config(base_argv(args))
    arms = list(dict.fromkeys(["grpo"] + [a for n in args.arms for a in ARM_SETS.get(n, [n])]))
    needs_kl = [a for a in arms if a in CONTROLS or a == "tepo-tokratio"]
    if base.beta == 0 and needs_kl:                  # they compare against a KL term that is not there
        print(f"note: the {args.preset} preset has no KL term (beta = 0): {', '.join(needs_kl)} skipped")
        arms = [a for a in arms if a not in needs_kl]
    args.arms = arms
    if args.batches < 1 or args.train_steps < 1 or args.held_out < 0:
        parser.error("--batches and --train-steps must be >= 1, --held-out >= 0")
    return args


def base_argv(args):
    return ["--preset", args.preset, "--seed", str(args.seed), *args.extra]


def arm_config(args, name):
    """The arm's config, as compare.py would run it: train.py's flags for its loss and options."""
    loss, flags = ARMS[name]
    beta = train.parse_config(base_argv(args)).beta
    return train.parse_config(base_argv(args) + ["--loss", loss] + [f.format(beta=beta) for f in flags])


# ----------------------------------------------------------------------------------------
# A point of training: the objects train.main builds, and the bytes every arm starts from.

class Point:
    """The policy, its reference, optimizer, scheduler and scaler, as train.main builds them (and
    loads them from a checkpoint, as --resume does)."""
    def __init__(self, cfg, device, run=None):
        self.cfg, self.device = cfg, device
        self.policy, self.tok = load_model(cfg, device)
        self.ref = reference_model(self.policy, cfg)
        torch.manual_seed(cfg.seed)
        random.seed(cfg.seed)
        self.optimizer = make_optimizer(self.policy, cfg)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda s: min(1.0, (s + 1) / max(cfg.lr_warmup_steps, 1)))
        self.scaler = grad_scaler(cfg, device)
        self.step = 0
        if run is not None:
            self.step = checkpoints.resume(Path(run), self.policy, self.optimizer, self.scheduler,
                                           self.scaler, cfg)
        self.params = [p for group in self.optimizer.param_groups for p in group["params"]]

    def snapshot(self):
        """Everything an update reads or changes: parameters, optimizer, scheduler, scaler, random state."""
        return dict(params=[p.detach().clone() for p in self.params],
                    optimizer=copy.deepcopy(self.optimizer.state_dict()),
                    scheduler=copy.deepcopy(self.scheduler.state_dict()),
                    scaler=copy.deepcopy(self.scaler.state_dict()), rng=rng_state())

    def restore(self, snap):
        """Back to the snapshot's bytes (copies: the optimizer would otherwise update the snapshot's
        tensors in place; the old state goes first, so that two copies of AdamW's state at most exist)."""
        with torch.no_grad():
            for p, saved in zip(self.params, snap["params"]):
                p.copy_(saved)
                p.grad = None
        self.optimizer.state.clear()
        self.optimizer.load_state_dict(copy.deepcopy(snap["optimizer"]))
        self.scheduler.load_state_dict(copy.deepcopy(snap["scheduler"]))
        if snap["scaler"]:
            self.scaler.load_state_dict(copy.deepcopy(snap["scaler"]))
        set_rng_state(snap["rng"])

    def fingerprint(self):
        """sha256 of the bytes of the parameters, the optimizer's state and hyperparameters, the
        scheduler's state and the random state: each tensor hashed on its own (in threads: hashlib
        lets go of the GIL, and 1.6 GB of AdamW state is seconds on one core), then the digests in
        order."""
        state = self.optimizer.state_dict()
        tensors = list(self.params) + [value for index in sorted(state["state"])
                                       for _, value in sorted(state["state"][index].items())
                                       if torch.is_tensor(value)]
        with concurrent.futures.ThreadPoolExecutor() as pool:
            digests = list(pool.map(lambda t: hashlib.sha256(tensor_bytes(t)).digest(), tensors))
        h = hashlib.sha256(b"".join(digests))
        h.update(json.dumps(state["param_groups"], sort_keys=True).encode())
        for index in sorted(state["state"]):
            for key, value in sorted(state["state"][index].items()):
                h.update(key.encode())
                if not torch.is_tensor(value):
                    h.update(repr(value).encode())
        h.update(json.dumps(self.scheduler.state_dict(), sort_keys=True, default=str).encode())
        rng = rng_state()
        h.update(tensor_bytes(rng["torch"]))
        h.update(repr(rng["python"]).encode())
        for generator in rng["cuda"]:
            h.update(tensor_bytes(generator))
        return h.hexdigest()[:16]


def tensor_bytes(t):
    """A tensor's bytes as a buffer (no copy on the CPU)."""
    return t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy()


def rng_state():
    return dict(torch=torch.get_rng_state(), python=random.getstate(),
                cuda=torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [])


def set_rng_state(state):
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    if state["cuda"]:
        torch.cuda.set_rng_state_all(state["cuda"])


# ----------------------------------------------------------------------------------------
# One batch and one update, as train.grpo_step makes them (tests/test_one_step.py checks the bytes).

def sample(policy, tok, problems, cfg, device):
    """grpo_step's steps 1-3: G completions per problem, their rewards, the group advantages.
    Returns (batch, rewards, correct, advantages)."""
    G = cfg.group_size
    batch = train.rollout(policy, tok, [p["question"] for p in problems], cfg, group_size=G)
    texts = train.decode(tok, batch.completions, batch.mask)
    golds = [rewards.gold_answer(p["answer"]) for p in problems for _ in range(G)]
    r = torch.tensor([rewards.reward(text, gold) for text, gold in zip(texts, golds)])
    correct = torch.tensor([rewards.correctness_reward(text, gold) for text, gold in zip(texts, golds)])
    return batch, r, correct, group_advantages(r, G, cfg.scale_std).to(device)


def update_inputs(policy, ref, batch, adv, cfg, ref_logp=None):
    """grpo_step's step 4: (old_logp, entropy, ref_logp, cw_weights), in update()'s order; None where
    the step has none (on policy, update() takes the old log-probs from its own pass). ``ref_logp``:
    the reference's log-probs of this batch, if already computed (the same for every arm)."""
    old_logp = entropy = cw_weights = None
    if cfg.loss == "cw_grpo" and cfg.cw_detach:
        old_logp, entropy = score_no_grad(policy, batch, cfg)
        cw_weights = cw_grpo_weights(old_logp, adv, batch.mask, cfg.group_size, scope=cfg.cw_scope,
                                     normalise=cfg.cw_normalise)
    if cfg.beta <= 0:
        ref_logp = None
    elif ref_logp is None:
        with policy.disable_adapter() if cfg.lora_rank > 0 else contextlib.nullcontext():
            ref_logp = score_no_grad(ref if ref is not None else policy, batch, cfg)[0]
    return old_logp, entropy, ref_logp, cw_weights


@contextlib.contextmanager
def logp_gradients(name):
    """While inside, LOSSES[name] also records ∂L/∂logp of the tokens it is given, micro-batch by
    micro-batch (a tensor hook: the values and the gradient are untouched)."""
    original, grads = LOSSES[name], []

    @functools.wraps(original)           # update() reads the default aggregation from the signature
    def recording(logp, *args, **kwargs):
        if logp.requires_grad:
            logp.register_hook(lambda g: grads.append(g.detach().clone()))
        return original(logp, *args, **kwargs)
    LOSSES[name] = recording
    try:
        yield grads
    finally:
        LOSSES[name] = original


def one_update(point, batch, adv, cfg, ref_logp=None):
    """One train.update() on the batch, as grpo_step's first update. Returns (stats of update(), the
    gradient AdamW received, a tensor per parameter (None if fp16 skipped the step), ∂L/∂logp [B, C]).
    The gradient tensors are the parameters' own .grad (AdamW reads them, never writes them; the next
    update sets .grad to None and leaves them to us): no copy."""
    taken = {}

    def before_step(optimizer, args, kwargs):         # after clip_grad_norm_, before AdamW
        taken["grad"] = [p.grad if p.grad is not None else torch.zeros_like(p) for p in point.params]
    hook = point.optimizer.register_step_pre_hook(before_step)
    try:
        inputs = update_inputs(point.policy, point.ref, batch, adv, cfg, ref_logp)
        with logp_gradients(cfg.loss) as grads:
            stats, _ = train.update(point.policy, point.optimizer, point.scheduler, batch, adv, *inputs, cfg,
                                    point.scaler)
    finally:
        hook.remove()
    C = batch.mask.shape[1]
    dlogp = torch.cat([torch.nn.functional.pad(g, (0, C - g.shape[1])) for g in grads])
    if point.scaler.is_enabled():
        dlogp = dlogp / point.scaler.get_scale()
    return stats, taken.get("grad"), dlogp


def flat(tensors):
    return torch.cat([t.detach().reshape(-1).float() for t in tensors])


def dot(a, b):
    """Σ a·b over lists of tensors, in float64 one tensor at a time (a float32 dot product over 135M
    coordinates is off in the fifth digit; a float64 copy of them all would be 1 GB)."""
    return sum(x.detach().double().flatten() @ y.detach().double().flatten() for x, y in zip(a, b)).item()


def norm_and_cosine(a, b):
    """(‖a‖, cos(a, b)) of two sequences of tensors, in one pass (``a`` may be a generator), float64."""
    aa = ab = bb = 0.0
    for x, y in zip(a, b):
        x, y = x.detach().double().flatten(), y.detach().double().flatten()
        aa, ab, bb = aa + (x @ x).item(), ab + (x @ y).item(), bb + (y @ y).item()
    return math.sqrt(aa), (ab / math.sqrt(aa * bb) if aa * bb > 0 else None)


def cosine(a, b):
    """cos(a, b) of two lists of tensors (one vector each); None if either is missing or zero."""
    if a is None or b is None:
        return None
    denominator = math.sqrt(dot(a, a) * dot(b, b))
    return dot(a, b) / denominator if denominator > 0 else None


# ----------------------------------------------------------------------------------------
# The measurements: each a small function, checked by hand in tests/test_one_step.py.

def position_logprobs(model, batch, cfg):
    """log softmax(logits / T) at every completion position, float32 [b, width, V] per micro-batch
    (a list: one micro-batch's is 250 MB on SmolLM2): the logits scoring.score computes (the same
    inputs, positions and precision), kept whole."""
    return [lp for _, lp in each_position_logprobs(model, batch, cfg)]


@torch.no_grad()
def each_position_logprobs(model, batch, cfg):
    """(rows, log-probs [b, width, V]) micro-batch by micro-batch, one alive at a time."""
    was_training = model.training
    model.eval()
    for rows, part in micro_batches(batch, cfg):
        ids = torch.cat([part.prompt_ids, part.completions[:, :-1]], dim=1)
        attn = torch.cat([part.prompt_attn, part.mask[:, :-1].to(part.prompt_attn.dtype)], dim=1)
        with autocast(cfg, ids.device):
            logits = model(input_ids=ids, attention_mask=attn, position_ids=(attn.cumsum(1) - 1).clamp(min=0),
                           logits_to_keep=part.completions.shape[1], use_cache=False).logits
        yield rows, torch.log_softmax(logits.float() / cfg.temperature, dim=-1)
        del logits
    model.train(was_training)


@torch.no_grad()
def changes(before, model, batch, cfg):
    """Per token of the batch, [B, C] each (0 on padding): KL(before ‖ after), the entropy before and
    after, and the change of the sampled token's log-prob; ``before``: position_logprobs before the
    step, the model: after it."""
    C, parts = batch.mask.shape[1], []
    for lp_before, (rows, lp_after) in zip(before, each_position_logprobs(model, batch, cfg)):
        tokens = batch.completions[rows, :lp_after.shape[1]]
        kl, h_before, h_after = token_kl_entropy(lp_before, lp_after)
        change = (lp_after - lp_before).gather(-1, tokens[..., None]).squeeze(-1)
        parts.append([torch.nn.functional.pad(t, (0, C - t.shape[1]))
                      for t in (kl, h_before, h_after, change)])
    return [torch.cat(t) for t in zip(*parts)]


def token_mean(x, mask):
    """Mean of x over the tokens where mask is 1 (None where there are none)."""
    n = mask.sum()
    return (x * mask).sum().item() / n.item() if n > 0 else None


def token_kl_entropy(before, after):
    """Per position: (KL(before ‖ after), entropy before, entropy after), from log-probs [..., V]."""
    p = before.exp()
    return (p * (before - after)).sum(-1), -(p * before).sum(-1), -(after.exp() * after).sum(-1)


def mean_by_sign(x, adv, mask):
    """Means of x [B, C] over the valid tokens of positive- and of negative-advantage answers
    (positive, negative), None where there are none."""
    return tuple(token_mean(x, mask * side[:, None].float()) for side in (adv > 0, adv < 0))


@torch.no_grad()
def onehot_distance(before, tokens):
    """‖onehot(o_t) − p_t‖ per position, from the log-probs ``before`` [..., V] and the tokens [...]:
    sqrt(1 − 2 p_t[o_t] + Σ_v p_t,v²)."""
    p = before.exp()
    p_token = p.gather(-1, tokens[..., None]).squeeze(-1)
    return (1 - 2 * p_token + (p * p).sum(-1)).clamp(min=0).sqrt()


def token_push(dlogp, distance, temperature):
    """|∂L/∂logits_t| = |∂L/∂logp_t| · ‖onehot(o_t) − p_t‖ / T, [B, C]: logp_t = log p_t[o_t] with
    p_t = softmax(logits_t / T), so ∂logp_t/∂logits_t = (onehot(o_t) − p_t) / T."""
    return dlogp.abs() * distance / temperature


def top_share(values, mask, fraction=0.01):
    """The share of sum(values) over the valid tokens carried by the top ``fraction`` of them
    (at least one token)."""
    v = values[mask > 0]
    if v.numel() == 0 or v.sum() == 0:
        return None
    k = max(1, math.ceil(fraction * v.numel()))
    return (v.topk(k).values.sum() / v.sum()).item()




# ----------------------------------------------------------------------------------------
# The lab: every arm on every batch, at a point.

def arms_on_a_batch(point, arm_cfgs, batch, adv, held_out=None):
    """Every arm's one update from the same bytes; a record per arm (GRPO first: the cosines are
    with its gradient and update). The point is left as it was found, random state included."""
    start = point.snapshot()
    before = position_logprobs(point.policy, batch, point.cfg)
    held_before = None if held_out is None else position_logprobs(point.policy, held_out, point.cfg)
    C, mask = batch.mask.shape[1], batch.mask
    distance = torch.cat([torch.nn.functional.pad(onehot_distance(lp, batch.completions[rows, :lp.shape[1]]),
                                                  (0, C - lp.shape[1]))
                          for lp, (rows, _) in zip(before, micro_batches(batch, point.cfg))])
    records, grpo = [], {}
    ref_logp = update_inputs(point.policy, point.ref, batch, adv, point.cfg)[2]      # scored once for all
    for name, cfg in arm_cfgs.items():
        point.restore(start)
        t = time.perf_counter()
        sha = point.fingerprint()
        lr = point.optimizer.param_groups[0]["lr"]
        t_update = time.perf_counter()
        (loss, grad_norm, infos), grad, dlogp = one_update(point, batch, adv, cfg, ref_logp)
        t_update = time.perf_counter() - t_update
        with torch.no_grad():                          # GRPO's step is kept; the others are read in one pass
            delta = [p - s for p, s in zip(point.params, start["params"])] if name == "grpo" else \
                (p - s for p, s in zip(point.params, start["params"]))
            if name == "grpo":
                grpo = dict(grad=grad, delta=delta)
            update_norm, update_cos = norm_and_cosine(delta, grpo["delta"])
        kl, h_before, h_after, change = changes(before, point.policy, batch, point.cfg)
        pos, neg = mean_by_sign(change, adv, mask)
        n_tok = sum(n for _, n in infos)
        record = dict(arm=name, loss_name=cfg.loss, lr=lr, loss=loss, grad_norm_pre_clip=grad_norm,
                      grad_norm_post_clip=None if grad is None else math.sqrt(dot(grad, grad)),
                      max_grad_norm=cfg.max_grad_norm, grad_cos_grpo=cosine(grad, grpo["grad"]),
                      update_norm=update_norm, update_cos_grpo=update_cos,
                      kl=token_mean(kl, mask), entropy_before=token_mean(h_before, mask),
                      entropy_change=token_mean(h_after - h_before, mask),
                      logp_change_pos=pos, logp_change_neg=neg,
                      push_top1pct_share=top_share(token_push(dlogp, distance, cfg.temperature), mask),
                      kl_to_ref=sum(info["kl"].item() * n for info, n in infos) / n_tok,
                      start_sha=sha, update_time=t_update)
        del delta, grad
        if held_out is not None:
            kl, h_before, h_after, _ = changes(held_before, point.policy, held_out, point.cfg)
            record.update(held_out_kl=token_mean(kl, held_out.mask),
                          held_out_entropy_before=token_mean(h_before, held_out.mask),
                          held_out_entropy_change=token_mean(h_after - h_before, held_out.mask))
        record["time"] = time.perf_counter() - t
        records.append(record)
        print(f"  {name}: {record['time']:.0f}s", flush=True)
    point.restore(start)
    return records


def held_out_completions(point, problems, cfg):
    """One completion per held-out prompt, sampled from π_before with a random stream of its own
    (the training batches are the same with or without them)."""
    if not problems:
        return None
    with torch.random.fork_rng(devices=list(range(torch.cuda.device_count())) if torch.cuda.is_available()
                               else []):
        torch.manual_seed(2_000_003 + cfg.seed)
        return train.rollout(point.policy, point.tok, [p["question"] for p in problems], cfg)


def trained_run(args, cfg):
    """The run the trained point loads: --from-run, or a GRPO run of --train-steps steps trained
    here (once; evaluation off, which leaves the training's random stream as it is)."""
    if args.from_run:
        return Path(args.from_run)
    run = args.out / f"trained-grpo-s{args.seed}"
    ckpt = run / "ckpt" / "last.pt"
    if not ckpt.exists() or torch.load(ckpt, weights_only=True)["step"] != args.train_steps:
        if (run / "config.json").exists():
            raise SystemExit(f"error: {run} holds another run; remove it")
        train.main(base_argv(args) + ["--loss", "grpo", "--steps", str(args.train_steps), "--out", str(run),
                                      "--eval-every", "0", "--eval-n", "0", "--pass-n", "0"])
    return run


def finished(path, arms):
    """{(point, batch)} whose every arm is logged; the file is rewritten without the others."""
    if not path.exists():
        return set()
    lines = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    seen = {}
    for r in lines:
        seen.setdefault((r["point"], r["batch"]), set()).add(r["arm"])
    done = {key for key, got in seen.items() if set(arms) <= got}
    path.write_text("".join(json.dumps(r) + "\n" for r in lines if (r["point"], r["batch"]) in done))
    return done


def main(argv=None):
    args = parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    cfg = train.parse_config(base_argv(args) + ["--loss", "grpo"])
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    arm_cfgs = {name: arm_config(args, name) for name in args.arms}
    device = pick_device(cfg)
    train_problems, held_out = load_problems(cfg)
    log_path, config_path = args.out / "one_step.jsonl", args.out / "config.json"
    lab = dict(preset=args.preset, arms=args.arms, train_steps=args.train_steps, from_run=args.from_run,
               held_out=args.held_out, seed=args.seed, extra=args.extra)
    if config_path.exists() and log_path.exists():      # going on: only --batches and --points may change
        saved = json.loads(config_path.read_text())
        changed = {k: (saved.get(k), v) for k, v in lab.items() if saved.get(k) != v}
        if changed:
            raise SystemExit(f"error: {args.out} holds a lab run with other settings ("
                             + ", ".join(f"{k}: {a!r} there, {b!r} now" for k, (a, b) in changed.items())
                             + "); choose another --out")
    config_path.write_text(json.dumps(dict(lab, batches=args.batches, points=args.points, config=vars(cfg),
                                           machine=mfu.machine(device)), indent=2, default=str))
    done = finished(log_path, args.arms)
    start_time = time.time()
    with open(log_path, "a") as log:
        for name in args.points:
            point = Point(cfg, device, trained_run(args, cfg) if name == "trained" else None)
            held = held_out_completions(point, held_out[:args.held_out], cfg)
            for k in range(args.batches):
                problems = batch_of_prompts(train_problems, cfg, point.step + 1 + k)   # the run's next ones
                batch, r, correct, adv = sample(point.policy, point.tok, problems, cfg, device)
                if (name, k) in done:
                    continue
                common = dict(point=name, step=point.step, batch=k, preset=args.preset, seed=args.seed,
                              reward=r.mean().item(), accuracy=correct.mean().item(),
                              frac_zero_std=(adv.view(-1, cfg.group_size) == 0).all(1).float().mean().item(),
                              tokens=int(batch.mask.sum().item()), rows=batch.mask.shape[0])
                for record in arms_on_a_batch(point, arm_cfgs, batch, adv, held):
                    log.write(json.dumps({**common, **record}) + "\n")
                log.flush()
                print(f"{name} batch {k}: {len(arm_cfgs)} arms [{time.time() - start_time:.0f}s]", flush=True)
            del point
    print(f"done: {log_path}  [{time.time() - start_time:.0f}s]")
    return 0


if __name__ == "__main__":
    sys.exit(main())
