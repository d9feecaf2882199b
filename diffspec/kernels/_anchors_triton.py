"""Triton kernels of :mod:`diffspec.kernels.anchors` (imported only when a kernel runs).

Layout: every tensor is seen as ``[rows, M]`` (contiguous); the grid is ``(cdiv(M, BLOCK), rows)``.
Each program loads one block of every anchor once (any float dtype, converted to fp32), forms
``sum_j w_j a_j`` in fp32 and stores it once. The L1 sums are written as per-block fp32 partials
``[rows, blocks]`` and reduced by one torch ``sum`` (deterministic, no atomics).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import triton
import triton.language as tl

BLOCK = 2048
NUM_WARPS = 8


@triton.jit
def _forecast_kernel(anchors, w_ptr, sw_j, sw_r, out_ptr, true_ptr, err_ptr, norm_ptr, M, n_blocks,
                     N: tl.constexpr, HAS_TRUE: tl.constexpr, BLOCK: tl.constexpr):
    blk = tl.program_id(0)
    row = tl.program_id(1).to(tl.int64)
    offs = blk * BLOCK + tl.arange(0, BLOCK)
    mask = offs < M
    base = row * M
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for j in tl.static_range(N):
        w = tl.load(w_ptr + j * sw_j + row * sw_r).to(tl.float32)
        a = tl.load(anchors[j] + base + offs, mask=mask, other=0.0).to(tl.float32)
        acc += w * a
    tl.store(out_ptr + base + offs, acc.to(out_ptr.dtype.element_ty), mask=mask)
    if HAS_TRUE:
        y = tl.load(true_ptr + base + offs, mask=mask, other=0.0).to(tl.float32)
        tl.store(err_ptr + row * n_blocks + blk, tl.sum(tl.abs(acc - y), axis=0))
        tl.store(norm_ptr + row * n_blocks + blk, tl.sum(tl.abs(y), axis=0))


@triton.jit
def _l1_kernel(d_ptr, t_ptr, b_ptr, err_ptr, norm_ptr, M, n_blocks, HAS_BASE: tl.constexpr, BLOCK: tl.constexpr):
    blk = tl.program_id(0)
    row = tl.program_id(1).to(tl.int64)
    offs = blk * BLOCK + tl.arange(0, BLOCK)
    mask = offs < M
    base = row * M
    d = tl.load(d_ptr + base + offs, mask=mask, other=0.0).to(tl.float32)
    t = tl.load(t_ptr + base + offs, mask=mask, other=0.0).to(tl.float32)
    y = t
    if HAS_BASE:
        y = t - tl.load(b_ptr + base + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(err_ptr + row * n_blocks + blk, tl.sum(tl.abs(d - t), axis=0))
    tl.store(norm_ptr + row * n_blocks + blk, tl.sum(tl.abs(y), axis=0))


def _rows(x: torch.Tensor) -> torch.Tensor:
    return x.contiguous().view(x.shape[0], -1)


def forecast_triton(anchors: Sequence[torch.Tensor], weights: Sequence[float] | torch.Tensor,
                    true: torch.Tensor | None, out_dtype: torch.dtype):
    """Triton path of :func:`~diffspec.kernels.anchors.forecast` (same arguments and outputs)."""
    flat = tuple(_rows(a) for a in anchors)
    rows, m = flat[0].shape
    dev = flat[0].device
    if isinstance(weights, torch.Tensor):
        w = weights.to(device=dev, dtype=torch.float32).contiguous()
        sw_j, sw_r = w.stride(0), w.stride(1)
    else:
        w = torch.tensor(list(weights), dtype=torch.float32).to(dev, non_blocking=True)
        sw_j, sw_r = 1, 0
    out = torch.empty((rows, m), dtype=out_dtype, device=dev)
    n_blocks = triton.cdiv(m, BLOCK)
    if true is not None:
        y = _rows(true)
        err = torch.empty((rows, n_blocks), dtype=torch.float32, device=dev)
        norm = torch.empty_like(err)
    else:
        y, err, norm = out, out, out  # unused pointers
    _forecast_kernel[(n_blocks, rows)](flat, w, sw_j, sw_r, out, y, err, norm, m, n_blocks,
                                       N=len(flat), HAS_TRUE=true is not None, BLOCK=BLOCK, num_warps=NUM_WARPS)
    out = out.view(anchors[0].shape)
    if true is None:
        return out
    return out, err.sum(1), norm.sum(1)


def l1_error_triton(draft: torch.Tensor, true: torch.Tensor, base: torch.Tensor | None):
    """Triton path of :func:`~diffspec.kernels.anchors.l1_error`."""
    d, t = _rows(draft), _rows(true)
    b = _rows(base) if base is not None else t
    rows, m = d.shape
    n_blocks = triton.cdiv(m, BLOCK)
    err = torch.empty((rows, n_blocks), dtype=torch.float32, device=d.device)
    norm = torch.empty_like(err)
    _l1_kernel[(n_blocks, rows)](d, t, b, err, norm, m, n_blocks, HAS_BASE=base is not None, BLOCK=BLOCK,
                                 num_warps=NUM_WARPS)
    return err.sum(1), norm.sum(1)
