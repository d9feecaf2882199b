"""Public names that import their module on first use (PEP 562), so that ``import diffspec`` and the CLI's
``--help`` stay light: torch, diffusers and transformers load only with the code that needs them.

Example:
    >>> __getattr__, __dir__ = lazy_exports("diffspec", {"SpecStats": ".stats"})  # in a package's __init__.py
    >>> __getattr__("SpecStats").__name__
    'SpecStats'
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable
from typing import Any


def lazy_exports(package: str, exports: dict[str, str]) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``(__getattr__, __dir__)`` for ``package``: ``exports`` maps each public name to its module (relative to
    ``package``), imported when the name is first read and then cached in the package's namespace."""

    def __getattr__(name: str) -> Any:
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module, package), name)
        setattr(sys.modules[package], name, value)
        return value

    def __dir__() -> list[str]:
        return sorted({*vars(sys.modules[package]), *exports})

    return __getattr__, __dir__
