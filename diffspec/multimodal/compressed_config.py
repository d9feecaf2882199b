"""Config of ``compressed-draft``: a same-family smaller VLM drafts on a pruned visual context, exact.

The drafter's vision tower encodes the full image/video; its language model then sees only a
fraction of the visual tokens (pruned right after the merge of visual features into the prompt
embeddings), each kept token at its original position (1-D or M-RoPE), so the drafter's prefill and
every draft step attend over ``text + ratio x visual`` slots. Image tokens are kept evenly spaced
by default; video tokens by the target's prefill attention plus an even spread (SpecVLM's two
stages; scores from :class:`~diffspec.multimodal.visual.AttentionProbe`). The target verifies every
draft with its full context, so the output is the target's. Tokens are pruned, not pooled (a kept
token keeps its own feature and position). The drafter must lay the prompt out as the target does
(same family and processor: same number of visual tokens), else a ``ValueError`` says so.

Example:
    >>> from diffspec.multimodal.compressed_config import CompressedDraftConfig
    >>> CompressedDraftConfig(video_keep=0.2).video_selection
    'mixed'
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ..config import check_choice, check_float, check_int
from .config import DraftConfig
from .visual import SELECTIONS


@dataclass(frozen=True)
class CompressedDraftConfig(DraftConfig):
    """A smaller VLM drafter on pruned visual tokens (method ``compressed-draft``), exact.

    Args:
        image_keep: fraction of each row's image tokens the drafter keeps, in ``(0, 1]``.
        video_keep: fraction of each row's video tokens the drafter keeps, in ``(0, 1]``.
        image_selection: ``"uniform"`` (evenly spaced, default), ``"attention"`` (top target
            attention) or ``"mixed"`` (half each).
        video_selection: as ``image_selection``; default ``"mixed"``.
        score_rows: last prompt rows whose target attention ranks the visual tokens (1-64).
        num_draft_tokens, schedule, max_draft_tokens: as :class:`~diffspec.multimodal.config.DraftConfig`.

    Example:
        >>> CompressedDraftConfig(image_keep=0.5, image_selection="attention").method
        'compressed-draft'
    """

    method: ClassVar[str] = "compressed-draft"

    image_keep: float = 0.25
    video_keep: float = 0.1
    image_selection: str = "uniform"
    video_selection: str = "mixed"
    score_rows: int = 8

    def __post_init__(self) -> None:
        super().__post_init__()
        check_float("image_keep", self.image_keep, 0.0, 1.0, lo_open=True)
        check_float("video_keep", self.video_keep, 0.0, 1.0, lo_open=True)
        check_choice("image_selection", self.image_selection, SELECTIONS)
        check_choice("video_selection", self.video_selection, SELECTIONS)
        check_int("score_rows", self.score_rows, 1, 64)

    @property
    def needs_scores(self) -> bool:
        """Whether a selection ranks tokens by the target's prefill attention."""
        return self.image_selection != "uniform" or self.video_selection != "uniform"
