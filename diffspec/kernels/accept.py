"""Speculative acceptance for token targets: warp, ratio test, residual draw, in one pass per row.

Two entry points share one Triton kernel (one program per verified position, looping over vocab
blocks; with few positions, a large vocabulary and no top-k/top-p, a vocab-split variant spreads
each position over several programs: ``_accept_split_triton``) and their torch references:

- :func:`rejection_sample` (SJD / MC-SJD): at every position independently, accept a draft
  ``x ~ q`` when ``u_a * q(x) < p(x)``, else draw from ``normalise(max(0, p - q))`` (``p`` where
  that mass is 0) by inverse CDF at ``u_r``. The output is distributed as ``p`` whatever ``q``,
  and equals the draft with probability ``1 - TV(p, q)`` (the maximal-coupling draw of MC-SJD).
- :func:`speculative_accept` (classic speculative decoding, Leviathan et al.): target logits
  ``[B, K+1, V]`` warped (temperature, top-k, top-p) in the kernel, draft probabilities
  ``[B, K, V]`` (or draft logits, ``draft_logits=True``, warped in the kernel the same way), the ratio test at each of the ``K`` drafts, the first-rejection index ``m`` and
  the token at ``m``: the residual draw, or a draw from ``p_{K}`` (the bonus) after ``K`` accepts.

Warping (:func:`warp_reference`): ``x = logits / T``; top-k keeps ``x >= `` the k-th largest
value (ties kept); top-p keeps token ``i`` iff the mass of the tokens strictly more probable than
``i`` is ``< top_p``, then renormalises. The Triton kernel finds both thresholds by bisection on
the float's bit pattern (32 passes over the row for top-k, 30 for top-p; exact thresholds, the
sums in a different order than torch, so a decision can differ only when a mass sits within
rounding of ``top_p``). Inverse-CDF draws (:func:`inverse_cdf`): the first index whose running sum
exceeds ``u * total``.

Example:
    >>> p = torch.tensor([[0.5, 0.5, 0.0]]); q = torch.tensor([[0.0, 0.0, 1.0]])
    >>> acc, tok = rejection_sample(p, q, torch.tensor([2]), torch.tensor([0.3]), torch.tensor([0.9]))
    >>> acc.tolist(), tok.tolist()
    ([False], [1])
"""

from __future__ import annotations

import torch

from .dispatch import use_triton


def _check_warp(temperature: float, top_k: int, top_p: float) -> None:
    if not temperature > 0:
        raise ValueError(f"temperature={temperature!r} is out of range: allowed (0, inf) (greedy is an argmax)")
    if top_k < 0:
        raise ValueError(f"top_k={top_k!r} is out of range: allowed [0, inf] (0 = whole vocabulary)")
    if not 0 < top_p <= 1:
        raise ValueError(f"top_p={top_p!r} is out of range: allowed (0, 1]")


def warp_reference(logits: torch.Tensor, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0) -> torch.Tensor:
    """fp32 probabilities ``(..., V)`` from logits: temperature, top-k (ties kept), top-p (tie-free threshold).

    Example:
        >>> warp_reference(torch.tensor([2.0, 1.0, 0.0]), top_k=2)[2].item()
        0.0
    """
    x = logits.float() / temperature
    if 0 < top_k < x.shape[-1]:
        kth = x.topk(top_k, dim=-1).values[..., -1:]
        x = x.masked_fill(x < kth, float("-inf"))
    probs = x.softmax(-1)
    if top_p < 1.0:
        desc = probs.sort(-1, descending=True).values
        above = torch.cat([torch.zeros_like(desc[..., :1]), desc.cumsum(-1)], -1)  # mass of the first j
        asc = desc.flip(-1).contiguous()
        greater = asc.shape[-1] - torch.searchsorted(asc, probs.contiguous(), right=True)  # count strictly above
        probs = probs.masked_fill(above.gather(-1, greater) >= top_p, 0.0)
        probs = probs / probs.sum(-1, keepdim=True)
    return probs


def inverse_cdf(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Draw of each row of ``probs`` ``(..., V)`` (unnormalised allowed) at uniforms ``u`` ``(...)``.

    Returns the first index whose running sum exceeds ``u * total`` (a zero-probability index is
    never drawn).

    Example:
        >>> inverse_cdf(torch.tensor([[0.0, 2.0, 2.0]]), torch.tensor([0.6])).tolist()
        [2]
    """
    cdf = probs.float().cumsum(-1)
    total = cdf[..., -1:]
    x = torch.minimum(u.unsqueeze(-1) * total, torch.nextafter(total, torch.zeros_like(total)))
    idx = torch.searchsorted(cdf.contiguous(), x.contiguous(), right=True).squeeze(-1)
    return idx.clamp_(max=probs.shape[-1] - 1)


def rejection_sample_reference(p: torch.Tensor, q: torch.Tensor, draft: torch.Tensor, u_accept: torch.Tensor,
                               u_residual: torch.Tensor, accept_mass: tuple[torch.Tensor, torch.Tensor] | None = None,
                               ) -> tuple[torch.Tensor, torch.Tensor]:
    """Torch reference of :func:`rejection_sample`."""
    idx = draft.unsqueeze(-1)
    px, qx = p.gather(-1, idx).squeeze(-1), q.gather(-1, idx).squeeze(-1)
    if accept_mass is not None:
        px, qx = accept_mass
    accepted = u_accept * qx < px
    residual = (p - q).clamp_min_(0)
    mass = residual.sum(-1, keepdim=True)
    residual = torch.where(mass > 0, residual, p)
    return accepted, torch.where(accepted, draft, inverse_cdf(residual, u_residual))


def _check_positions(p: torch.Tensor, q: torch.Tensor, draft: torch.Tensor, *uniforms: torch.Tensor) -> None:
    if p.shape != q.shape or p.shape[:-1] != draft.shape or any(u.shape != draft.shape for u in uniforms):
        raise ValueError(f"rejection_sample: p {tuple(p.shape)} and q {tuple(q.shape)} must be (..., V) with "
                         f"draft and uniforms of shape (...), got draft {tuple(draft.shape)}, uniforms "
                         f"{[tuple(u.shape) for u in uniforms]}")


def rejection_sample(p: torch.Tensor, q: torch.Tensor, draft: torch.Tensor, u_accept: torch.Tensor,
                     u_residual: torch.Tensor, *, accept_mass: tuple[torch.Tensor, torch.Tensor] | None = None,
                     backend: str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Modified rejection sampling of ``draft`` (drawn from ``q``) against ``p`` at every position.

    Args:
        p: ``(..., V)`` fp32 target probabilities.
        q: ``(..., V)`` fp32 law each draft was drawn from.
        draft: ``(...)`` draft tokens.
        u_accept: ``(...)`` uniforms of the ratio test.
        u_residual: ``(...)`` uniforms of the residual draw.
        accept_mass: relaxed rules: ``(p_mass, q_mass)`` ``(...)`` replacing ``(p(x), q(x))`` in the test.
        backend: ``None`` (auto), ``"torch"`` or ``"triton"``.

    Returns:
        ``(accepted (...) bool, tokens (...))``: the draft where accepted, else the residual draw.
    """
    _check_positions(p, q, draft, u_accept, u_residual)
    masses = accept_mass if accept_mass is not None else (None, None)
    if not use_triton([p, q, draft, u_accept, u_residual, *masses], backend):
        return rejection_sample_reference(p, q, draft, u_accept, u_residual, accept_mass)
    from ._accept_triton import accept_rows

    lead, vocab = draft.shape, p.shape[-1]
    acc, tok = accept_rows(p.reshape(-1, vocab), q.reshape(-1, vocab), draft.reshape(-1), u_accept.reshape(-1),
                           u_residual.reshape(-1), q_rows=1, accept_mass=accept_mass)
    return acc.view(lead), tok.view(lead)


def emit(drafts: torch.Tensor, accepted: torch.Tensor, samples: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(m, tokens)``: accepted prefix length ``m`` ``(B,)`` and ``(B, K+1)`` tokens, the drafts with
    ``samples[:, m]`` at index ``m`` (``samples`` ``(B, K+1)``: per-position residual or bonus draws)."""
    m = accepted.long().cumprod(1).sum(1)
    correction = samples.gather(1, m[:, None])
    tokens = torch.cat([drafts, correction], dim=1)
    return m, tokens.scatter(1, m[:, None], correction)


def speculative_accept_reference(target_logits: torch.Tensor, drafts: torch.Tensor, draft_probs: torch.Tensor,
                                 u_accept: torch.Tensor, u_residual: torch.Tensor, temperature: float = 1.0,
                                 top_k: int = 0, top_p: float = 1.0, draft_logits: bool = False,
                                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """Torch reference of :func:`speculative_accept`."""
    p = warp_reference(target_logits, temperature, top_k, top_p)
    q = warp_reference(draft_probs, temperature, top_k, top_p) if draft_logits else draft_probs.float()
    q = torch.cat([q, torch.zeros_like(p[:, :1])], 1)  # the bonus position: residual = p
    k = drafts.shape[1]
    d = torch.cat([drafts, torch.zeros_like(drafts[:, :1])], 1)
    ua = torch.cat([u_accept, torch.ones_like(u_accept[:, :1])], 1)
    accepted, samples = rejection_sample_reference(p, q, d, ua, u_residual)
    bonus = inverse_cdf(p[:, k], u_residual[:, k])  # after K accepts: a draw from p_K (never a kept draft)
    return emit(drafts, accepted[:, :k], torch.cat([samples[:, :k], bonus[:, None]], 1))


def speculative_accept(target_logits: torch.Tensor, drafts: torch.Tensor, draft_probs: torch.Tensor,
                       u_accept: torch.Tensor, u_residual: torch.Tensor, *, temperature: float = 1.0, top_k: int = 0,
                       top_p: float = 1.0, draft_logits: bool = False, backend: str | None = None,
                       ) -> tuple[torch.Tensor, torch.Tensor]:
    """Speculative rejection sampling of ``K`` drafts per row against warped target logits.

    Args:
        target_logits: ``(B, K+1, V)`` target scores at the ``K`` drafts and the bonus position
            (``-inf`` where a logits processor removed a token).
        drafts: ``(B, K)`` draft tokens, drawn from ``draft_probs``.
        draft_probs: ``(B, K, V)`` the draft's (already warped) distributions, or with
            ``draft_logits=True`` its logits (``-inf`` where removed), warped in the kernel exactly
            as the target's (same temperature, top-k, top-p): the caller builds no ``(B, K, V)`` softmax.
        u_accept: ``(B, K)`` uniforms of the ratio tests.
        u_residual: ``(B, K+1)`` uniforms of the draws (only the one at the first rejection, or
            the bonus, is used: the law is exact).
        temperature, top_k, top_p: the target's warping (see the module docstring).
        draft_logits: ``draft_probs`` holds logits (see above).
        backend: ``None`` (auto), ``"torch"`` or ``"triton"``.

    Returns:
        ``(m, tokens)``: accepted counts ``(B,)`` and ``(B, K+1)`` tokens whose first ``m + 1`` are emitted.

    Example:
        >>> logits = torch.log(torch.tensor([[[0.5, 0.5], [0.5, 0.5]]]))
        >>> m, tok = speculative_accept(logits, torch.tensor([[1]]), torch.tensor([[[0.0, 1.0]]]),
        ...                             torch.tensor([[0.4]]), torch.tensor([[0.5, 0.2]]))
        >>> m.tolist(), tok.tolist()
        ([1], [[1, 0]])
        >>> speculative_accept(logits, torch.tensor([[1]]), logits[:, :1], torch.tensor([[0.4]]),
        ...                    torch.tensor([[0.5, 0.2]]), draft_logits=True)[0].tolist()  # q = p: accepted
        [1]
    """
    _check_warp(temperature, top_k, top_p)
    b, k = drafts.shape
    if target_logits.shape[:2] != (b, k + 1) or draft_probs.shape != (b, k, target_logits.shape[-1]):
        raise ValueError(f"speculative_accept: target_logits {tuple(target_logits.shape)} must be (B, K+1, V) and "
                         f"draft_probs {tuple(draft_probs.shape)} (B, K, V) for drafts {tuple(drafts.shape)}")
    if u_accept.shape != (b, k) or u_residual.shape != (b, k + 1):
        raise ValueError(f"speculative_accept: u_accept {tuple(u_accept.shape)} must be ({b}, {k}) and u_residual "
                         f"{tuple(u_residual.shape)} ({b}, {k + 1})")
    if not use_triton([target_logits, drafts, draft_probs, u_accept, u_residual], backend):
        return speculative_accept_reference(target_logits, drafts, draft_probs, u_accept, u_residual,
                                            temperature, top_k, top_p, draft_logits)
    from ._accept_triton import accept_rows

    vocab = target_logits.shape[-1]
    d = torch.cat([drafts, torch.zeros_like(drafts[:, :1])], 1)
    ua = torch.cat([u_accept, torch.ones_like(u_accept[:, :1])], 1)  # the bonus position is never accepted
    accepted, samples = accept_rows(target_logits.reshape(-1, vocab), draft_probs.reshape(-1, vocab), d.reshape(-1),
                                    ua.reshape(-1), u_residual.reshape(-1), q_rows=(k, k + 1),
                                    warp=(temperature, top_k, top_p), q_logits=draft_logits)
    return emit(drafts, accepted.view(b, k + 1)[:, :k], samples.view(b, k + 1))
