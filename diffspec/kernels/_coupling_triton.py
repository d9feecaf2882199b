"""Triton kernels of :mod:`diffspec.kernels.coupling` (two passes over ``[rows, M]``, see there)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .coupling import DELTA_EPS, Coupled, decide

BLOCK = 2048
NUM_WARPS = 8


@triton.jit
def _sums_kernel(z_ptr, a_ptr, b_ptr, s_ptr, dd_ptr, zd_ptr, M, n_blocks, BLOCK: tl.constexpr):
    blk = tl.program_id(0)
    row = tl.program_id(1).to(tl.int64)
    offs = blk * BLOCK + tl.arange(0, BLOCK)
    mask = offs < M
    base = row * M
    s = tl.load(s_ptr + row).to(tl.float32)
    a = tl.load(a_ptr + base + offs, mask=mask, other=0.0).to(tl.float32)
    b = tl.load(b_ptr + base + offs, mask=mask, other=0.0).to(tl.float32)
    z = tl.load(z_ptr + base + offs, mask=mask, other=0.0).to(tl.float32)
    d = ((b - a) / s).to(tl.float64)
    tl.store(dd_ptr + row * n_blocks + blk, tl.sum(d * d, axis=0))
    tl.store(zd_ptr + row * n_blocks + blk, tl.sum(z.to(tl.float64) * d, axis=0))


@triton.jit
def _sample_kernel(y_ptr, z_ptr, a_ptr, b_ptr, s_ptr, acc_ptr, dl_ptr, c_ptr, out_ptr, M, BLOCK: tl.constexpr):
    blk = tl.program_id(0)
    row = tl.program_id(1).to(tl.int64)
    offs = blk * BLOCK + tl.arange(0, BLOCK)
    mask = offs < M
    base = row * M
    if tl.load(acc_ptr + row) != 0:
        y = tl.load(y_ptr + base + offs, mask=mask, other=0.0)
        tl.store(out_ptr + base + offs, y, mask=mask)
    else:
        s = tl.load(s_ptr + row).to(tl.float32)
        dl = tl.load(dl_ptr + row)
        c = tl.load(c_ptr + row)
        a = tl.load(a_ptr + base + offs, mask=mask, other=0.0).to(tl.float32)
        b = tl.load(b_ptr + base + offs, mask=mask, other=0.0).to(tl.float32)
        z = tl.load(z_ptr + base + offs, mask=mask, other=0.0).to(tl.float32)
        e = ((b - a) / s) / dl
        r = b + s * (z - 2.0 * c * e)
        tl.store(out_ptr + base + offs, r.to(out_ptr.dtype.element_ty), mask=mask)


def reflection_coupling_triton(draft: torch.Tensor, noise: torch.Tensor, draft_mean: torch.Tensor,
                               target_mean: torch.Tensor, std: torch.Tensor, uniform: torch.Tensor) -> Coupled:
    """Triton path of :func:`~diffspec.kernels.coupling.reflection_coupling`."""
    rows = draft.shape[0]
    y, z, a, b = (t.contiguous().view(rows, -1) for t in (draft, noise, draft_mean, target_mean))
    m = y.shape[1]
    n_blocks = triton.cdiv(m, BLOCK)
    s = std.float().contiguous()
    dd = torch.empty((rows, n_blocks), dtype=torch.float64, device=y.device)
    zd = torch.empty_like(dd)
    grid = (n_blocks, rows)
    _sums_kernel[grid](z, a, b, s, dd, zd, m, n_blocks, BLOCK=BLOCK, num_warps=NUM_WARPS)
    zd_row = zd.sum(1)
    accepted, log_ratio, delta = decide(dd.sum(1), zd_row, uniform)
    dl = delta.clamp_min(DELTA_EPS)
    coef = (zd_row / dl).float()  # <e, z> with e = D / delta
    out = torch.empty_like(y)
    _sample_kernel[grid](y, z, a, b, s, accepted.to(torch.int32), dl.float(), coef, out, m, BLOCK=BLOCK,
                         num_warps=NUM_WARPS)
    return Coupled(accepted, out.view(draft.shape), log_ratio, delta)
