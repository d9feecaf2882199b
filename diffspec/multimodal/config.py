"""Configs of the exact multimodal draft methods: ``draft`` and ``text-draft``.

Both run the shared draft/verify loop (:mod:`diffspec.multimodal.loop`) with a drafter model
that shares the target's tokenizer. ``draft`` feeds the drafter everything the target gets
(pixels included) when the drafter is a VLM, and only the text tokens when it is a text LM;
``text-draft`` always feeds it the text tokens only (visual placeholder tokens masked out).

Example:
    >>> from diffspec.multimodal.config import DraftConfig
    >>> DraftConfig(num_draft_tokens=4, schedule="heuristic").max_draft_tokens
    16
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ..config import MethodConfig, check_choice, check_int

SCHEDULES = ("constant", "heuristic")
"""Draft-length schedules: fixed ``k``, or transformers' heuristic (+2 after a full accept, -1 otherwise)."""


@dataclass(frozen=True)
class DraftConfig(MethodConfig):
    """Classic speculative decoding with a smaller same-tokenizer drafter (method ``draft``), exact.

    Args:
        num_draft_tokens: draft length ``k`` per round (the start value for ``"heuristic"``).
        schedule: ``"constant"`` or ``"heuristic"`` (transformers' ``num_assistant_tokens_schedule``:
            ``k += 2`` when every active row accepted all drafts, else ``k -= 1``, kept in
            ``[1, max_draft_tokens]``).
        max_draft_tokens: upper bound of ``k`` under the heuristic schedule.

    Example:
        >>> DraftConfig(num_draft_tokens=3).schedule
        'constant'
    """

    method: ClassVar[str] = "draft"
    family: ClassVar[str] = "multimodal"
    exact: ClassVar[bool] = True
    text_only: ClassVar[bool] = False

    num_draft_tokens: int = 5
    schedule: str = "constant"
    max_draft_tokens: int = 16

    def __post_init__(self) -> None:
        check_int("num_draft_tokens", self.num_draft_tokens, 1, 64)
        check_choice("schedule", self.schedule, SCHEDULES)
        check_int("max_draft_tokens", self.max_draft_tokens, 1, 64)
        if self.max_draft_tokens < self.num_draft_tokens:
            raise ValueError(f"max_draft_tokens={self.max_draft_tokens!r} is out of range: allowed "
                             f"[num_draft_tokens={self.num_draft_tokens}, 64]")


@dataclass(frozen=True)
class TextDraftConfig(DraftConfig):
    """A text-only drafter for a VLM (method ``text-draft``), exact: it never sees visual tokens.

    The visual placeholder tokens of the prompt are masked out of the drafter's input (attention
    mask 0, gap-free positions) and no pixel input, ``mm_token_type_ids`` or grid reaches it, so
    a plain LM with the target's vocabulary drafts for LLaVA or Qwen2-VL alike.

    Example:
        >>> TextDraftConfig().method
        'text-draft'
    """

    method: ClassVar[str] = "text-draft"
    text_only: ClassVar[bool] = True
