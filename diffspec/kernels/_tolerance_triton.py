"""Triton kernel of :mod:`diffspec.kernels.tolerance`: one program per (row, position).

One pass over the position's scores in vocab blocks: running maximum and its first index (the
argmax as torch breaks ties: the smallest index), and the draft's score; then the rule
(``BIN``: bin distance of action tokens; else the beta gap on relaxed rows).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _tolerance_kernel(s_ptr, d_ptr, rel_ptr, t_ptr, ok_ptr, L, D, V, first_id, n_bins, tol, log_beta,
                      BIN: tl.constexpr, REVERSE: tl.constexpr, BLOCK: tl.constexpr):
    pid = tl.program_id(0).to(tl.int64)
    n = pid // L
    j = pid % L
    row = s_ptr + pid * V
    has_d = j < D
    d = tl.load(d_ptr + n * D + tl.minimum(j, D - 1)).to(tl.int64)
    ar = tl.arange(0, BLOCK)
    mx = tl.full([], float("-inf"), tl.float32)
    arg = tl.full([], 0, tl.int64)
    xd = tl.full([], float("-inf"), tl.float32)
    for start in range(0, V, BLOCK):
        offs = start + ar
        m = offs < V
        x = tl.load(row + offs, mask=m, other=float("-inf")).to(tl.float32)
        bmx = tl.max(x, axis=0)
        barg = tl.min(tl.where(m & (x == bmx), offs, V), axis=0).to(tl.int64)
        better = bmx > mx
        arg = tl.where(better, barg, arg)
        mx = tl.maximum(mx, bmx)
        xd = tl.where((d >= start) & (d < start + BLOCK), tl.sum(tl.where(offs == d, x, 0.0), axis=0), xd)
    arg = tl.minimum(arg, V - 1)
    same = d == arg
    if BIN:
        last = first_id + n_bins - 1
        if REVERSE:
            bd = last - d
            bt = last - arg
        else:
            bd = d - first_id
            bt = arg - first_id
        bd = tl.minimum(tl.maximum(bd, 0), n_bins - 1)
        bt = tl.minimum(tl.maximum(bt, 0), n_bins - 1)
        both = (d >= first_id) & (d <= last) & (arg >= first_id) & (arg <= last)
        dist = tl.where(bd > bt, bd - bt, bt - bd)
        ok = tl.where(both, dist <= tol, same)
    else:
        rel = tl.load(rel_ptr + n) != 0
        ok = same | (rel & (xd - mx >= log_beta))
    tl.store(t_ptr + pid, arg)
    if has_d:
        tl.store(ok_ptr + n * D + j, ok.to(tl.int8))


def tolerance_rows(scores: torch.Tensor, drafts: torch.Tensor, bins: tuple[int, int, bool, int] | None = None,
                   log_beta: float = 0.0, relaxed: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(t (N, L), ok (N, D))`` of scores ``(N, L, V)`` and drafts ``(N, D)``.

    Args:
        bins: ``(first_id, n_bins, reverse, tolerance)``: the bin rule; ``None``: the beta rule.
        log_beta, relaxed: the beta rule's ``log(beta)`` and ``(N,)`` relaxed rows.
    """
    n, length, vocab = scores.shape
    dd = drafts.shape[1]
    t = torch.empty(n, length, dtype=torch.long, device=scores.device)
    ok = torch.zeros(n, max(dd, 1), dtype=torch.int8, device=scores.device)
    first_id, n_bins, reverse, tol = bins if bins is not None else (0, 1, False, 0)
    d = drafts.contiguous() if dd else torch.zeros(n, 1, dtype=torch.long, device=scores.device)  # no draft
    rel = relaxed.to(torch.int8).contiguous() if relaxed is not None else ok
    block = min(4096, triton.next_power_of_2(vocab))
    _tolerance_kernel[(n * length,)](scores.contiguous(), d, rel, t, ok, length, max(dd, 1), vocab,
                                     int(first_id), int(n_bins), int(tol), float(log_beta), BIN=bins is not None,
                                     REVERSE=bool(reverse), BLOCK=block, num_warps=8 if block >= 2048 else 4)
    return t, ok[:, :dd].bool()
