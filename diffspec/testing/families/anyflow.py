"""AnyFlow (``AnyFlowTransformer3DModel``, as ``AnyFlowPipeline`` calls it: text-to-video flow-map sampling).

A Wan 2.1 backbone conditioned on a source timestep ``t`` and a target timestep ``r`` (both per frame). The pipeline's
default ``use_mean_velocity=True`` passes the next step's timestep as ``r``, which ``call(model, x, t)`` is not given;
this mirrors its ``use_mean_velocity=False`` mode (raw Euler stepping, ``r = t``).
"""

from __future__ import annotations

import torch
from torch import nn

from ..transformer_spec import Call, Family, Rand, TransformerSpec, text_mask


def _call(spec: TransformerSpec, batch: int, rand: Rand, device: str | torch.device,
          dtype: torch.dtype) -> tuple[torch.Tensor, Call]:
    cfg, hw, frames = spec.config, spec.latent_hw, spec.frames
    latents = rand(batch, frames, cfg["in_channels"], hw, hw)  # the pipeline permutes to (B, F, C, H, W)
    # UMT5 embeddings zero-padded past the prompt's length; no attention mask reaches the transformer
    text = rand(batch, spec.text_tokens, cfg["text_dim"]) * text_mask(batch, spec.text_tokens, device)[..., None]

    def call(model: nn.Module, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        # FlowMapEulerDiscreteScheduler timesteps (1000 * sigma), repeated per frame: (B, F); r = t (see the docstring)
        timestep = t.expand(x.shape[0]).unsqueeze(-1).repeat(1, x.shape[1])
        return model(hidden_states=x, timestep=timestep, r_timestep=timestep, encoder_hidden_states=text,
                     attention_kwargs=None, return_dict=False)[0]

    return latents, call


FAMILIES = {"anyflow": Family(cls="AnyFlowTransformer3DModel", make_call=_call, timesteps="flow1000")}

SPECS = {
    # the Wan 2.1 tiny layout of tiny-wan, plus the dual timestep embedding (gate_value 0.25, deltatime_type "r")
    "tiny-anyflow": TransformerSpec(
        "tiny-anyflow", "anyflow",
        dict(patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=16, in_channels=4, out_channels=4,
             text_dim=24, freq_dim=32, ffn_dim=64, num_layers=3, rope_max_seq_len=32),
        4, 6, 2,
    ),
}
