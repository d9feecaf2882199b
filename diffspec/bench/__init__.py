"""Benchmark suites writing the benchmark JSON (docs/benchmarks/index.md) (``diffspec bench SUITE --out FILE``).

Example:
    >>> from diffspec.bench import run_bench
    >>> doc = run_bench("dit-cache", model="tiny-dit", methods=["taylor"], repeats=1,
    ...                 quality_samples=20, out="dit.json")  # doctest: +SKIP
"""

from __future__ import annotations

import datetime as _dt
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .ar_image import run_ar_image
from .ar_image_cost import run_ar_image_cost
from .auto import run_auto
from .dit_cache import run_dit_cache
from .exact_diffusion import run_exact_diffusion
from .kernels import run_kernels
from .mm_cost import run_multimodal_cost
from .multimodal import run_multimodal
from .speech import run_speech
from .vla import run_multimodal_action

SUITES: dict[str, Callable[..., dict[str, Any]]] = {"dit-cache": run_dit_cache, "exact-diffusion": run_exact_diffusion,
                                                    "ar-image": run_ar_image, "multimodal": run_multimodal,
                                                    "multimodal-action": run_multimodal_action, "speech": run_speech,
                                                    "kernels": run_kernels,
                                                    "multimodal-cost": run_multimodal_cost,
                                                    "ar-image-cost": run_ar_image_cost, "auto": run_auto}


def run_bench(suite: str, *, out: str | Path | None = None, **kwargs: Any) -> dict[str, Any]:
    """Run ``suite`` with ``kwargs`` and write its JSON to ``out`` (when given).

    Raises:
        ValueError: unknown suite or bad suite argument.
    """
    if suite not in SUITES:
        raise ValueError(f"unknown benchmark suite {suite!r}; choose one of {', '.join(SUITES)}")
    created = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    doc = {"created": created, **SUITES[suite](**kwargs)}
    doc = {"suite": doc.pop("suite"), **doc}
    if out is not None:
        path = Path(out)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(doc, indent=2) + "\n")
    return doc


__all__ = ["SUITES", "run_ar_image", "run_ar_image_cost", "run_auto", "run_bench", "run_dit_cache", "run_exact_diffusion",
           "run_kernels", "run_multimodal", "run_multimodal_action", "run_multimodal_cost", "run_speech"]
