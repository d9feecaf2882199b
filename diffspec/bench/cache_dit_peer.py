"""cache-dit's DBCache (alone, and with its TaylorSeer calibrator) as a benchmark peer.

cache-dit (``pip install cache-dit``, the ``bench`` extra) caches at the level of a whole block
list: on every step it runs the first ``Fn`` blocks, compares their residual with the previous
step's, and when the relative L1 change is under ``residual_diff_threshold`` it reuses (or, with
the calibrator, extrapolates) the cached residual of the remaining blocks instead of running them.

Two arms, both ``"peer": true``:

* ``cache-dit-dbcache``: ``DBCacheConfig()`` at cache-dit's defaults (F8B0, threshold 0.08,
  8 warmup steps, no cap on cached steps);
* ``cache-dit-dbcache-taylorseer``: the same plus ``TaylorSeerCalibratorConfig(taylorseer_order=1)``,
  as cache-dit documents DBCache + TaylorSeer.

Only two settings depart from ``DBCacheConfig()``, and both are recorded in the arm's config:
``enable_separate_cfg=False`` (DiTPipeline batches the guided and unguided rows into one call, and
the loop workload has no guidance) and, on block lists of at most 8 blocks (the tiny test models),
``Fn_compute_blocks=1`` (F1B0), because F8 needs more blocks than such a list has (cache-dit asserts
``Fn <= len(blocks)``, and ``Fn == len(blocks)`` would leave nothing to cache).

How cache-dit is attached:

* **pipeline workload**: a :class:`cache_dit.BlockAdapter` with ``pipe`` set, so cache-dit wraps the
  pipeline class's ``__call__`` and creates fresh cache contexts at the start of every pipeline call
  (its documented pipeline mode);
* **loop workload** (bare transformer): a ``BlockAdapter`` without a pipeline (cache-dit's
  transformer-only mode, persistent contexts) and ``cache_dit.refresh_context(transformer,
  num_inference_steps=...)`` at the start of every generation, so no run reuses another's caches.

Which ``ForwardPattern`` each block family needs (see :data:`BLOCK_LAYOUTS`; the same choices as
cache-dit's own registered adapters for these models):

* ``Pattern_3`` (takes and returns ``hidden_states`` only; any text stream is a keyword argument
  passed through unchanged): DiT and PixArt ``BasicTransformerBlock``, Sana, HunyuanDiT blocks;
* ``Pattern_1`` (takes ``hidden_states, encoder_hidden_states``, returns ``(encoder, hidden)``):
  SD3 ``JointTransformerBlock``, Flux ``FluxTransformerBlock`` and ``FluxSingleTransformerBlock``
  (cache-dit treats Flux's two lists as one list of dual-stream blocks);
* ``Pattern_0`` (same inputs, returns ``(hidden, encoder)``): CogVideoX and HunyuanVideo blocks;
* ``Pattern_2`` (same inputs, returns ``hidden_states`` only): Wan and LTX-Video blocks.

DiT, Flux and HunyuanDiT also need cache-dit's patch functor for the model (it rewrites the
transformer's ``forward`` so the block lists can be swapped). ``cache_dit.disable_cache`` restores
the wrapped forward and the pipeline class but leaves that patched ``forward`` (and, for DiT, a
``_norm1_emb`` submodule that shows up in ``state_dict``), so :class:`CacheDitCache` snapshots every
attribute it could touch before attaching and puts them back after ``disable_cache``.
"""

from __future__ import annotations

import dataclasses
import enum
import os
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

CACHE_DIT_PEERS = ("cache-dit-dbcache", "cache-dit-dbcache-taylorseer")

SHALLOW_FN_COMPUTE_BLOCKS = 1
"""``Fn_compute_blocks`` on block lists too short for cache-dit's default (F1B0)."""


@dataclass(frozen=True)
class BlockLayout:
    """How cache-dit's ``BlockAdapter`` sees one transformer class.

    Attributes:
        blocks: the block-list attributes, in execution order.
        pattern: the ``cache_dit.ForwardPattern`` member name of every list.
        patch_functor: cache-dit's patch functor class for the model, if it needs one.
        merged: cache the concatenated lists as one (the later lists run as empty dummies).
        check_num_outputs: let cache-dit check the blocks' return annotations (off where
            diffusers' annotations are wrong).
    """

    blocks: tuple[str, ...]
    pattern: str
    patch_functor: str | None = None
    merged: bool = False
    check_num_outputs: bool = False


BLOCK_LAYOUTS: dict[str, BlockLayout] = {
    "DiTTransformer2DModel": BlockLayout(("transformer_blocks",), "Pattern_3", "DiTPatchFunctor"),
    "PixArtTransformer2DModel": BlockLayout(("transformer_blocks",), "Pattern_3"),
    "SanaTransformer2DModel": BlockLayout(("transformer_blocks",), "Pattern_3"),
    "HunyuanDiT2DModel": BlockLayout(("blocks",), "Pattern_3", "HunyuanDiTPatchFunctor"),
    "SD3Transformer2DModel": BlockLayout(("transformer_blocks",), "Pattern_1"),
    "FluxTransformer2DModel": BlockLayout(("transformer_blocks", "single_transformer_blocks"), "Pattern_1",
                                          "FluxPatchFunctor", merged=True),
    "CogVideoXTransformer3DModel": BlockLayout(("transformer_blocks",), "Pattern_0"),
    "HunyuanVideoTransformer3DModel": BlockLayout(("transformer_blocks", "single_transformer_blocks"), "Pattern_0"),
    "WanTransformer3DModel": BlockLayout(("blocks",), "Pattern_2"),
    "LTXVideoTransformer3DModel": BlockLayout(("transformer_blocks",), "Pattern_2"),
}
"""Transformer class name -> its layout for cache-dit (the families ``diffspec bench`` builds)."""


_USER_LOG_LEVEL = os.environ.get("CACHE_DIT_LOG_LEVEL")


def import_cache_dit() -> Any:
    """``cache_dit``, with its logging (INFO lines on stdout for every attach) lowered to errors
    unless the user chose a level with ``CACHE_DIT_LOG_LEVEL``.

    Raises:
        ImportError: cache-dit is not installed.
    """
    os.environ.setdefault("CACHE_DIT_LOG_LEVEL", "error")
    try:
        import cache_dit
    except ImportError as e:
        raise ImportError("the cache-dit peers need cache-dit: pip install 'cache-dit>=1.5' "
                          "(or diffspec[bench])") from e
    if _USER_LOG_LEVEL is None:  # also when something imported cache_dit before us, at its INFO default
        import logging

        for name, logger in list(logging.Logger.manager.loggerDict.items()):
            if name.startswith("cache_dit") and isinstance(logger, logging.Logger):
                logger.setLevel(logging.ERROR)
    return cache_dit


def block_layout(transformer: nn.Module, model: str | None = None) -> BlockLayout:
    """The cache-dit layout of ``transformer``.

    Raises:
        ValueError: a transformer class cache-dit is not wired up for here (names the supported ones).
    """
    name = type(transformer).__name__
    layout = BLOCK_LAYOUTS.get(name)
    if layout is None:
        which = f"model {model!r} ({name})" if model else name
        raise ValueError(f"cache-dit peers: no cache-dit block layout for {which}; supported transformers: "
                         f"{', '.join(BLOCK_LAYOUTS)}")
    missing = [b for b in layout.blocks if not isinstance(getattr(transformer, b, None), nn.ModuleList)]
    if missing:
        raise ValueError(f"cache-dit peers: {name} has no block list {', '.join(missing)}")
    return layout


def _cached_list_lengths(transformer: nn.Module, layout: BlockLayout) -> list[int]:
    lengths = [len(getattr(transformer, b)) for b in layout.blocks]
    return [sum(lengths)] if layout.merged else lengths


def cache_dit_configs(name: str, transformer: nn.Module, layout: BlockLayout,
                      overrides: dict[str, Any] | None = None) -> tuple[Any, Any, dict[str, Any]]:
    """``(DBCacheConfig, calibrator config or None, departures from the defaults)`` for peer ``name``.

    ``overrides``: ``DBCacheConfig`` fields (``residual_diff_threshold``, ``max_warmup_steps``...) and,
    for the calibrated peer, ``taylorseer_order``, applied last (the equal-budget search sets them).
    """
    cache_dit = import_cache_dit()
    if name not in CACHE_DIT_PEERS:
        raise ValueError(f"unknown cache-dit peer {name!r}; choose one of {', '.join(CACHE_DIT_PEERS)}")
    config = cache_dit.DBCacheConfig(enable_separate_cfg=False)
    changed: dict[str, Any] = {"enable_separate_cfg": "False: one transformer call per step (guidance batched)"}
    shortest = min(_cached_list_lengths(transformer, layout))
    if shortest <= config.Fn_compute_blocks:
        changed["Fn_compute_blocks"] = (f"{SHALLOW_FN_COMPUTE_BLOCKS}: the default {config.Fn_compute_blocks} "
                                        f"needs more than the {shortest} blocks of this model's cached list")
        config.Fn_compute_blocks = SHALLOW_FN_COMPUTE_BLOCKS
    calibrator = None
    if name == "cache-dit-dbcache-taylorseer":
        calibrator = cache_dit.TaylorSeerCalibratorConfig(taylorseer_order=1)
    for key, value in (overrides or {}).items():
        target = calibrator if key == "taylorseer_order" else config
        if target is None or not hasattr(target, key):
            raise ValueError(f"cache-dit peer {name}: no setting {key!r} (a DBCacheConfig field, or "
                             "taylorseer_order with the calibrator)")
        setattr(target, key, value)
        changed[key] = f"{value}: set by the caller"
    return config, calibrator, changed


def _jsonable(value: Any) -> Any:
    if isinstance(value, enum.Enum):
        return value.name
    if isinstance(value, torch.Tensor):
        return value.tolist()
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return value


def _dataclass_dict(config: Any) -> dict[str, Any] | None:
    return None if config is None else _jsonable(dataclasses.asdict(config))


class _AttributeSnapshot:
    """The instance (and class) attributes of some objects, to put back exactly as they were.

    For modules the ``_modules`` / ``_parameters`` / ``_buffers`` tables are saved by content and
    order, so a submodule registered later (cache-dit's DiT functor adds ``_norm1_emb``) is removed
    again, and a block list that cache-dit's ``mock.patch`` re-registered at the end of ``_modules``
    (which reorders ``state_dict`` and the block lists) goes back to its place.
    """

    _TABLES = ("_modules", "_parameters", "_buffers")

    def __init__(self, objects: list[Any]) -> None:
        self._saved = []
        for obj in objects:
            attrs = dict(vars(obj))
            tables = {k: dict(attrs[k]) for k in self._TABLES if isinstance(attrs.get(k), dict)}
            self._saved.append((obj, attrs, tables))

    def restore(self) -> list[str]:
        """Undo every change; returns what was undone (``Class.attr``), for the record."""
        undone = []
        for obj, attrs, tables in self._saved:
            label = obj.__name__ if isinstance(obj, type) else type(obj).__name__
            current = dict(vars(obj))
            for key in current.keys() - attrs.keys():
                if isinstance(obj, type):
                    type.__delattr__(obj, key)
                else:
                    del obj.__dict__[key]
                undone.append(f"{label}.{key}")
            for key, value in attrs.items():
                if current.get(key, _MISSING) is not value:
                    if isinstance(obj, type):
                        type.__setattr__(obj, key, value)
                    else:
                        obj.__dict__[key] = value
                    undone.append(f"{label}.{key}")
            for key, saved in tables.items():
                table = obj.__dict__[key]
                if list(table) != list(saved) or any(table[k] is not v for k, v in saved.items()):
                    table.clear()
                    table.update(saved)
                    undone.append(f"{label}.{key}")
        return sorted(set(undone))


_MISSING = object()


class CacheDitStats:
    """cache-dit's own count of cached steps after the latest generation (``cache_dit.summary``)."""

    def __init__(self) -> None:
        self.last: dict[str, Any] = {}

    def record(self, summaries: list[Any]) -> None:
        # one entry per cached block list, then a transformer-level copy of the last one
        per_list = summaries[:-1] if len(summaries) > 1 else summaries
        contexts = [{"cached_steps": int(s.accumulated_cached_steps),
                     "executed_steps": int(s.accumulated_executed_steps),
                     "cached_step_indices": [int(i) for i in s.cached_steps]} for s in per_list]
        self.last = {**contexts[0], "contexts": len(contexts)} if contexts else {}
        if len(contexts) > 1:
            self.last["per_context"] = contexts

    def to_dict(self) -> dict[str, Any]:
        return dict(self.last)


class CacheDitCache:
    """Attach / detach one cache-dit configuration on a transformer (or its pipeline).

    Example:
        >>> cache = CacheDitCache(transformer, "cache-dit-dbcache", num_steps=28)  # doctest: +SKIP
        >>> cache.attach(); cache.start_generation(); out = run(); cache.detach()  # doctest: +SKIP
    """

    def __init__(self, transformer: nn.Module, name: str, num_steps: int, *, pipe: Any = None,
                 model: str | None = None, overrides: dict[str, Any] | None = None) -> None:
        self.cache_dit = import_cache_dit()
        self.transformer, self.name, self.num_steps, self.pipe = transformer, name, num_steps, pipe
        self.layout = block_layout(transformer, model)
        self.cache_config, self.calibrator_config, self.changed = cache_dit_configs(name, transformer, self.layout, overrides)
        self.stats = CacheDitStats()
        self._adapter: Any = None
        self._snapshot: _AttributeSnapshot | None = None
        self.undone: list[str] = []

    @property
    def persistent(self) -> bool:
        """Transformer-only mode: contexts live across calls and are refreshed per generation."""
        return self.pipe is None

    def _make_adapter(self) -> Any:
        from cache_dit.caching import patch_functors

        cd, layout, t = self.cache_dit, self.layout, self.transformer
        pattern = getattr(cd.ForwardPattern, layout.pattern)
        lists = [getattr(t, b) for b in layout.blocks]
        kwargs: dict[str, Any] = dict(pipe=self.pipe, transformer=t, check_forward_pattern=True,
                                      check_num_outputs=layout.check_num_outputs)
        if layout.patch_functor:
            kwargs["patch_functor"] = getattr(patch_functors, layout.patch_functor)()
        if layout.merged:
            blocks = nn.ModuleList([b for blocks in lists for b in blocks])
            kwargs.update(blocks=blocks, blocks_name=layout.blocks[0], dummy_blocks_names=list(layout.blocks[1:]),
                          forward_pattern=pattern)
        elif len(lists) == 1:
            kwargs.update(blocks=lists[0], blocks_name=layout.blocks[0], forward_pattern=pattern)
        else:
            kwargs.update(blocks=lists, blocks_name=list(layout.blocks), forward_pattern=[pattern] * len(lists))
        return cd.BlockAdapter(**kwargs)

    def _touched(self) -> list[Any]:
        from cache_dit.caching.block_adapters import FakeDiffusionPipeline

        objects: list[Any] = list(self.transformer.modules())
        objects.append(FakeDiffusionPipeline)
        if self.pipe is not None:
            objects += [self.pipe, type(self.pipe)]
        return objects

    def attach(self) -> None:
        import copy

        self._snapshot = _AttributeSnapshot(self._touched())
        try:
            self._adapter = self._make_adapter()
            self.cache_dit.enable_cache(self._adapter, cache_config=copy.deepcopy(self.cache_config),
                                        calibrator_config=copy.deepcopy(self.calibrator_config))
        except Exception:
            self.detach()
            raise

    def detach(self) -> None:
        """``cache_dit.disable_cache``, then every attribute back to its state before :meth:`attach`."""
        if self._adapter is not None:
            self.cache_dit.disable_cache(self._adapter)
            self._adapter = None
        if self._snapshot is not None:
            self.undone = self._snapshot.restore()
            self._snapshot = None

    def start_generation(self) -> None:
        """Fresh cache contexts (transformer-only mode; a wrapped pipeline call makes its own)."""
        if self.persistent:
            self.cache_dit.refresh_context(self.transformer, num_inference_steps=self.num_steps)

    def end_generation(self) -> None:
        self.stats.record(self.cache_dit.summary(self.transformer, logging=False))

    def describe(self) -> dict[str, Any]:
        """The arm's ``config`` in the JSON."""
        import cache_dit

        return {
            "library": f"cache-dit {getattr(cache_dit, '__version__', '?')}",
            "cache_config": _dataclass_dict(self.cache_config),
            "calibrator_config": _dataclass_dict(self.calibrator_config),
            "changed_from_defaults": self.changed,
            "adapter": {"blocks": list(self.layout.blocks), "forward_pattern": self.layout.pattern,
                        "patch_functor": self.layout.patch_functor, "merged": self.layout.merged,
                        "mode": "transformer-only: refresh_context before each generation" if self.persistent
                        else "pipeline: contexts reset by cache-dit at each pipeline call"},
        }
