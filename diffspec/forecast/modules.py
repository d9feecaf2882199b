"""Module granularity: forecast the heavy submodules of each block, recompute the rest (TaylorSeer).

On a full step the attention and feed-forward submodules of every block run and their outputs
(before the block applies its adaLN gates) are stored as anchors. On a forecast step each block
still runs its own code (norms, gates from the current conditioning, residual additions), but
those submodules return their forecast instead of running. This is TaylorSeer's caching: more
memory than the block granularity (one anchor per submodule instead of one residual per block
list) for a forecast that follows the current step's conditioning.

The submodules are named in each block's :class:`~.profiles.BlockProfile` (``modules``).
``FluxSingleTransformerBlock`` forecasts its fused ``proj_out`` output instead ("total" in the
reference code); on a forecast step only its gate is recomputed, so its attention and MLP do not
run either (its profile's ``draft_forward``).

Example:
    >>> spec = SpeculativePipeline.from_pipe(pipe, method="taylor", granularity="module")  # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

import torch
from torch import nn

from .profiles import BLOCKS, block_profile

if TYPE_CHECKING:
    from .engine import ForecastCall


class ModuleHost(Protocol):
    """What a submodule wrapper reads from the hooks (:class:`~.hooks.ForecastHooks`)."""

    call: ForecastCall | None  # the current call: its ``mode`` and ``modules_real`` (the verifier runs them for real)
    module_recording: bool  # module anchors wanted at this call

    def module_forecaster(self, list_index: int, key: str) -> Any: ...
    def record_module(self, list_index: int, key: str, value: torch.Tensor) -> None: ...
    def module_forecast(self, list_index: int, key: str, like: torch.Tensor) -> torch.Tensor: ...


def supports_modules(block: nn.Module) -> bool:
    """Whether ``block``'s class names submodules to forecast (its :class:`~.profiles.BlockProfile`'s ``modules``)."""
    return bool(block_profile(block).modules)


def check_module_support(blocks: list[nn.Module]) -> None:
    """Raise ``ValueError`` naming the block classes without a module table."""
    missing = sorted({type(b).__name__ for b in blocks if not supports_modules(b)})
    if missing:
        raise ValueError(
            f"granularity='module' is not supported for {', '.join(missing)}; supported blocks: "
            f"{', '.join(n for n, b in BLOCKS.items() if b.modules)}. Use granularity='block' (every diffusers "
            "DiT) or 'auto'."
        )


def wrap_submodules(host: ModuleHost, block: nn.Module, list_index: int, block_index: int,
                    own_forward: Callable[[nn.Module, nn.Module], Callable[..., Any]] | None = None
                    ) -> list[tuple[nn.Module, Any]]:
    """Replace the ``forward`` of ``block``'s forecast submodules on the instance; returns the patched ones, each with
    the ``forward`` it had on the instance before (None: its class's), to restore on detach.

    ``own_forward(block, sub)``: what the wrapper runs as ``sub``'s own forward (default ``sub.forward``;
    ``CompiledCalls.submodule_forward`` compiles it under regional compilation).
    """
    patched = []
    for name in block_profile(block).modules:
        sub = getattr(block, name, None)
        if isinstance(sub, nn.Module):
            previous = sub.__dict__.get("forward")  # an instance forward already there (accelerate's offload hook)
            original = own_forward(block, sub) if own_forward else sub.forward
            sub.forward = SubmoduleWrapper(host, original, list_index, f"m{block_index}.{name}")
            patched.append((sub, previous))
    return patched


class SubmoduleWrapper:
    """A forecast submodule's ``forward``: run (and recorded) on a full pass and for the verifier, its forecast
    (anchor key ``"m{block}.{name}.{part}"``) on a draft.

    Args:
        host: the hooks whose current call it follows.
        original: the submodule's own forward.
        list_index: the block list of its block.
        key: ``"m{block}.{name}"``.
    """

    def __init__(self, host: ModuleHost, original: Callable[..., Any], list_index: int, key: str) -> None:
        self.host, self.original, self.list_index, self.key = host, original, list_index, key

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        host, call, key = self.host, self.host.call, self.key
        if call is None or call.mode == "full" or call.modules_real:
            out = self.original(*args, **kwargs)
            if call is not None and call.mode == "full" and host.module_recording:
                for i, part in enumerate(_parts(out)):
                    host.record_module(self.list_index, f"{key}.{i}", part)
            return out
        like = args[0] if args else next(iter(kwargs.values()))
        parts = [host.module_forecast(self.list_index, f"{key}.{i}", like)
                 for i in range(_num_parts(host, self.list_index, key))]
        return parts[0] if len(parts) == 1 and not _was_tuple(host, self.list_index, key) else tuple(parts)


def _parts(out: Any) -> list[torch.Tensor]:
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, (tuple, list)) and all(isinstance(o, torch.Tensor) for o in out):
        return list(out)
    raise ValueError(f"granularity='module': a forecast submodule returned {type(out).__name__}; "
                     "expected a tensor or a tuple of tensors")


def _num_parts(host: ModuleHost, list_index: int, key: str) -> int:
    n = 0
    while host.module_forecaster(list_index, f"{key}.{n}") is not None:
        n += 1
    if n == 0:
        raise RuntimeError(f"no anchor recorded for {key} before a forecast step")
    return n


def _was_tuple(host: ModuleHost, list_index: int, key: str) -> bool:
    return host.module_forecaster(list_index, f"{key}.1") is not None
