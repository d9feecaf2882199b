"""Config of ``self-draft``: the target drafts for itself (STD style), exact; no second model.

Draft mode runs the target with a subset of its decoder layers (layer skip) and/or attending to
only the top-K visual cache entries plus every text entry (sparse visual KV, ranked once by the
target's prefill attention); verification is the full target in one dense pass. Differences from
STD (ours): one visual index set per row, shared by all layers and heads (STD: per layer/head),
chosen once at prefill (no refresh: every decoded token is text and always kept).

Example:
    >>> from diffspec.multimodal.self_config import SelfDraftConfig
    >>> SelfDraftConfig(draft_layers=(0, 2), visual_top_k=64).sparse_visual
    True
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ..config import check_float, check_int
from .config import DraftConfig


@dataclass(frozen=True)
class SelfDraftConfig(DraftConfig):
    """Self-speculative decoding with sparse visual KV and/or layer skip (method ``self-draft``), exact.

    Args:
        visual_top_k: visual cache entries the draft pass attends to (at least; ``0`` turns the
            sparse KV off). Per row ``K = min(n_visual, max(visual_top_k, ceil(visual_ratio x n_visual)))``.
        visual_ratio: the fraction part of ``K`` in ``[0, 1]`` (STD: ``K = max(512, 0.1 N)``).
        draft_layers: decoder layer indices the draft pass runs (``None``: all); the others are
            skipped (identity), their KV is neither read nor written while drafting.
        score_rows: last prompt rows whose target attention ranks the visual tokens (1-64).
        num_draft_tokens, schedule, max_draft_tokens: as :class:`~diffspec.multimodal.config.DraftConfig`.

    Example:
        >>> SelfDraftConfig(visual_top_k=0, visual_ratio=0.0, draft_layers=(0,)).sparse_visual
        False
    """

    method: ClassVar[str] = "self-draft"

    visual_top_k: int = 512
    visual_ratio: float = 0.1
    draft_layers: tuple[int, ...] | None = None
    score_rows: int = 8

    def __post_init__(self) -> None:
        super().__post_init__()
        check_int("visual_top_k", self.visual_top_k, 0)
        check_float("visual_ratio", self.visual_ratio, 0.0, 1.0)
        check_int("score_rows", self.score_rows, 1, 64)
        if self.draft_layers is not None:
            layers = tuple(self.draft_layers)
            if not layers or any(isinstance(i, bool) or not isinstance(i, int) or i < 0 for i in layers) \
                    or len(set(layers)) != len(layers):
                raise ValueError(f"draft_layers={self.draft_layers!r} is not allowed: a non-empty tuple of distinct "
                                 "layer indices >= 0, or None (all layers)")
            object.__setattr__(self, "draft_layers", tuple(sorted(layers)))
        if self.visual_top_k == 0 and self.visual_ratio == 0 and self.draft_layers is None:
            raise ValueError("self-draft with visual_top_k=0, visual_ratio=0 and draft_layers=None drafts with the "
                             "full target: set visual_top_k/visual_ratio (sparse visual KV) or draft_layers (layer skip)")

    @property
    def sparse_visual(self) -> bool:
        """Whether the draft pass attends to a top-K subset of the visual cache."""
        return self.visual_top_k > 0 or self.visual_ratio > 0
