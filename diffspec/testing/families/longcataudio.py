"""LongCat-AudioDiT (``LongCatAudioDiTTransformer``, as ``LongCatAudioDiTPipeline`` calls it: text-to-audio, no CFG).

An audio DiT on channels-last 1-D latents ``(B, T, C)`` (``latent_hw`` is the latent length T) with a long skip from
the input embedding to the blocks' output; its scheduler inverts the sigmas (the timestep grows over sampling).
"""

from __future__ import annotations

import torch
from torch import nn

from ..transformer_spec import Call, Family, Rand, TransformerSpec, text_mask


def _call(spec: TransformerSpec, batch: int, rand: Rand, device: str | torch.device,
          dtype: torch.dtype) -> tuple[torch.Tensor, Call]:
    cfg, length = spec.config, spec.latent_hw
    latents = rand(batch, length, cfg["latent_dim"])  # prepare_latents: (B, duration, latent_dim)
    # UMT5 states (layer-normed, plus the normed first hidden state), padded to the longest prompt, and their mask
    text = rand(batch, spec.text_tokens, cfg["dit_text_dim"])
    mask = text_mask(batch, spec.text_tokens, device).bool()
    frames = torch.ones(batch, length, dtype=torch.bool, device=device)  # _lens_to_mask of the (common) duration
    latent_cond = torch.zeros(batch, length, cfg["latent_dim"], device=device, dtype=dtype)  # text-to-audio: zeros

    def call(model: nn.Module, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        # FlowMatchEulerDiscreteScheduler(invert_sigmas=True) on sigmas 1 .. 1/n: the model sees t / 1000 = 1 - sigma
        # (0 = noise), growing over sampling, and predicts data - noise; negated into the loop's velocity
        timestep = (1 - t.expand(x.shape[0])).to(dtype)
        return -model(hidden_states=x, encoder_hidden_states=text, encoder_attention_mask=mask, timestep=timestep,
                      attention_mask=frames, latent_cond=latent_cond, return_dict=False)[0]

    return latents, call


def _init(model: nn.Module) -> None:
    """Random values for the global adaLN projection and the output layers, which the class initialises to zero (the
    prediction would be zero and the modulations time-independent)."""
    for module in (model.adaln_global_mlp.mlp[-1], model.norm_out.linear, model.proj_out):
        module.reset_parameters()


FAMILIES = {"longcataudio": Family(cls="LongCatAudioDiTTransformer", make_call=_call, timesteps="sigma",
                                   init=_init, audio=True)}

SPECS = {
    # the released layout (global adaLN with the text mean, long skip, ConvNeXt text convs, latent condition, QK norm)
    # at width 32, 2 heads of 16
    "tiny-longcataudio": TransformerSpec(
        "tiny-longcataudio", "longcataudio",
        dict(dit_dim=32, dit_depth=3, dit_heads=2, dit_text_dim=24, latent_dim=4, ff_mult=2.0),
        16, 6,
    ),
}
