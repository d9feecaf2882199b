"""CogView3-Plus (``CogView3PlusTransformer2DModel``, called as ``CogView3PlusPipeline`` calls it)."""

from __future__ import annotations

from ..transformer_spec import Family, TransformerSpec
from .cogview4 import _call as _cogview_call

# CogView3PlusPipeline passes what CogView4Pipeline passes (NCHW latents patchified by the model, padded text states
# without a mask, original / target size in pixels and crop (0, 0)): T5 states instead of GLM's, and discrete 0..999
# timesteps of its CogVideoXDDIMScheduler (v-prediction) instead of 1000 * sigma

FAMILIES = {"cogview3plus": Family(cls="CogView3PlusTransformer2DModel", make_call=_cogview_call, timesteps="ddpm")}

SPECS = {
    # pos_embed_max_size bounds the latent grid (a sincos table of pos_embed_max_size**2 positions);
    # condition_dim sizes each micro-conditioning scalar's embedding (pooled projection = 6 * condition_dim)
    "tiny-cogview3plus": TransformerSpec(
        "tiny-cogview3plus", "cogview3plus",
        dict(patch_size=2, in_channels=4, num_layers=3, attention_head_dim=16, num_attention_heads=2, out_channels=4,
             text_embed_dim=24, time_embed_dim=32, condition_dim=8, pos_embed_max_size=8, sample_size=8),
        8, 6,
    ),
}
