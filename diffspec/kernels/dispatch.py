"""Backend choice for every kernel entry point: the Triton kernel or its torch reference.

``backend=None`` (auto) picks Triton when ``triton`` imports, every tensor argument is on CUDA
and the environment variable ``DIFFSPEC_KERNELS`` is not ``"0"``; otherwise the torch
reference. ``backend="torch"`` forces the reference; ``backend="triton"`` forces the kernel (on
CPU only under Triton's interpreter, ``TRITON_INTERPRET=1`` set before triton is imported).

Triton is imported lazily (:func:`triton_available`), so ``import diffspec`` never needs it.

Example:
    >>> import torch
    >>> use_triton([torch.zeros(2)], None)
    False
"""

from __future__ import annotations

import functools
import importlib.util
import os
from collections.abc import Iterable

import torch

BACKENDS = ("torch", "triton")
"""Explicit ``backend=`` values (``None`` = auto)."""


@functools.lru_cache(maxsize=1)
def triton_available() -> bool:
    """Whether ``triton`` is installed (the import itself is left to the kernel modules)."""
    return importlib.util.find_spec("triton") is not None


def interpreting() -> bool:
    """Whether Triton runs kernels in its CPU interpreter (``TRITON_INTERPRET=1``)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def kernels_enabled() -> bool:
    """``False`` when ``DIFFSPEC_KERNELS=0`` forces the torch references everywhere."""
    return os.environ.get("DIFFSPEC_KERNELS", "1") != "0"


def use_triton(tensors: Iterable[torch.Tensor | None], backend: str | None) -> bool:
    """Resolve ``backend`` for a call on ``tensors`` (``None`` entries are ignored).

    Args:
        tensors: the call's tensor arguments.
        backend: ``None`` (auto), ``"torch"`` or ``"triton"``.

    Returns:
        ``True`` to run the Triton kernel, ``False`` for the torch reference.

    Raises:
        ValueError: unknown backend, or ``"triton"`` asked where it cannot run (not installed, or
            CPU tensors without ``TRITON_INTERPRET=1``).
    """
    if backend is not None and backend not in BACKENDS:
        raise ValueError(f"backend={backend!r} is not supported: choose None (auto), 'torch' or 'triton'")
    if backend == "torch":
        return False
    present = [t for t in tensors if t is not None]
    on_cuda = bool(present) and all(t.is_cuda for t in present)
    if backend is None:
        return on_cuda and kernels_enabled() and triton_available()
    if not triton_available():
        raise ValueError("backend='triton' needs the triton package: pip install 'diffspec[cuda]'")
    if not on_cuda and not interpreting():
        raise ValueError("backend='triton' on CPU tensors needs Triton's interpreter: set TRITON_INTERPRET=1 "
                         "before triton is imported, or move the tensors to CUDA, or use backend='torch'")
    return True
