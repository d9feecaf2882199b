"""Triton kernel of :mod:`diffspec.kernels.accept`: one program per verified position (row).

With draft logits (``Q_LOGITS``) the draft row gets the same warp passes as the target row
(:func:`_warp_stats`) and ``q`` is formed block by block like ``p``, never written out.

Passes over the row's vocabulary, in blocks (the row stays in L1/L2 after the first if it fits):
top-k threshold (32 bisection passes, only with top-k), max and normaliser (one online-softmax
pass), top-p threshold (30 bisection passes) and its normaliser (only with top-p), then one pass
for ``p(x)``, ``q(x)`` and
the running sums of the residual ``max(0, p - q)`` and of ``p``, and, only on a rejection, one
inverse-CDF scan at ``u_r`` that re-forms the same running sums block by block.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

SPLIT = 8192
"""Vocabulary piece per program of the split path (few rows, large vocabulary)."""
SPLIT_ROWS = 256
"""Below this many rows the split path runs (one program per row leaves the GPU idle)."""


@triton.jit
def _key(x):
    """Order-preserving int32 key of an fp32 value."""
    i = x.to(tl.int32, bitcast=True)
    return tl.where(i >= 0, i, i ^ 0x7FFFFFFF)


@triton.jit
def _probs(t_row, offs, m, temperature, kth_key, mx, z, thr, z2, FROM_LOGITS: tl.constexpr, TOP_P: tl.constexpr):
    if FROM_LOGITS:
        x = tl.load(t_row + offs, mask=m, other=float("-inf")).to(tl.float32) / temperature
        keep = m & (_key(x) >= kth_key)
        p = tl.where(keep, tl.exp(x - mx) / z, 0.0)
        if TOP_P:
            p = tl.where((_key(p) >= thr) & (p > 0), p / z2, 0.0)  # p > 0: an empty row stays 0, not 0/0
    else:
        p = tl.load(t_row + offs, mask=m, other=0.0).to(tl.float32)
    return p


@triton.jit
def _warp_stats(row, L, V, temperature, top_k, top_p, TOP_K: tl.constexpr, TOP_P: tl.constexpr,
                BLOCK: tl.constexpr):
    """Warp thresholds and normalisers of the logits ``row[:L]`` (``L = 0``: an empty row, p = 0)."""
    ar = tl.arange(0, BLOCK)
    kth_key = tl.full([], -2147483648, tl.int64)
    thr = tl.full([], 0, tl.int64)
    z2 = tl.full([], 1.0, tl.float32)
    if TOP_K:  # largest key t with #{key >= t} >= top_k: the k-th largest value, exactly
        lo = tl.full([], -2147483648, tl.int64)
        hi = tl.full([], 2147483647, tl.int64)
        for _ in range(32):
            mid = (lo + hi + 1) >> 1
            cnt = tl.full([], 0, tl.int32)
            for start in range(0, V, BLOCK):
                offs = start + ar
                m = offs < L
                x = tl.load(row + offs, mask=m, other=float("-inf")).to(tl.float32) / temperature
                cnt += tl.sum((m & (_key(x).to(tl.int64) >= mid)).to(tl.int32), axis=0)
            ok = cnt >= top_k
            lo = tl.where(ok, mid, lo)
            hi = tl.where(ok, hi, mid - 1)
        kth_key = lo
    mx = tl.full([], float("-inf"), tl.float32)
    z = tl.full([], 0.0, tl.float32)
    for start in range(0, V, BLOCK):  # online softmax: running max and rescaled normaliser, one pass
        offs = start + ar
        m = offs < L
        x = tl.load(row + offs, mask=m, other=float("-inf")).to(tl.float32) / temperature
        keep = m & (_key(x) >= kth_key)
        new_mx = tl.maximum(mx, tl.max(tl.where(keep, x, float("-inf")), axis=0))
        scale = tl.where(new_mx == float("-inf"), 1.0, tl.exp(mx - new_mx))
        z = z * scale + tl.sum(tl.where(keep, tl.exp(x - new_mx), 0.0), axis=0)
        mx = new_mx
    if TOP_P:  # smallest key t with mass{p > t} < top_p: keep p >= t
        lo = tl.full([], 0, tl.int64)
        hi = tl.full([], 0x3F800000, tl.int64)
        for _ in range(30):
            mid = (lo + hi) >> 1
            f = tl.full([], 0.0, tl.float32)
            for start in range(0, V, BLOCK):
                offs = start + ar
                m = offs < L
                p = _probs(row, offs, m, temperature, kth_key, mx, z, thr, z2, True, False)
                f += tl.sum(tl.where(_key(p).to(tl.int64) > mid, p, 0.0), axis=0)
            ok = f < top_p
            hi = tl.where(ok, mid, hi)
            lo = tl.where(ok, lo, mid + 1)
        thr = lo
        z2 = tl.full([], 0.0, tl.float32)
        for start in range(0, V, BLOCK):
            offs = start + ar
            m = offs < L
            p = _probs(row, offs, m, temperature, kth_key, mx, z, thr, z2, True, False)
            z2 += tl.sum(tl.where(_key(p).to(tl.int64) >= thr, p, 0.0), axis=0)
    return kth_key, mx, z, thr, z2


@triton.jit
def _accept_kernel(t_ptr, q_ptr, d_ptr, ua_ptr, ur_ptr, pm_ptr, qm_ptr, acc_ptr, tok_ptr, V, G, QK,
                   temperature, top_k, top_p, FROM_LOGITS: tl.constexpr, Q_LOGITS: tl.constexpr,
                   TOP_K: tl.constexpr, TOP_P: tl.constexpr, HAS_MASS: tl.constexpr, BLOCK: tl.constexpr):
    n = tl.program_id(0).to(tl.int64)
    k = n % G
    q_len = tl.where(k < QK, V, 0)  # no draft at the bonus position: q = 0
    t_row = t_ptr + n * V
    q_row = q_ptr + ((n // G) * QK + tl.minimum(k, QK - 1)) * V
    ar = tl.arange(0, BLOCK)
    kth_key = tl.full([], -2147483648, tl.int64)
    mx = tl.full([], 0.0, tl.float32)
    z = tl.full([], 1.0, tl.float32)
    thr = tl.full([], 0, tl.int64)
    z2 = tl.full([], 1.0, tl.float32)
    if FROM_LOGITS:
        kth_key, mx, z, thr, z2 = _warp_stats(t_row, V, V, temperature, top_k, top_p, TOP_K, TOP_P, BLOCK)
    q_kth = tl.full([], -2147483648, tl.int64)
    q_mx = tl.full([], 0.0, tl.float32)
    q_z = tl.full([], 1.0, tl.float32)
    q_thr = tl.full([], 0, tl.int64)
    q_z2 = tl.full([], 1.0, tl.float32)
    if Q_LOGITS:  # the draft's law from its logits, warped as the target's
        q_kth, q_mx, q_z, q_thr, q_z2 = _warp_stats(q_row, q_len, V, temperature, top_k, top_p, TOP_K, TOP_P, BLOCK)
    d = tl.load(d_ptr + n).to(tl.int64)
    px = tl.full([], 0.0, tl.float32)
    qx = tl.full([], 0.0, tl.float32)
    tot_r = tl.full([], 0.0, tl.float32)
    tot_p = tl.full([], 0.0, tl.float32)
    for start in range(0, V, BLOCK):
        offs = start + ar
        m = offs < V
        p = _probs(t_row, offs, m, temperature, kth_key, mx, z, thr, z2, FROM_LOGITS, TOP_P)
        q = _probs(q_row, offs, offs < q_len, temperature, q_kth, q_mx, q_z, q_thr, q_z2, Q_LOGITS, TOP_P)
        hit = offs == d
        px += tl.sum(tl.where(hit, p, 0.0), axis=0)
        qx += tl.sum(tl.where(hit, q, 0.0), axis=0)
        tot_r = tl.max(tot_r + tl.cumsum(tl.maximum(p - q, 0.0), axis=0), axis=0)
        tot_p = tl.max(tot_p + tl.cumsum(p, axis=0), axis=0)
    if HAS_MASS:
        px = tl.load(pm_ptr + n).to(tl.float32)
        qx = tl.load(qm_ptr + n).to(tl.float32)
    accepted = (tl.load(ua_ptr + n).to(tl.float32) * qx < px) & (k < QK)  # the bonus is never accepted
    tok = d
    if not accepted:  # inverse-CDF draw from the residual (p where the residual is empty)
        use_r = tot_r > 0
        total = tl.where(use_r, tot_r, tot_p)
        below = (total.to(tl.int32, bitcast=True) - 1).to(tl.float32, bitcast=True)
        x = tl.minimum(tl.load(ur_ptr + n).to(tl.float32) * total, below)
        carry = tl.full([], 0.0, tl.float32)
        cnt = tl.full([], 0, tl.int64)
        for start in range(0, V, BLOCK):
            offs = start + ar
            m = offs < V
            p = _probs(t_row, offs, m, temperature, kth_key, mx, z, thr, z2, FROM_LOGITS, TOP_P)
            q = _probs(q_row, offs, offs < q_len, temperature, q_kth, q_mx, q_z, q_thr, q_z2, Q_LOGITS, TOP_P)
            w = tl.where(use_r, tl.maximum(p - q, 0.0), p)
            cdf = carry + tl.cumsum(w, axis=0)
            carry = tl.max(cdf, axis=0)
            cnt += tl.sum((m & (cdf <= x)).to(tl.int64), axis=0)
        tok = tl.minimum(cnt, V - 1)
    tl.store(acc_ptr + n, accepted.to(tl.int8))
    tl.store(tok_ptr + n, tok)


def accept_rows(target: torch.Tensor, q: torch.Tensor, draft: torch.Tensor, u_accept: torch.Tensor,
                u_residual: torch.Tensor, q_rows: int | tuple[int, int] = 1,
                warp: tuple[float, int, float] | None = None,
                accept_mass: tuple[torch.Tensor, torch.Tensor] | None = None, split: int | None = None,
                q_logits: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Accept/draw for ``N`` rows of ``target`` ``[N, V]`` (probabilities, or logits with ``warp``).

    Args:
        q_rows: ``1``: row ``n`` uses ``q[n]``; ``(K, G)``: row ``n = b * G + k`` uses ``q[b * K + k]``
            for ``k < K`` and no draft (``q = 0``: the bonus position) otherwise.
        warp: ``(temperature, top_k, top_p)`` to warp logits, ``None`` for probabilities.
        accept_mass: ``(p_mass, q_mass)`` ``[N]`` replacing ``(p(x), q(x))`` in the test.
        split: vocabulary piece per program (:mod:`~diffspec.kernels._accept_split_triton`); ``None``:
            ``SPLIT`` when there are fewer than ``SPLIT_ROWS`` rows, a large vocabulary and no top-k/top-p,
            else one program per row. Ignored with top-k/top-p.
        q_logits: ``q`` holds the draft's logits, warped in the kernel with ``warp`` (needs ``warp``).

    Returns:
        ``(accepted [N] bool, tokens [N] long)``.
    """
    rows, vocab = target.shape
    qk, g = (1, 1) if q_rows == 1 else q_rows
    temperature, top_k, top_p = warp if warp is not None else (1.0, 0, 1.0)
    use_k = warp is not None and 0 < top_k < vocab
    use_p = warp is not None and top_p < 1.0
    if split is None and rows < SPLIT_ROWS and vocab >= 2 * SPLIT:
        split = SPLIT
    if q_logits and warp is None:
        raise ValueError("accept_rows: q_logits=True needs warp=(temperature, top_k, top_p)")
    if split is not None and not (use_k or use_p):
        from ._accept_split_triton import accept_rows_split

        return accept_rows_split(target, q, draft, u_accept, u_residual, qk, g,
                                 float(temperature) if warp is not None else None, accept_mass, split, q_logits)
    acc = torch.empty(rows, dtype=torch.int8, device=target.device)
    tok = torch.empty(rows, dtype=torch.long, device=target.device)
    pm, qm = accept_mass if accept_mass is not None else (u_accept, u_accept)
    block = min(4096, triton.next_power_of_2(vocab))
    _accept_kernel[(rows,)](target.contiguous(), q.contiguous(), draft.contiguous(), u_accept.contiguous(),
                            u_residual.contiguous(), pm.reshape(-1).contiguous(), qm.reshape(-1).contiguous(),
                            acc, tok, vocab, g, qk, float(temperature), int(top_k), float(top_p),
                            FROM_LOGITS=warp is not None, Q_LOGITS=q_logits, TOP_K=use_k, TOP_P=use_p,
                            HAS_MASS=accept_mass is not None, BLOCK=block, num_warps=8 if block >= 2048 else 4)
    return acc.bool(), tok
