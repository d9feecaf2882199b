"""``torch.compile`` for the diffusion bench suites: every arm runs on the same compiled transformer.

``--compile MODE`` (``compile=`` of :func:`~diffspec.bench.run_exact_diffusion` and
:func:`~diffspec.bench.run_dit_cache`):

- ``none``: eager (the default).
- ``default`` / ``reduce-overhead``: ``transformer.compile(mode=...)`` (whole model, in place);
  ``reduce-overhead`` captures CUDA graphs on CUDA (on the CPU it compiles like ``default``).
- ``repeated-blocks``: diffusers' ``transformer.compile_repeated_blocks()`` (regional), for models
  that declare ``_repeated_blocks`` (e.g. Flux); other models are refused with their name.
- ``blocks``: diffspec's regional compile of every transformer block
  (:func:`~diffspec.forecast.compile.compile_blocks`), also for models without ``_repeated_blocks``
  (DiT, PixArt, SD3).

Shapes are static (``dynamic=False``). The exact samplers (``coupling``, ``autospec``, Picard)
call the transformer with a number of rows that changes from round to round, so
:class:`PaddedRows` pads every call to the next of a few fixed row counts (``2^k`` and
``3 * 2^k``, plus the plain step's own count) by repeating the last row, and drops the padding
from the output: the real rows' results are unchanged up to float rounding, the padding is never
counted as an evaluation, and the number of compiled shapes is bounded and compiled in the
untimed warmup (:meth:`PaddedRows.prewarm`). :class:`CompileWatch` counts graphs dynamo compiles
per arm, in warmup and after it.

Example:
    >>> transformer = compile_transformer(pipe.transformer, "reduce-overhead", "dit-xl-2-256")  # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

COMPILE_MODES = ("none", "default", "reduce-overhead", "repeated-blocks", "blocks")


def check_compile_mode(mode: str | None) -> str:
    """``mode`` (``None`` means ``"none"``) if it is one of :data:`COMPILE_MODES`.

    Raises:
        ValueError: any other value, naming the allowed ones.
    """
    mode = "none" if mode is None else mode
    if mode not in COMPILE_MODES:
        raise ValueError(f"compile={mode!r} is not supported; choose one of {', '.join(COMPILE_MODES)}")
    return mode


def compile_transformer(transformer: nn.Module, mode: str, model: str, backend: str = "inductor") -> nn.Module:
    """``transformer`` compiled in place under ``mode``: whole model (``nn.Module.compile``) or its
    blocks (regional). ``model`` names the model in errors; ``backend``
    other than inductor (tests: ``"eager"``) ignores the inductor ``mode``.

    Raises:
        ValueError: unknown ``mode``, or ``repeated-blocks`` on a model without ``_repeated_blocks``.
    """
    from ..forecast.compile import compile_blocks

    mode = check_compile_mode(mode)
    if mode == "none":
        return transformer
    kwargs: dict[str, Any] = {"dynamic": False, "backend": backend}
    if backend == "inductor":
        kwargs["mode"] = "reduce-overhead" if mode == "reduce-overhead" else "default"
    if mode in ("default", "reduce-overhead"):  # in place (nn.Module.compile): hooks still find the blocks
        transformer.compile(**kwargs)
        return transformer
    if mode == "repeated-blocks":
        if not getattr(transformer, "_repeated_blocks", None):
            raise ValueError(f"compile='repeated-blocks': {model!r} ({type(transformer).__name__}) declares no "
                             "_repeated_blocks, so diffusers' compile_repeated_blocks() cannot compile it; use "
                             "compile='blocks' (diffspec's regional compile of every block) or 'default'")
        transformer.compile_repeated_blocks(**kwargs)
        return transformer
    if compile_blocks(transformer, **kwargs) == 0:
        raise ValueError(f"compile='blocks': found no transformer blocks in {model!r} ({type(transformer).__name__})")
    return transformer


def row_buckets(max_rows: int, fixed: tuple[int, ...] = ()) -> list[int]:
    """Sorted row counts calls are padded to: ``2^k`` and ``3 * 2^k`` up to ``max_rows`` (which is
    added), plus ``fixed`` (e.g. the plain sampler's rows, so it is never padded).

    Example:
        >>> row_buckets(20, fixed=(10,))
        [1, 2, 3, 4, 6, 8, 10, 12, 16, 20]
    """
    if max_rows < 1:
        raise ValueError(f"max_rows={max_rows} is out of range; must be >= 1")
    sizes = {max_rows, *(f for f in fixed if f <= max_rows)}
    k = 1
    while k < max_rows:
        sizes.update(v for v in (k, 3 * k) if v < max_rows)
        k *= 2
    return sorted(sizes)


def _pad(value: Any, rows: int, padded: int) -> Any:
    if isinstance(value, torch.Tensor) and value.dim() >= 1 and value.shape[0] == rows and padded > rows:
        return torch.cat([value, value[-1:].expand(padded - rows, *value.shape[1:])])
    return value


def _unpad(value: Any, rows: int, padded: int) -> Any:
    if isinstance(value, torch.Tensor) and value.dim() >= 1 and value.shape[0] == padded:
        return value[:rows]
    if isinstance(value, tuple):
        return type(value)(_unpad(v, rows, padded) for v in value)
    if hasattr(value, "to_tuple") and hasattr(value, "keys"):  # a diffusers / transformers ModelOutput
        return type(value)(**{k: _unpad(value[k], rows, padded) for k in value.keys()})
    return value


class PaddedRows(nn.Module):
    """Calls ``inner`` with every batch-first tensor argument padded to the next row bucket.

    Attributes the pipelines read (``config``, ``dtype``, ...) are forwarded to ``inner``. Padding
    repeats the last row (a valid input); outputs are cut back to the real rows. ``active=False``
    passes calls through unpadded (the untimed quality passes run eagerly at large batches).

    Args:
        inner: the (compiled) transformer.
        buckets: the allowed row counts (:func:`row_buckets`); calls above the largest pass unpadded.
    """

    def __init__(self, inner: nn.Module, buckets: list[int]) -> None:
        super().__init__()
        self.inner = inner
        self.buckets = sorted(buckets)
        self.active = True
        self.seen: set[int] = set()  # padded row counts called while active
        self.padded_rows = 0
        self.real_rows = 0
        self._last: tuple[tuple[Any, ...], dict[str, Any]] | None = None

    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(self._modules["inner"], name)

    def _rows_of(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> int | None:
        first = args[0] if args else kwargs.get("hidden_states")
        return first.shape[0] if isinstance(first, torch.Tensor) and first.dim() >= 1 else None

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        rows = self._rows_of(args, kwargs)
        if not self.active or rows is None:
            return self.inner(*args, **kwargs)
        padded = next((b for b in self.buckets if b >= rows), rows)
        self._last = (args, kwargs)
        self.seen.add(padded)
        self.real_rows += rows
        self.padded_rows += padded - rows
        out = self._call(tuple(_pad(a, rows, padded) for a in args),
                         {k: _pad(v, rows, padded) for k, v in kwargs.items()})
        return _unpad(out, rows, padded)

    def _call(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        first = args[0] if args else kwargs.get("hidden_states")
        if first.is_cuda and hasattr(torch.compiler, "cudagraph_mark_step_begin"):
            torch.compiler.cudagraph_mark_step_begin()  # outputs of the previous call are no longer read
            return _clone(self.inner(*args, **kwargs))  # CUDA-graph outputs are overwritten by the next replay
        return self.inner(*args, **kwargs)

    def prewarm(self, max_rows: int | None = None) -> list[int]:
        """Call ``inner`` once at every bucket (up to ``max_rows``) on the last call's inputs, so that
        each shape is compiled (and CUDA-graph captured) before timing. Returns the buckets called."""
        if self._last is None:
            raise ValueError("PaddedRows.prewarm needs one call first (it replays that call's inputs)")
        args, kwargs = self._last
        rows = self._rows_of(args, kwargs)
        done = []
        for b in self.buckets:
            if max_rows is not None and b > max_rows:
                break
            src_a = tuple(_pad(a, rows, max(b, rows)) for a in args)
            src_k = {k: _pad(v, rows, max(b, rows)) for k, v in kwargs.items()}
            self._call(tuple(_head(a, rows, b) for a in src_a), {k: _head(v, rows, b) for k, v in src_k.items()})
            self.seen.add(b)
            done.append(b)
        return done


def _head(value: Any, rows: int, size: int) -> Any:
    if isinstance(value, torch.Tensor) and value.dim() >= 1 and value.shape[0] == max(size, rows):
        return value[:size]
    return value


def _clone(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.clone()
    if isinstance(value, tuple):
        return type(value)(_clone(v) for v in value)
    if hasattr(value, "to_tuple") and hasattr(value, "keys"):
        return type(value)(**{k: _clone(value[k]) for k in value.keys()})
    return value


def graphs_compiled() -> int:
    """Graphs dynamo has compiled in this process so far (``counters["stats"]["unique_graphs"]``)."""
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


@contextlib.contextmanager
def eager(padded: PaddedRows | None = None) -> Iterator[None]:
    """Run compiled code eagerly (``torch.compiler.set_stance("force_eager")``) and unpadded: the
    untimed counting and quality passes, whose hooks and batch sizes must not compile anything."""
    was = padded.active if padded is not None else None
    if padded is not None:
        padded.active = False
    try:
        with torch.compiler.set_stance("force_eager"):
            yield
    finally:
        if padded is not None:
            padded.active = was


def recompile_limit(n: int) -> contextlib.AbstractContextManager[Any]:
    """Dynamo's per-function limit on compiled variants raised to at least ``n`` (one per row bucket)."""
    import torch._dynamo

    cfg = torch._dynamo.config
    name = "recompile_limit" if hasattr(cfg, "recompile_limit") else "cache_size_limit"
    return cfg.patch(**{name: max(getattr(cfg, name), n)})
