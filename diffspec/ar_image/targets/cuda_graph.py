"""CUDA-graph replay of an AR session's ``step`` (one graph per input shape), for launch-bound decoding.

At batch 1-8 an eager LlamaGen forward is bound by kernel launches, not by the GPU (a 7B-size forward feeding 65
tokens to 2 rows keeps an H200 busy about 9 ms of its 40), which flatters any method that feeds more tokens per
call; a tuned deployment removes the launches with CUDA graphs, so a fair GPU baseline replays graphs too.
:class:`GraphedStep` captures
``session.step`` once per ``(tokens shape, start shape)`` and replays it: the static KV cache of
:class:`~diffspec.ar_image.targets.llamagen_session.LlamaGenSession` is written in place at slots computed from ``start``,
so one graph serves every round of a Jacobi window (``K = L + 1`` fixed) and every plain step (``K = 1``).

Requirements of the wrapped ``step``: no host syncs, no new device memory that outlives the call except its
output, and in-place cache writes (a ``graph_safe`` session, e.g. ``LlamaGenSession``). The warmup calls before a capture
run the step for real on the same inputs; that is harmless for ``LlamaGenSession`` (it rewrites the same cache
slots with the same values), and the captured call is replayed once to produce the first output.

Example:
    >>> session = target.start(class_labels=[3], guidance_scale=4.0)  # doctest: +SKIP
    >>> session.step = GraphedStep(session.step, "cuda")  # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ...config import check_int

Step = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


class GraphedStep:
    """``step(tokens, start)`` replayed from CUDA graphs captured per input shape (see the module docstring).

    Args:
        step: the session's ``step``.
        device: the CUDA device the session runs on.
        warmup: eager calls on a side stream before each capture (cuBLAS / cuDNN workspaces, lazy tables).

    Raises:
        ValueError: ``device`` is not a CUDA device, or ``warmup`` is negative.
    """

    def __init__(self, step: Step, device: torch.device | str, warmup: int = 2) -> None:
        self.device = torch.device(device)
        if self.device.type != "cuda":
            raise ValueError(f"GraphedStep needs a CUDA device, got device={str(self.device)!r}")
        check_int("warmup", warmup, 0)
        self.step, self.warmup = step, warmup
        self.pool = torch.cuda.graph_pool_handle()
        self.graphs: dict[tuple[Any, ...], tuple[torch.cuda.CUDAGraph, torch.Tensor, torch.Tensor, torch.Tensor]] = {}

    def __call__(self, tokens: torch.Tensor, start: torch.Tensor) -> torch.Tensor:
        key = (tuple(tokens.shape), tokens.dtype, tuple(start.shape), start.dtype)
        entry = self.graphs.get(key)
        if entry is None:
            entry = self.graphs[key] = self._capture(tokens, start)
        graph, static_tokens, static_start, out = entry
        static_tokens.copy_(tokens)
        static_start.copy_(start)
        graph.replay()
        return out.clone()  # the next replay overwrites the static output

    @property
    def captured(self) -> int:
        """Graphs captured so far (one per input shape)."""
        return len(self.graphs)

    def _capture(self, tokens: torch.Tensor, start: torch.Tensor
                 ) -> tuple[torch.cuda.CUDAGraph, torch.Tensor, torch.Tensor, torch.Tensor]:
        static_tokens = tokens.to(self.device).clone()
        static_start = start.to(self.device).clone()
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            for _ in range(self.warmup):
                self.step(static_tokens, static_start)
        torch.cuda.current_stream(self.device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            out = self.step(static_tokens, static_start)
        return graph, static_tokens, static_start, out
