"""Choosing the cache granularity and order under a memory budget (``max_cache_gb``)."""

from __future__ import annotations

import warnings
from typing import Any


def cache_candidates(granularity: str, order: int, module_ok: bool) -> list[tuple[str, int]]:
    """``(granularity, order)`` choices, most faithful first.

    ``"auto"`` prefers the module granularity at the configured order, then the block
    granularity at decreasing orders; an explicit granularity only lowers the order.
    """
    lower = list(range(order, -1, -1))
    if granularity == "module":
        return [("module", o) for o in lower]
    if granularity == "auto" and module_ok:
        return [("module", order)] + [("block", o) for o in lower]
    return [("block", o) for o in lower]


def choose_cache(granularity: str, order: int, max_cache_gb: float | None, level_bytes: dict[str, int],
                 module_ok: bool) -> tuple[str, int]:
    """The first candidate whose anchors, ``(order + 1) * level_bytes[granularity]``, fit the budget.

    Args:
        granularity: the configured ``"block"``, ``"module"`` or ``"auto"``.
        order: the configured order.
        max_cache_gb: the budget in GB (None: no budget, the first candidate).
        level_bytes: bytes of one anchor level per granularity, measured on the first step.
        module_ok: whether every block has a module table.

    Example:
        >>> choose_cache("auto", 2, 1.0, {"module": 6e8, "block": 1e8}, True)
        ('block', 2)
    """
    candidates = cache_candidates(granularity, order, module_ok)
    if max_cache_gb is None:
        return candidates[0]
    for g, o in candidates:
        if (o + 1) * level_bytes.get(g, 0) <= max_cache_gb * 1e9:
            return g, o
    g, o = candidates[-1]
    warnings.warn(f"max_cache_gb={max_cache_gb}: even granularity={g!r}, order={o} needs "
                  f"{(o + 1) * level_bytes.get(g, 0) / 1e9:.2f} GB; using it anyway", stacklevel=3)
    return g, o


def settle_cache(forecasters: list[dict[str, Any]], config: Any, module_ok: bool) -> tuple[str, int, dict[str, int]]:
    """Choose from the first step's anchors and apply the choice to every forecaster dict, in place.

    ``forecasters``: per block-list state, ``{key: TaylorForecaster}`` where module anchors' keys start
    with ``"m"``. The other granularity's forecasters are dropped and the kept ones set to the order.

    Returns:
        ``(granularity, order, bytes of one anchor level per granularity)``.
    """
    level = {"module": 0, "block": 0}
    for table in forecasters:
        for key, f in table.items():
            level["module" if key.startswith("m") else "block"] += f.nbytes
    granularity, order = choose_cache(config.granularity, config.order, config.max_cache_gb, level, module_ok)
    for table in forecasters:
        for key in [k for k in table if k.startswith("m") != (granularity == "module")]:
            del table[key]
        for f in table.values():
            f.set_order(order)
    return granularity, order, level
