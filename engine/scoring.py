"""scoring.py — log-probs and entropies of sampled completions under a model, in micro-batches.

``score`` is the plain computation: the prompt and the completion through the model in one
pass, then losses.token_logprobs on the completion positions (with ``--plain``,
losses.token_logprobs_plain: autograd's own log_softmax, no custom autograd function). Two
devices compute the same numbers faster (tests/test_speed.py checks values and gradients
against ``score``):

* ``score_sharing_prompts``: each prompt runs once per group, its key/value cache repeated for
  the G completions (the gradient of the copies flows back into the one prompt pass);
* ``micro_batches`` cuts each micro-batch to its longest completion instead of the whole
  batch's: padding comes after every real token, and causal attention never looks forward.

``train.py --plain`` turns both off. A ``batch`` is anything with the fields of train.Rollout
(prompt_ids, prompt_attn, completions, mask; tensors with a row per completion). ``autocast``
is the precision sampling, scoring and the update compute in (``--dtype``);
``check_ratio_is_one`` compares the update's own pass with ``score`` before the first step.
"""
import contextlib
import dataclasses
import sys

import torch

from losses import token_logprobs, token_logprobs_plain


def compute_dtype(cfg, device):
    """The dtype autocast computes in (None: float32). bf16 only where it is real:
    is_bf16_supported() says yes on a T4 (emulated, slow), so ask for compute capability >= 8;
    below it --dtype bfloat16 computes in float32 (models.pick_device says so), and --dtype
    float16 is such a card's fast path. fp16 comes with train.py's gradient scaler."""
    if cfg.dtype == "float16":
        return torch.float16
    emulated_bf16 = device.type == "cuda" and torch.cuda.get_device_capability(device)[0] < 8
    return torch.bfloat16 if cfg.dtype == "bfloat16" and not emulated_bf16 else None


def autocast(cfg, device):
    """Autocast in compute_dtype. Master weights and AdamW stay float32, because bf16 weights
    silently drop updates smaller than 1/256 of the weight (lr 1e-6 does; fp16's 1/2048 too)."""
    dtype = compute_dtype(cfg, device)
    return contextlib.nullcontext() if dtype is None else torch.autocast(device.type, dtype=dtype)


def score(model, batch, cfg):
    """Per-token log-probs of the completions (temperature applied) and the full-vocabulary
    entropy, both [B, C]; only completion positions get logits (not the long prompt).
    ``cfg.plain``: the log-probs and entropy of token_logprobs_plain, by autograd alone."""
    # The last completion token is never an input: nothing after it is scored.
    ids = torch.cat([batch.prompt_ids, batch.completions[:, :-1]], dim=1)
    attn = torch.cat([batch.prompt_attn, batch.mask[:, :-1].to(batch.prompt_attn.dtype)], dim=1)
    # Positions as generate() counts them under left padding (from the attention mask). RoPE
    # only sees position differences, so Qwen would survive arange(); absolute-position
    # models would not, and an explicit argument keeps the two code paths visibly the same.
    position_ids = (attn.cumsum(1) - 1).clamp(min=0)
    with autocast(cfg, ids.device):
        logits = model(input_ids=ids, attention_mask=attn, position_ids=position_ids,
                       logits_to_keep=batch.completions.shape[1], use_cache=False).logits    # [B, C, V]
    logprobs = token_logprobs_plain if cfg.plain else token_logprobs
    return logprobs(logits, batch.completions, cfg.temperature)


def score_sharing_prompts(model, batch, cfg):
    """score(), with each prompt run once per group instead of once per completion.

    The G completions of a group continue the same prompt, so its keys and values are the
    same G times: run the prompts once (B/G rows), repeat their key/value cache G times, and
    run only the completions on top of it. Rows must come in whole groups."""
    G, L = cfg.group_size, batch.prompt_ids.shape[1]     # L: prompt width
    firsts = slice(None, None, G)                               # one row per group
    prompt_attn, completions = batch.prompt_attn, batch.completions
    with autocast(cfg, completions.device):
        prompt = model(input_ids=batch.prompt_ids[firsts], attention_mask=prompt_attn[firsts],
                       position_ids=(prompt_attn[firsts].cumsum(1) - 1).clamp(min=0), use_cache=True,
                       logits_to_keep=1)                        # predicts completion token 0
        cache = prompt.cache
        cache.batch_repeat_interleave(G)                        # [B/G rows] -> [B rows], differentiable
        # The last completion token is never an input (nothing after it is scored).
        attn = torch.cat([prompt_attn, batch.mask[:, :-1].to(prompt_attn.dtype)], dim=1)
        rest = model(input_ids=completions[:, :-1], attention_mask=attn,
                     position_ids=(attn.cumsum(1) - 1).clamp(min=0)[:, L:], cache=cache,
                     use_cache=True)                            # predicts completion tokens 1..C-1
    # Token 0 is predicted by the prompt pass (the same logits for the G rows of a group).
    first = token_logprobs(prompt.logits.repeat_interleave(G, dim=0), completions[:, :1], cfg.temperature)
    others = token_logprobs(rest.logits, completions[:, 1:], cfg.temperature)
    logp, entropy = (torch.cat(pair, dim=1) for pair in zip(first, others))
    return logp, entropy


def can_share_prompts(cfg):
    """Prompt sharing needs whole groups in a micro-batch and a KV cache in the training pass
    (gradient checkpointing turns the cache off)."""
    return (cfg.share_prompts and not cfg.plain and cfg.micro_batch % cfg.group_size == 0
            and not cfg.grad_checkpointing)


def training_scorer(cfg):
    """The function the update scores with: score_sharing_prompts where it applies, else score."""
    return score_sharing_prompts if can_share_prompts(cfg) else score


def micro_batches(batch, cfg):
    """(rows, part) for each micro-batch of ``cfg.micro_batch`` rows; each part is cut to its own
    longest completion (the plain computation with --plain keeps the batch's full width).

    A rollout is padded to the longest completion of the whole batch: once the model answers
    in 20 tokens, one rambling sample still makes every row 80 columns wide, and scoring would
    spend most of its time on padding."""
    for i in range(0, batch.mask.shape[0], cfg.micro_batch):
        rows = slice(i, i + cfg.micro_batch)
        part = batch[rows]
        width = batch.mask.shape[1] if cfg.plain else longest_completion(part.mask)
        yield rows, dataclasses.replace(part, completions=part.completions[:, :width],
                                        mask=part.mask[:, :width])


def longest_completion(mask):
    return max(int(mask.sum(1).max().item()), 1)


def pad_to(x, width):
    """Back to the batch's width, zeros on the right (masked out everywhere they are used)."""
    return torch.nn.functional.pad(x, (0, width - x.shape[1]))


@torch.no_grad()
def score_no_grad(model, batch, cfg):
    """score() over micro-batches without gradients (CW-GRPO's old policy, the reference model)."""
    C, parts = batch.mask.shape[1], []
    for _, part in micro_batches(batch, cfg):
        parts.append([pad_to(t, C) for t in score(model, part, cfg)])
    logp, entropy = (torch.cat(t) for t in zip(*parts))
    return logp, entropy


def check_ratio_is_one(train_logp, plain_logp, mask, cfg):
    """Before the first update the policy is the sampling policy, so log(pi / pi_old) must be 0:
    the training pass against the plain, gradient-free score() catches dropout at scoring time,
    a wrong temperature, and any difference between the speed devices and the plain computation.
    The bound: float32 agrees to ~1e-5; bf16 and fp16 round differently in differently shaped
    batches (bf16: ~1e-2), so they get a looser one, still far below what dropout or a wrong T
    cause. train.grpo_step runs it on one row."""
    tol = 1e-3 if compute_dtype(cfg, train_logp.device) is None else 0.1
    drift = ((train_logp - plain_logp).abs() * mask).max().item()
    if drift > tol:
        print("warning: the importance ratio is not 1 before the first update "
              f"(max |log ratio| {drift:.2e}): "
              "sampling and scoring disagree (dropout on? temperature?)", file=sys.stderr)
