"""How peaked an AR image model's next-token laws are: per-token entropy and top-1 probability.

Speculative Jacobi decoding accepts more when the target's per-token laws are peaked; real
models have top-1 probabilities below 5 % for most tokens. These statistics describe a target at
given sampling settings (pass logits after CFG mixing and the warpers you sample with).

Example:
    >>> import torch
    >>> stats = entropy_summary(torch.zeros(2, 3, 4))   # uniform over 4 tokens
    >>> round(stats["mean_entropy_nats"], 4), stats["median_top1_prob"], stats["frac_top1_gt_0_9"]
    (1.3863, 0.25, 0.0)
"""

from __future__ import annotations

import torch


def per_token_entropy(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Entropy (nats) and top-1 probability of each row of ``logits`` (..., V).

    ``-inf`` logits (masked by top-k/top-p) count as zero probability.

    Example:
        >>> h, top1 = per_token_entropy(torch.tensor([[0.0, float("-inf")]]))
        >>> h.tolist(), top1.tolist()
        ([0.0], [1.0])
    """
    logp = torch.log_softmax(logits.float(), dim=-1)
    p = logp.exp()
    entropy = 0.0 - (p * logp.masked_fill(p == 0, 0.0)).sum(-1)  # 0.0 - x: no negative zero
    return entropy, p.amax(-1)


def summarize_entropy(entropy: torch.Tensor, top1: torch.Tensor, threshold: float = 0.9) -> dict[str, float]:
    """Summary of per-token ``entropy`` (nats) and ``top1`` probabilities (any equal shapes).

    Returns:
        ``mean_entropy_nats``, ``median_entropy_nats``, ``median_top1_prob``, ``mean_top1_prob``,
        ``frac_top1_gt_0_9`` (fraction of tokens whose top-1 probability exceeds ``threshold``),
        ``frac_top1_lt_0_05`` and ``rows`` (tokens summarised).

    Example:
        >>> summarize_entropy(torch.tensor([0.0, 1.0]), torch.tensor([1.0, 0.5]))["frac_top1_gt_0_9"]
        0.5
    """
    entropy, top1 = entropy.flatten().double(), top1.flatten().double()
    return {
        "mean_entropy_nats": float(entropy.mean()),
        "median_entropy_nats": float(entropy.median()),
        "median_top1_prob": float(top1.median()),
        "mean_top1_prob": float(top1.mean()),
        "frac_top1_gt_0_9": float((top1 > threshold).double().mean()),
        "frac_top1_lt_0_05": float((top1 < 0.05).double().mean()),
        "rows": int(top1.numel()),
    }


def entropy_summary(logits: torch.Tensor, threshold: float = 0.9) -> dict[str, float]:
    """:func:`summarize_entropy` of every row of ``logits`` (..., V) (see the module example)."""
    return summarize_entropy(*per_token_entropy(logits), threshold=threshold)


__all__ = ["entropy_summary", "per_token_entropy", "summarize_entropy"]
