"""Per-pipeline guided denoisers for the exact samplers: many rows, each at its own step, in ONE transformer call.

A denoiser is ``denoise(model_input, steps, traj) -> output`` (see
:data:`~diffspec.schedulers.speculative.Denoise`): row ``r`` is at step index ``steps[r]`` of the
sampler and belongs to trajectory ``traj[r]``, whose conditioning (class label, prompt embeddings
and mask, pooled projections, micro-conditions) is gathered per row. Under classifier-free
guidance the rows are doubled (unconditional and conditional halves, in the order the pipeline
uses) and combined as the pipeline does; learned-sigma channels are dropped.

Example:
    >>> denoise = dit_denoiser(pipe, torch.tensor([1, 2]), 4.0, kernel.timesteps)  # doctest: +SKIP
    >>> eps = denoise(x, torch.tensor([0, 7]), torch.tensor([0, 1]))  # rows at steps 0 and 7  # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ..schedulers.speculative import Denoise

Forward = Callable[[torch.Tensor, torch.Tensor, dict[str, Any]], torch.Tensor]
"""``forward(hidden_states, timesteps, conditioning) -> raw transformer output`` for a batch of rows."""


def _gather(cond: dict[str, torch.Tensor | None], traj: torch.Tensor) -> dict[str, torch.Tensor | None]:
    return {k: None if v is None else v[traj] for k, v in cond.items()}


def guided_denoiser(forward: Forward, timesteps: torch.Tensor | None, cond: dict[str, torch.Tensor | None],
                    uncond: dict[str, torch.Tensor | None] | None, guidance_scale: float,
                    channels: int | None = None, cond_first: bool = False) -> Denoise:
    """The guided denoiser over per-trajectory conditioning tensors (first dimension: trajectory).

    Args:
        forward: the transformer call (see :data:`Forward`).
        timesteps: ``(N,)`` the model timestep of each step index (or ``None``, then set later with the
            returned function's ``set_timesteps(values)``).
        cond: conditional inputs per trajectory (``None`` values are passed as ``None``).
        uncond: unconditional inputs with the same keys, or ``None`` for no guidance.
        guidance_scale: ``uncond + scale * (cond - uncond)``.
        channels: keep the first ``channels`` output channels (learned sigma dropped); ``None`` keeps all.
        cond_first: the conditional half comes first in the doubled batch (DiT's order).

    Returns:
        A :data:`Denoise` returning float32 outputs.
    """

    table = {"timesteps": timesteps}

    def denoise(model_input: torch.Tensor, steps: torch.Tensor, traj: torch.Tensor) -> torch.Tensor:
        t = table["timesteps"][steps]
        kwargs = _gather(cond, traj)
        if uncond is not None:
            other = _gather(uncond, traj)
            halves = (kwargs, other) if cond_first else (other, kwargs)
            kwargs = {k: None if v is None else torch.cat([halves[0][k], halves[1][k]]) for k, v in kwargs.items()}
            model_input, t = torch.cat([model_input, model_input]), torch.cat([t, t])
        out = forward(model_input, t, kwargs)
        out = (out if channels is None else out[:, :channels]).float()
        if uncond is not None:
            first, second = out.chunk(2)
            cond_out, uncond_out = (first, second) if cond_first else (second, first)
            out = uncond_out + guidance_scale * (cond_out - uncond_out)
        return out

    denoise.set_timesteps = lambda values: table.update(timesteps=values)  # type: ignore[attr-defined]
    return denoise


def dit_denoiser(pipe: Any, class_labels: torch.Tensor, guidance_scale: float,
                 timesteps: torch.Tensor | None = None) -> Denoise:
    """``DiTPipeline``: rows ``[cond, null class 1000]`` under guidance, learned-sigma channels dropped."""
    transformer = pipe.transformer

    def forward(x: torch.Tensor, t: torch.Tensor, kw: dict[str, Any]) -> torch.Tensor:
        return transformer(x.to(transformer.dtype), timestep=t, class_labels=kw["labels"]).sample

    uncond = {"labels": torch.full_like(class_labels, 1000)} if guidance_scale > 1 else None
    return guided_denoiser(forward, timesteps, {"labels": class_labels}, uncond, guidance_scale,
                           channels=transformer.config.in_channels, cond_first=True)


def pixart_denoiser(pipe: Any, timesteps: torch.Tensor, embeds: tuple[torch.Tensor, torch.Tensor],
                    negative: tuple[torch.Tensor, torch.Tensor] | None, guidance_scale: float,
                    micro: dict[str, torch.Tensor] | None = None) -> Denoise:
    """``PixArtAlphaPipeline`` / ``PixArtSigmaPipeline``: T5 embeddings and mask per row, optional
    resolution / aspect-ratio micro-conditions, rows ``[negative, positive]`` under guidance, and
    the learned-sigma half of the output channels dropped when the transformer predicts it."""
    transformer = pipe.transformer
    channels = transformer.config.in_channels
    learned_sigma = transformer.config.out_channels // 2 == channels

    def forward(x: torch.Tensor, t: torch.Tensor, kw: dict[str, Any]) -> torch.Tensor:
        added = {"resolution": kw["resolution"], "aspect_ratio": kw["aspect_ratio"]}
        return transformer(x.to(transformer.dtype), encoder_hidden_states=kw["embeds"],
                           encoder_attention_mask=kw["mask"], timestep=t, added_cond_kwargs=added,
                           return_dict=False)[0]

    micro = micro or {"resolution": None, "aspect_ratio": None}
    cond = {"embeds": embeds[0], "mask": embeds[1], **micro}
    uncond = None if negative is None else {"embeds": negative[0], "mask": negative[1], **micro}
    return guided_denoiser(forward, timesteps, cond, uncond, guidance_scale,
                           channels=channels if learned_sigma else None)


def sd3_denoiser(pipe: Any, timesteps: torch.Tensor, embeds: tuple[torch.Tensor, torch.Tensor],
                 negative: tuple[torch.Tensor, torch.Tensor] | None, guidance_scale: float,
                 joint_attention_kwargs: dict[str, Any] | None = None) -> Denoise:
    """``StableDiffusion3Pipeline``: joint text embeddings and pooled projections per row, rows
    ``[negative, positive]`` under guidance; the output is the flow velocity."""
    transformer = pipe.transformer

    def forward(x: torch.Tensor, t: torch.Tensor, kw: dict[str, Any]) -> torch.Tensor:
        return transformer(hidden_states=x.to(transformer.dtype), timestep=t, encoder_hidden_states=kw["embeds"],
                           pooled_projections=kw["pooled"], joint_attention_kwargs=joint_attention_kwargs,
                           return_dict=False)[0]

    cond = {"embeds": embeds[0], "pooled": embeds[1]}
    uncond = None if negative is None else {"embeds": negative[0], "pooled": negative[1]}
    return guided_denoiser(forward, timesteps, cond, uncond, guidance_scale)


def flux_denoiser(pipe: Any, timesteps: torch.Tensor, embeds: tuple[torch.Tensor, torch.Tensor],
                  negative: tuple[torch.Tensor, torch.Tensor] | None, true_cfg_scale: float, guidance_scale: float,
                  ids: tuple[torch.Tensor, torch.Tensor],
                  joint_attention_kwargs: dict[str, Any] | None = None) -> Denoise:
    """``FluxPipeline``: T5 embeddings and pooled CLIP projections per row, ``timestep / 1000``, the
    distilled ``guidance`` (``guidance_scale`` per row) where the transformer embeds it, the shared
    text and image position ids ``ids = (txt_ids, img_ids)``. True CFG (``negative`` given): the
    negative rows join the same call, combined as ``neg + true_cfg_scale * (cond - neg)``."""
    transformer = pipe.transformer
    embedded = transformer.config.guidance_embeds

    def forward(x: torch.Tensor, t: torch.Tensor, kw: dict[str, Any]) -> torch.Tensor:
        guidance = torch.full((x.shape[0],), guidance_scale, device=x.device, dtype=torch.float32) if embedded else None
        return transformer(hidden_states=x.to(transformer.dtype), timestep=t.to(x.dtype) / 1000, guidance=guidance,
                           pooled_projections=kw["pooled"], encoder_hidden_states=kw["embeds"], txt_ids=ids[0],
                           img_ids=ids[1], joint_attention_kwargs=joint_attention_kwargs, return_dict=False)[0]

    cond = {"embeds": embeds[0], "pooled": embeds[1]}
    uncond = None if negative is None else {"embeds": negative[0], "pooled": negative[1]}
    return guided_denoiser(forward, timesteps, cond, uncond, true_cfg_scale, cond_first=True)
