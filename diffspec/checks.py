"""Value checks shared by the method configs, the pipeline call and the ComfyUI nodes.

Each raises ``ValueError`` naming the field (or argument), the bad value and what is allowed, so a
user can fix a call without reading the source. NaN is never a valid number; infinities only where a
field documents a meaning for them (``allow_inf``).

A call to a :class:`~diffspec.api.SpeculativePipeline` checks its arguments with
:func:`check_finite_arguments`: a NaN compares false with every threshold, so ``guidance_scale=nan`` runs a
diffusers pipeline as if guidance were off (``guidance_scale > 1`` is false), and one NaN in ``latents``
spreads to the whole output.

Example:
    >>> check_float("beta", 0.5, 0.0, 1.0)
    >>> check_float("beta", float("inf"), 0.0)
    Traceback (most recent call last):
    ...
    ValueError: beta=inf is not finite: allowed [0.0, inf)
    >>> check_finite_arguments({"guidance_scale": float("nan")})
    Traceback (most recent call last):
    ...
    ValueError: guidance_scale=nan is not finite: pass a finite number
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import torch


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


UNCHECKED_SUFFIXES = ("mask",)
"""Arguments left unchecked, by name suffix: additive attention masks may hold ``-inf`` on purpose."""

_POSITIONAL = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)


def named_arguments(callables: Sequence[Callable[..., Any]], args: tuple, kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """``kwargs`` plus ``args`` under their parameter names, read from the first of ``callables`` whose signature
    names positional parameters (``argument i`` where none does).

    Example:
        >>> named_arguments([lambda prompt, steps=2: None], ("a fox",), {"guidance_scale": 2.0})
        {'prompt': 'a fox', 'guidance_scale': 2.0}
    """
    names: list[str] = []
    for fn in callables:
        try:
            names = [p.name for p in inspect.signature(fn).parameters.values() if p.kind in _POSITIONAL]
        except (TypeError, ValueError):  # no signature to read
            continue
        if names:
            break
    named = {names[i] if i < len(names) else f"argument {i}": a for i, a in enumerate(args)}
    return {**named, **kwargs}


def check_finite_arguments(arguments: Mapping[str, Any]) -> None:
    """Raise ``ValueError`` naming the first argument that is, or holds, a NaN or an infinity.

    Checked: floats, floating-point (and complex) tensors and NumPy arrays, and those inside lists, tuples and
    dicts (``sigmas=[...]``, ``ip_adapter_image_embeds=[tensor]``, ``joint_attention_kwargs={"scale": ...}``).
    Arguments named ``*mask`` are not (:data:`UNCHECKED_SUFFIXES`).
    """
    for name, value in arguments.items():
        if not name.endswith(UNCHECKED_SUFFIXES):
            _check(name, value, depth=0)


def _check(name: str, value: Any, depth: int) -> None:
    if isinstance(value, (float, np.floating)):
        if not math.isfinite(value):
            raise ValueError(f"{name}={float(value)!r} is not finite: pass a finite number")
    elif isinstance(value, torch.Tensor):
        if (value.is_floating_point() or value.is_complex()) and value.device.type != "meta":
            finite = torch.isfinite(value)
            if not bool(finite.all()):
                raise ValueError(f"{name} holds {int((~finite).sum())} non-finite value(s) (NaN or Inf) among its "
                                 f"{value.numel()}: pass finite values")
    elif isinstance(value, np.ndarray):
        if value.dtype.kind in "fc" and not np.isfinite(value).all():
            raise ValueError(f"{name} holds {int((~np.isfinite(value)).sum())} non-finite value(s) (NaN or Inf) "
                             f"among its {value.size}: pass finite values")
    elif depth < 2 and isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            _check(f"{name}[{i}]", item, depth + 1)
    elif depth < 2 and isinstance(value, dict):
        for key, item in value.items():
            if not (isinstance(key, str) and key.endswith(UNCHECKED_SUFFIXES)):
                _check(f"{name}[{key!r}]", item, depth + 1)
