"""tqdm progress bars for long work, silenced globally like diffusers' ``disable_progress_bar``."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from tqdm.auto import tqdm

_enabled = True


def disable_progress_bar() -> None:
    """Silence every diffspec progress bar (generation batches, benchmarks)."""
    global _enabled
    _enabled = False


def enable_progress_bar() -> None:
    """Show diffspec progress bars again."""
    global _enabled
    _enabled = True


def progress(iterable: Iterable[Any] | None = None, **kwargs: Any) -> tqdm:
    """A tqdm bar that honours :func:`disable_progress_bar` (``disable=`` may still force it off)."""
    kwargs["disable"] = kwargs.get("disable", False) or not _enabled
    return tqdm(iterable, **kwargs)
