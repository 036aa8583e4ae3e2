"""GPU memory of a GRPO run at consumer card sizes: peak allocated and reserved memory, and time,
per phase (load, sample, score, update, eval) of a few full steps of train.py at a preset's real
settings, inside a memory cap the size of the card.

    # one 12 GB card: the qwen-0.5b preset as it is (full fine-tuning, bf16 autocast, checkpointing)
    python -m experiments.benchmarks.gpu_memory --arch qwen2.5-0.5b --cap-gb 12 --steps 3 \\
        --json mem-0.5b.json -- --preset qwen-0.5b --data /path/to/gsm8k
    # one 24 GB card: the qwen-1.5b preset as it is (LoRA rank 64)
    python -m experiments.benchmarks.gpu_memory --arch qwen2.5-1.5b --cap-gb 24 --steps 3 \\
        --json mem-1.5b.json -- --preset qwen-1.5b --data /path/to/gsm8k
    # the CPU smoke test (tests/test_gpu_memory.py): a 2-layer model with the same vocabulary
    python -m experiments.benchmarks.gpu_memory --arch qwen2.5-0.5b --scale-down \\
        -- --preset qwen-0.5b --device cpu ...

The models are the real Qwen2.5-0.5B and 1.5B architectures, built from their published configs
(``PUBLISHED``) with random weights, float32 (seed 0), and saved once under runs/models/random-<arch>
(``--cache``). The Hub is not needed: the tokenizer is a stand-in (``stand_in_tokenizer``), one
token per word, punctuation mark or digit of GSM8K's training problems, padded with filler tokens
to Qwen's 151,936 ids, its special tokens at Qwen's ids and a Qwen-style chat template. Flags
after ``--`` go to train.py, which runs in this process (``train.main``); this script adds
``--model <the random model> --out <a temporary directory, or --out> --steps N`` and, unless
given, ``--eval-n 64 --eval-batch 64`` (one evaluation batch, measured too) and
``--ckpt-every 1000000``. The checkpoint and final/ that a run writes at its last step are
skipped (``--save`` keeps them). ``--cap-gb G`` caps PyTorch's allocator at G GiB with
torch.cuda.set_per_process_memory_fraction before anything is allocated; a run that does not
fit stops with "out of memory", the phase and the step, and exit code 3.

Each phase is measured by wrapping train.py's own functions, without editing it: ``rollout``
(sample; eval when greedy), ``score_no_grad`` (score: the reference model's log-probs, CW-GRPO's
old ones, and the one-row check of check_ratio_is_one: its median mixes the two, its total does
not), ``update`` (one call per optimizer step). Around each call: synchronize, reset the peak
statistics; after it, the seconds and max_memory_allocated / max_memory_reserved. A phase's peak
is the largest over its calls and includes what stays resident (weights, reference, gradients,
AdamW state). "load" is everything before the optimizer exists (model, reference copy), and "at
rest" the memory allocated between phases. Printed at the end, and with ``--json PATH`` written
as JSON: that table, the GPU, the cap, the architecture, train.py's flags, the prompt lengths in
tokens (mean, max, per word), the completion lengths and truncated fraction from the run's
metrics.jsonl, and sampling tokens/s. On a CPU the memory columns stay empty ("-", null in the
JSON); the times are measured.

What it cannot tell: random weights almost never say EOS, so completions run to --max-new-tokens
(truncated_frac about 1): the worst case for sampling, scoring and update memory, not a trained
model's typical step. The stand-in tokenizer is not Qwen's: a prompt takes a different number of
tokens (it prints tokens per word; Qwen's byte-level BPE takes about 1.3 per English word), so
prompt-dependent memory is approximate. The cap limits PyTorch's allocator only; a real card also
holds the CUDA context (0.7 GiB on an H100 with CUDA 13; less on smaller cards) and whatever the
desktop uses: compare the peak reserved memory with the card's size minus that.
"""
import argparse
import contextlib
import json
import math
import platform
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from unittest import mock


import torch

import data
from engine import models
import train

# From the published config.json files of Qwen/Qwen2.5-0.5B(-Instruct) and Qwen/Qwen2.5-1.5B(-Instruct).
_QWEN25 = dict(vocab_size=151936, max_position_embeddings=32768, rope_theta=1000000.0, rms_norm_eps=1e-6,
               hidden_act="silu", bos_token_id=151643, eos_token_id=151645, use_sliding_window=False)
PUBLISHED = {
    "qwen2.5-0.5b": dict(_QWEN25, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                         num_attention_heads=14, num_key_value_heads=2, tie_word_embeddings=True),
    "qwen2.5-1.5b": dict(_QWEN25, hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
                         num_attention_heads=12, num_key_value_heads=2, tie_word_embeddings=True),
}
# --scale-down: the same vocabulary and special tokens, a body small enough for a CPU test.
SCALED_DOWN = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                   num_key_value_heads=2)

# Qwen2.5's special tokens, at Qwen's ids: <|endoftext|> is the pad token, <|im_end|> the EOS.
VOCAB_SIZE = 151936
SPECIAL = {"<|endoftext|>": 151643, "<|im_start|>": 151644, "<|im_end|>": 151645}
UNK = "[UNK]"
CHAT_TEMPLATE = (
    "{% for m in messages %}"
    "{% if loop.first and m['role'] != 'system' %}"
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n{% endif %}"
    "<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
PHASES = ("load", "sample", "score", "update", "eval")
OOM_EXIT = 3


# ----------------------------------------------------------------------------------------
# The stand-in tokenizer and the random model.

def pre_tokenizer():
    """Newlines are tokens; other whitespace separates words; each punctuation mark and each
    digit is a token of its own (Qwen splits digits one by one too)."""
    from tokenizers import Regex, pre_tokenizers
    return pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(r"\n"), "isolated"),
        pre_tokenizers.Split(Regex(r"[^\S\n]+"), "removed"),
        pre_tokenizers.Punctuation("isolated"),
        pre_tokenizers.Digits(individual_digits=True)])


def stand_in_tokenizer(problems, vocab_size=VOCAB_SIZE):
    """A word-level tokenizer over the words of ``problems`` (questions and answers) and of the
    prompt (data.SYSTEM_PROMPT, the chat template), padded with filler tokens to exactly
    ``vocab_size`` ids, so every id a random model samples decodes. [UNK] is id 0."""
    from tokenizers import Tokenizer
    from tokenizers import models as tk_models
    from transformers import PreTrainedTokenizerFast
    split = pre_tokenizer()
    texts = [p[k] for p in problems for k in ("question", "answer")]
    texts += [data.SYSTEM_PROMPT, "system user assistant You are a helpful assistant."]
    words = sorted({w for text in texts for w, _ in split.pre_tokenize_str(text)} - set(SPECIAL) - {UNK})
    if len(words) + 1 + len(SPECIAL) > vocab_size:
        raise ValueError(f"{len(words)} words do not fit in {vocab_size} ids")
    by_id = [UNK] + words
    while len(by_id) < vocab_size:
        by_id.append(next((s for s, i in SPECIAL.items() if i == len(by_id)), f"<|filler_{len(by_id)}|>"))
    tk = Tokenizer(tk_models.WordLevel({w: i for i, w in enumerate(by_id)}, unk_token=UNK))
    tk.pre_tokenizer = split
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, unk_token=UNK, pad_token="<|endoftext|>",
                                  eos_token="<|im_end|>", additional_special_tokens=["<|im_start|>"],
                                  padding_side="left")
    tok.chat_template = CHAT_TEMPLATE
    return tok


class _SavedAsPlainFast:
    """save_pretrained of the tokenizer, its tokenizer_config naming PreTrainedTokenizerFast, so
    models.load_tokenizer loads it as it is (never as Qwen2Tokenizer, which needs Qwen's files)."""
    def __init__(self, tok):
        self.tok = tok

    def save_pretrained(self, path):
        self.tok.save_pretrained(path)
        config = Path(path) / "tokenizer_config.json"
        config.write_text(json.dumps({**json.loads(config.read_text()),
                                      "tokenizer_class": "PreTrainedTokenizerFast"}, indent=2))


def arch_config(arch, scale_down=False):
    return {**PUBLISHED[arch], **(SCALED_DOWN if scale_down else {})}


def random_model_dir(arch, problems, scale_down=False, cache=None):
    """The directory of the random ``arch`` model and its stand-in tokenizer; built (float32,
    seed 0) and saved on first use, reused after (``problems``: the tokenizer's vocabulary)."""
    from transformers import AutoModelForCausalLM, Qwen2Config
    target = Path(cache or models.CACHE) / f"random-{arch}{'-scaled-down' if scale_down else ''}"
    if (target / "config.json").exists():
        return target
    print(f"building a random {arch}{' (scaled down)' if scale_down else ''} and its tokenizer: {target}")
    tok = stand_in_tokenizer(problems)
    torch.manual_seed(0)
    config = Qwen2Config(**arch_config(arch, scale_down))
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    # As Qwen2.5-Instruct's generation_config.json: both end tokens stop, <|endoftext|> pads.
    model.generation_config.eos_token_id = [SPECIAL["<|im_end|>"], SPECIAL["<|endoftext|>"]]
    model.generation_config.pad_token_id = SPECIAL["<|endoftext|>"]
    return models.save_atomically(target, model, _SavedAsPlainFast(tok))


# ----------------------------------------------------------------------------------------
# Per-phase measurement: train.py's functions, wrapped.

def gib(n):
    return None if n is None else n / 2 ** 30


def _max(a, b):
    return b if a is None else a if b is None else max(a, b)


class Phases:
    """Seconds and peak memory of each call of each phase; a phase keeps the max over its calls."""

    def __init__(self, cuda):
        self.cuda, self.stats, self.step, self.where, self.oom = cuda, {}, 0, "load", None
        self.rest = {"after_load": None, "after_update": None}   # GiB allocated between phases
        self.prompts = {"sample": [], "eval": []}                 # tokens per prompt
        self.words = {"sample": 0, "eval": 0}                     # whitespace words per prompt, summed
        self.completion_tokens = {"sample": 0, "eval": 0}
        self.t0 = time.perf_counter()

    def sync(self):
        if self.cuda:
            torch.cuda.synchronize()

    def record(self, phase, seconds, allocated=None, reserved=None):
        """One call: its seconds, its peak allocated and reserved memory in GiB (None: unknown)."""
        s = self.stats.setdefault(phase, dict(calls=0, seconds=[], peak_allocated_gib=None,
                                              peak_reserved_gib=None))
        s["calls"] += 1
        s["seconds"].append(seconds)
        s["peak_allocated_gib"] = _max(s["peak_allocated_gib"], allocated)
        s["peak_reserved_gib"] = _max(s["peak_reserved_gib"], reserved)

    def measure(self, phase, fn, *args, **kwargs):
        """fn(*args, **kwargs), timed, with its peak memory; an OOM is noted (phase, step), then re-raised."""
        self.sync()
        if self.cuda:
            torch.cuda.reset_peak_memory_stats()
        self.where, t = phase, time.perf_counter()
        try:
            out = fn(*args, **kwargs)
            self.sync()
        except torch.OutOfMemoryError as e:
            self.note_oom(e)
            raise
        seconds = time.perf_counter() - t
        peak = self.peaks()
        self.record(phase, seconds, *peak)
        self.where = "between phases"
        return out

    def peaks(self):
        if not self.cuda:
            return None, None
        return gib(torch.cuda.max_memory_allocated()), gib(torch.cuda.max_memory_reserved())

    def allocated(self):
        return gib(torch.cuda.memory_allocated()) if self.cuda else None

    def note_oom(self, error):
        if self.oom is None:
            self.oom = dict(phase=self.where, step=self.step, message=str(error).strip().split("\n")[0],
                            allocated_gib=self.allocated(),
                            reserved_gib=gib(torch.cuda.memory_reserved()) if self.cuda else None)

    @contextlib.contextmanager
    def patched(self):
        """train.py's rollout, score_no_grad, update, batch_of_prompts and make_optimizer, wrapped."""
        orig = {name: getattr(train, name) for name in
                ("rollout", "score_no_grad", "update", "batch_of_prompts", "make_optimizer")}

        def rollout(model, tok, questions, cfg, greedy=False, group_size=1):
            phase = "eval" if greedy else "sample"
            batch = self.measure(phase, orig["rollout"], model, tok, questions, cfg, greedy=greedy,
                                 group_size=group_size)
            self.prompts[phase] += batch.prompt_attn[::group_size].sum(1).tolist()
            self.words[phase] += sum(len(data.render_prompt(tok, q).split()) for q in questions)
            self.completion_tokens[phase] += int(batch.mask.sum().item())
            return batch

        def score_no_grad(*args, **kwargs):
            return self.measure("score", orig["score_no_grad"], *args, **kwargs)

        def update(*args, **kwargs):
            out = self.measure("update", orig["update"], *args, **kwargs)
            self.rest["after_update"] = _max(self.rest["after_update"], self.allocated())
            return out

        def batch_of_prompts(problems, cfg, step):
            self.step = step
            return orig["batch_of_prompts"](problems, cfg, step)

        def make_optimizer(policy, cfg):           # the model and its reference are loaded: "load" ends
            optimizer = orig["make_optimizer"](policy, cfg)
            self.sync()
            self.record("load", time.perf_counter() - self.t0, *self.peaks())
            self.rest["after_load"] = self.allocated()
            self.where = "between phases"
            return optimizer

        wrappers = dict(rollout=rollout, score_no_grad=score_no_grad, update=update,
                        batch_of_prompts=batch_of_prompts, make_optimizer=make_optimizer)
        try:
            for name, fn in wrappers.items():
                setattr(train, name, fn)
            yield self
        finally:
            for name, fn in orig.items():
                setattr(train, name, fn)

    def table(self):
        rows = {}
        for phase in [p for p in PHASES if p in self.stats] + [p for p in self.stats if p not in PHASES]:
            s = self.stats[phase]
            rows[phase] = dict(calls=s["calls"], peak_allocated_gib=s["peak_allocated_gib"],
                               peak_reserved_gib=s["peak_reserved_gib"],
                               median_s=statistics.median(s["seconds"]), total_s=sum(s["seconds"]),
                               seconds=s["seconds"])
        return rows

    def prompt_lengths(self):
        out = {}
        for phase, lengths in self.prompts.items():
            if lengths:
                out[phase] = dict(prompts=len(lengths), mean_tokens=statistics.mean(lengths),
                                  max_tokens=max(lengths), tokens_per_word=sum(lengths) / self.words[phase])
        return out

    def tokens_per_s(self):
        """Completion tokens (up to the first EOS) per second of sampling / evaluation."""
        return {phase: n / sum(self.stats[phase]["seconds"]) for phase, n in self.completion_tokens.items()
                if n and phase in self.stats}


# ----------------------------------------------------------------------------------------
# main: build (once) -> cap -> run train.py's main, wrapped -> report.

def completions_from_metrics(path):
    """Per training step: completion_len, truncated_frac and train.py's own tokens_per_s."""
    if not path.exists():
        return {}
    steps = [r for r in map(json.loads, path.read_text().splitlines()) if "completion_len" in r]
    keys = ("step", "completion_len", "truncated_frac", "tokens_per_s", "gen_time", "score_time",
            "update_time", "step_time")
    return {k: [r.get(k) for r in steps] for k in keys}


def has_flag(flags, name):
    return any(f == name or f.startswith(name + "=") for f in flags)


def train_flags(a, extra, model_dir, out):
    """train.py's argv: the user's flags, this script's defaults where the user gave none, then
    the model and the run directory."""
    flags = list(extra)
    defaults = [("--steps", str(a.steps)), ("--eval-n", "64"), ("--eval-batch", "64"),
                ("--ckpt-every", "1000000")]
    for name, value in defaults:
        if not has_flag(flags, name):
            flags += [name, value]
    return flags + ["--model", str(model_dir), "--out", str(out)]


def fmt(x, spec=".2f"):
    return "-" if x is None else format(x, spec)


def report(result):
    """The table and the numbers around it, as text."""
    lines = [f"device: {result['device_name']} ({result['device']}); cap: "
             + (f"{result['cap_gb']} GiB (fraction {result['cap_fraction']:.4f} of "
                f"{result['total_memory_gib']:.1f} GiB)" if result["cap_fraction"] else "none"),
             f"arch: {result['arch']}{' (scaled down)' if result['scaled_down'] else ''} "
             f"({result['parameters'] or '?'} parameters), random weights",
             "train.py " + " ".join(result["train_flags"]),
             "",
             f"{'phase':8s} {'calls':>5s} {'peak alloc GiB':>14s} {'peak reserved GiB':>17s} "
             f"{'median s':>9s} {'total s':>8s}"]
    for phase, r in result["phases"].items():
        lines.append(f"{phase:8s} {r['calls']:5d} {fmt(r['peak_allocated_gib']):>14s} "
                     f"{fmt(r['peak_reserved_gib']):>17s} {r['median_s']:9.2f} {r['total_s']:8.2f}")
    rest = result["at_rest_allocated_gib"]
    lines.append(f"allocated at rest: after load {fmt(rest['after_load'])} GiB, after an update "
                 f"{fmt(rest['after_update'])} GiB (weights, reference, gradients, AdamW state)")
    for phase, p in result["prompt_lengths"].items():
        lines.append(f"prompt tokens ({phase}): mean {p['mean_tokens']:.1f}, max {p['max_tokens']} over "
                     f"{p['prompts']} prompts; {p['tokens_per_word']:.2f} per word (stand-in tokenizer; "
                     "Qwen's: ~1.3)")
    c = result["completions"]
    if c.get("completion_len"):
        lines.append("completion_len per step: " + ", ".join(f"{x:.1f}" for x in c["completion_len"])
                     + "; truncated_frac: " + ", ".join(f"{x:.2f}" for x in c["truncated_frac"]))
    for phase, v in result["tokens_per_s"].items():
        lines.append(f"{phase} tokens/s: {v:.1f}")
    if result["oom"]:
        o = result["oom"]
        lines += ["", f"OUT OF MEMORY in phase '{o['phase']}' at step {o['step']} (cap "
                  f"{result['cap_gb']} GiB; {fmt(o['allocated_gib'])} GiB allocated, "
                  f"{fmt(o['reserved_gib'])} GiB reserved when it failed): {o['message']}"]
    return "\n".join(lines)


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    ours, extra = (argv[:argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv else (argv, [])
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                usage="%(prog)s --arch ARCH [options] -- [train.py flags]")
    p.add_argument("--arch", choices=list(PUBLISHED), required=True)
    p.add_argument("--cap-gb", type=float, default=None,
                   help="cap PyTorch's CUDA allocator at this many GiB (a card's size)")
    p.add_argument("--steps", type=int, default=3, help="training steps (train.py --steps, unless given)")
    p.add_argument("--scale-down", action="store_true",
                   help="a 2-layer, 64-wide model with the same vocabulary (CPU tests)")
    p.add_argument("--cache", default=None, help="parent of random-<arch>/ (default: runs/models)")
    p.add_argument("--out", default=None, help="the run directory (default: a temporary one, removed)")
    p.add_argument("--save", action="store_true", help="keep the run's checkpoint and final/ writes")
    p.add_argument("--json", default=None, help="write the results here as JSON")
    a = p.parse_args(ours)
    for flag in ("--model", "--init", "--out", "--resume"):
        if has_flag(extra, flag):
            p.error(f"{flag} belongs to this script (the random model, --out), not after '--'")

    cfg = train.parse_config(train_flags(a, extra, "unused", "unused"))   # the flags' errors come first
    device = models.pick_device(cfg)
    cuda = device.type == "cuda"
    cap_fraction = total = None
    if a.cap_gb and cuda:                  # before anything is allocated on the GPU
        index = device.index if device.index is not None else torch.cuda.current_device()
        total = torch.cuda.get_device_properties(index).total_memory
        cap_fraction = min(1.0, a.cap_gb * 2 ** 30 / total)
        torch.cuda.set_per_process_memory_fraction(cap_fraction, index)
        if cap_fraction == 1.0:
            print(f"note: --cap-gb {a.cap_gb} is not below this GPU's {gib(total):.1f} GiB: no cap")
    elif a.cap_gb:
        print(f"note: --cap-gb applies to CUDA only; the run is on {device.type}: no cap, no memory columns")

    train_problems, _ = data.load_problems(cfg)         # the stand-in tokenizer's vocabulary
    model_dir = random_model_dir(a.arch, train_problems, a.scale_down, a.cache)
    tmp = None if a.out else Path(tempfile.mkdtemp(prefix="gpu_memory-"))
    out = Path(a.out) if a.out else tmp / "run"
    flags = train_flags(a, extra, model_dir, out)

    phases = Phases(cuda)
    code, saves = 0, contextlib.ExitStack()
    if not a.save:                         # the last step's checkpoint and final/: disk, not GPU memory
        saves.enter_context(mock.patch.object(train.checkpoints, "save_checkpoint", do_nothing))
        saves.enter_context(mock.patch.object(train.checkpoints, "save_final", do_nothing))
    try:
        with saves, phases.patched():
            code = train.main(flags)
    except torch.OutOfMemoryError as e:
        phases.note_oom(e)                 # outside the wrapped phases: loading, mostly
        code = OOM_EXIT
    finally:
        completions = completions_from_metrics(out / "metrics.jsonl")
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)
    result = dict(
        device=device.type, device_name=torch.cuda.get_device_name(device) if cuda else
        (platform.processor() or platform.machine()), cap_gb=a.cap_gb if cap_fraction else None,
        cap_fraction=cap_fraction, total_memory_gib=gib(total), arch=a.arch, scaled_down=a.scale_down,
        arch_config=arch_config(a.arch, a.scale_down), parameters=_parameters(model_dir),
        train_flags=flags, phases=phases.table(), at_rest_allocated_gib=phases.rest,
        prompt_lengths=phases.prompt_lengths(), completions=completions, tokens_per_s=phases.tokens_per_s(),
        oom=phases.oom, exit_code=code,
        versions=dict(torch=torch.__version__, transformers=_version("transformers"), peft=_version("peft")))
    print("\n" + report(result))
    if a.json:
        Path(a.json).write_text(json.dumps(result, indent=2))
    return code


def do_nothing(*args, **kwargs):
    return None


def _parameters(model_dir):
    """The model's parameter count from its safetensors headers, without loading it (tied: once)."""
    try:
        from safetensors import safe_open
        n = 0
        for f in Path(model_dir).glob("*.safetensors"):
            with safe_open(f, "pt") as st:
                for k in st.keys():
                    n += math.prod(st.get_slice(k).get_shape())
        return n or None
    except Exception:
        return None


def _version(package):
    import importlib.metadata
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


if __name__ == "__main__":
    sys.exit(main())
