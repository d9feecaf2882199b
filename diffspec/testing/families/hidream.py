"""HiDream-I1 (``HiDreamImageTransformer2DModel``, called as ``HiDreamImagePipeline`` calls it).

Double-stream then single-stream blocks with mixture-of-experts feed-forwards; every block also reads one
Llama-3 hidden layer of the prompt, concatenated to its text stream (double) or its tokens (single).
"""

from __future__ import annotations

import torch
from torch import nn

from ..transformer_spec import Call, Family, Rand, TransformerSpec

LLAMA_LAYERS = 3  # hidden layers of the (tiny) Llama-3 text encoder: the stack the pipeline passes


def _call(spec: TransformerSpec, batch: int, rand: Rand, device: str | torch.device,
          dtype: torch.dtype) -> tuple[torch.Tensor, Call]:
    cfg, hw, tokens = spec.config, spec.latent_hw, spec.text_tokens
    t5_dim, llama_dim = cfg["caption_channels"]
    # square (B, C, H, W) latents: the model patchifies them itself (no token mask, img_ids built inside)
    latents = rand(batch, cfg["in_channels"], hw, hw)
    # T5 and Llama-3 states padded to max_length, no mask reaches the transformer; Llama-3 comes as the stack
    # of its hidden layers, (layers, B, L, D): the batch is dim 1 (rows.py BATCH_DIM1_ARGS)
    t5 = rand(batch, tokens, t5_dim)
    llama = rand(LLAMA_LAYERS, batch, tokens, llama_dim)
    pooled = rand(batch, cfg["text_emb_dim"])  # the two CLIP pooled embeddings, concatenated

    def call(model: nn.Module, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        # flow-matching timesteps (1000 * sigma) under the name ``timesteps``; the pipeline negates the prediction
        out = model(hidden_states=x, timesteps=t.expand(x.shape[0]), encoder_hidden_states_t5=t5,
                    encoder_hidden_states_llama3=llama, pooled_embeds=pooled, return_dict=False)[0]
        return -out

    return latents, call


FAMILIES = {"hidream": Family(cls="HiDreamImageTransformer2DModel", make_call=_call, timesteps="flow1000")}

SPECS = {
    # rope axes (8, 4, 4) sum to the head dim, as (64, 32, 32) for 128 at real size; llama_layers names the
    # Llama-3 layer each block reads (num_layers + num_single_layers entries, repeats allowed); the feed-forwards
    # round their hidden size up to a multiple of 256 whatever the dim
    "tiny-hidream": TransformerSpec(
        "tiny-hidream", "hidream",
        dict(patch_size=2, in_channels=4, out_channels=4, num_layers=2, num_single_layers=2, attention_head_dim=16,
             num_attention_heads=2, caption_channels=[24, 20], text_emb_dim=16, num_routed_experts=4,
             num_activated_experts=2, axes_dims_rope=(8, 4, 4), max_resolution=(16, 16),
             llama_layers=[0, 1, 2, 2]),
        8, 6,
    ),
}
