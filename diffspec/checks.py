"""Value checks shared by the method configs and the ComfyUI nodes.

Each raises ``ValueError`` naming the field (or argument), the bad value and what is allowed, so a
user can fix a call without reading the source. NaN is never a valid number; infinities only where a
field documents a meaning for them (``allow_inf``).

Example:
    >>> check_float("beta", 0.5, 0.0, 1.0)
    >>> check_float("beta", float("inf"), 0.0)
    Traceback (most recent call last):
    ...
    ValueError: beta=inf is not finite: allowed [0.0, inf)
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any


def check_int(name: str, value: Any, lo: int, hi: int | None = None) -> None:
    """Raise ``ValueError`` unless ``value`` is an int in ``[lo, hi]`` (``hi=None``: unbounded)."""
    upper = "inf" if hi is None else str(hi)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name}={value!r} must be an integer in [{lo}, {upper}]")
    if value < lo or (hi is not None and value > hi):
        raise ValueError(f"{name}={value!r} is out of range: allowed [{lo}, {upper}]")


def check_float(name: str, value: Any, lo: float, hi: float = math.inf, *, lo_open: bool = False,
                allow_inf: bool = False) -> None:
    """Raise ``ValueError`` unless ``value`` is a real number in ``[lo, hi]`` (or ``(lo, hi]``): NaN never,
    infinities only with ``allow_inf`` (where ``inf`` has a documented meaning)."""
    allowed = f"{'(' if lo_open else '['}{lo}, {hi}{']' if allow_inf or math.isfinite(hi) else ')'}"
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
        raise ValueError(f"{name}={value!r} must be a number in {allowed}")
    if math.isinf(value) and not allow_inf:
        raise ValueError(f"{name}={value!r} is not finite: allowed {allowed}")
    if value > hi or value < lo or (lo_open and value == lo):
        raise ValueError(f"{name}={value!r} is out of range: allowed {allowed}")


def check_bool(name: str, value: Any) -> None:
    """Raise ``ValueError`` naming ``name`` unless ``value`` is ``True`` or ``False``."""
    if not isinstance(value, bool):
        raise ValueError(f"{name}={value!r} must be True or False")


def check_choice(name: str, value: Any, choices: Iterable[str]) -> None:
    """Raise ``ValueError`` unless ``value`` is one of ``choices``."""
    choices = tuple(choices)
    if value not in choices:
        raise ValueError(f"{name}={value!r} is not supported: choose one of {', '.join(map(repr, choices))}")


def check_names(name: str, value: Any) -> tuple[str, ...] | None:
    """``value`` as a tuple of non-empty strings (None stays None); ``ValueError`` otherwise."""
    if value is None:
        return None
    if isinstance(value, str):
        value = (value,)
    if not isinstance(value, (tuple, list)) or not value or not all(isinstance(v, str) and v for v in value):
        raise ValueError(f"{name}={value!r} must be a non-empty tuple of attribute names (strings)")
    return tuple(value)


def check_steps(name: str, value: Any) -> tuple[int, ...] | None:
    """None, or a non-empty collection of distinct step indices >= 0, returned sorted as a tuple."""
    if value is None:
        return None
    if isinstance(value, (str, bytes)) or not hasattr(value, "__iter__"):
        raise ValueError(f"{name}={value!r} must be a list of step indices (ints >= 0) or None")
    steps = list(value)
    if not steps or any(isinstance(v, bool) or not isinstance(v, int) or v < 0 for v in steps):
        raise ValueError(f"{name}={value!r} must be a non-empty list of step indices (ints >= 0) or None")
    if len(set(steps)) != len(steps):
        raise ValueError(f"{name}={value!r} repeats a step; each step index may appear once")
    return tuple(sorted(steps))
