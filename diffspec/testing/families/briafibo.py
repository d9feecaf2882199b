"""Bria FIBO (``BriaFiboTransformer2DModel``, called as ``BriaFiboPipeline`` calls it).

Flux-like double then single blocks; every block also reads one hidden layer of the text encoder, projected
into the second half of its text stream's channels.
"""

from __future__ import annotations

import torch
from torch import nn

from ..transformer_spec import Call, Family, Rand, TransformerSpec, text_mask

TEXT_LAYERS = 3  # hidden layers of the (tiny) text encoder: it returns TEXT_LAYERS + 1 hidden states


def _call(spec: TransformerSpec, batch: int, rand: Rand, device: str | torch.device,
          dtype: torch.dtype) -> tuple[torch.Tensor, Call]:
    cfg, hw, tokens = spec.config, spec.latent_hw, spec.text_tokens
    latents = rand(batch, hw * hw, cfg["in_channels"])  # do_patching=False: one token per latent pixel
    # prompts padded to the longest: the last two hidden states concatenated, and every hidden state (embeddings
    # included), trimmed from the front (or the last one repeated) to one per block
    text = rand(batch, tokens, cfg["joint_attention_dim"])
    layers = [rand(batch, tokens, cfg["text_encoder_dim"]) for _ in range(TEXT_LAYERS + 1)]
    blocks = cfg["num_layers"] + cfg["num_single_layers"]
    layers = layers[-blocks:] + [layers[-1]] * (blocks - len(layers))
    # some prompt is padded: the pipeline passes a boolean key mask over text + image tokens, (B, 1, 1, S)
    keep = torch.cat([text_mask(batch, tokens, device), torch.ones(batch, hw * hw, dtype=torch.long, device=device)], 1)
    attention = {"attention_mask": keep.bool()[:, None, None, :]}
    # position ids without a batch dimension (the pipeline drops it): image tokens (0, h, w), text tokens all zero
    img_ids = torch.zeros(hw, hw, 3)
    img_ids[..., 1] += torch.arange(hw)[:, None]
    img_ids[..., 2] += torch.arange(hw)[None, :]
    img_ids = img_ids.reshape(-1, 3).to(device=device, dtype=dtype)
    txt_ids = torch.zeros(tokens, 3, device=device, dtype=dtype)

    def call(model: nn.Module, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        # the scheduler's timestep (1000 * sigma) in the latents' dtype; the prediction is used as is
        return model(hidden_states=x, timestep=t.expand(x.shape[0]).to(dtype), encoder_hidden_states=text,
                     text_encoder_layers=layers, joint_attention_kwargs=attention, return_dict=False,
                     txt_ids=txt_ids, img_ids=img_ids)[0]

    return latents, call


FAMILIES = {"briafibo": Family(cls="BriaFiboTransformer2DModel", make_call=_call, timesteps="flow1000")}

SPECS = {
    # joint_attention_dim = 2 * text_encoder_dim (the last two hidden states concatenated); rope axes sum to the
    # head dim
    "tiny-briafibo": TransformerSpec(
        "tiny-briafibo", "briafibo",
        dict(patch_size=1, in_channels=8, num_layers=2, num_single_layers=2, attention_head_dim=16,
             num_attention_heads=2, joint_attention_dim=24, text_encoder_dim=12, axes_dims_rope=[4, 6, 6]),
        4, 6,
    ),
}
