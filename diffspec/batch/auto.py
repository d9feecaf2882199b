"""``diffspec generate --method auto``: items get the method chosen for their settings before they are keyed.

Items with method ``auto`` that share their call settings and ``quality`` are one group: the group's own prompts
(or class labels) tune the choice (:class:`~diffspec.pipelines.auto.AutoPipeline`, cached on disk, so a rerun
measures nothing), and each item then carries the chosen method and config, which its manifest line records.

Example:
    >>> items, choices = resolve_auto(pipe, items)  # doctest: +SKIP
    >>> items[0].method, choices[0]["psnr"], choices[0]["speedup"]  # doctest: +SKIP
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from typing import Any

from .adapter import PipelineAdapter
from .items import GenItem


def resolve_auto(pipe: Any, items: Sequence[GenItem]) -> tuple[list[GenItem], list[dict[str, Any]]]:
    """``items`` with every ``auto`` item given its chosen method and config; also the choices made.

    Raises:
        ValueError: a quality no method reaches on this model (the best reachable one in the message).
    """
    from ..api import SpeculativePipeline, resolve_config

    groups: dict[str, list[GenItem]] = {}
    for item in items:
        if item.method == "auto":
            key = json.dumps([PipelineAdapter.batch_key(item), item.overrides], sort_keys=True, default=str)
            groups.setdefault(key, []).append(item)
    adapter, chosen, choices = PipelineAdapter(pipe), {}, []
    for group in groups.values():
        spec = SpeculativePipeline.from_pipe(pipe, method=resolve_config("auto", group[0].overrides)[1])
        kwargs = {k: v for k, v in adapter.kwargs(group).items() if k not in ("generator", "output_type")}
        try:
            choice = spec.calibrate(**kwargs)
        finally:
            spec.disable()
        overrides = {k: v for k, v in (choice["config"] or {}).items() if k != "method"}
        for item in group:
            chosen[item.index] = dataclasses.replace(item, method=choice["method"], overrides=overrides)
        choices.append(choice)
    return [chosen.get(item.index, item) for item in items], choices

