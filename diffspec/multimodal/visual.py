"""Visual-token bookkeeping for the compressed and self drafters: which prompt slots are visual,
how the target attends to them in the prefill, which ones a drafter keeps.

Scores (:class:`AttentionProbe`): SDPA returns no attention weights, so during the target's prefill
forward pre-hooks on the attention modules of a few decoder layers (``L/4``, ``L/2``, ``3L/4``)
recompute, from the layer's input hidden states, the softmax attention of the last ``rows`` prompt
rows over all prompt keys: ``q_proj``/``k_proj``, the rotary embedding the layer receives
(``position_embeddings``, M-RoPE already merged for Qwen-VL), grouped KV heads repeated, padding and
causality masked. The score of a slot is that attention averaged over heads, rows and layers.
Cost: ``rows x T`` logits per head at 3 layers, a small fraction of the prefill (no eager pass).
Per-head q/k norms (Qwen3-style) are not applied: the score is then a proxy, still exact-safe
since only the drafter uses it.

Example:
    >>> import torch
    >>> visual = torch.tensor([[False, True, True, True, True, False]])
    >>> select_visual(visual, torch.tensor([2])).long().tolist()
    [[0, 1, 0, 1, 0, 0]]
"""

from __future__ import annotations

import math
from contextlib import AbstractContextManager
from typing import Any

import torch

from .drafter import text_mask
from .prune import decoder_of

SELECTIONS = ("uniform", "attention", "mixed")
"""Visual-token selections: evenly spaced, top target attention, or half of each (SpecVLM's two stages)."""


def visual_mask(target: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                model_kwargs: dict[str, Any]) -> torch.Tensor:
    """(B, T) bool: real prompt slots that are visual placeholders (image/video/audio tokens)."""
    return attention_mask.bool() & (text_mask(target, input_ids, attention_mask, model_kwargs) == 0)


def keep_count(visual: torch.Tensor, ratio: float, minimum: int = 1) -> torch.Tensor:
    """(B,) visual tokens kept per row: ``ceil(ratio * n_visual)``, at least ``minimum``, at most ``n_visual``."""
    n = visual.sum(1)
    return torch.minimum(torch.clamp((n * ratio).ceil().long(), min=minimum), n)


def _uniform(visual: torch.Tensor, n_keep: torch.Tensor) -> torch.Tensor:
    n = visual.sum(1, keepdim=True).clamp(min=1)
    rank = visual.long().cumsum(1) - 1  # rank among the row's visual slots
    step = (rank * n_keep[:, None]) // n
    prev = ((rank - 1) * n_keep[:, None]) // n
    return visual & ((rank == 0) & (n_keep[:, None] > 0) | (step != prev))


def _top(visual: torch.Tensor, n_keep: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
    order = torch.argsort(scores.float().masked_fill(~visual, float("-inf")), dim=1, descending=True, stable=True)
    rank = order.argsort(1)
    return visual & (rank < n_keep[:, None])


def select_visual(visual: torch.Tensor, n_keep: torch.Tensor, scores: torch.Tensor | None = None,
                  mode: str = "uniform") -> torch.Tensor:
    """(B, T) bool: the ``n_keep[b]`` visual slots of row ``b`` a drafter keeps.

    ``"uniform"``: evenly spaced along the prompt (raster/frame order); ``"attention"``: the top
    ``scores``; ``"mixed"``: the top ``ceil(n/2)`` by score, the rest evenly spaced over the others.
    """
    if mode == "uniform" or scores is None:
        return _uniform(visual, n_keep)
    if mode == "attention":
        return _top(visual, n_keep, scores)
    top = _top(visual, (n_keep + 1) // 2, scores)
    return top | _uniform(visual & ~top, n_keep - (n_keep + 1) // 2)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    a, b = x.chunk(2, dim=-1)
    return torch.cat([-b, a], dim=-1)


class AttentionProbe(AbstractContextManager):
    """Records the target's prefill attention of the last ``rows`` prompt rows (see module doc).

    Use around exactly one forward; :attr:`scores` is then (B, T), each row summing to ~1.

    Example:
        >>> with AttentionProbe(model, attention_mask) as probe:  # doctest: +SKIP
        ...     model(**inputs)
        >>> probe.scores.shape  # doctest: +SKIP
    """

    def __init__(self, model: Any, attention_mask: torch.Tensor, rows: int = 8) -> None:
        layers = decoder_of(model).layers
        n = len(layers)
        self.layer_ids = sorted({max(0, min(n - 1, (n * i) // 4)) for i in (1, 2, 3)})
        self.attn = [layers[i].self_attn for i in self.layer_ids]
        self.mask = attention_mask.bool()
        self.rows = rows
        self.total: torch.Tensor | None = None
        self.count = 0
        self._handles: list[Any] = []

    def __enter__(self) -> AttentionProbe:
        self._handles = [a.register_forward_pre_hook(self._hook, with_kwargs=True) for a in self.attn]
        return self

    def __exit__(self, *exc: Any) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []

    @property
    def scores(self) -> torch.Tensor:
        if self.total is None:
            raise ValueError("AttentionProbe saw no forward: use it around the target's prefill call")
        return self.total / self.count

    @torch.no_grad()
    def _hook(self, module: Any, args: tuple, kwargs: dict[str, Any]) -> None:
        h = args[0] if args else kwargs["hidden_states"]
        B, T, _ = h.shape
        if T != self.mask.shape[1]:  # not the prefill (decode/verify calls are not scored)
            return
        r = min(self.rows, T)
        d = module.head_dim
        q = module.q_proj(h[:, -r:]).view(B, r, -1, d).transpose(1, 2)
        k = module.k_proj(h).view(B, T, -1, d).transpose(1, 2)
        rope = kwargs.get("position_embeddings")
        if rope is not None:
            cos, sin = (t.unsqueeze(1) for t in rope)
            q = q * cos[..., -r:, :] + _rotate_half(q) * sin[..., -r:, :]
            k = k * cos + _rotate_half(k) * sin
        k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
        logits = (q.float() @ k.float().transpose(-1, -2)) / math.sqrt(d)  # (B, H, r, T)
        causal = torch.arange(T, device=h.device)[None, :] <= torch.arange(T - r, T, device=h.device)[:, None]
        allowed = causal[None, None] & self.mask[:, None, None, :]
        probs = torch.softmax(logits.masked_fill(~allowed, float("-inf")), dim=-1).nan_to_num(0.0)
        score = probs.mean(dim=(1, 2))
        self.total = score if self.total is None else self.total + score
        self.count += 1
