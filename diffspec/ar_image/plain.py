"""The plain AR loop (one target call per image token): the baseline and the exactness reference.

Also the output object and post-processing every AR image generation call shares, so a target's
plain call and a speculative pipeline's call return the same thing.

Example:
    >>> from diffspec.ar_image.targets.toy import ToyTableTarget
    >>> target = ToyTableTarget(seed=0)
    >>> session = target.start(class_labels=[0, 1])
    >>> tokens = plain_sample(session, target.num_tokens, {"temperature": 1.0}, torch.Generator().manual_seed(0))
    >>> tokens.shape
    torch.Size([2, 6])
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from ..progress import progress
from ..speculation.sampling import Generators, force, sample, warp
from ..stats import SpecStats

if TYPE_CHECKING:
    from .target import ARImageTarget, ARSession

OUTPUT_TYPES = ("pil", "np", "pt", "tokens")


@dataclass
class ARImageOutput:
    """What an AR image generation call returns.

    Attributes:
        images: PIL images, ``(B, H, W, 3)`` numpy array or ``(B, 3, H, W)`` tensor in ``[0, 1]``
            (``output_type`` ``"pil"``, ``"np"``, ``"pt"``); ``None`` for ``"tokens"``.
        tokens: ``(B, num_tokens)`` image tokens (row-major over the grid).
        spec_stats: the call's :class:`~diffspec.stats.SpecStats`.
    """

    images: Any
    tokens: torch.Tensor
    spec_stats: SpecStats | None = None


def open_session(target: ARImageTarget, class_labels: Any = None, prompt: Any = None,
                 guidance_scale: float | None = None, **conditions: Any) -> ARSession:
    """``target.start`` with the conditions given (``None`` ones left out) and the target's default CFG."""
    if class_labels is not None:
        conditions["class_labels"] = class_labels
    if prompt is not None:
        conditions["prompt"] = prompt
    scale = getattr(target, "default_guidance_scale", 1.0) if guidance_scale is None else guidance_scale
    return target.start(guidance_scale=scale, **conditions)


def plain_sample(session: ARSession, num_tokens: int, sampling: dict[str, Any], generator: Generators,
                 stats: SpecStats | None = None, bar: Any = None) -> torch.Tensor:
    """Sample ``(B, num_tokens)`` image tokens one per target call (prefill + ``num_tokens - 1`` steps).

    Args:
        session: an open session (its ``first_logits`` predict token 0).
        num_tokens: image tokens per image.
        sampling: keyword arguments of :func:`~diffspec.speculation.sampling.warp`.
        generator: ``None``, a generator, or one per batch row.
        stats: counters to fill (``target_calls`` = ``num_tokens``, prefill included).
        bar: a tqdm bar advanced by the batch size per token.
    """
    batch = session.batch_size
    device = session.first_logits.device
    forced = session.forced_tokens()
    forced = None if forced is None else forced.to(device)
    tokens = torch.zeros(batch, num_tokens, dtype=torch.long, device=device)
    logits = session.first_logits
    for n in range(num_tokens):
        if n > 0:
            logits = session.step(tokens[:, n - 1:n], torch.full((batch,), n - 1, device=device))[:, 0]
        probs = warp(logits, **sampling)
        if forced is not None:
            probs = force(probs, forced[n].expand(batch))
        tokens[:, n] = sample(probs, generator)
        if bar is not None:
            bar.update(batch)
    if stats is not None:
        stats.target_calls += num_tokens
        stats.target_evals += num_tokens * session.cfg_branches
        stats.extra.update(iterations=num_tokens - 1, step_compression=1.0, tokens_per_call=1.0)
    return tokens


def finish(target: ARImageTarget, tokens: torch.Tensor, output_type: str = "pil", return_dict: bool = True,
           stats: SpecStats | None = None) -> Any:
    """Decode ``tokens`` to ``output_type`` and wrap them (``return_dict=False``: ``(images, tokens)``)."""
    if output_type not in OUTPUT_TYPES:
        raise ValueError(f"output_type={output_type!r} is not supported: choose one of {', '.join(OUTPUT_TYPES)}")
    images = None
    if output_type != "tokens":
        with torch.no_grad():
            images = (target.decode_tokens(tokens).float() / 2 + 0.5).clamp(0, 1)
        if output_type != "pt":
            images = images.cpu().permute(0, 2, 3, 1).numpy()
            if output_type == "pil":
                from diffusers.utils import numpy_to_pil

                images = numpy_to_pil(images)
    if not return_dict:
        return images, tokens
    return ARImageOutput(images=images, tokens=tokens, spec_stats=stats)


def generate_plain(target: ARImageTarget, class_labels: Any = None, prompt: Any = None,
                   guidance_scale: float | None = None, generator: Generators = None,
                   temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0,
                   stats: SpecStats | None = None, desc: str = "plain", **conditions: Any) -> torch.Tensor:
    """Open a session and run :func:`plain_sample` under a progress bar over committed tokens."""
    from .config import ARSamplingConfig

    sampling = ARSamplingConfig(temperature=temperature, top_k=top_k, top_p=top_p).sampling  # validates
    with torch.no_grad():
        session = open_session(target, class_labels, prompt, guidance_scale, **conditions)
        with progress(total=session.batch_size * target.num_tokens, desc=desc) as bar:
            return plain_sample(session, target.num_tokens, sampling, generator, stats, bar)
