"""Vocab-split variant of the acceptance kernel, for few rows over a large vocabulary.

One program per row streams the whole vocabulary with one block in flight, which leaves most of
the GPU idle at batch 1. Here each row is cut into ``SPLIT``-token pieces, one program each, in
three launches with a few ``[rows, splits]`` torch ops between them (no host sync):

1. per piece: online-softmax max and normaliser of ``logits / T``;
2. per piece, with the row's merged max and normaliser: ``p(x)``, ``q(x)`` and the running-sum
   totals of the residual ``max(0, p - q)`` and of ``p``; torch then takes the ratio test, the
   piece where ``u_r * total`` falls (prefix sums over pieces), and the offset before it;
3. per rejected row: the inverse-CDF scan of that one piece.

Draft logits (``q_logits``) get their own per-piece statistics (launch 1 over the draft rows).
Only temperature warping (logits) or probabilities: top-k / top-p need row-wide thresholds and use
the one-program-per-row kernel. The running sums are formed piece by piece, so an inverse-CDF draw
can differ from the per-row scan only where ``u_r * total`` falls within rounding of a boundary.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._accept_triton import _probs


@triton.jit
def _piece_stats(t_ptr, m_ptr, z_ptr, V, S, temperature, SPLIT: tl.constexpr, BLOCK: tl.constexpr):
    n = tl.program_id(0).to(tl.int64)
    s = tl.program_id(1)
    t_row = t_ptr + n * V
    ar = tl.arange(0, BLOCK)
    mx = tl.full([], float("-inf"), tl.float32)
    z = tl.full([], 0.0, tl.float32)
    for start in range(0, SPLIT, BLOCK):
        offs = s * SPLIT + start + ar
        m = offs < V
        x = tl.load(t_row + offs, mask=m, other=float("-inf")).to(tl.float32) / temperature
        new_mx = tl.maximum(mx, tl.max(x, axis=0))
        scale = tl.where(new_mx == float("-inf"), 1.0, tl.exp(mx - new_mx))
        z = z * scale + tl.sum(tl.where(x > float("-inf"), tl.exp(x - new_mx), 0.0), axis=0)  # an all -inf block: 0
        mx = new_mx
    tl.store(m_ptr + n * S + s, mx)
    tl.store(z_ptr + n * S + s, z)


@triton.jit
def _piece_mass(t_ptr, q_ptr, d_ptr, mx_ptr, z_ptr, qmx_ptr, qz_ptr, px_ptr, qx_ptr, rt_ptr, pt_ptr, V, S, G, QK,
                temperature, FROM_LOGITS: tl.constexpr, Q_LOGITS: tl.constexpr, SPLIT: tl.constexpr,
                BLOCK: tl.constexpr):
    n = tl.program_id(0).to(tl.int64)
    s = tl.program_id(1)
    k = n % G
    q_len = tl.where(k < QK, V, 0)
    t_row = t_ptr + n * V
    qi = (n // G) * QK + tl.minimum(k, QK - 1)
    q_row = q_ptr + qi * V
    mx = tl.load(mx_ptr + n)
    z = tl.load(z_ptr + n)
    q_mx = tl.load(qmx_ptr + qi)
    q_z = tl.load(qz_ptr + qi)
    d = tl.load(d_ptr + n).to(tl.int64)
    ar = tl.arange(0, BLOCK)
    px = tl.full([], 0.0, tl.float32)
    qx = tl.full([], 0.0, tl.float32)
    tot_r = tl.full([], 0.0, tl.float32)
    tot_p = tl.full([], 0.0, tl.float32)
    for start in range(0, SPLIT, BLOCK):
        offs = s * SPLIT + start + ar
        m = offs < V
        p = _probs(t_row, offs, m, temperature, -2147483648, mx, z, 0, 1.0, FROM_LOGITS, False)
        q = _probs(q_row, offs, offs < q_len, temperature, -2147483648, q_mx, q_z, 0, 1.0, Q_LOGITS, False)
        hit = offs == d
        px += tl.sum(tl.where(hit, p, 0.0), axis=0)
        qx += tl.sum(tl.where(hit, q, 0.0), axis=0)
        tot_r = tl.max(tot_r + tl.cumsum(tl.maximum(p - q, 0.0), axis=0), axis=0)
        tot_p = tl.max(tot_p + tl.cumsum(p, axis=0), axis=0)
    out = n * S + s
    tl.store(px_ptr + out, px)
    tl.store(qx_ptr + out, qx)
    tl.store(rt_ptr + out, tot_r)
    tl.store(pt_ptr + out, tot_p)


@triton.jit
def _piece_draw(t_ptr, q_ptr, d_ptr, mx_ptr, z_ptr, qmx_ptr, qz_ptr, acc_ptr, piece_ptr, base_ptr, x_ptr, use_r_ptr,
                tok_ptr, V, G, QK, temperature, FROM_LOGITS: tl.constexpr, Q_LOGITS: tl.constexpr,
                SPLIT: tl.constexpr, BLOCK: tl.constexpr):
    n = tl.program_id(0).to(tl.int64)
    tok = tl.load(d_ptr + n).to(tl.int64)
    if tl.load(acc_ptr + n) == 0:
        k = n % G
        q_len = tl.where(k < QK, V, 0)
        t_row = t_ptr + n * V
        qi = (n // G) * QK + tl.minimum(k, QK - 1)
        q_row = q_ptr + qi * V
        mx = tl.load(mx_ptr + n)
        z = tl.load(z_ptr + n)
        q_mx = tl.load(qmx_ptr + qi)
        q_z = tl.load(qz_ptr + qi)
        s = tl.load(piece_ptr + n)
        carry = tl.load(base_ptr + n)
        x = tl.load(x_ptr + n)
        use_r = tl.load(use_r_ptr + n) != 0
        ar = tl.arange(0, BLOCK)
        cnt = tl.full([], 0, tl.int64)
        last = tl.full([], -1, tl.int64)
        for start in range(0, SPLIT, BLOCK):
            offs = s * SPLIT + start + ar
            m = offs < V
            p = _probs(t_row, offs, m, temperature, -2147483648, mx, z, 0, 1.0, FROM_LOGITS, False)
            q = _probs(q_row, offs, offs < q_len, temperature, -2147483648, q_mx, q_z, 0, 1.0, Q_LOGITS, False)
            w = tl.where(use_r, tl.maximum(p - q, 0.0), p)
            cdf = carry + tl.cumsum(w, axis=0)
            carry = tl.max(cdf, axis=0)
            cnt += tl.sum((m & (cdf <= x)).to(tl.int64), axis=0)
            last = tl.maximum(last, tl.max(tl.where(m & (w > 0), offs.to(tl.int64), -1), axis=0))
        piece_len = tl.minimum(V - s * SPLIT, SPLIT)
        # x past the piece's own running total (rounding between the two sums): its last positive token
        tok = tl.where(cnt < piece_len, s * SPLIT + cnt, last)
    tl.store(tok_ptr + n, tok)


def accept_rows_split(target: torch.Tensor, q: torch.Tensor, draft: torch.Tensor, u_accept: torch.Tensor,
                      u_residual: torch.Tensor, qk: int, g: int, temperature: float | None,
                      accept_mass: tuple[torch.Tensor, torch.Tensor] | None, split: int, q_logits: bool = False,
                      ) -> tuple[torch.Tensor, torch.Tensor]:
    """Vocab-split path of :func:`~diffspec.kernels._accept_triton.accept_rows` (``temperature=None``: probabilities;
    ``q_logits``: ``q`` holds draft logits, softmaxed at ``temperature`` from their own per-piece statistics)."""
    if split < 16 or split & (split - 1):
        raise ValueError(f"split={split} must be a power of two >= 16")
    rows, vocab = target.shape
    pieces = triton.cdiv(vocab, split)
    block = min(4096, split)
    dev = target.device
    t, qq, d = target.contiguous(), q.contiguous(), draft.contiguous()
    logits = temperature is not None
    temp = float(temperature) if logits else 1.0
    f32 = dict(dtype=torch.float32, device=dev)
    if q_logits and not logits:
        raise ValueError("accept_rows_split: q_logits=True needs a temperature (target logits)")

    def stats(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Row max and normaliser of ``x / T`` merged over the pieces."""
        n_rows = x.shape[0]
        m_s, z_s = torch.empty(n_rows, pieces, **f32), torch.empty(n_rows, pieces, **f32)
        _piece_stats[(n_rows, pieces)](x, m_s, z_s, vocab, pieces, temp, SPLIT=split, BLOCK=block)
        m = m_s.max(1).values
        return m, (z_s * torch.exp(m_s - m[:, None]).nan_to_num(0.0)).sum(1)
    mx, z = stats(t) if logits else (torch.zeros(rows, **f32), torch.ones(rows, **f32))
    q_mx, q_z = stats(qq) if q_logits else (mx, z)  # unused unless q_logits
    px_s, qx_s, rt_s, pt_s = (torch.empty(rows, pieces, **f32) for _ in range(4))
    _piece_mass[(rows, pieces)](t, qq, d, mx, z, q_mx, q_z, px_s, qx_s, rt_s, pt_s, vocab, pieces, g, qk, temp,
                                FROM_LOGITS=logits, Q_LOGITS=q_logits, SPLIT=split, BLOCK=block)
    if accept_mass is None:
        px, qx = px_s.sum(1), qx_s.sum(1)
    else:
        px, qx = (mass.reshape(-1).float() for mass in accept_mass)
    bonus = (torch.arange(rows, device=dev) % g) >= qk
    accepted = (u_accept.float() * qx < px) & ~bonus
    use_r = (rt_s > 0).any(1)
    w = torch.where(use_r[:, None], rt_s, pt_s)
    cum = w.cumsum(1)
    total = cum[:, -1]
    x = torch.minimum(u_residual.float() * total, torch.nextafter(total, torch.zeros_like(total)))
    piece = (cum <= x[:, None]).sum(1).clamp_(max=pieces - 1)
    before = torch.cat([torch.zeros_like(cum[:, :1]), cum[:, :-1]], 1)  # running total before each piece (<= x)
    base = before.gather(1, piece[:, None])[:, 0]
    tok = torch.empty(rows, dtype=torch.long, device=dev)
    _piece_draw[(rows,)](t, qq, d, mx, z, q_mx, q_z, accepted.to(torch.int8), piece.to(torch.int32), base, x,
                         use_r.to(torch.int8), tok, vocab, g, qk, temp, FROM_LOGITS=logits, Q_LOGITS=q_logits,
                         SPLIT=split, BLOCK=block)
    return accepted, tok
