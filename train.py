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
import hashlib
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
import rewards
from losses import LOSSES, cw_grpo_weights, group_advantages, microbatch_scale, token_entropy, token_logprobs


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
    data: str = ""                 # local GSM8K JSONL file/dir; "" = Hub (qwen) or synthetic (tiny)
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


PRESETS = {
    # CPU, offline: a 0.5M-parameter Qwen2 built from a config, a character tokenizer and
    # synthetic one-step problems; a short SFT warm-up, then GRPO.
    "tiny": dict(),
    # One 12 GB GPU: full fine-tuning, fp32 master weights + AdamW, bf16 autocast.
    "qwen-0.5b": dict(model="Qwen/Qwen2.5-0.5B-Instruct", steps=500, group_size=8, prompts_per_step=8,
                      micro_batch=2, lr=1e-6, lr_warmup_steps=10, max_new_tokens=400, eval_every=50,
                      eval_n=500, eval_batch=64, ckpt_every=50, sample_every=10, dtype="bfloat16",
                      grad_checkpointing=True),
    # One 24 GB GPU: LoRA (full fine-tuning needs ~25 GB for weights, grads and AdamW alone).
    "qwen-1.5b": dict(model="Qwen/Qwen2.5-1.5B-Instruct", steps=500, group_size=8, prompts_per_step=8,
                      micro_batch=4, lr=2e-5, lr_warmup_steps=10, max_new_tokens=400, eval_every=50,
                      eval_n=500, eval_batch=64, ckpt_every=50, sample_every=10, dtype="bfloat16",
                      grad_checkpointing=True, lora_rank=64),
}
# Fields that may differ when resuming (everything else must match the checkpoint's config).
RESUMABLE = {"resume", "steps", "eval_every", "eval_n", "eval_batch", "sample_every", "ckpt_every",
             "device", "threads", "out", "micro_batch", "warmup_only"}


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

def tiny_tokenizer():
    """A character-level tokenizer built locally, wrapped as an HF fast tokenizer.

    Like Qwen's, its pad token *is* its EOS token, so masks built from token ids would be
    wrong here too: we build them from positions. The chat template renders only the user's
    question ("Q: ...\\nA: "): a system prompt of 150 characters would triple every prompt of
    a character-level model without telling it anything it can read.
    """
    from tokenizers import Tokenizer, decoders, models
    from transformers import PreTrainedTokenizerFast
    chars = [chr(i) for i in range(32, 127)] + ["\n"]
    vocab = {"<|endoftext|>": 0, **{c: i + 1 for i, c in enumerate(chars)}}
    tk = Tokenizer(models.BPE(vocab=vocab, merges=[]))     # no merges: one token per character
    tk.decoder = decoders.Fuse()
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, eos_token="<|endoftext|>", pad_token="<|endoftext|>",
                                  padding_side="left")
    tok.chat_template = ("{% for m in messages %}{% if m['role'] == 'user' %}Q: {{ m['content'] }}\nA: "
                         "{% endif %}{% endfor %}")
    return tok


def tiny_model(tok):
    """Qwen2 architecture, ~0.5M parameters: what the real run trains, shrunk to a laptop."""
    from transformers import Qwen2Config, Qwen2ForCausalLM
    config = Qwen2Config(vocab_size=len(tok), hidden_size=128, intermediate_size=512, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                         tie_word_embeddings=True, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
                         bos_token_id=None)
    return Qwen2ForCausalLM(config)


def load_model(cfg, device):
    """(policy, tokenizer) from --init / --model, or the tiny model's cached warm start."""
    from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerFast
    source = cfg.init or cfg.model or warm_start(cfg)
    try:
        tok = AutoTokenizer.from_pretrained(source)
        if type(tok).__name__ != "TokenizersBackend" and _plain_tokenizer_json(source):
            # transformers 5 maps a plain tokenizer.json to the model type's class (Qwen2Tokenizer),
            # which re-splits text Qwen's way and silently breaks our character tokenizer.
            tok = PreTrainedTokenizerFast.from_pretrained(source)
        model = AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32)
    except OSError as e:
        raise SystemExit(f"error: could not load the model '{source}' ({e.__class__.__name__}). Without network "
                         "access a Hub model must already be in the local HF cache, or pass a local directory "
                         "with --model/--init. For the offline demo run: python train.py --preset tiny") from None
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
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
        model = get_peft_model(model, LoraConfig(r=cfg.lora_rank, lora_alpha=2 * cfg.lora_rank, lora_dropout=0.0,
                                                 target_modules=["q_proj", "k_proj", "v_proj", "o_proj",
                                                                 "gate_proj", "up_proj", "down_proj"]))
    return model, tok


def _plain_tokenizer_json(source):
    config = Path(source) / "tokenizer_config.json"
    return config.exists() and json.loads(config.read_text()).get("tokenizer_class") in (
        "TokenizersBackend", "PreTrainedTokenizerFast")


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
    if cfg.preset == "tiny" and not cfg.data:
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
    """Every sampling knob written out. Checkpoints ship their own defaults (Qwen2.5-Instruct:
    top_k=20, top_p=0.8, repetition_penalty=1.05) which would silently sample from another
    distribution than the one we score, so we replace the model's generation config."""
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
def rollout(model, tok, questions, cfg, greedy=False):
    """Generate one completion per question (repeat questions for a group). Returns the
    prompt ids/attention, completion ids, mask and truncation flags."""
    prompts = [data.render_prompt(tok, q) for q in questions]
    enc = tok(prompts, return_tensors="pt", padding=True, add_special_tokens=False).to(model.device)
    gen_cfg = generation_config(model, tok, cfg, greedy)
    model.generation_config = gen_cfg                       # no hidden defaults left to merge
    was_training = model.training
    model.eval()
    out = model.generate(**enc, generation_config=gen_cfg)
    model.train(was_training)
    completions = out[:, enc["input_ids"].shape[1]:]
    mask, truncated = completion_mask(completions, gen_cfg.eos_token_id)
    return enc["input_ids"], enc["attention_mask"], completions, mask, truncated


def decode(tok, completions, mask):
    """Completion texts, up to and including the first EOS (tokens after it become padding)."""
    return tok.batch_decode(completions * mask.long() + tok.pad_token_id * (1 - mask.long()),
                            skip_special_tokens=True)


def score(model, prompt_ids, prompt_attn, completions, mask, cfg, device, with_entropy=False):
    """Per-token log-probs of the completions (temperature applied) and, optionally, the
    full-vocabulary entropy; only completion positions get logits (not the long prompt)."""
    ids = torch.cat([prompt_ids, completions], dim=1)
    attn = torch.cat([prompt_attn, mask.to(prompt_attn.dtype)], dim=1)
    # Positions as generate() counts them under left padding (from the attention mask). RoPE
    # only sees position differences, so Qwen would survive arange(); absolute-position
    # models would not, and an explicit argument keeps the two code paths visibly the same.
    position_ids = (attn.cumsum(1) - 1).clamp(min=0)
    C = completions.shape[1]
    with autocast(cfg, device):
        logits = model(input_ids=ids, attention_mask=attn, position_ids=position_ids,
                       logits_to_keep=C + 1, use_cache=False).logits[:, :-1]
    logp = token_logprobs(logits, completions, cfg.temperature)
    entropy = token_entropy(logits, cfg.temperature) if with_entropy else None
    return logp, entropy


@torch.no_grad()
def score_no_grad(model, batch, cfg, device, with_entropy=False):
    """score() over micro-batches without gradients (old policy, reference model)."""
    parts = [score(model, *[t[i:i + cfg.micro_batch] for t in batch], cfg, device, with_entropy)
             for i in range(0, batch[0].shape[0], cfg.micro_batch)]
    logp = torch.cat([p[0] for p in parts])
    return logp, (torch.cat([p[1] for p in parts]) if with_entropy else None)


# ----------------------------------------------------------------------------------------
# One GRPO step: rollout -> reward -> advantage -> loss -> update.

def grpo_step(policy, ref, tok, optimizer, scheduler, problems, cfg, device):
    """Sample, score, reward and update on one batch; returns (metrics, sample record)."""
    t0 = time.perf_counter()
    questions = [p["question"] for p in problems for _ in range(cfg.group_size)]
    golds = [rewards.gold_answer(p["answer"]) for p in problems for _ in range(cfg.group_size)]
    prompt_ids, prompt_attn, completions, mask, truncated = rollout(policy, tok, questions, cfg)
    gen_time = time.perf_counter() - t0
    batch = (prompt_ids, prompt_attn, completions, mask)

    # Reward and group-relative advantage.
    texts = decode(tok, completions, mask)
    r = torch.tensor([rewards.reward(t, g) for t, g in zip(texts, golds)])
    correct = torch.tensor([rewards.correctness_reward(t, g) for t, g in zip(texts, golds)])
    adv = group_advantages(r, cfg.group_size, cfg.scale_std).to(device)

    # Scores of the sampling policy (old_logp, entropy) and of the reference.
    old_logp, entropy = score_no_grad(policy, batch, cfg, device, with_entropy=True)
    ref_logp = None
    if cfg.beta > 0:
        with (policy.disable_adapter() if cfg.lora_rank > 0 else contextlib.nullcontext()):
            ref_logp = score_no_grad(ref if ref is not None else policy, batch, cfg, device)[0]

    loss_fn = LOSSES[cfg.loss]
    kwargs = dict(clip_eps=cfg.clip_eps, beta=cfg.beta, max_tokens=cfg.max_new_tokens)
    if cfg.agg:
        kwargs["agg"] = cfg.agg
    agg = cfg.agg or inspect.signature(loss_fn).parameters["agg"].default
    # CW-GRPO's weights are statistics of the whole batch: compute them once, slice per micro-batch.
    cw_weights = cw_grpo_weights(old_logp, adv, mask) if cfg.loss == "cw_grpo" else None

    policy.train()
    for update in range(cfg.updates_per_batch):
        optimizer.zero_grad(set_to_none=True)
        total, infos = 0.0, []
        for i in range(0, mask.shape[0], cfg.micro_batch):
            rows = slice(i, i + cfg.micro_batch)
            logp, _ = score(policy, *[t[rows] for t in batch], cfg, device)
            if update == 0 and i == 0:
                drift = (logp.detach() - old_logp[rows]).abs().mul(mask[rows]).max().item()
                if drift > 1e-3:
                    print(f"warning: the importance ratio is not 1 before the first update (max |log ratio| "
                          f"{drift:.2e}): sampling and scoring disagree (dropout on? temperature?)", file=sys.stderr)
            extra = {"weights": cw_weights[rows]} if cw_weights is not None else {}
            loss, info = loss_fn(logp, old_logp[rows], None if ref_logp is None else ref_logp[rows], adv[rows],
                                 mask[rows], entropy[rows], **kwargs, **extra)
            loss = loss * microbatch_scale(agg, mask[rows], mask)
            loss.backward()
            total += loss.item()
            infos.append((info, mask[rows].sum().item()))
        grad_norm = torch.nn.utils.clip_grad_norm_(policy.parameters(), cfg.max_grad_norm).item()
        if not (math.isfinite(total) and math.isfinite(grad_norm)):
            raise FloatingPointError(f"non-finite loss ({total}) or gradient norm ({grad_norm})")
        optimizer.step()
        scheduler.step()
        if update == 0:
            first = (total, grad_norm, infos)
    total, grad_norm, infos = first

    n_tok = mask.sum().item()
    tok_mean = lambda key: sum(info[key].item() * n for info, n in infos) / n_tok   # over micro-batches
    valid = mask > 0
    weights = torch.cat([i["weights"] for i, _ in infos])
    groups = r.view(-1, cfg.group_size)
    metrics = dict(loss=total, reward=r.mean().item(), reward_std=r.std().item(),
                   accuracy=correct.mean().item(),
                   frac_zero_std=(groups == groups[:, :1]).all(1).float().mean().item(),
                   entropy=entropy[valid].mean().item(), grad_norm=grad_norm,
                   kl=tok_mean("kl"), clip_frac=tok_mean("clip_frac"),
                   weight_mean=weights[valid].float().mean().item(),
                   completion_len=mask.sum(1).mean().item(), truncated_frac=truncated.float().mean().item(),
                   lr=scheduler.get_last_lr()[0], gen_time=gen_time)
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
# The tiny preset's warm start: a short supervised fine-tune on worked solutions, so GRPO
# starts from a model that is sometimes right (GRPO needs groups with mixed rewards). Half the
# solutions are in the wordy style that overruns the token budget: greedy decoding then picks
# it for most questions although half the samples are terse, and GRPO has a behaviour to find.

def warm_start(cfg):
    """Directory of the cached warm start for these settings; built on first use."""
    settings = dict(level=cfg.level, sft_steps=cfg.sft_steps, sft_lr=cfg.sft_lr, sft_batch=cfg.sft_batch,
                    sft_wordy=cfg.sft_wordy, level1_max=data.LEVEL1_MAX, v=2)
    key = hashlib.sha1(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:8]
    path = Path(cfg.out).parent / f"warmstart-tiny-{key}"     # beside the runs that share it
    if (path / "config.json").exists():
        return str(path)
    torch.manual_seed(1234)
    tok = tiny_tokenizer()
    model = tiny_model(tok)
    train = data.make_synthetic(20_000, level=cfg.level, seed=0)
    rng = random.Random(1234)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.sft_lr, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 20) * max(0.0, 1 - s / cfg.sft_steps))
    model.train()
    bar = tqdm(range(cfg.sft_steps), desc="SFT warm-up")
    for _ in bar:
        rows = [data.wordy_solution(p) if rng.random() < cfg.sft_wordy else p for p in rng.sample(train, cfg.sft_batch)]
        prompts = [data.render_prompt(tok, p["question"]) for p in rows]
        texts = [pr + p["answer"] + tok.eos_token for pr, p in zip(prompts, rows)]
        enc = tok(texts, return_tensors="pt", padding=True, add_special_tokens=False)
        labels = enc["input_ids"].clone()
        labels[enc["attention_mask"] == 0] = -100             # padding (left) is not a target
        for j, pr in enumerate(prompts):                      # nor is the prompt
            n_pad = (enc["attention_mask"][j] == 0).sum().item()
            labels[j, :n_pad + len(tok(pr, add_special_tokens=False)["input_ids"])] = -100
        position_ids = (enc["attention_mask"].cumsum(1) - 1).clamp(min=0)
        loss = model(**enc, position_ids=position_ids, labels=labels).loss
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        bar.set_postfix(loss=f"{loss.item():.3f}")
    tmp = path.with_name(path.name + ".tmp")
    model.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    os.replace(tmp, path)            # atomic: parallel runs never see half a warm start
    return str(path)


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
    run = prepare_run_dir(cfg)
    device = pick_device(cfg)
    torch.manual_seed(cfg.seed)
    random.seed(cfg.seed)

    train, held_out = load_problems(cfg)          # first, so a broken data file fails fast
    policy, tok = load_model(cfg, device)
    ref = None
    if cfg.beta > 0 and cfg.lora_rank == 0:     # with LoRA the reference is the base, adapters off
        ref = copy.deepcopy(policy).requires_grad_(False).eval()
        if cfg.dtype == "bfloat16":
            ref.to(torch.bfloat16)

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
    print(f"done: {run}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
