"""Peers run side by side: diffusers' own cache hooks, attached to any diffusers transformer.

``DiTTransformer2DModel`` and ``PixArtTransformer2DModel`` lack diffusers' ``CacheMixin``
(``enable_cache``), so the hooks are applied with diffusers' ``apply_*`` functions and removed by
hook name, exactly as ``CacheMixin.disable_cache`` does. Each generation runs in the ``"cond"``
cache context after a state reset, as diffusers' pipelines do.
"""

from __future__ import annotations

import contextlib
import io
import re
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from ..config import ForecastConfig

PEER_CACHES = ("diffusers-taylorseer", "diffusers-taylorseer-tuned", "diffusers-fbc", "diffusers-magcache")


ATTENTION_FALLBACK_IDENTIFIERS = [r"^[^.]*blocks\.\d+\.attn\d*$"]
"""Used when diffusers' default TaylorSeer patterns (module names ending in ``attn``) match no module,
as on DiT and PixArt, whose attention is ``attn1``; the defaults would silently cache nothing."""


def taylorseer_identifiers(transformer: nn.Module) -> list[str] | None:
    """None if diffusers' default TaylorSeer patterns hook something here, else the fallback patterns."""
    from diffusers.hooks.taylorseer_cache import _TRANSFORMER_BLOCK_IDENTIFIERS

    names = [n for n, _ in transformer.named_modules()]
    if any(re.fullmatch(p, n) for p in _TRANSFORMER_BLOCK_IDENTIFIERS for n in names):
        return None
    return ATTENTION_FALLBACK_IDENTIFIERS


def peer_cache_config(name: str, num_steps: int, mag_ratios: list[float] | None = None,
                      transformer: nn.Module | None = None, forecast: ForecastConfig | None = None) -> Any:
    """The diffusers config of a peer at its documented defaults (TaylorSeer: see :func:`taylorseer_identifiers`).

    ``diffusers-taylorseer-tuned`` is TaylorSeer at ``forecast``'s schedule (``taylor``'s config,
    default ``ForecastConfig()``): ``cache_interval = interval``, ``max_order = order`` and
    ``disable_cache_before_step = warmup``, so both run about the same number of full steps.
    """
    from diffusers import FirstBlockCacheConfig, MagCacheConfig, TaylorSeerCacheConfig

    if name in ("diffusers-taylorseer", "diffusers-taylorseer-tuned"):
        identifiers = taylorseer_identifiers(transformer) if transformer is not None else None
        if name == "diffusers-taylorseer":
            return TaylorSeerCacheConfig(cache_identifiers=identifiers)
        f = forecast or ForecastConfig()
        return TaylorSeerCacheConfig(cache_interval=f.interval, max_order=f.order, disable_cache_before_step=f.warmup,
                                     cache_identifiers=identifiers)
    if name == "diffusers-fbc":
        return FirstBlockCacheConfig()
    if name == "diffusers-magcache":
        if mag_ratios is None:
            return MagCacheConfig(calibrate=True, num_inference_steps=num_steps)
        return MagCacheConfig(mag_ratios=mag_ratios, num_inference_steps=num_steps)
    raise ValueError(f"unknown peer {name!r}; choose one of {', '.join(PEER_CACHES)}")


def taylorseer_full_steps(config: Any, num_steps: int) -> int:
    """Steps diffusers' TaylorSeer computes in full (its hook's rule: warmup, then every ``cache_interval``
    steps counting from ``disable_cache_before_step + 1``, and every step from ``disable_cache_after_step``)."""
    before, interval, after = config.disable_cache_before_step, config.cache_interval, config.disable_cache_after_step
    return sum(1 for s in range(num_steps)
               if s < before or (s - before - 1) % interval == 0 or (after is not None and s >= after))


def config_dict(config: Any) -> dict[str, Any]:
    """A JSON-friendly view of a diffusers cache config."""
    out = {}
    for key, value in vars(config).items():
        if callable(value):
            continue
        if isinstance(value, torch.Tensor):
            value = [round(float(v), 4) for v in value.flatten()] if value.numel() <= 64 else f"tensor{list(value.shape)}"
        elif isinstance(value, torch.dtype):
            value = str(value)
        out[key] = value
    return out


class DiffusersCache:
    """Attach / detach one diffusers cache config on a transformer and set its context per run."""

    def __init__(self, transformer: nn.Module, config: Any) -> None:
        self.transformer = transformer
        self.config = config

    def attach(self) -> None:
        from diffusers.hooks import HookRegistry

        if hasattr(self.transformer, "enable_cache"):
            self.transformer.enable_cache(self.config)
            return
        from diffusers import FirstBlockCacheConfig, MagCacheConfig, TaylorSeerCacheConfig
        from diffusers.hooks import apply_first_block_cache, apply_mag_cache, apply_taylorseer_cache

        apply = {TaylorSeerCacheConfig: apply_taylorseer_cache, FirstBlockCacheConfig: apply_first_block_cache,
                 MagCacheConfig: apply_mag_cache}[type(self.config)]
        apply(self.transformer, self.config)
        HookRegistry.check_if_exists_or_initialize(self.transformer).invalidate_child_registries_cache()

    def detach(self) -> None:
        from diffusers.hooks import HookRegistry

        if hasattr(self.transformer, "disable_cache"):
            self.transformer.disable_cache()
            return
        from diffusers.hooks.first_block_cache import _FBC_BLOCK_HOOK, _FBC_LEADER_BLOCK_HOOK
        from diffusers.hooks.mag_cache import _MAG_CACHE_BLOCK_HOOK, _MAG_CACHE_LEADER_BLOCK_HOOK
        from diffusers.hooks.taylorseer_cache import _TAYLORSEER_CACHE_HOOK

        registry = HookRegistry.check_if_exists_or_initialize(self.transformer)
        for name in (_TAYLORSEER_CACHE_HOOK, _FBC_LEADER_BLOCK_HOOK, _FBC_BLOCK_HOOK, _MAG_CACHE_LEADER_BLOCK_HOOK,
                     _MAG_CACHE_BLOCK_HOOK):
            registry.remove_hook(name, recurse=True)
        registry.invalidate_child_registries_cache()

    def start_generation(self) -> None:
        """Fresh state and the ``"cond"`` context (one batched call per step, CFG included)."""
        from diffusers.hooks import HookRegistry
        from diffusers.hooks.hooks import CacheContext, _set_cache_context

        HookRegistry.check_if_exists_or_initialize(self.transformer).reset_stateful_hooks(recurse=True)
        _set_cache_context(self.transformer, CacheContext("cond"))

    def end_generation(self) -> None:
        from diffusers.hooks.hooks import _set_cache_context

        _set_cache_context(self.transformer, None)


def calibrate_magcache(transformer: nn.Module, num_steps: int, generate: Callable[[], Any]) -> list[float]:
    """MagCache's documented calibration: one full run in ``calibrate=True`` mode, ratios parsed from its report."""
    cache = DiffusersCache(transformer, peer_cache_config("diffusers-magcache", num_steps))
    cache.attach()
    buf = io.StringIO()
    try:
        cache.start_generation()
        with contextlib.redirect_stdout(buf):
            generate()
        cache.end_generation()
    finally:
        cache.detach()
    match = re.search(r"\[([0-9eE.,\s+-]+)\]", buf.getvalue())
    if match is None:
        raise RuntimeError("MagCache calibration printed no ratios")
    ratios = [float(v) for v in match.group(1).split(",")]
    if len(ratios) != num_steps:
        raise RuntimeError(f"MagCache calibration gave {len(ratios)} ratios for {num_steps} steps")
    return ratios
