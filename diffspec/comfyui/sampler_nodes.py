"""ComfyUI nodes (V1) for exact speculative sampling: a ``SAMPLER`` and its statistics.

- ``diffspec Speculative Sampler``: a ``SAMPLER`` for ``SamplerCustom`` / ``SamplerCustomAdvanced``
  (like ``KSamplerSelect``'s) running ComfyUI's ``euler_ancestral`` or ``ddpm`` step with exact
  speculative sampling (reflection-coupling verification of frozen-``x0`` drafts). Same output law
  as the plain sampler with the same model, sigmas, guidance, eta and s_noise; fewer sequential
  model calls. The step noise is seeded from the sampler node's noise seed, as ComfyUI's own samplers.
- ``diffspec Sampler Stats``: the latest run's model calls and acceptance as a STRING; the LATENT
  passes through.
"""

from __future__ import annotations

import json
from typing import Any

import torch

from ..config import CouplingConfig
from ..schedulers.sigma import KINDS, SigmaTransition
from .nodes import _SAMPLES, CATEGORY, StatsNode, _choice, _float, _int
from .sampler import SpeculativeRun, sample_speculative

_DEFAULT = CouplingConfig()


class SpeculativeSamplerNode:
    """-> SAMPLER: exact speculative ``euler_ancestral`` / ``ddpm`` (ComfyUI's step law, fewer model calls)."""

    @classmethod
    def INPUT_TYPES(cls) -> dict[str, Any]:  # noqa: N802 (ComfyUI's name)
        return {"required": {
            "sampler": _choice(list(KINDS), "euler_ancestral",
                               "The ComfyUI sampler whose law is kept (euler_ancestral follows the model: "
                               "rectified-flow models get ComfyUI's RF ancestral step)."),
            "lookahead": _int(_DEFAULT.lookahead, 1, 256, "Drafted steps verified per model call at the start "
                              "(1 with adaptive off: the plain sampler)."),
            "adaptive": ("BOOLEAN", {"default": _DEFAULT.adaptive,
                                     "tooltip": "Double the lookahead after a fully accepted round, halve it after "
                                                "a round that kept less than half."}),
            "max_lookahead": _int(_DEFAULT.max_lookahead, 1, 256, "Upper bound of the adaptive lookahead."),
            "eta": _float(1.0, 0.01, 1.0, 0.01, "Ancestral noise fraction (euler_ancestral); must be > 0 for "
                          "speculation. Ignored by ddpm."),
            "s_noise": _float(1.0, 0.0, 100.0, 0.01, "Noise multiplier (euler_ancestral). Ignored by ddpm."),
        }}

    RETURN_TYPES = ("SAMPLER",)
    RETURN_NAMES = ("sampler",)
    FUNCTION = "get_sampler"
    CATEGORY = CATEGORY
    DESCRIPTION = ("Exact speculative sampling of euler_ancestral / ddpm: drafts several steps, verifies them in one "
                   "batched model call (reflection coupling). Same output law as the plain sampler; fewer calls.")

    def get_sampler(self, sampler: str, lookahead: int, adaptive: bool, max_lookahead: int, eta: float,
                    s_noise: float) -> tuple[Any]:
        """A ComfyUI ``KSAMPLER`` whose function is :func:`~diffspec.comfyui.sampler.sample_speculative`."""
        from comfy.samplers import KSAMPLER  # lazy: only inside ComfyUI (or a test's stand-in)

        if sampler not in KINDS:
            raise ValueError(f"sampler={sampler!r} is not supported: allowed {', '.join(KINDS)}")
        # validate now, as sampling would: the lookahead fields, then the step law (eta, s_noise)
        CouplingConfig(lookahead=lookahead, adaptive=adaptive, max_lookahead=max_lookahead)
        SigmaTransition(torch.tensor([1.0, 0.0]), sampler, eta=eta, s_noise=s_noise)
        options = {"kind": sampler, "lookahead": lookahead, "adaptive": adaptive, "max_lookahead": max_lookahead,
                   "eta": eta, "s_noise": s_noise, "run": SpeculativeRun()}
        return (KSAMPLER(sample_speculative, extra_options=options),)


def sampler_stats_text(sampler: Any) -> str:
    """Summary line plus the JSON of the latest run's :class:`~diffspec.stats.SpecStats`."""
    run = getattr(sampler, "extra_options", {}).get("run")
    if not isinstance(run, SpeculativeRun):
        return "not a diffspec SAMPLER (connect the output of diffspec Speculative Sampler)"
    if run.runs == 0:
        return "diffspec coupling: no sampling run yet"
    return run.summary() + "\n" + json.dumps(run.stats.to_dict(), indent=1, default=str)


class SamplerStats(StatsNode):
    """Reports the sequential model calls and draft acceptance of a diffspec SAMPLER's latest run.

    Connect the SAMPLER given to SamplerCustom and its output LATENT (which orders this node after
    sampling); the LATENT passes through, the STRING can go to a text preview node.
    """

    @classmethod
    def INPUT_TYPES(cls) -> dict[str, Any]:  # noqa: N802 (ComfyUI's name)
        return {"required": {
            "sampler": ("SAMPLER", {"tooltip": "The diffspec Speculative Sampler's output."}),
            "samples": _SAMPLES,
        }}

    DESCRIPTION = "Sequential model calls and draft acceptance of the latest run of a diffspec SAMPLER."

    def report(self, sampler: Any, samples: Any) -> dict[str, Any]:
        """``{"ui": {"text": [stats]}, "result": (samples, stats)}``."""
        return self.output(sampler_stats_text(sampler), samples)


SAMPLER_NODE_CLASS_MAPPINGS: dict[str, type] = {
    "DiffspecSpeculativeSampler": SpeculativeSamplerNode,
    "DiffspecSamplerStats": SamplerStats,
}
SAMPLER_NODE_DISPLAY_NAME_MAPPINGS: dict[str, str] = {
    "DiffspecSpeculativeSampler": "diffspec Speculative Sampler",
    "DiffspecSamplerStats": "diffspec Sampler Stats",
}
