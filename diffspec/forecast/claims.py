"""One set of diffspec hooks per module: a second wrap is refused instead of stacked.

Forecasting replaces ``forward`` on a transformer's blocks (and on a ControlNet) and adds hooks to the
transformer. A second set on the same modules would run inside the first (mixed statistics, forecasts of
forecasts, an exact sampler drawing from a forecast model) and could not be removed in every order. So
the hooks :func:`claim` the modules they attach to and :func:`release` them when detached; a module is
claimed by one owner at a time, wherever it is shared (diffusers' ``DiffusionPipeline.from_pipe`` shares
components between pipelines).

Example:
    >>> import torch
    >>> block, first, second = torch.nn.Linear(2, 2), torch.nn.Identity(), torch.nn.Identity()  # owners: hooks
    >>> claim(block, first, "taylor", "the block")
    >>> claim(block, second, "speca", "the block")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: the block already carries diffspec 'taylor' hooks: ...
    >>> release(block, first); claim(block, second, "speca", "the block")
"""

from __future__ import annotations

import weakref
from typing import Any

from torch import nn

HINT = ("a module takes one diffspec method at a time: call spec.disable() on the SpeculativePipeline that "
        "holds it before wrapping it again (or keep using that one)")

_OWNERS: weakref.WeakKeyDictionary[nn.Module, tuple[weakref.ref, str]] = weakref.WeakKeyDictionary()
"""Claimed module -> (a weak reference to the hooks holding it, their method's name)."""


def _base(module: nn.Module) -> nn.Module:
    return getattr(module, "_orig_mod", module)  # a torch.compile wrapper's module: the one hooks patch


def holder(module: nn.Module) -> str | None:
    """The method whose hooks hold ``module`` (or the module a ``torch.compile`` wrapper holds), None if free."""
    entry = _OWNERS.get(_base(module))
    return entry[1] if entry is not None and entry[0]() is not None else None


def claim(module: nn.Module, owner: Any, method: str, label: str) -> None:
    """Record that ``owner`` (hooks of ``method``) holds ``module``; ``label`` names it in the error.

    Raises:
        ValueError: another live owner holds it, naming ``spec.disable()``.
    """
    module = _base(module)
    entry = _OWNERS.get(module)
    if entry is not None and entry[0]() not in (None, owner):
        raise ValueError(f"{label} already carries diffspec {entry[1]!r} hooks: {HINT}")
    _OWNERS[module] = (weakref.ref(owner), method)


def release(module: nn.Module, owner: Any) -> None:
    """Free ``module`` if ``owner`` holds it."""
    module = _base(module)
    entry = _OWNERS.get(module)
    if entry is not None and entry[0]() in (None, owner):
        del _OWNERS[module]


def check_unclaimed(pipe: Any) -> None:
    """Raise ``ValueError`` naming the first component of ``pipe`` (a diffusers pipeline) that diffspec hooks hold."""
    for name, component in getattr(pipe, "components", {}).items():
        if isinstance(component, nn.Module) and (method := holder(component)) is not None:
            raise ValueError(f"{type(pipe).__name__}.{name} already carries diffspec {method!r} hooks: {HINT}")
