"""Latent neighbourhoods of VQ codes (LANTERN): the ``k`` nearest codes of every code.

A code's neighbourhood ``A_k(x)`` is the ``k`` codes closest to ``x`` in the image tokenizer's
codebook (L2 distance, ``x`` itself excluded), sorted nearest first. Only ``k`` columns are kept
and distances are computed a block of rows at a time, so a 16384-code LlamaGen codebook never
materialises a ``V x V`` matrix. LlamaGen matches l2-normalised codes, so its rows are normalised
first (``normalize=True``).

Example:
    >>> codebook = torch.tensor([[0.0], [1.0], [3.0], [10.0]])
    >>> latent_neighbours(codebook, k=2).tolist()
    [[1, 2], [0, 2], [1, 0], [2, 1]]
"""

from __future__ import annotations

from typing import Any

import torch


def latent_neighbours(codebook: torch.Tensor, k: int, normalize: bool = False, chunk: int = 1024) -> torch.Tensor:
    """``(V, k)`` long tensor: row ``x`` lists the ``k`` codes nearest to code ``x`` (self excluded).

    Args:
        codebook: ``(V, D)`` code vectors.
        k: neighbours per code, ``1 <= k <= V - 1``.
        normalize: l2-normalise the codes first (LlamaGen's quantizer).
        chunk: rows of the distance matrix computed at once (memory ``chunk x V``).

    Raises:
        ValueError: ``k`` out of range (named with the allowed range).
    """
    vocab = codebook.shape[0]
    if not 1 <= k <= vocab - 1:
        raise ValueError(f"k={k} is out of range; must be in [1, {vocab - 1}] (codebook_size - 1)")
    codes = codebook.detach().float()
    if normalize:
        codes = torch.nn.functional.normalize(codes, dim=-1)
    out = torch.empty(vocab, k, dtype=torch.long, device=codes.device)
    for lo in range(0, vocab, chunk):  # blocks of rows: memory chunk x V, never V x V
        rows = codes[lo: lo + chunk]
        dist = torch.cdist(rows, codes)
        self_idx = torch.arange(lo, lo + rows.shape[0], device=codes.device)
        dist[torch.arange(rows.shape[0], device=codes.device), self_idx] = float("inf")
        out[lo: lo + rows.shape[0]] = dist.topk(k, dim=-1, largest=False, sorted=True).indices
    return out


def target_neighbours(target: Any, k: int) -> torch.Tensor:
    """Neighbourhoods of a target's codebook (``target.codebook``), normalised for LlamaGen's VQ.

    ``k`` is capped at ``codebook_size - 1``. The result is cached on the target per ``k``.

    Raises:
        ValueError: the target exposes no codebook.
    """
    try:
        codebook = target.codebook
    except (AttributeError, ValueError) as err:
        raise ValueError(f"{type(target).__name__} exposes no VQ codebook (target.codebook): LANTERN needs one "
                         f"for its latent neighbourhoods ({err})") from err
    k = min(k, codebook.shape[0] - 1)
    cache = target.__dict__.setdefault("_lantern_neighbours", {})
    if k not in cache:
        decoder_cfg = getattr(getattr(target, "decoder", None), "config", None)
        normalize = bool(getattr(decoder_cfg, "codebook_l2_norm", False))
        cache[k] = latent_neighbours(codebook.to(target.device), k, normalize=normalize)
    return cache[k]
