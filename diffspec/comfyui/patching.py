"""Installing a :class:`~diffspec.comfyui.forecast.ComfyForecast` on a ComfyUI MODEL (a ModelPatcher).

The MODEL is cloned, never mutated. The clone gets:
- a ``patches_replace["dit"][(kind, i)]`` entry (:class:`BlockPatch`)
  for every block of every block list (``set_model_patch_replace``); a replacement another node
  installed before is chained, not dropped;
- an ``APPLY_MODEL`` wrapper that plans each model call (full or draft, per row) and recomputes rows
  after the verifier;
- an ``OUTER_SAMPLE`` wrapper that starts a fresh run and, in ``finally``, drops every anchor (also
  when sampling is interrupted), keeping the statistics for :func:`forecast_of`;
- the shared state under ``model_options["transformer_options"]["diffspec"]``.

``comfy`` is imported lazily and only for its wrapper-type names; the ModelPatcher is duck-typed
(``clone``, ``model_options``, ``set_model_patch_replace``, ``add_wrapper_with_key``, and
``model.diffusion_model``), so this module imports and is tested without ComfyUI.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch

from ..config import ForecastConfig, SpecaConfig
from ..forecast.engine import BlockPosition
from .forecast import ComfyForecast, DictStreams

KEY = "diffspec"
"""Key of the wrappers and of the shared state in ``transformer_options``."""

BLOCK_LISTS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("double_block", ("double_blocks", "joint_blocks", "transformer_blocks", "double_layers", "blocks")),
    ("single_block", ("single_blocks", "single_layers")),
)
"""Patch kind -> attribute names of the ComfyUI diffusion model's block lists, in execution order
(Flux/Chroma/HunyuanVideo: ``double_blocks`` + ``single_blocks``; SD3: ``joint_blocks``; Qwen-Image,
LTXV: ``transformer_blocks``; Wan, Mochi: ``blocks``; AuraFlow: ``double_layers`` + ``single_layers``)."""

UNSUPPORTED = {"HunYuanDiT": "its blocks take long-skip inputs from earlier blocks, which a draft step does not run"}


def wrapper_types() -> tuple[str, str]:
    """``(OUTER_SAMPLE, APPLY_MODEL)`` wrapper-type names, from ComfyUI when it is importable."""
    try:
        from comfy.patcher_extension import WrappersMP  # type: ignore[import-not-found]

        return WrappersMP.OUTER_SAMPLE, WrappersMP.APPLY_MODEL
    except ImportError:
        return "outer_sample", "apply_model"


def diffusion_model_of(model: Any) -> Any:
    """The ``diffusion_model`` module of a ModelPatcher (``model.model.diffusion_model``)."""
    dm = getattr(getattr(model, "model", None), "diffusion_model", None)
    if dm is None:
        raise TypeError(f"expected a ComfyUI MODEL (a ModelPatcher with .model.diffusion_model), got {type(model).__name__}")
    return dm


def find_block_lists(diffusion_model: Any) -> list[tuple[str, int]]:
    """``(patch kind, number of blocks)`` of a ComfyUI diffusion model's block lists (see :data:`BLOCK_LISTS`).

    Raises:
        ValueError: for a model without DiT block lists (UNet models such as SD1.5/SDXL) or a known
            unsupported family, naming what is supported.
    """
    name = type(diffusion_model).__name__
    if name in UNSUPPORTED:
        raise ValueError(f"diffspec forecasting does not support {name}: {UNSUPPORTED[name]}")
    found = []
    for kind, attrs in BLOCK_LISTS:
        for attr in attrs:
            blocks = getattr(diffusion_model, attr, None)
            if isinstance(blocks, torch.nn.ModuleList) and len(blocks) > 0:
                found.append((kind, len(blocks)))
                break
    if not found:
        known = sorted({a for _, attrs in BLOCK_LISTS for a in attrs})
        raise ValueError(
            f"{name} has no DiT block list that ComfyUI lets nodes replace (looked for {', '.join(known)}). "
            "diffspec forecasting needs a DiT that calls transformer_options['patches_replace']['dit'] per block: "
            "Flux, Chroma, SD3/SD3.5, HunyuanVideo, Wan, Qwen-Image, LTXV, Mochi, AuraFlow."
        )
    return found


class BlockPatch:
    """A ComfyUI ``patches_replace["dit"][(kind, i)]`` entry: ``patch(args, {"original_block": f}) -> dict``.

    Args:
        forecast: the shared :class:`ComfyForecast`.
        list_index: index of the block list in ``forecast.block_lists``.
        block_index: index of the block in its list.
        inner: a replacement that was installed before (another node's); it is called in place of the
            original block, so patches chain instead of being dropped.
    """

    def __init__(self, forecast: ComfyForecast, list_index: int, block_index: int, inner: Callable[[dict, dict], dict] | None = None) -> None:
        self.forecast = forecast
        n = forecast.block_lists[list_index][1]
        self.at = BlockPosition(list_index, block_index, first=block_index == 0, last=block_index == n - 1,
                                split=forecast.verify and list_index == len(forecast.block_lists) - 1)
        self.io = DictStreams()  # its streams, as the forecast engine reads them
        self.inner = inner

    def __deepcopy__(self, memo: dict) -> BlockPatch:
        return self

    def run(self, args: dict, extra: dict) -> dict:
        """The real block (or the replacement installed before this one)."""
        if self.inner is not None:
            return self.inner(args, extra)
        return extra["original_block"](args)

    def __call__(self, args: dict, extra: dict) -> dict:
        return self.forecast.block(self, args, extra)


class OuterSampleWrapper:
    """``OUTER_SAMPLE`` wrapper: one generation per call; state reset on entry and in ``finally``."""

    def __init__(self, forecast: ComfyForecast) -> None:
        self.forecast = forecast

    def __deepcopy__(self, memo: dict) -> OuterSampleWrapper:
        return self

    def __call__(self, executor: Any, *args: Any, **kwargs: Any) -> Any:
        # CFGGuider.outer_sample(noise, latent_image, sampler, sigmas, ...)
        sigmas = args[3] if len(args) > 3 else kwargs.get("sigmas")
        self.forecast.begin_run(sigmas)
        start = time.perf_counter()
        try:
            return executor(*args, **kwargs)
        finally:
            self.forecast.end_run(time.perf_counter() - start)


class ApplyModelWrapper:
    """``APPLY_MODEL`` wrapper: plans each model call and recomputes rows after the verifier."""

    def __init__(self, forecast: ComfyForecast) -> None:
        self.forecast = forecast

    def __deepcopy__(self, memo: dict) -> ApplyModelWrapper:
        return self

    def __call__(self, executor: Any, x: torch.Tensor, t: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        # BaseModel.apply_model(x, t, c_concat, c_crossattn, control, transformer_options, **kwargs)
        transformer_options = args[3] if len(args) > 3 else kwargs.get("transformer_options") or {}
        return self.forecast.run_call(lambda: executor(x, t, *args, **kwargs), x, t, transformer_options)


def apply_forecast(model: Any, config: ForecastConfig | SpecaConfig) -> Any:
    """A clone of the ComfyUI MODEL ``model`` that forecasts its DiT blocks under ``config``.

    Applying it again replaces the previous diffspec patches. Another node's block replacements
    are kept and chained (called in place of the original block).

    Example:
        >>> patched = apply_forecast(model, ForecastConfig(interval=4))  # doctest: +SKIP
        >>> forecast_of(patched).stats  # after sampling  # doctest: +SKIP
    """
    block_lists = find_block_lists(diffusion_model_of(model))
    forecast = ComfyForecast(config, block_lists)
    m = model.clone()
    outer, apply_model = wrapper_types()
    if hasattr(m, "remove_wrappers_with_key"):
        m.remove_wrappers_with_key(outer, KEY)
        m.remove_wrappers_with_key(apply_model, KEY)
    replaced = m.model_options.get("transformer_options", {}).get("patches_replace", {}).get("dit", {})
    for li, (kind, n) in enumerate(block_lists):
        for i in range(n):
            inner = replaced.get((kind, i))
            if isinstance(inner, BlockPatch):  # ours, from an earlier diffspec node: replace, don't chain
                inner = inner.inner
            m.set_model_patch_replace(BlockPatch(forecast, li, i, inner), "dit", kind, i)
    m.model_options.setdefault("transformer_options", {})[KEY] = forecast
    m.add_wrapper_with_key(outer, KEY, OuterSampleWrapper(forecast))
    m.add_wrapper_with_key(apply_model, KEY, ApplyModelWrapper(forecast))
    return m


def forecast_of(model: Any) -> ComfyForecast | None:
    """The diffspec state of a patched MODEL (None if it carries none)."""
    options = getattr(model, "model_options", None) or {}
    found = options.get("transformer_options", {}).get(KEY)
    return found if isinstance(found, ComfyForecast) else None
