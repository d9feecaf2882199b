"""One prepared exact-sampling call (:class:`Job`) and the helpers every pipeline preparer shares.

A preparer (:mod:`~diffspec.pipelines.prepare`, :mod:`~diffspec.pipelines.prepare_flux`) turns one
call's arguments into a :class:`Job`: the scheduler's Gaussian transition, the batched guided
denoiser, the initial latents and how to finish (decode into the pipeline's own output class).

Example:
    >>> refuse({"sigmas": None}, "sigmas")  # passes: the argument is left None
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from ..schedulers.gaussian import GaussianTransition
from ..schedulers.speculative import Denoise


@dataclass
class Job:
    """One prepared call: the sampler's inputs and how to finish.

    Attributes:
        kernel: the scheduler's Gaussian transition at the call's number of steps.
        denoise: the guided batched denoiser.
        latents: ``(B, ...)`` initial latents (scaled by the scheduler's initial sigma).
        generator: the call's generator(s).
        finish: decode the final latents into the pipeline's output (``output_type``, ``return_dict``).
        on_round: ``on_round(step, latents)`` runs the pipeline's callback after a round (``step``:
            the last step every trajectory has committed); returns replacement latents or ``None``.
    """

    kernel: GaussianTransition
    denoise: Denoise
    latents: torch.Tensor
    generator: Any
    finish: Callable[[torch.Tensor], Any]
    on_round: Callable[[int, torch.Tensor], torch.Tensor | None] | None = None


def refuse(a: dict[str, Any], *names: str) -> None:
    """``ValueError`` for the first of ``names`` the call sets (not ``None``): arguments the exact samplers
    cannot honour."""
    for name in names:
        if a.get(name) is not None:
            raise ValueError(f"{name}= is not supported by the exact samplers (they own the denoising loop and "
                             f"read the scheduler as a Gaussian transition); leave it None")


def pipeline_output(pipe: Any, images: Any, return_dict: bool, cls: Any) -> Any:
    """Free the pipeline's model hooks and wrap ``images`` as the pipeline does (``cls`` or a tuple)."""
    pipe.maybe_free_model_hooks()
    return cls(images=images) if return_dict else (images,)
