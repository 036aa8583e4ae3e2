"""sampling.py — how the rollout draws completions: the decoding loop and what makes it fast.

train.rollout() calls one function here:

    completions = sampling.generate(model, prompt_ids, prompt_attn, group_size, ...)   # [B, C], B = P*G

``generate`` is our own decoding loop (``sample``) with four speed devices around it; each is
tested to compute what the plain computation computes (tests/test_speed.py):

* ``prefill``: a group's G completions share their prompt, so the prompt runs once per group and
  its key/value cache is repeated G times (instead of G forward passes over the same prompt).
* finished rows leave the batch (``sample``, ``keep_rows``): a long straggler does not make every
  finished row pay for the rest of the loop.
* ``draw``: inverse-CDF sampling, one random number per row.
* ``weight_first_linears``: on the CPU, every nn.Linear computes x @ W.T as (W @ x.T).T, the
  operand order that MKL multiplies fastest at a decoding step's few rows.

``--cuda-graphs`` swaps the loop for ``sample_in_place``: no row leaves the batch, every tensor the
model reads keeps its shape and address, and on a GPU one decoding step is recorded once as a CUDA
graph (``cuda_graph``) and replayed for every token.

The plain computation stays one call away: ``generate_plain`` is transformers' ``generate()``
with every sampling knob written out (``generation_config``); ``train.py --plain`` samples with it.
Greedy, both pick the same tokens; sampled, they draw from the same distributions with different
random numbers. docs/performance.md has what each device saves, measured.
"""
import contextlib
import functools

import torch


def eos_ids(model, tok):
    """Every token id that ends a completion (Qwen-Instruct has two: <|im_end|>, <|endoftext|>)."""
    ids = {tok.eos_token_id}
    gen_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    ids.update(gen_eos if isinstance(gen_eos, list) else [gen_eos] if gen_eos is not None else [])
    return sorted(i for i in ids if i is not None)


def generation_config(model, tok, cfg, greedy=False):
    """Every sampling knob written out, for transformers' generate(): what final/ ships, what
    --plain samples with, and what the tests compare sample() with. Checkpoints ship their own
    defaults (Qwen2.5-Instruct: top_k=20, top_p=0.8, repetition_penalty=1.05) which would
    silently sample from another distribution than the one we score, so this replaces them."""
    from transformers import GenerationConfig
    # top_k=0 is what disables top-k sampling; greedy decoding has no warpers at all, and
    # transformers warns about top_k=0 there, so leave it unset.
    return GenerationConfig(do_sample=not greedy, temperature=1.0 if greedy else cfg.temperature,
                            top_k=None if greedy else 0,
                            top_p=1.0, min_p=None, typical_p=1.0, repetition_penalty=1.0,
                            no_repeat_ngram_size=0,
                            max_new_tokens=cfg.max_new_tokens, eos_token_id=eos_ids(model, tok),
                            pad_token_id=tok.pad_token_id, bos_token_id=None, use_cache=True)


@torch.no_grad()
def generate_plain(model, prompt_ids, prompt_attn, gen_config):
    """The plain computation: transformers' generate(), every row its own prompt pass, padded to
    the token budget. ``prompt_ids``/``prompt_attn`` already hold one row per completion."""
    out = model.generate(input_ids=prompt_ids, attention_mask=prompt_attn, generation_config=gen_config)
    out = out[:, prompt_ids.shape[1]:]                                     # the completions alone
    return torch.nn.functional.pad(out, (0, gen_config.max_new_tokens - out.shape[1]),
                                   value=gen_config.pad_token_id)


@torch.no_grad()
def generate(model, prompt_ids, prompt_attn, group_size, max_new_tokens, temperature, eos, pad,
             share_prompts=True, cuda_graphs=False):
    """``group_size`` completions for each of the P prompts, the rows of a group adjacent: [P*G, C].

    ``temperature=None`` is greedy decoding. ``share_prompts=False`` runs every row's prompt
    itself (the same tokens, for the tests and the benchmarks). ``cuda_graphs``: sample_in_place,
    replaying a CUDA graph on a GPU (elsewhere the same fixed-shape loop, eagerly)."""
    share = group_size if share_prompts else 1
    ids, attn = (t.repeat_interleave(group_size // share, dim=0) for t in (prompt_ids, prompt_attn))
    cache = prefill(model, ids, attn, group_size=share, max_len=ids.shape[1] + max_new_tokens)
    ids, attn = (t.repeat_interleave(share, dim=0) for t in (ids, attn))
    if cuda_graphs and model.config._attn_implementation == "sdpa":      # its mask is the one we build
        return sample_in_place(model, ids, attn, cache, max_new_tokens=max_new_tokens,
                               temperature=temperature, eos=eos, pad=pad, graph=ids.is_cuda)
    with weight_first_linears(model):
        return sample(model, ids, attn, cache, max_new_tokens=max_new_tokens, temperature=temperature,
                      eos=eos, pad=pad)


def prefill(model, ids, attn, group_size, max_len):
    """Run the prompts through the model once, into a preallocated key/value cache of max_len
    positions, and repeat each prompt's cache for the G completions of its group.

    The last prompt token stays out of the cache: sample() feeds it to get the first logits.
    A StaticCache is allocated once; transformers' default cache grows by concatenation,
    copying every layer's keys and values at every new token."""
    from transformers import StaticCache
    cache = StaticCache(config=model.config, max_cache_len=max_len)
    ids, attn = ids[:, :-1], attn[:, :-1]
    model(input_ids=ids, attention_mask=attn, position_ids=(attn.cumsum(1) - 1).clamp(min=0),
          cache=cache, use_cache=True, logits_to_keep=1)
    if group_size > 1:
        keep_rows(cache, torch.arange(ids.shape[0], device=ids.device).repeat_interleave(group_size))
    return cache


def keep_rows(cache, rows):
    """Index every layer's preallocated keys and values by batch row (repeat or drop rows)."""
    for layer in cache.layers:
        layer.keys, layer.values = layer.keys[rows], layer.values[rows]
        layer.batch_size = len(rows)


@torch.no_grad()
def sample(model, ids, attn, cache, max_new_tokens, temperature, eos, pad):
    """The decoding loop, written out: feed the newest token, draw the next one from
    softmax(logits / T) (the argmax when temperature is None), stop a row at its first EOS and
    pad it after. Nothing else touches the logits: no top-k, top-p or repetition penalty.

    Once a quarter of the rows still in the batch have stopped, they are dropped from the
    model's batch and its cache (``active`` lists the rows the model still computes)."""
    rows, width = ids.shape
    eos = torch.tensor(eos, device=ids.device)
    out = torch.full((rows, max_new_tokens), pad, dtype=ids.dtype, device=ids.device)   # [B, C]
    attn = torch.cat([attn, attn.new_ones(rows, max_new_tokens)], 1)
    position = attn[:, :width].sum(1) - 1                 # position of the last prompt token (left padding)
    unfinished = torch.ones(rows, dtype=torch.bool, device=ids.device)
    active = torch.arange(rows, device=ids.device)
    token = ids[:, -1]
    for t in range(max_new_tokens):
        logits = model(input_ids=token[active, None], attention_mask=attn[active, :width + t],
                       position_ids=position[active, None], cache=cache, use_cache=True).logits[:, -1]
        token = torch.full_like(token, pad)
        token[active] = pick(logits, temperature)
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


@torch.no_grad()
def sample_in_place(model, ids, attn, cache, max_new_tokens, temperature, eos, pad, graph=False):
    """sample(), with every tensor the model reads kept at one shape and address and updated in
    place, so that a decoding step can be recorded once as a CUDA graph and replayed per token
    (``graph=True``): one launch where eager decoding pays one per kernel, ~500 a token for
    SmolLM2, which is what bounds a small model's decoding on a GPU. The price: no row leaves the
    batch (that would change the shapes); finished rows compute on and their tokens become pad."""
    rows, width = ids.shape
    eos = torch.tensor(eos, device=ids.device)
    out = torch.full((rows, max_new_tokens), pad, dtype=ids.dtype, device=ids.device)   # [B, C]
    token = ids[:, -1:].clone()                           # [B, 1] the newest token
    position = attn.sum(1, keepdim=True) - 1              # [B, 1] its position (left padding)
    # [B, 1, 1, L], True where the new token may attend. transformers takes a 4D mask as it is (so
    # nothing in the step depends on the values of its inputs); the prompt's padding stays closed
    # and the cache slot of each new token opens as that token is fed.
    visible = torch.zeros(rows, 1, 1, width + max_new_tokens, dtype=torch.bool, device=ids.device)
    visible[:, 0, 0, :width] = attn.bool()
    unfinished = torch.ones(rows, dtype=torch.bool, device=ids.device)

    def step():
        return model(input_ids=token, attention_mask=visible, position_ids=position, cache=cache,
                     use_cache=True).logits[:, -1]
    step = cuda_graph(step) if graph else step
    for t in range(max_new_tokens):
        visible[:, 0, 0, width - 1 + t] = True
        logits = step()
        new = torch.where(unfinished, pick(logits, temperature), pad)
        out[:, t] = new
        unfinished &= ~torch.isin(new, eos)
        if not unfinished.any():
            break
        token.copy_(new[:, None])
        position += 1
    return out


def cuda_graph(fn, warmup=2):
    """fn, the same computation launched as one CUDA graph: fn() itself on the first ``warmup``
    calls (on a side stream, as CUDA asks before recording), then recorded once and replayed.

    A graph replays fixed addresses: fn must read tensors that are updated in place, and each
    replay overwrites the tensor it returned. Autocast's cache of cast weights is off inside, so
    that a recorded cast is recorded, and runs again at every replay."""
    graph, output, calls = None, None, 0
    autocast = dict(device_type="cuda", enabled=torch.is_autocast_enabled("cuda"),
                    dtype=torch.get_autocast_dtype("cuda"), cache_enabled=False)

    def replay():
        nonlocal graph, output, calls
        calls += 1
        with torch.autocast(**autocast):
            if calls <= warmup:
                side = torch.cuda.Stream()
                side.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(side):
                    result = fn()
                torch.cuda.current_stream().wait_stream(side)
                return result
            if graph is None:
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph):   # records the kernels, runs none of them
                    output = fn()
        graph.replay()
        return output
    return replay


def pick(logits, temperature):
    """The next token of each row: drawn from softmax(logits / T), or the argmax for T = None."""
    if temperature is None:
        return logits.argmax(-1)
    return draw(torch.softmax(logits.float() / temperature, -1))


def draw(probs):
    """One token per row of probs: the first one whose cumulative probability exceeds
    u ~ U(0, total), i.e. inverse-CDF sampling.

    One random number per row, where torch.multinomial (what generate() calls) draws one
    exponential number per vocabulary entry. torch accumulates the float32 cumulative sum in
    float64, so each boundary is within 6e-8 of the exact one."""
    cdf = probs.cumsum(-1)
    u = torch.rand(len(probs), 1, device=probs.device) * cdf[:, -1:]
    return torch.searchsorted(cdf, u, right=True).squeeze(1).clamp_(max=probs.shape[-1] - 1)


@contextlib.contextmanager
def weight_first_linears(model):
    """Inside, every plain nn.Linear whose weight is on the CPU computes x @ W.T as (W @ x.T).T:
    the same product, in the operand order MKL multiplies fastest when x has a few rows, as in
    decoding (one new token per row). cuBLAS has no such preference, so GPU layers are left
    alone, and so is the update (at its hundreds of rows F.linear is as fast or faster)."""
    # Plain nn.Linear only (subclasses may pack W), and none whose forward something else
    # (accelerate's offloading hooks) already replaced.
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
    y = y if linear.bias is None else y + linear.bias.to(y.dtype)      # bf16 under autocast, as F.linear
    return y.view(*x.shape[:-1], -1)
