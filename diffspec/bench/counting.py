"""How much of the transformer actually ran: full calls and full-call equivalents.

Every ``nn.Linear`` inside the transformer's block lists adds its multiply-accumulates (weight
size times the rows it was applied to: batch x tokens) to the running call's total, so a call that
recomputes only some batch rows counts as that fraction. A call whose total
equals a full call's is a *target call*; the sum of all calls' totals divided by a full call's is
*target evals* (partial skips such as attention-only caching count fractionally). Only work done
inside a block's call counts: DiT's output head, for one, calls ``transformer_blocks[0].norm1.emb``
directly, and that is not block work.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from ..forecast.blocks import find_block_lists


class ComputeCounter:
    """Counts per-call block work on a transformer while attached.

    Example:
        >>> counter = ComputeCounter(pipe.transformer)  # doctest: +SKIP
        >>> with counter: pipe(class_labels=[0], num_inference_steps=10)  # doctest: +SKIP
        >>> counter.full_calls(counter.max_units()), counter.evals(counter.max_units())  # doctest: +SKIP
    """

    def __init__(self, transformer: nn.Module, block_lists: list[nn.ModuleList] | None = None) -> None:
        """``block_lists``: the lists whose work counts (default: the transformer's, :func:`find_block_lists`)."""
        self.transformer = transformer
        self.block_lists = block_lists
        self.per_call: list[int] = []
        self._current = 0
        self._depth = 0
        self._handles: list[Any] = []

    def __enter__(self) -> ComputeCounter:
        self.per_call.clear()
        self._handles.append(self.transformer.register_forward_pre_hook(self._start))
        self._handles.append(self.transformer.register_forward_hook(self._end))
        lists = self.block_lists or [blocks for _, blocks in find_block_lists(self.transformer)]
        for blocks in lists:
            for block in blocks:
                self._handles.append(block.register_forward_pre_hook(self._enter))
                self._handles.append(block.register_forward_hook(self._leave))
            for module in blocks.modules():
                if isinstance(module, nn.Linear):
                    self._handles.append(module.register_forward_pre_hook(self._linear(module)))
        return self

    def __exit__(self, *exc: Any) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()

    def _start(self, module: nn.Module, args: Any) -> None:
        self._current = 0
        self._depth = 0

    def _end(self, module: nn.Module, args: Any, output: Any) -> None:
        self.per_call.append(self._current)

    def _enter(self, module: nn.Module, args: Any) -> None:
        self._depth += 1

    def _leave(self, module: nn.Module, args: Any, output: Any) -> None:
        self._depth -= 1

    def _linear(self, linear: nn.Linear):
        weight, width = linear.weight.numel(), linear.in_features

        def hook(module: nn.Module, args: Any) -> None:
            if self._depth:
                self._current += weight * (args[0].numel() // width)

        return hook

    def max_units(self) -> int:
        return max(self.per_call, default=0)

    def full_calls(self, full_units: int) -> int:
        """Calls that ran every block in full."""
        return sum(1 for u in self.per_call if u >= full_units)

    def evals(self, full_units: int) -> float:
        """Total work in full-call equivalents."""
        return round(sum(self.per_call) / full_units, 3) if full_units else 0.0
