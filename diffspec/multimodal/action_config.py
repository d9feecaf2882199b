"""Config of ``relaxed-action``: tolerance acceptance of drafted VLA action tokens.

Example:
    >>> from diffspec.multimodal.action_config import RelaxedActionConfig
    >>> RelaxedActionConfig(tolerance=3, draft_source="kalman").exact
    False
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ..config import MethodConfig, check_choice, check_float, check_int

DRAFT_SOURCES = ("previous", "kalman", "model")
"""Where the drafted action comes from: the previous action's bins, a constant-velocity Kalman
extrapolation of the last actions, or a drafter model (``draft=`` of ``from_pipe``)."""


@dataclass(frozen=True)
class RelaxedActionConfig(MethodConfig):
    """Draft a whole action, verify it in one target pass, accept bins within ``tolerance`` (method ``relaxed-action``).

    Every action step drafts all ``n_dof`` tokens, appends them to the prompt and runs the
    target once: its argmax at every position is read. Draft ``i`` is accepted while
    ``|bin(target_i) - bin(draft_i)| <= tolerance`` (the draft token is kept; a non-action
    target token never accepts); at the first rejection the target's own token is emitted and
    the remaining drafts are verified in the next pass. ``tolerance=0`` is exact greedy
    decoding (identical tokens to plain ``generate``); otherwise each accepted token is within
    ``tolerance * bin_width`` of the target's greedy value given the same prefix.

    Args:
        tolerance: ``r`` in bins (0 = exact greedy; Spec-VLA's default is 9).
        draft_source: ``"previous"``, ``"kalman"`` or ``"model"`` (needs ``draft=<model>``).
        n_dof: action tokens per step (7 for OpenVLA).
        n_bins: bins per DoF (the last ``n_bins`` vocabulary ids).
        kalman_context: the last actions the Kalman filter runs over.
        process_noise: Kalman process noise (velocity random walk variance, normalised units).
        measurement_noise: Kalman measurement noise variance (normalised units).

    Example:
        >>> RelaxedActionConfig(tolerance=9).tolerance
        9
    """

    method: ClassVar[str] = "relaxed-action"
    family: ClassVar[str] = "multimodal"
    exact: ClassVar[bool] = False

    tolerance: int = 0
    draft_source: str = "previous"
    n_dof: int = 7
    n_bins: int = 256
    kalman_context: int = 10
    process_noise: float = 1e-3
    measurement_noise: float = 1e-4

    def __post_init__(self) -> None:
        check_int("tolerance", self.tolerance, 0, 255)
        check_choice("draft_source", self.draft_source, DRAFT_SOURCES)
        check_int("n_dof", self.n_dof, 1, 64)
        check_int("n_bins", self.n_bins, 2, 65536)
        check_int("kalman_context", self.kalman_context, 2, 1000)
        check_float("process_noise", self.process_noise, 0.0, lo_open=True)
        check_float("measurement_noise", self.measurement_noise, 0.0, lo_open=True)
        if self.tolerance >= self.n_bins:
            raise ValueError(f"tolerance={self.tolerance} is out of range: allowed [0, n_bins - 1 = {self.n_bins - 1}]")
