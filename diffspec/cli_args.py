"""Argument types, the parser class and the override syntax of ``diffspec``'s commands (torch-free, so that
``diffspec --help`` starts at once).

Example:
    >>> parse_overrides(["interval=4", "form=taylor"])
    {'interval': 4, 'form': 'taylor'}
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

from .batch.items import MAX_SIDE, shorten

DTYPES = ("float32", "float16", "bfloat16")


class UsageError(Exception):
    """Bad command-line input: reported as one line, exit code 2."""


class Parser(argparse.ArgumentParser):
    """One-line errors (:class:`UsageError`); a help text that needs heavy imports (the method registry) is set
    on an action as ``action.help_fn`` and computed only when the help is shown."""

    def error(self, message: str) -> NoReturn:  # one line instead of usage + message
        raise UsageError(f"{message} (see `{self.prog} --help`)")

    def format_help(self) -> str:
        for action in self._actions:
            fill: Callable[[], str] | None = getattr(action, "help_fn", None)
            if fill is not None:
                action.help, action.help_fn = fill(), None  # type: ignore[attr-defined]
        return super().format_help()


def parse_overrides(pairs: Sequence[str]) -> dict[str, Any]:
    """``["interval=4", "form=taylor"]`` → ``{"interval": 4, "form": "taylor"}`` (ints, floats, bools parsed)."""
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep or not key:
            raise UsageError(f"--set expects KEY=VALUE, got {pair!r}")
        value: Any = raw
        if raw.lower() in ("true", "false"):
            value = raw.lower() == "true"
        else:
            for cast in (int, float):
                try:
                    value = cast(raw)
                    break
                except ValueError:
                    continue
        out[key] = value
    return out


def step_counts(text: str) -> int | list[int]:
    """``"100"`` -> 100; ``"50,100,250"`` -> a sweep (exact-diffusion)."""
    values = positive_list(text)
    return values[0] if len(values) == 1 else values


def positive_list(text: str) -> list[int]:
    """``"12,18"`` -> ``[12, 18]`` (each >= 1)."""
    return [positive(v) for v in text.split(",") if v.strip()]


def positive(text: str) -> int:
    """An integer >= 1."""
    return integer(text, 1)


def non_negative(text: str) -> int:
    """An integer >= 0."""
    return integer(text, 0)


def pixels(text: str) -> int:
    """An image side in pixels: 1 to ``MAX_SIDE``."""
    return integer(text, 1, MAX_SIDE)


def integer(text: str, lo: int, hi: int | None = None) -> int:
    """An integer in ``[lo, hi]`` (``hi`` None: no upper bound)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{shorten(text)} is not an integer") from None
    if value < lo or (hi is not None and value > hi):
        allowed = f">= {lo}" if hi is None else f"{lo} to {hi}"
        raise argparse.ArgumentTypeError(f"{value} is out of range; must be {allowed}")
    return value


def quality(text: str) -> str | float:
    """``--quality``: a preset name, or a number of dB (checked by ``AutoConfig``).

    Example:
        >>> quality("balanced"), quality("35")
        ('balanced', 35.0)
    """
    try:
        return float(text)
    except ValueError:
        return text


def finite(text: str) -> float:
    """A finite number (``nan`` and ``inf`` are refused)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{shorten(text)} is not a number") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{shorten(text)} is not a finite number")
    return value


def resolve_device(name: str | None) -> str:
    """``--device``: checked against torch (imported here); default cuda when available, else cpu."""
    import torch

    if name is None:
        return "cuda" if torch.cuda.is_available() else "cpu"
    try:
        dev = torch.device(name)
    except RuntimeError:
        raise UsageError(f"--device {name!r} is not a torch device (cpu, cuda, cuda:1, ...)") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise UsageError(f"--device {name}: CUDA is not available on this machine; use --device cpu")
    return name


def diffusion_methods_help() -> str:
    """``generate --method``'s help: the registry's diffusion methods (imports it, so only when help is shown)."""
    from .api import methods

    names = ", ".join(m.name for m in methods("diffusion", available_only=True))
    return f"acceleration method: {names}; or 'none' for the plain pipeline (default taylor; see docs/stats.md)"
