"""GRPO and three token-regulated variants, side by side.

Every loss has the same signature and returns ``(loss, info)``:

    loss, info = LOSSES[name](logp, old_logp, ref_logp, advantages, mask, entropy=None, *,
                              clip_eps=0.2, beta=0.04, agg=<default>, max_tokens=None, **params)

Shapes: ``logp, old_logp, ref_logp, mask, entropy`` are ``[B, C]`` (B = prompts x group
size, C = completion positions); ``advantages`` is ``[B]``. ``mask`` is a 0/1 float tensor:
1 on completion tokens up to and including the first EOS, 0 on padding (built from
positions, never from token ids: on Qwen the pad token is also an EOS token). ``logp``
carries the gradient; everything else is treated as a constant.

The specification (equations, defaults, which parts are our reconstruction of papers whose
exact equations we could not read) is docs/METHODS.md; the README repeats it for learners.
Reading order: the shared pieces (advantages, surrogate, KL, aggregation), then
``grpo_loss`` and the three variants, each a few lines away from it.

Run ``python losses.py`` for a side-by-side demo on a toy batch, ``--bench`` for timings.
"""
import argparse
import time

import torch

AGGREGATIONS = ("seq-mean-token-mean", "token-mean", "seq-mean-token-sum-norm")


# ----------------------------------------------------------------------------------------
# Shared pieces: written once, used by all four losses.

def group_advantages(rewards, group_size, scale_std=True):
    """A_i = (r_i - mean_group(r)) / (std_group(r) + 1e-4), rows grouped consecutively.

    Rows are ``[g0 g0 g0 g1 g1 g1 ...]``: the ``group_size`` completions of one prompt are
    adjacent. ``std`` is the sample std (N-1), as in the GRPO paper. A group whose rewards
    are all equal carries no learning signal and gets exactly 0 (not 0/0 = NaN, and not a
    rounding residue divided by 1e-4). ``scale_std=False`` is Dr. GRPO (no std division).
    """
    # BEGIN SOLUTION group_advantages
    if group_size < 2:
        raise ValueError(f"group_size must be >= 2 (advantages are relative to the group), got {group_size}")
    if rewards.dim() != 1 or rewards.numel() % group_size != 0:
        raise ValueError(f"rewards must be a 1-D tensor whose length is a multiple of group_size="
                         f"{group_size}; got shape {tuple(rewards.shape)}")
    r = rewards.view(-1, group_size)
    adv = r - r.mean(dim=1, keepdim=True)
    if scale_std:
        adv = adv / (r.std(dim=1, keepdim=True) + 1e-4)
    all_equal = (r == r[:, :1]).all(dim=1, keepdim=True)
    return torch.where(all_equal, torch.zeros_like(adv), adv).view(-1)
    # END SOLUTION


def aggregate(x, mask, agg, max_tokens=None):
    """Reduce a per-token quantity ``x[B, C]`` to a scalar over valid tokens.

    seq-mean-token-mean (GRPO paper): each sequence counts equally; a token of a long
        answer counts less than a token of a short one (length bias).
    token-mean (DAPO): each token counts equally, whichever sequence it is in.
    seq-mean-token-sum-norm (Dr. GRPO): sum over tokens / (B * max_tokens); a constant
        denominator, so no length bias at all.
    A row without valid tokens adds 0 and still counts in B (no 0/0). ``x`` must be finite
    at padded positions (the losses guarantee it: see ``_log_ratio``).
    """
    # BEGIN SOLUTION aggregation
    x = x * mask
    if agg == "seq-mean-token-mean":
        return (x.sum(-1) / mask.sum(-1).clamp(min=1)).mean()
    if agg == "token-mean":
        return x.sum() / mask.sum().clamp(min=1)
    if agg == "seq-mean-token-sum-norm":
        return x.sum() / (x.shape[0] * (max_tokens or x.shape[1]))
    raise ValueError(f"unknown aggregation {agg!r}; choose one of {AGGREGATIONS}")
    # END SOLUTION


def microbatch_scale(agg, mb_mask, batch_mask):
    """Factor that makes micro-batch losses add up to the full-batch loss.

    A training loop that splits a batch into micro-batches and accumulates gradients must
    multiply each micro-batch's loss by this: rows/B for the two sequence-mean modes (with
    ``max_tokens`` fixed for sum-norm), tokens/total tokens for token-mean. Without it the
    gradient changes with the micro-batch size.
    """
    # BEGIN SOLUTION aggregation
    if agg == "token-mean":
        return (mb_mask > 0).sum().item() / max((batch_mask > 0).sum().item(), 1)
    if agg in AGGREGATIONS:
        return mb_mask.shape[0] / batch_mask.shape[0]
    raise ValueError(f"unknown aggregation {agg!r}; choose one of {AGGREGATIONS}")
    # END SOLUTION


def clipped_surrogate(ratio, adv, clip_eps):
    """PPO's min(ratio*A, clip(ratio)*A): the per-token policy-gradient objective.

    Returns the objective and where the clip is active (the min picked the clipped,
    gradient-free branch), for the ``clip_frac`` diagnostic. That happens on one side only
    for each sign of A: ratio > 1 + eps with A > 0 (the high side: the token was already
    pushed up enough), ratio < 1 - eps with A < 0 (the low side: pushed down enough). With
    A = 0, or a ratio inside [1 - eps, 1 + eps] (on policy it is exactly 1), it never acts.
    """
    # BEGIN SOLUTION grpo_loss
    unclipped = ratio * adv
    clipped = ratio.clamp(1 - clip_eps, 1 + clip_eps) * adv
    return torch.minimum(unclipped, clipped), clipped < unclipped
    # END SOLUTION


def k3(logp, ref_logp):
    """k3(a, b) = exp(b - a) - (b - a) - 1 >= 0: Schulman's unbiased KL(pi || ref) estimator."""
    # BEGIN SOLUTION grpo_loss
    d = ref_logp - logp
    return torch.exp(d) - d - 1
    # END SOLUTION


def _log_ratio(logp, old_logp, mask):
    # log(pi / pi_old), zeroed at padding *before* exp(): padded positions may hold any
    # finite garbage, and an exp() overflow there would turn into NaN in the backward pass
    # (0 * inf), even if the aggregation masks the value out afterwards.
    return (logp - old_logp) * mask


def _kl_term(logp, ref_logp, mask, beta):
    """Per-token k3 against the reference; zeros when there is none (beta == 0 needs none)."""
    if ref_logp is None:
        if beta != 0:
            raise ValueError("beta > 0 needs ref_logp (log-probs under the frozen reference model)")
        return torch.zeros_like(logp)
    return k3(logp * mask, ref_logp * mask)          # zeroed at padding, for the same reason


def _info(mask, weights, ratio, clipped, kl, clip_ratio=None, **extra):
    """Detached diagnostics, identical in every loss so the plots can compare them.

    Means over valid tokens: ``clip_frac`` (the clip acts, see ``clipped_surrogate``), split
    into ``clip_low_frac`` (clipped ratio < 1 - eps, A < 0) and ``clip_high_frac`` (> 1 + eps,
    A > 0); ``clip_ratio`` is what was clipped when that is not the ratio itself (TR-GRPO's
    ``inside_clip``: w * ratio); ``abs_log_ratio``, |log ratio|, how far the policy has moved
    from the one that sampled (0 on policy; for TEPO the sequence ratio's |log s_i|); ``kl``
    (k3 against the reference, whatever beta) and ``ratio_mean``.
    """
    mean = lambda t: (t.detach() * mask).sum() / mask.sum().clamp(min=1)
    side = ratio if clip_ratio is None else clip_ratio
    return {"weights": weights.detach(), "clip_frac": mean(clipped),
            "clip_low_frac": mean(clipped & (side < 1)), "clip_high_frac": mean(clipped & (side > 1)),
            "abs_log_ratio": mean(ratio.detach().log().abs()),
            "kl": mean(kl), "ratio_mean": mean(ratio), **{k: v.detach() for k, v in extra.items()}}


# ----------------------------------------------------------------------------------------
# The four losses.

def grpo_loss(logp, old_logp, ref_logp, advantages, mask, entropy=None, *,
              clip_eps=0.2, beta=0.04, agg="seq-mean-token-mean", max_tokens=None):
    """GRPO (Shao et al. 2024, DeepSeekMath):

        J = agg_t[ min(r_t A_i, clip(r_t, 1-eps, 1+eps) A_i) - beta * k3(pi_theta, pi_ref) ],
        r_t = pi_theta(o_t|q,o_<t) / pi_old(o_t|q,o_<t)

    Intuition: push up every token of an answer that beat its group, down every token of
    one that lost, by the same advantage, trusting the update only near the old policy.
    """
    # BEGIN SOLUTION grpo_loss
    ratio = torch.exp(_log_ratio(logp, old_logp, mask))
    surrogate, clipped = clipped_surrogate(ratio, advantages[:, None], clip_eps)
    kl = _kl_term(logp, ref_logp, mask, beta)
    loss = -aggregate(surrogate - beta * kl, mask, agg, max_tokens)
    return loss, _info(mask, torch.ones_like(logp), ratio, clipped, kl)
    # END SOLUTION


def tr_grpo_weights(logp, alpha=2.0, tau=1 / 9, mu=0.25, w_min=1.0, w_max=1.4):
    """TR-GRPO's shaping weight w(p) = clamp(alpha * (sigmoid(p / tau) - mu), w_min, w_max).

    Monotone non-decreasing in the token's probability p: 1.0 for p <~ 0.12, ~1.22 at
    p = 0.2, 1.4 for p >~ 0.33 with the defaults. [reconstruction: tau read as 1/9]
    """
    # BEGIN SOLUTION tr_grpo_weights
    p = torch.exp(logp.detach())
    return (alpha * (torch.sigmoid(p / tau) - mu)).clamp(w_min, w_max)
    # END SOLUTION


def tr_grpo_loss(logp, old_logp, ref_logp, advantages, mask, entropy=None, *,
                 clip_eps=0.2, beta=0.04, agg="seq-mean-token-mean", max_tokens=None,
                 alpha=2.0, tau=1 / 9, mu=0.25, w_min=1.0, w_max=1.4,
                 mean_one=False, inside_clip=False):      # a control, another reading: off
    """TR-GRPO (Le et al., arXiv 2511.00066): GRPO with each token weighted by its probability.

        J = agg_t[ w(p_t) * min(r_t A_i, clip(r_t) A_i) - beta * k3 ],
        w(p) = clamp(alpha * (sigmoid(p / tau) - mu), L, U),  p_t = pi_theta(o_t).detach()

    Intuition: d log p / d logit scales with (1 - p), so rare tokens get the largest
    gradients; weighting confident tokens up evens that out and smooths the update.
    [reconstruction] the sigmoid-clip family, its constants, tau = 1/9, w detached and
    applied to the whole clipped surrogate (not to the KL term).
    Two options, both off by default (docs/METHODS.md):
    ``mean_one=True`` (a control): w <- w / mean_row(w) over each row's valid tokens, so every
    sequence's weights average 1, as GRPO's do, and only which tokens of a sequence count differs.
    ``inside_clip=True`` (another reading of the paper): w multiplies the ratio inside the clip,
    J = agg_t[ min(w r A, clip(w r, 1-eps, 1+eps) A) - beta * k3(w pi_ref / pi) ]; on policy a
    token of a positive-advantage answer with w > 1 + eps is clipped and gets no gradient.
    """
    ratio = torch.exp(_log_ratio(logp, old_logp, mask))
    w = tr_grpo_weights(logp, alpha, tau, mu, w_min, w_max)                  # <- new
    if mean_one:                                                            # <- new (a control)
        w = w * mask.sum(-1, keepdim=True).clamp(min=1) / (w * mask).sum(-1, keepdim=True).clamp(min=1e-12)
    kl = _kl_term(logp, ref_logp, mask, beta)
    if inside_clip:                                                         # <- new (another reading)
        surrogate, clipped = clipped_surrogate(w * ratio, advantages[:, None], clip_eps)
        kl_w = _kl_term(logp, None if ref_logp is None else ref_logp + w.log(), mask, beta)
        loss = -aggregate(surrogate - beta * kl_w, mask, agg, max_tokens)
        return loss, _info(mask, w, ratio, clipped, kl, clip_ratio=w * ratio)
    surrogate, clipped = clipped_surrogate(ratio, advantages[:, None], clip_eps)
    loss = -aggregate(w * surrogate - beta * kl, mask, agg, max_tokens)     # <- w *
    return loss, _info(mask, w, ratio, clipped, kl)


def cw_grpo_weights(logp, advantages, mask, group_size=None, *, scope="group", normalise="valid"):
    """CW-GRPO's Gaussian-kernel weights on the covariance term, per group, as its authors compute them.

        lc_t = (l_t - mean_t l_i) m_t       l = logp, centred on its own sequence's valid tokens
        Ac_i = A_i - mean_group(A)          a plain mean over the group's rows
        c_t  = lc_t * Ac_i,   sigma = std(c) over the group's valid tokens (ddof 0) + 1e-8
        w_t  = exp(-c_t^2 / (2 sigma^2)) m_t,   then w <- w * Z / sum(w)

    Groups are ``group_size`` consecutive rows (None: all rows are one group). Z is ours by
    default, the group's valid tokens (``normalise="valid"``: mean weight 1 over real tokens);
    ``"padded"`` is theirs, rows x the group's longest completion (what their padding gives).
    ``scope="batch"`` is our other reading (Cui et al.'s covariance code): l and A centred
    over every valid token of the call, A_i counted once per token, sigma over them all.
    Differentiable in ``logp``: pass ``logp.detach()`` for fixed weights. Padding may hold any
    finite values and weighs 0; with no spread (c = 0, e.g. equal advantages) every exp() is
    exactly 1. A group's weights depend on its rows alone, not on columns past its longest
    completion: micro-batches of whole groups can compute them.
    """
    # BEGIN SOLUTION cw_grpo_weights
    if scope not in ("group", "batch"):
        raise ValueError(f"scope must be 'group' or 'batch', got {scope!r}")
    if normalise not in ("valid", "padded"):
        raise ValueError(f"normalise must be 'valid' or 'padded', got {normalise!r}")
    B, C = logp.shape
    G = B if group_size is None or scope == "batch" else group_size
    if G < 1 or B % G:
        raise ValueError(f"group_size={group_size} must divide the {B} rows into whole groups")
    m = mask.to(logp.dtype).reshape(-1, G, C)                       # [groups, G, C]
    l = logp.reshape(-1, G, C) * m                                   # padding's values never enter
    a = advantages.to(logp.dtype).reshape(-1, G, 1)
    n = m.sum(-1, keepdim=True)                                      # valid tokens per row
    N = n.sum(1, keepdim=True).clamp(min=1)                          # ... per group
    if scope == "group":
        lc = (l - l.sum(-1, keepdim=True) / n.clamp(min=1)) * m
        ac = a - a.mean(1, keepdim=True)
    else:
        lc = (l - l.sum((1, 2), keepdim=True) / N) * m
        ac = a - (a * n).sum(1, keepdim=True) / N
    c = lc * ac
    var = ((c - c.sum((1, 2), keepdim=True) / N).square() * m).sum((1, 2), keepdim=True) / N
    # sqrt's gradient at 0 is infinite: clamped at the smallest float, a group without spread
    # gets a zero gradient through sigma instead of 0 * inf = NaN, and no value changes.
    sigma = var.clamp(min=torch.finfo(var.dtype).tiny).sqrt() + 1e-8
    w = torch.exp(-c.square() / (2 * sigma.square())) * m
    Z = N if normalise == "valid" else G * n.amax(1, keepdim=True)
    return (w * Z / w.sum((1, 2), keepdim=True).clamp(min=torch.finfo(w.dtype).tiny)).reshape(B, C)
    # END SOLUTION


def cw_grpo_loss(logp, old_logp, ref_logp, advantages, mask, entropy=None, *,
                 clip_eps=0.2, beta=0.04, agg="seq-mean-token-mean", max_tokens=None,
                 group_size=None, scope="group", normalise="valid", detach=True, weights=None):
    """CW-GRPO (Wang et al., ACL 2026, arXiv 2605.11538): GRPO with covariance-kernel weights.

        J = agg_t[ min(r_t w_t A_i, clip(r_t) w_t A_i) - beta * k3 ],  w_t = cw_grpo_weights, per group

    Intuition: entropy moves with the covariance of log-prob and advantage (Cui et al.
    2025); the tokens where that covariance is extreme drive collapse or explosion, and a
    Gaussian kernel with a bandwidth estimated from the group smoothly down-weights them.
    Because w_t >= 0, min(r w A, clip(r) w A) = w * min(r A, clip(r) A).
    Ours: w detached (``detach=False``: computed from the live ``logp``, the gradient flowing
    through it, as in the authors' code) and mean 1 over valid tokens (``normalise="padded"``:
    theirs). With both of theirs, on policy, this is their loss and gradient (they have no clip).
    Pass ``weights=`` (computed on whole groups) when called on rows that split a group.
    """
    if weights is not None and not detach:
        raise ValueError("detach=False computes the weights from the live logp: pass no weights=")
    ratio = torch.exp(_log_ratio(logp, old_logp, mask))
    surrogate, clipped = clipped_surrogate(ratio, advantages[:, None], clip_eps)
    if weights is None:                                                                        # <- new
        weights = cw_grpo_weights(logp.detach() if detach else logp, advantages, mask, group_size,
                                  scope=scope, normalise=normalise)
    kl = _kl_term(logp, ref_logp, mask, beta)
    loss = -aggregate(weights * surrogate - beta * kl, mask, agg, max_tokens)                # <- w *
    return loss, _info(mask, weights, ratio, clipped, kl)


def tepo_sequence_ratio(logp, old_logp, mask):
    """TEPO's likelihood ratio ``[B, C]``: one value per sequence, a gradient per token.

        log s_i = sum_t (logp_t - old_logp_t) m_t / sum_t m_t   (geometric mean of the token ratios)
        s_i,t   = exp(sg[log s_i] + logp_t - sg[logp_t])         (sg = stop-gradient, ``.detach()``)

    The value at every position of row i, padding included, is s_i; the gradient of s_i,t
    with respect to logp_t is s_i, and nothing flows to the row's other tokens (the
    GSPO-token form). So every token of a sequence is pushed with the same ratio, the one of
    the whole sequence. Padded positions may hold any finite garbage (they are zeroed before
    ``exp``, see ``_log_ratio``); a row without valid tokens has s = 1.
    """
    # BEGIN SOLUTION tepo
    log_s = _log_ratio(logp, old_logp, mask).sum(-1) / mask.sum(-1).clamp(min=1)
    return torch.exp(log_s.detach()[:, None] + logp - logp.detach())
    # END SOLUTION


def tepo_kl_mask(logp, entropy, advantages, mask):
    """TEPO's KL mask ``[B, C]``: 1.0 on the tokens whose reinforcement would lower entropy.

        M_i,t = (A_i > 0) and (logp_t + H_t > 0) and (m_t = 1),  else 0.0   (both ">" strict)

    Raising token t's logit changes the entropy H_t of its distribution by
    -p_t (log p_t + H_t): it lowers the entropy exactly when log p_t + H_t > 0, and a positive
    advantage is what raises it. A float tensor in ``logp``'s dtype, with no gradient.
    """
    # BEGIN SOLUTION tepo
    return (logp.detach() + entropy).gt_(0).mul_(mask * (advantages > 0)[:, None])
    # END SOLUTION


def tepo_loss(logp, old_logp, ref_logp, advantages, mask, entropy=None, *,
              clip_eps=0.2, beta=0.04, agg="token-mean", max_tokens=None,
              full_kl_beta=0.0, token_ratio=False):          # a control, an ablation: off
    """TEPO (Lin et al., arXiv 2510.09369 / 2604.12736, ACL 2026): sequence ratio + KL mask.

        log s_i = sum_t (logp - old_logp) m_t / sum_t m_t        (geometric-mean sequence ratio)
        s_i,t   = exp(sg[log s_i] + logp_t - sg[logp_t])          (value s_i, gradient per token)
        M_i,t   = (A_i > 0) and (logp_t + H_t > 0)                (reinforcing o_t lowers entropy)
        J = token-mean[ min(s A_i, clip(s) A_i) - beta * M * k3 ]

    Intuition: every token of a sequence shares one likelihood ratio, so the group reward
    reaches each token through the sequence's likelihood; the KL leash is put only on the
    tokens whose reinforcement would collapse entropy, leaving the rest free.
    [reconstruction] the GSPO-token form of the sequence ratio; the entropy test
    log pi(o_t) + H_t > 0; the mask's KL anchored to the reference model.
    ``full_kl_beta > 0`` (a control, docs/METHODS.md) adds GRPO's KL on every token beneath the
    masked one: J = token-mean[ min(s A, clip(s) A) - full_kl_beta * k3 - beta * M * k3 ], so a
    masked token pays both, and TEPO keeps the leash GRPO has everywhere.
    ``token_ratio=True`` (an ablation): GRPO's per-token ratio r_t instead of s_i, the KL mask
    kept, to tell which of TEPO's two parts moves its entropy.
    """
    if entropy is None:
        raise ValueError("tepo_loss needs entropy [B, C] (full-vocabulary entropy of the policy)")
    ratio = tepo_sequence_ratio(logp, old_logp, mask)                                 # <- new
    if token_ratio:                                                                   # <- new (an ablation)
        ratio = torch.exp(_log_ratio(logp, old_logp, mask))
    surrogate, clipped = clipped_surrogate(ratio, advantages[:, None], clip_eps)
    kl_mask = tepo_kl_mask(logp, entropy, advantages, mask)                           # <- new
    kl = _kl_term(logp, ref_logp, mask, beta + full_kl_beta)
    loss = -aggregate(surrogate - (beta * kl_mask + full_kl_beta) * kl, mask, agg, max_tokens)   # <- M *
    return loss, _info(mask, torch.ones_like(logp), ratio, clipped, kl, kl_mask=kl_mask)


LOSSES = {"grpo": grpo_loss, "tr_grpo": tr_grpo_loss, "cw_grpo": cw_grpo_loss, "tepo": tepo_loss}


# ----------------------------------------------------------------------------------------
# From logits to the per-token quantities the losses need (used by train.py).

def token_logprobs_plain(logits, tokens, temperature=1.0):
    """token_logprobs with no speed device: autograd's own log_softmax, gather and entropy.

        log p_t = log_softmax(logits_t / T)[tokens_t],   H_t = -sum_v p_t,v log p_t,v

    The same numbers, dtypes and gradient as ``token_logprobs`` (tests/test_losses.py checks
    it), computed the obvious way: ``train.py --plain`` scores with it. It holds the whole
    float32 log-softmax of the logits, which autograd keeps for the backward pass.
    """
    # BEGIN SOLUTION token_logprobs
    x = logits.to(torch.promote_types(logits.dtype, torch.float32)) / temperature
    log_probs = torch.log_softmax(x, dim=-1)                              # [..., V]
    logp = log_probs.gather(-1, tokens[..., None]).squeeze(-1)
    with torch.no_grad():                                                 # the entropy has no gradient
        entropy = -(log_probs.exp() * log_probs).sum(-1)
    return logp, entropy
    # END SOLUTION


def token_logprobs(logits, tokens, temperature=1.0):
    """(log-prob of each token, full-distribution entropy) under softmax(logits / temperature).

    ``logits[b, t]`` must already be the prediction for ``tokens[b, t]`` (shifted by the
    caller). The temperature is the sampling temperature: scoring without it gives a ratio
    != 1 on-policy. The entropy is that of the whole next-token distribution, not -log p of
    the sampled token (a common shortcut that measures surprise, not spread), and carries no
    gradient. Both are float32 for bf16, fp16 or fp32 logits (float64 for float64 ones),
    computed in row chunks so that no float32 temporary exceeds CHUNK_ELEMENTS (a full
    [B, C, V] log_softmax over Qwen's 151,936 words would be 1.2 GB for 4 x 512 tokens);
    under autograd the softmax kept for the backward pass is one float32 copy of the logits.
    The gradient is _TokenLogprobs'; token_logprobs_plain is the same without that device.
    """
    # BEGIN SOLUTION token_logprobs
    flat = logits.reshape(-1, logits.shape[-1])
    logp, entropy = _TokenLogprobs.apply(flat, tokens.reshape(-1), temperature)
    return logp.view(tokens.shape), entropy.view(tokens.shape)
    # END SOLUTION


# The speed device behind token_logprobs (docs/performance.md); on a first read, skip it.

CHUNK_ELEMENTS = 2 ** 26      # float32 temporaries of at most 256 MB at a time


def _row_chunks(logits):
    """Rows per chunk so that one chunk of [N, V] logits has at most CHUNK_ELEMENTS entries."""
    return max(1, CHUNK_ELEMENTS // logits.shape[-1])


class _TokenLogprobs(torch.autograd.Function):
    """log p(token) = x[token] - logsumexp(x) and H = logsumexp(x) - sum softmax(x) * x, with
    x = logits / T, on flat [N, V] logits; the gradient written out: d log p(token) / dx =
    onehot(token) - softmax(x).

    Speed device: autograd's own backward through gather and logsumexp builds three [N, V]
    temporaries and recomputes the softmax; this one keeps the softmax the entropy needed
    anyway and turns it into the gradient with one multiply and one scatter (what that saves:
    docs/performance.md). On a first read, skip it: ``token_logprobs_plain`` below computes
    the same numbers and gradient the obvious way."""

    @staticmethod
    def forward(ctx, logits, tokens, temperature):
        # BEGIN SOLUTION token_logprobs
        dtype = torch.promote_types(logits.dtype, torch.float32)      # bf16 logits are scored in float32
        logp = torch.empty(logits.shape[0], dtype=dtype, device=logits.device)
        entropy = torch.empty_like(logp)
        keep = ctx.needs_input_grad[0]                   # the softmax is kept only for a backward pass
        probs = torch.empty(logits.shape, dtype=dtype, device=logits.device) if keep else None
        step = _row_chunks(logits)
        for i in range(0, logits.shape[0], step):
            rows = slice(i, i + step)
            x = logits[rows].to(dtype)
            if temperature != 1.0:
                x = x / temperature
            shifted = x - x.amax(-1, keepdim=True)                           # <= 0
            p = torch.exp(shifted, out=probs[rows] if keep else None)
            total = p.sum(-1, keepdim=True)
            p /= total                                                        # softmax(x)
            log_total = total.log().squeeze(-1)                               # logsumexp(x) - max(x)
            logp[rows] = shifted.gather(-1, tokens[rows, None]).squeeze(-1) - log_total
            # H = logsumexp(x) - sum p x, both taken relative to max(x): with logits of +-35 the
            # unshifted difference cancels to an error of 1e-3 nats in float32, this one to 1e-6.
            entropy[rows] = log_total - shifted.mul_(p).sum(-1)
        ctx.mark_non_differentiable(entropy)
        if keep:
            ctx.save_for_backward(probs, tokens)
            ctx.temperature, ctx.dtype = temperature, logits.dtype
        return logp, entropy
        # END SOLUTION

    @staticmethod
    def backward(ctx, grad_logp, grad_entropy):
        # BEGIN SOLUTION token_logprobs
        probs, tokens = ctx.saved_tensors
        grad = probs * -grad_logp[:, None]                               # - softmax(x) * g
        grad.scatter_add_(-1, tokens[:, None], grad_logp[:, None])       # + onehot(token) * g
        if ctx.temperature != 1.0:
            grad /= ctx.temperature                                      # dx / dlogits = 1 / T
        return grad.to(ctx.dtype), None, None
        # END SOLUTION


# ----------------------------------------------------------------------------------------
# python losses.py          -> what each loss does to the same toy batch
# python losses.py --bench  -> forward+backward time of each loss, relative to GRPO

def _demo():
    torch.set_printoptions(precision=2)
    # One prompt, a group of 4 completions of 5 tokens; the last row stopped after 3 tokens.
    p = torch.tensor([[0.90, 0.60, 0.30, 0.05, 0.95],
                      [0.99, 0.15, 0.70, 0.40, 0.80],
                      [0.50, 0.02, 0.85, 0.20, 0.60],
                      [0.97, 0.10, 0.45, 0.50, 0.50]])
    entropy = torch.tensor([[0.4, 1.2, 1.9, 2.8, 0.2],
                            [0.1, 2.2, 0.9, 1.5, 0.7],
                            [1.3, 3.5, 0.6, 2.0, 1.1],
                            [0.2, 2.4, 1.4, 1.2, 0.0]])
    mask = torch.tensor([[1., 1, 1, 1, 1], [1, 1, 1, 1, 1], [1, 1, 1, 1, 1], [1, 1, 1, 0, 0]])
    rewards = torch.tensor([1.0, 1.0, 0.0, 0.0])
    adv = group_advantages(rewards, group_size=4)
    logp = p.log().requires_grad_()
    old_logp, ref_logp = logp.detach(), logp.detach() - 0.1       # on-policy; ref a bit less sure
    print("Toy batch: 1 prompt x 4 completions, 5 tokens each (row 3 ended after 3 tokens).")
    print(f"rewards {rewards.tolist()} -> group advantages {[round(a, 3) for a in adv.tolist()]}")
    print("token probabilities p (rows = completions):")
    for i in range(4):
        print(f"  row {i}  A={adv[i]:+.2f}  " + "  ".join(
            f"{v:.2f}" if m else "  . " for v, m in zip(p[i].tolist(), mask[i].tolist())))
    print("\nOn policy the ratio is exactly 1, so loss = -aggregate(w * A) + beta * KL for GRPO,"
          " TR-GRPO and CW-GRPO\n(w = their weights, 1 for GRPO) and -aggregate(A) + beta * M * KL"
          " for TEPO; the gradient is what differs.")
    for name, fn in LOSSES.items():
        logp.grad = None
        loss, info = fn(logp, old_logp, ref_logp, adv, mask, entropy)
        loss.backward()
        shown = info["kl_mask"] if name == "tepo" else info["weights"]
        label = "KL mask M (A>0 and log p + H > 0)" if name == "tepo" else "per-token weight w"
        print(f"\n{name:8s} loss = {loss.item():+.4f}   |grad| = {logp.grad.norm():.4f}   {label}:")
        for i in range(4):
            print("  row %d  " % i + "  ".join(
                f"{v:.2f}" if m else "  . " for v, m in zip(shown[i].tolist(), mask[i].tolist())))


def _bench(B=128, C=512, repeats=20, rounds=7):
    torch.manual_seed(0)
    logp = (torch.rand(B, C) * 4 - 4).log_softmax(-1).clamp(min=-20)
    old_logp = logp + 0.05 * torch.randn(B, C)
    ref_logp = logp + 0.05 * torch.randn(B, C)
    entropy = torch.rand(B, C) * 3
    adv = group_advantages(torch.randint(0, 2, (B,)).float(), group_size=8)
    lengths = torch.randint(C // 4, C + 1, (B,))
    mask = (torch.arange(C)[None] < lengths[:, None]).float()
    xs = {name: logp.clone().requires_grad_() for name in LOSSES}
    times = {name: float("inf") for name in LOSSES}
    for _ in range(rounds):               # interleaved rounds, best of each: robust to noise
        for name, fn in LOSSES.items():
            start = time.perf_counter()
            for _ in range(repeats):
                xs[name].grad = None
                loss, _ = fn(xs[name], old_logp, ref_logp, adv, mask, entropy)
                loss.backward()
            times[name] = min(times[name], (time.perf_counter() - start) / repeats)
    print(f"forward+backward, B={B}, C={C}, {torch.get_num_threads()} threads, "
          f"best of {rounds} rounds x {repeats}:")
    for name, t in times.items():
        print(f"  {name:8s} {t * 1e3:7.2f} ms   {t / times['grpo']:.2f}x grpo")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--bench", action="store_true", help="time forward+backward of each loss")
    args = parser.parse_args()
    _bench() if args.bench else _demo()
