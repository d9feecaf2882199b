"""Bria FIBO 2.0 (``BriaFibo2Transformer2DModel``, called as ``BriaFibo2Pipeline`` calls it).

Z-Image-like single-stream blocks: a noise refiner on the image tokens, then the main layers on gist tokens (a
Perceiver's summary of the prompt) followed by the image tokens; some main layers also cross-attend to the prompt.
"""

from __future__ import annotations

import torch
from torch import nn

from ..transformer_spec import Call, Family, Rand, TransformerSpec

SHORT_PROMPT = 5  # tokens of the odd rows' prompts (the even rows' fill spec.text_tokens)


def _call(spec: TransformerSpec, batch: int, rand: Rand, device: str | torch.device,
          dtype: torch.dtype) -> tuple[torch.Tensor, Call]:
    cfg, hw, tokens = spec.config, spec.latent_hw, spec.text_tokens
    latents = rand(batch, cfg["in_channels"], hw, hw)  # (B, C, H, W): the model patchifies them itself
    # Qwen3-VL bundles (B, 1 + len(injection_layer_ids), L, cap_feat_dim): the Perceiver's, then one per injection
    # block; prompts padded to the longest with the bool mask of real tokens (None only when none is padded). Odd
    # rows hold a short prompt: fewer gist tokens of its own, padded (masked) to the batch's count, placed last
    bundles = 1 + len(cfg["injection_layer_ids"])
    text = rand(batch, bundles, tokens, cfg["cap_feat_dim"])
    lengths = torch.tensor([tokens if i % 2 == 0 else SHORT_PROMPT for i in range(batch)], device=device)
    mask = torch.arange(tokens, device=device)[None] < lengths[:, None]
    mask = None if bool(mask.all()) else mask  # encode_prompt drops a mask that pads nothing (a batch of one)

    def call(model: nn.Module, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        # the pipeline passes t / 1000 (1 = noise, 0 = image); the model scales it by t_scale = 1000
        return model(hidden_states=x, timestep=t.expand(x.shape[0]), encoder_hidden_states=text,
                     encoder_attention_mask=mask, return_dict=False)[0]

    return latents, call


def _init(model: nn.Module) -> None:
    """Random values for the injection blocks' cross-attention gates, which the class initialises to zero (the
    blocks would ignore their prompt bundle)."""
    for module in model.modules():
        if type(module).__name__ == "BriaFibo2TransformerBlock" and module.cross_attention is not None:
            nn.init.normal_(module.cross_attn_gate)


FAMILIES = {"briafibo2": Family(cls="BriaFibo2Transformer2DModel", make_call=_call, timesteps="sigma", init=_init)}

SPECS = {
    # rope axes sum to the head dim; axes_lens[0] > max_num_gist_tokens + 1 (the image's rope plane). Gist tokens:
    # 8 for a 12-token prompt, 4 for a 5-token one (under gist_min_text_len); the last layer is an injection one
    "tiny-briafibo2": TransformerSpec(
        "tiny-briafibo2", "briafibo2",
        dict(in_channels=4, patch_size=2, dim=32, n_layers=3, n_refiner_layers=2, n_heads=2, cap_feat_dim=24,
             injection_layer_ids=(1, 2), perceiver_num_layers=1, min_num_gist_tokens=4, max_num_gist_tokens=8,
             gist_step=4, gist_min_text_len=8, gist_max_text_len=16, axes_dims=(4, 6, 6), axes_lens=(16, 8, 8)),
        8, 12,
    ),
}
