"""``torch.compile`` with block forecasting.

Two ways are supported; outputs match eager within float tolerance and, after one warmup
generation, a second generation with the same shapes compiles nothing new.

- **Regional (recommended)**: compile the transformer blocks, either with
  :func:`compile_blocks` (``spec.compile()``, which also covers models that declare no
  ``_repeated_blocks``, such as DiT) or with diffusers' ``transformer.compile_repeated_blocks()``,
  before or after attaching. ``nn.Module.compile()`` compiles a block's ``_call_impl``, which
  would trace the forecast wrapper installed as the block's ``forward`` (and guard on its state:
  one recompile per block and step). So while forecasting is attached, the compiled call is
  *borrowed*: taken off the block, and the block's own forward is compiled with the same
  ``torch.compile`` settings and run from the (eager) wrapper; detaching gives it back. The
  decision logic stays outside every compiled region, so nothing breaks a graph. At
  ``granularity="module"`` the forecast submodules (attention, feed-forward) are wrapped inside
  the block, so the regions shrink to them: the block runs eagerly (norms, gates, residuals) and
  each forecast submodule's own forward is compiled and run from its eager wrapper.
- **Whole model**: ``transformer.compile()`` or ``pipe.transformer = torch.compile(pipe.transformer)``.
  The transformer's forward hooks (step planning, the one ``timestep`` host read, the verifier's
  decision) are excluded with ``torch.compiler.disable`` and run eagerly around the compiled
  forward; forecasts are computed by the pre-hook and anchors recorded by the post-hook, so the
  block wrappers traced inside the graph only add a prepared tensor or stash one. Dynamo keeps one
  graph per call variant (full, draft, and for ``speca`` draft with / without a verifier run and
  the rows checked), all seen in a warmup generation. Rows recomputed by ``speca`` run through the
  same compiled forward.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from .blocks import find_block_lists


def uncompiled(module: nn.Module) -> nn.Module:
    """The module a ``torch.compile(module)`` wrapper (``OptimizedModule``) holds, else ``module``."""
    return getattr(module, "_orig_mod", module)


def compile_blocks(transformer: nn.Module, **compile_kwargs: Any) -> int:
    """Compile the transformer blocks that forecasting wraps (regional compilation).

    Calls ``block.compile(**compile_kwargs)`` on every block of the lists that
    :func:`~diffspec.forecast.blocks.find_block_lists` finds, as diffusers'
    ``compile_repeated_blocks()`` does for models that declare ``_repeated_blocks``. Safe
    before or after forecasting is attached.

    Returns:
        The number of blocks compiled.

    Example:
        >>> compile_blocks(pipe.transformer, backend="inductor")  # doctest: +SKIP
        28
    """
    n = 0
    for _, blocks in find_block_lists(uncompiled(transformer)):
        for block in blocks:
            block.compile(**compile_kwargs)
            n += 1
    return n


def recompile_like(compiled: Callable[..., Any], fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` compiled with the ``torch.compile`` settings (backend, mode, options) of ``compiled``.

    Falls back to ``torch.compile(fn)`` with default settings when they cannot be read.
    """
    try:
        from torch._dynamo.eval_frame import _TorchDynamoContext
    except ImportError:  # pragma: no cover - other torch versions
        return torch.compile(fn)
    for cell in getattr(compiled, "__closure__", None) or ():
        try:
            value = cell.cell_contents
        except ValueError:  # an empty cell
            continue
        if isinstance(value, _TorchDynamoContext):
            return value(fn)
    return torch.compile(fn)


class BlockForward:
    """A block's own forward as the forecast wrapper calls it: compiled once the block was compiled.

    Args:
        forward: the block's forward before wrapping (usually the bound class method).
    """

    def __init__(self, forward: Callable[..., Any]) -> None:
        self.eager = forward
        self.compiled: Callable[..., Any] | None = None
        self.taken: Callable[..., Any] | None = None  # the block's compiled call, given back on detach
        self.inner: list[BlockForward] = []  # forecast submodules (module granularity): compiled instead
        self.__signature__ = inspect.signature(forward)  # BlockIO reads the parameter names

    def adopt(self, compiled_call: Callable[..., Any]) -> None:
        """Take over a ``block.compile()`` result: run the block's own forward compiled like it or, when
        its submodules are forecast (module granularity), run the block eagerly and compile each
        forecast submodule's own forward instead, so no wrapper is traced."""
        self.taken = compiled_call
        for sub in self.inner:
            sub.compiled = recompile_like(compiled_call, sub.eager)
        if not self.inner:
            self.compiled = recompile_like(compiled_call, self.eager)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self.compiled is not None:
            return self.compiled(*args, **kwargs)
        return self.eager(*args, **kwargs)


class CompiledCalls:
    """Keeps compiled calls outside the forecast decision logic (see the module docstring).

    Args:
        transformer: the hooked transformer, possibly a ``torch.compile`` wrapper.
    """

    def __init__(self, transformer: nn.Module) -> None:
        self.model = uncompiled(transformer)
        self._blocks: list[tuple[nn.Module, BlockForward]] = []
        self._forward: tuple[Any, Callable[..., Any]] | None = None

    def block_forward(self, block: nn.Module) -> BlockForward:
        """The callable a wrapper runs as ``block``'s own forward (register before patching)."""
        forward = BlockForward(block.forward)
        self._blocks.append((block, forward))
        return forward

    def submodule_forward(self, block: nn.Module, sub: nn.Module) -> BlockForward:
        """The callable a module-granularity wrapper runs as ``sub``'s own forward (``sub`` inside
        ``block``, whose :meth:`block_forward` was taken first): compiled when ``block`` is."""
        forward = BlockForward(sub.forward)
        next(f for b, f in reversed(self._blocks) if b is block).inner.append(forward)
        return forward

    def borrow(self) -> None:
        """Move compiled calls set on the wrapped blocks (``compile_repeated_blocks``, ``block.compile``)
        into their :class:`BlockForward`. Cheap: one attribute read per block."""
        for block, forward in self._blocks:
            compiled_call = block._compiled_call_impl
            if compiled_call is not None:
                forward.adopt(compiled_call)
                block._compiled_call_impl = None

    def restore(self) -> None:
        """Give the borrowed compiled calls back to their blocks and forget the blocks."""
        for block, forward in self._blocks:
            if forward.taken is not None and block._compiled_call_impl is None:
                block._compiled_call_impl = forward.taken
        self._blocks.clear()
        self._forward = None

    def forward(self, module: nn.Module) -> Callable[..., Any]:
        """``module.forward`` without its hooks, compiled like ``module`` when ``module.compile()`` was used."""
        compiled_call = getattr(module, "_compiled_call_impl", None)
        if compiled_call is None:
            return module.forward
        if self._forward is None or self._forward[0] is not compiled_call:
            self._forward = (compiled_call, recompile_like(compiled_call, module.forward))
        return self._forward[1]
