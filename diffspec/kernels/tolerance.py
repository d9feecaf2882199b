"""Relaxed greedy acceptance rules as kernels: the target argmax and the per-draft test in one pass.

Both rules need only the argmax (and the maximum) of each verified position's scores, never a
softmax over the vocabulary; the Triton kernel (:mod:`~diffspec.kernels._tolerance_triton`, one
program per position, vocab blocks) reads each row once. Entry points:

- :func:`bin_tolerance` (``relaxed-action``, Spec-VLA rule A3): a draft passes when both it and
  the target argmax ``t`` are action tokens within ``r`` bins (``|bin(t) - bin(d)| <= r``), or
  when ``d == t``; the accepted prefix length is the first rejection index.
- :func:`beta_tolerance` (``relaxed-codec``): a draft passes when ``d == t``, or, on relaxed rows,
  when ``p(d) >= beta * max p``, tested as ``x_d - max x >= log(beta)`` on the scores ``x`` (the
  log-softmax normaliser cancels).

Example:
    >>> scores = torch.nn.functional.one_hot(torch.tensor([[13, 4, 3]]), 20).float()
    >>> t, ok, m = bin_tolerance(scores, torch.tensor([[12, 15, 3]]), first_id=10, n_bins=10, reverse=False,
    ...                          tolerance=1)
    >>> t.tolist(), ok.tolist(), m.tolist()
    ([[13, 4, 3]], [[True, False, True]], [1])
"""

from __future__ import annotations

import math

import torch

from .dispatch import use_triton


def _bins(ids: torch.Tensor, first_id: int, n_bins: int, reverse: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(is_action, bin) of token ids (bins clipped into ``[0, n_bins - 1]``)."""
    last = first_id + n_bins - 1
    bins = last - ids if reverse else ids - first_id
    return (ids >= first_id) & (ids <= last), bins.clamp(0, n_bins - 1)


def bin_tolerance_reference(scores: torch.Tensor, drafts: torch.Tensor, first_id: int, n_bins: int, reverse: bool,
                            tolerance: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Torch reference of :func:`bin_tolerance` (``(t, ok)``, before the prefix)."""
    t = scores.argmax(-1)
    act_d, bin_d = _bins(drafts, first_id, n_bins, reverse)
    act_t, bin_t = _bins(t, first_id, n_bins, reverse)
    return t, torch.where(act_d & act_t, (bin_d - bin_t).abs() <= tolerance, drafts == t)


def bin_tolerance(scores: torch.Tensor, drafts: torch.Tensor, *, first_id: int, n_bins: int, reverse: bool,
                  tolerance: int, always: torch.Tensor | None = None, backend: str | None = None,
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Bin-tolerance test of ``L`` drafts per row against the target argmax, and the accepted prefix.

    Args:
        scores: ``(B, L, V)`` processed target scores at the drafts' positions.
        drafts: ``(B, L)`` draft ids.
        first_id: the smallest action id (the action ids are ``[first_id, first_id + n_bins)``).
        n_bins: action bins.
        reverse: OpenVLA order (``bin = first_id + n_bins - 1 - id``) rather than ``id - first_id``.
        tolerance: ``r`` in bins (0: ``d == t``, exact greedy).
        always: optional ``(B, L)`` bool, positions that pass whatever the test (already decided).
        backend: ``None`` (auto), ``"torch"`` or ``"triton"``.

    Returns:
        ``(t, ok, m)``: argmax ``(B, L)``, per-draft pass ``(B, L)`` (before ``always``), and the
        first rejection index ``(B,)`` of ``ok | always`` (``L``: all passed).
    """
    if tolerance < 0:
        raise ValueError(f"tolerance={tolerance!r} is out of range: allowed [0, n_bins={n_bins}]")
    if scores.dim() != 3 or drafts.shape != scores.shape[:2] or (always is not None and always.shape != drafts.shape):
        raise ValueError(f"bin_tolerance: scores {tuple(scores.shape)} must be (B, L, V) with drafts (and always) "
                         f"(B, L), got drafts {tuple(drafts.shape)}")
    if use_triton([scores, drafts], backend):
        from ._tolerance_triton import tolerance_rows

        t, ok = tolerance_rows(scores, drafts, bins=(first_id, n_bins, reverse, tolerance))
    else:
        t, ok = bin_tolerance_reference(scores, drafts, first_id, n_bins, reverse, tolerance)
    passed = ok if always is None else ok | always
    return t, ok, passed.long().cumprod(1).sum(1)


def beta_tolerance_reference(scores: torch.Tensor, drafts: torch.Tensor, log_beta: float, relaxed: torch.Tensor,
                             ) -> tuple[torch.Tensor, torch.Tensor]:
    """Torch reference of :func:`beta_tolerance`."""
    x = scores.float()
    t = x.argmax(-1)
    d = drafts.shape[1]
    gap = x[:, :d].gather(-1, drafts[..., None])[..., 0] - x[:, :d].amax(-1)
    return t, (drafts == t[:, :d]) | (relaxed[:, None] & (gap >= log_beta))


def beta_tolerance(scores: torch.Tensor, drafts: torch.Tensor, *, beta: float, relaxed: torch.Tensor,
                   backend: str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Beta-tolerance test of ``D`` drafts per row against ``L >= D`` verified positions.

    Args:
        scores: ``(N, L, V)`` target scores (the last ``L - D`` positions only give their argmax).
        drafts: ``(N, D)`` draft ids, ``D <= L``.
        beta: tolerance in ``(0, 1]`` (1: only ``d == t`` and exact ties pass).
        relaxed: ``(N,)`` bool, rows where the tolerance applies (elsewhere ``d == t``).
        backend: ``None`` (auto), ``"torch"`` or ``"triton"``.

    Returns:
        ``(t, ok)``: argmax ``(N, L)`` and per-draft pass ``(N, D)``.

    Example:
        >>> x = torch.log(torch.tensor([[[0.5, 0.3, 0.2], [0.1, 0.1, 0.8]]]))
        >>> t, ok = beta_tolerance(x, torch.tensor([[1]]), beta=0.5, relaxed=torch.tensor([True]))
        >>> t.tolist(), ok.tolist()
        ([[0, 2]], [[True]])
    """
    if not 0 < beta <= 1:
        raise ValueError(f"beta={beta!r} is out of range: allowed (0, 1]")
    n, length = scores.shape[:2] if scores.dim() == 3 else (None, None)
    if n is None or drafts.dim() != 2 or drafts.shape[0] != n or drafts.shape[1] > length or relaxed.shape != (n,):
        raise ValueError(f"beta_tolerance: scores {tuple(scores.shape)} must be (N, L, V), drafts "
                         f"{tuple(drafts.shape)} (N, D <= L) and relaxed {tuple(relaxed.shape)} (N,)")
    log_beta = math.log(beta)
    if use_triton([scores, drafts, relaxed], backend):
        from ._tolerance_triton import tolerance_rows

        return tolerance_rows(scores, drafts, log_beta=log_beta, relaxed=relaxed)
    return beta_tolerance_reference(scores, drafts, log_beta, relaxed)
