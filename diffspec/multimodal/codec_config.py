"""Config of ``relaxed-codec``: speculative decoding of multi-codebook codec LMs (MusicGen), relaxed.

Example:
    >>> from diffspec.multimodal.codec_config import RelaxedCodecConfig
    >>> RelaxedCodecConfig(beta=1.0).is_exact_limit
    True
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ..config import MethodConfig, check_float, check_int


@dataclass(frozen=True)
class RelaxedCodecConfig(MethodConfig):
    """Frame drafts from a smaller codec LM, one verification pass, tolerance ``beta`` on later codebooks.

    A drafted frame (one token per codebook) is accepted when every codebook passes: the first
    ``exact_codebooks`` codebooks need the target's greedy token exactly; the others accept the
    draft token ``d`` when ``p_target(d) >= beta * max_v p_target(v)`` (SSD-style tolerance in the
    greedy setting, ours) and **keep the draft token**. ``beta=1`` is the exact limit: the output
    equals plain greedy ``generate`` token for token. Lower ``beta`` accepts more frames and changes
    some tokens of codebooks >= ``exact_codebooks``; the pipeline reports how many.

    Args:
        num_draft_tokens: frames drafted per round.
        beta: tolerance in ``(0, 1]``; 1 = exact greedy.
        exact_codebooks: leading codebooks verified exactly (at least the first, the coarsest).

    Example:
        >>> RelaxedCodecConfig(num_draft_tokens=3, beta=0.3).exact
        False
    """

    method: ClassVar[str] = "relaxed-codec"
    family: ClassVar[str] = "multimodal"
    exact: ClassVar[bool] = False

    num_draft_tokens: int = 4
    beta: float = 0.5
    exact_codebooks: int = 1

    def __post_init__(self) -> None:
        check_int("num_draft_tokens", self.num_draft_tokens, 1, 64)
        check_float("beta", self.beta, 0.0, 1.0, lo_open=True)
        check_int("exact_codebooks", self.exact_codebooks, 1, 64)

    @property
    def is_exact_limit(self) -> bool:
        """Whether this config reproduces plain greedy decoding exactly (``beta == 1``)."""
        return self.beta == 1.0
