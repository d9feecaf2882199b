"""ComfyUI nodes (V1 contract): MODEL -> MODEL forecast patches and a statistics node.

- ``diffspec Taylor Forecast``: fixed-interval Taylor forecasting of the DiT block lists; a forecast
  step runs no transformer block.
- ``diffspec SpecA Forecast``: the same forecast, gated per batch row by a verifier that reruns the
  last block on the drafted input.
- ``diffspec Forecast Stats``: after sampling, the full / forecast model calls of the MODEL's latest
  run as a STRING (and in the node's UI); its LATENT passes through.

The exact speculative SAMPLER node is in :mod:`diffspec.comfyui.sampler_nodes`.
"""

from __future__ import annotations

import json
from typing import Any

from ..config import FALLBACK_TAU, ForecastConfig, SpecaConfig
from .patching import apply_forecast, forecast_of

CATEGORY = "diffspec"

_DEFAULT = ForecastConfig()
_SPECA = SpecaConfig()


def _int(default: int, lo: int, hi: int, tooltip: str) -> tuple[str, dict[str, Any]]:
    return ("INT", {"default": default, "min": lo, "max": hi, "step": 1, "tooltip": tooltip})


def _float(default: float, lo: float, hi: float, step: float, tooltip: str) -> tuple[str, dict[str, Any]]:
    return ("FLOAT", {"default": default, "min": lo, "max": hi, "step": step, "tooltip": tooltip})


def _choice(choices: list[str], default: str, tooltip: str) -> tuple[list[str], dict[str, Any]]:
    return (choices, {"default": default, "tooltip": tooltip})


_MODEL = ("MODEL", {"tooltip": "A DiT model (Flux, Chroma, SD3, HunyuanVideo, Wan, Qwen-Image, LTXV...)."})
_COMMON = {
    "order": _int(_DEFAULT.order, 0, 4, "Polynomial order of the forecast (0 reuses the last full step)."),
    "warmup": _int(_DEFAULT.warmup, 1, 1000, "Leading sampling steps that always run in full."),
    "last_step_full": ("BOOLEAN", {"default": True, "tooltip": "Always run the final step in full."}),
    "form": _choice(["newton", "taylor"], _DEFAULT.form,
                    "newton: exact interpolation through the anchors at any spacing; taylor: TaylorSeer's recursion."),
    "abscissa": _choice(["sigma", "index"], _DEFAULT.abscissa,
                        "Extrapolate in sigma (true step spacing) or in step index (as the papers)."),
}


class TaylorForecast:
    """MODEL -> MODEL: fixed-interval Taylor forecasting of the transformer block lists.

    After ``warmup`` full steps, one step in ``interval`` runs in full (or ``full_steps`` full steps spread
    evenly over the run); on the others no transformer block runs: each block list's output is extrapolated
    from the last ``order + 1`` full steps.
    """

    @classmethod
    def INPUT_TYPES(cls) -> dict[str, Any]:  # noqa: N802 (ComfyUI's name)
        return {"required": {
            "model": _MODEL,
            "interval": _int(_DEFAULT.interval, 1, 100, "A full step every `interval` steps after warmup (1: never forecast)."),
            "full_steps": _int(0, 0, 10_000, "Instead of `interval` (0: use interval): exactly this many full steps per "
                               "run, the warmup, the last step and the rest spread evenly."),
            **_COMMON,
        }}

    RETURN_TYPES = ("MODEL",)
    RETURN_NAMES = ("model",)
    FUNCTION = "patch"
    CATEGORY = CATEGORY
    DESCRIPTION = "Forecast DiT block outputs at a fixed interval (TaylorSeer-style; relaxed: small quality loss)."

    def patch(self, model: Any, interval: int, full_steps: int, order: int, warmup: int, last_step_full: bool,
              form: str, abscissa: str) -> tuple[Any]:
        """Return a patched clone of ``model``."""
        config = ForecastConfig(order=order, interval=interval, warmup=warmup, last_step_full=last_step_full,
                                form=form, abscissa=abscissa, full_steps=full_steps or None)
        return (apply_forecast(model, config),)


class SpecaForecast:
    """MODEL -> MODEL: Taylor forecasting gated by a last-block verifier, per batch row (SpecA).

    A draft is checked once ``k_min`` drafts ran in a row: the last block runs on the drafted input
    and the relative error of its draft must stay under ``tau(p) = max(tau0 * beta**p, tau_min)``
    (``p``: progress 0..1); otherwise the step is recomputed (strict) or the next one is full (lazy).
    """

    @classmethod
    def INPUT_TYPES(cls) -> dict[str, Any]:  # noqa: N802 (ComfyUI's name)
        return {"required": {
            "model": _MODEL,
            "tau0": _float(FALLBACK_TAU["tau0"], 0.0, 100.0, 0.001, "Error threshold at the first step."),
            "beta": _float(FALLBACK_TAU["beta"], 0.001, 100.0, 0.001,
                           "Threshold factor over the run (tau0 * beta at the last step); < 1 tightens it."),
            "tau_min": _float(FALLBACK_TAU["tau_min"], 0.0, 100.0, 0.001, "Lowest threshold."),
            "k_min": _int(_SPECA.k_min, 0, 1000, "Drafts in a row before checks start (0: check every draft)."),
            "k_max": _int(_SPECA.k_max, 1, 1000, "Full steps are at most k_max steps apart."),
            **_COMMON,
            "policy": _choice(["strict", "lazy"], _SPECA.policy,
                              "strict: recompute a rejected draft before it is used; lazy: keep it, next step full."),
            "metric": _choice(["rel_l1", "rel_res", "rel_l1_mean"], _SPECA.metric,
                              "Verifier error: relative L1 of the block output, of its residual, or the "
                              "reference code's elementwise mean."),
        }}

    RETURN_TYPES = ("MODEL",)
    RETURN_NAMES = ("model",)
    FUNCTION = "patch"
    CATEGORY = CATEGORY
    DESCRIPTION = "Forecast DiT block outputs, verified on the last block per row (SpecA-style; relaxed)."

    def patch(self, model: Any, tau0: float, beta: float, tau_min: float, k_min: int, k_max: int, order: int,
              warmup: int, last_step_full: bool, form: str, abscissa: str, policy: str, metric: str) -> tuple[Any]:
        """Return a patched clone of ``model``."""
        config = SpecaConfig(order=order, warmup=warmup, k_min=k_min, k_max=k_max, tau0=tau0, beta=beta,
                             tau_min=tau_min, policy=policy, metric=metric, last_step_full=last_step_full,
                             form=form, abscissa=abscissa)
        return (apply_forecast(model, config),)


def stats_text(model: Any) -> str:
    """Summary line plus the JSON of the latest run's :class:`~diffspec.stats.SpecStats`."""
    forecast = forecast_of(model)
    if forecast is None:
        return "no diffspec forecast on this MODEL (connect the MODEL output of a diffspec forecast node)"
    if forecast.runs == 0:
        return f"diffspec {forecast.stats.method}: no sampling run yet"
    data = forecast.stats.to_dict()
    data.get("extra", {}).pop("checked_errors", None)
    return forecast.summary() + "\n" + json.dumps(data, indent=1, default=str)


_SAMPLES = ("LATENT", {"tooltip": "The sampler's output (runs this node after sampling)."})


class StatsNode:
    """What the statistics nodes share: (source, LATENT) -> (LATENT, STRING), shown in the node's UI."""

    RETURN_TYPES = ("LATENT", "STRING")
    RETURN_NAMES = ("samples", "stats")
    FUNCTION = "report"
    CATEGORY = CATEGORY
    OUTPUT_NODE = True

    @staticmethod
    def output(text: str, samples: Any) -> dict[str, Any]:
        """``{"ui": {"text": [text]}, "result": (samples, text)}``."""
        return {"ui": {"text": [text]}, "result": (samples, text)}


class ForecastStats(StatsNode):
    """Reports the full / forecast model calls of the MODEL's latest sampling run.

    Connect the MODEL the sampler used and the sampler's LATENT output (which orders this node after
    sampling); the LATENT passes through, the STRING can go to a text preview node.
    """

    @classmethod
    def INPUT_TYPES(cls) -> dict[str, Any]:  # noqa: N802 (ComfyUI's name)
        return {"required": {
            "model": ("MODEL", {"tooltip": "The forecast-patched MODEL given to the sampler."}),
            "samples": _SAMPLES,
        }}

    DESCRIPTION = "Full vs forecast model calls of the latest run of a diffspec-patched MODEL."

    def report(self, model: Any, samples: Any) -> dict[str, Any]:
        """``{"ui": {"text": [stats]}, "result": (samples, stats)}``."""
        return self.output(stats_text(model), samples)


NODE_CLASS_MAPPINGS: dict[str, type] = {
    "DiffspecSpecaForecast": SpecaForecast,
    "DiffspecTaylorForecast": TaylorForecast,
    "DiffspecForecastStats": ForecastStats,
}
NODE_DISPLAY_NAME_MAPPINGS: dict[str, str] = {
    "DiffspecSpecaForecast": "diffspec SpecA Forecast",
    "DiffspecTaylorForecast": "diffspec Taylor Forecast",
    "DiffspecForecastStats": "diffspec Forecast Stats",
}
