"""The device's own cost of a target call against the tokens it feeds (``method="auto"`` on AR image and multimodal).

A speculative decoder trades calls for tokens fed per call: a Jacobi window of ``L`` drafts feeds ``L + 1`` tokens,
a draft length ``k`` feeds ``k + 1``. Whether that pays depends on how the call's cost grows with the tokens fed on
the user's device, so ``method="auto"`` times a few calls at 2-4 sizes (interleaved, after warm-up, median of
repeats) into a :class:`CostCurve` and predicts a candidate's wall-clock as its calls times the curve at its feed.

Example:
    >>> curve = CostCurve({1: 0.010, 17: 0.012, 65: 0.030})
    >>> round(curve(41), 4), round(curve(129), 4)
    (0.021, 0.054)
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

COST_REPEATS = 5
"""Timed calls per size (their median is kept)."""
COST_WARMUP = 2
"""Untimed rounds over every size before timing."""


@dataclass(frozen=True)
class CostCurve:
    """Median seconds of one target call by tokens fed, linear between the measured sizes and beyond the largest.

    Example:
        >>> CostCurve.from_dict(CostCurve({1: 0.5, 8: 1.0}).to_dict())(8)
        1.0
    """

    seconds: dict[int, float]

    def __call__(self, tokens: float) -> float:
        sizes = sorted(self.seconds)
        costs = [self.seconds[k] for k in sizes]
        if tokens > sizes[-1] and len(sizes) > 1:
            slope = (costs[-1] - costs[-2]) / (sizes[-1] - sizes[-2])
            return costs[-1] + max(slope, 0.0) * (tokens - sizes[-1])
        return float(np.interp(tokens, sizes, costs))

    def to_dict(self) -> dict[str, float]:
        """JSON-able form (sizes as strings)."""
        return {str(k): v for k, v in sorted(self.seconds.items())}

    @classmethod
    def from_dict(cls, data: dict[str, float]) -> CostCurve:
        """The curve :meth:`to_dict` wrote."""
        return cls({int(k): float(v) for k, v in data.items()})


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


CLOCK_MARGIN = 0.05
"""How much faster on the clock a timed candidate must run than the best-ranked one to replace it: a few timed
samples on a loaded CPU vary by about that much, while the rank comes from every calibration sample."""


def clock_pick(measured: list[float], margin: float = CLOCK_MARGIN) -> int:
    """Which of the timed candidates to keep, from their measured speedups, best-ranked first: the fastest, when it
    runs more than ``margin`` faster than the first; else the first.

    Example:
        >>> clock_pick([2.23, 2.278, 2.252]), clock_pick([1.5, 1.7, 1.6])
        (0, 1)
    """
    best = max(range(len(measured)), key=measured.__getitem__)
    return best if measured[best] > measured[0] * (1 + margin) else 0


def interleaved_times(calls: dict[Any, Callable[[], Any]], device: torch.device, repeats: int = COST_REPEATS,
                      warmup: int = COST_WARMUP) -> dict[Any, list[float]]:
    """Seconds of each call (``calls``: name -> a zero-argument call), interleaved and rotated per round, after
    ``warmup`` untimed rounds; ``repeats`` timed calls each.

    Example:
        >>> {k: len(v) for k, v in interleaved_times({1: lambda: None}, torch.device("cpu"), repeats=2).items()}
        {1: 2}
    """
    names = list(calls)
    times: dict[Any, list[float]] = {k: [] for k in names}
    for r in range(warmup + repeats):
        for k in names[r % len(names):] + names[: r % len(names)]:
            _synchronize(device)
            start = time.perf_counter()
            calls[k]()
            _synchronize(device)
            if r >= warmup:
                times[k].append(time.perf_counter() - start)
    return times


def median_times(calls: dict[Any, Callable[[], Any]], device: torch.device, repeats: int = COST_REPEATS,
                 warmup: int = COST_WARMUP) -> dict[Any, float]:
    """Median seconds of each call of :func:`interleaved_times`.

    Example:
        >>> sorted(median_times({1: lambda: None, 4: lambda: None}, torch.device("cpu"), repeats=2, warmup=1))
        [1, 4]
    """
    return {k: statistics.median(v) for k, v in interleaved_times(calls, device, repeats, warmup).items()}


def ar_call_cost(target: Any, sizes: list[int], conditions: dict[str, Any], guidance_scale: float | None,
                 repeats: int = COST_REPEATS) -> CostCurve:
    """An AR image target's call cost at ``sizes`` tokens fed (one image, its CFG rows), with the KV cache
    filled up to the middle of the image (``conditions``: ``class_labels=`` or ``prompt=`` of one image)."""
    from ..ar_image.plain import open_session

    n, device = target.num_tokens, target.device
    generator = torch.Generator("cpu").manual_seed(0)
    with torch.inference_mode():
        session = open_session(target, guidance_scale=guidance_scale, **conditions)
        mid = n // 2
        session.step(torch.randint(target.codebook_size, (1, mid), generator=generator).to(device),
                     torch.zeros(1, dtype=torch.long, device=device))
        feeds = {k: (torch.randint(target.codebook_size, (1, k), generator=generator).to(device),
                     torch.full((1,), min(mid, n - k), dtype=torch.long, device=device)) for k in sizes}
        return CostCurve(median_times({k: lambda k=k: session.step(*feeds[k]) for k in sizes}, device, repeats))


def lm_call_cost(model: Any, inputs: dict[str, torch.Tensor], sizes: list[int],
                 repeats: int = COST_REPEATS) -> CostCurve:
    """A transformers model's decode-call cost at ``sizes`` tokens fed, its KV cache holding the prefill of
    ``inputs`` (the first row), each call's entries cropped off again."""
    row = {k: v[:1] if isinstance(v, torch.Tensor) and v.shape[0] == inputs["input_ids"].shape[0] else v
           for k, v in inputs.items()}
    with torch.inference_mode():
        cache = model(**row, use_cache=True).past_key_values
        token = row["input_ids"][:, -1:]

        def call(k: int) -> None:
            model(input_ids=token.expand(1, k), past_key_values=cache, use_cache=True)
            cache.crop(-k)

        return CostCurve(median_times({k: lambda k=k: call(k) for k in sizes}, model.device, repeats))
