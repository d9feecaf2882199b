"""ConsisID (``ConsisIDTransformer3DModel``, called as ``ConsisIDPipeline`` calls it: a reference image's latents
and a face identity)."""

from __future__ import annotations

import torch
from torch import nn

from ..transformer_spec import Call, Family, Rand, TransformerSpec

VIT_TOKENS = 5  # tokens of each face-ViT hidden state (577 at real size)


def _call(spec: TransformerSpec, batch: int, rand: Rand, device: str | torch.device,
          dtype: torch.dtype) -> tuple[torch.Tensor, Call]:
    from diffusers.models.embeddings import get_3d_rotary_pos_embed
    from diffusers.pipelines.consisid.pipeline_consisid import get_resize_crop_region_for_grid

    cfg, hw, frames = spec.config, spec.latent_hw, spec.frames
    channels = cfg["out_channels"]
    latents = rand(batch, frames, channels, hw, hw)  # (B, F, C, H, W), as CogVideoX
    text = rand(batch, spec.text_tokens, cfg["text_embed_dim"])  # T5 states padded to 226 tokens, no mask
    # prepare_latents: the reference image's latents as the first frame, zero frames after it (no keypoints)
    image = torch.cat([rand(batch, 1, channels, hw, hw),
                       torch.zeros(batch, frames - 1, channels, hw, hw, device=device, dtype=dtype)], dim=1)
    # the face identity as the pipeline passes it, not repeated per row: one (1, id_dim) embedding and the
    # face ViT's hidden states at LFE_num_scale depths; the model broadcasts them over the batch (CFG) rows
    id_cond = rand(1, cfg["LFE_id_dim"])
    id_vit_hidden = [rand(1, VIT_TOKENS, cfg["LFE_vit_dim"]) for _ in range(cfg["LFE_num_scale"])]
    # ConsisIDPipeline._prepare_rotary_positional_embeddings (CogVideoX's 3-D RoPE, cropped to the base size)
    p = cfg["patch_size"]
    crops = get_resize_crop_region_for_grid((hw // p, hw // p), cfg["sample_width"] // p, cfg["sample_height"] // p)
    rope = get_3d_rotary_pos_embed(embed_dim=cfg["attention_head_dim"], crops_coords=crops, grid_size=(hw // p, hw // p),
                                   temporal_size=frames, device=device)

    def call(model: nn.Module, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        # CogVideoXDPMScheduler: discrete 0..999 timesteps, v-prediction; the image latents join in the channels
        return model(hidden_states=torch.cat([x, image], dim=2), encoder_hidden_states=text,
                     timestep=t.expand(x.shape[0]), image_rotary_emb=rope, return_dict=False,
                     id_vit_hidden=id_vit_hidden, id_cond=id_cond)[0]

    return latents, call


FAMILIES = {"consisid": Family(cls="ConsisIDTransformer3DModel", make_call=_call, timesteps="ddpm")}

SPECS = {
    # is_train_face (as released): a local facial extractor (LFE) turns the identity into tokens that a perceiver
    # cross-attention adds to the stream after every cross_attn_interval-th block (blocks 0 and 2 of 4);
    # LFE_output_dim = the perceiver's kv dim, int(inner_dim * 2 / 3); LFE_depth is a multiple of LFE_num_scale;
    # head dim 16 = rope axes (t, h, w) of 4, 6, 6; in_channels = 2 * out_channels (noise + image latents)
    "tiny-consisid": TransformerSpec(
        "tiny-consisid", "consisid",
        dict(num_attention_heads=2, attention_head_dim=16, in_channels=8, out_channels=4, time_embed_dim=32,
             text_embed_dim=24, num_layers=4, sample_width=4, sample_height=4, sample_frames=5, patch_size=2,
             max_text_seq_length=6, use_rotary_positional_embeddings=True, is_train_face=True, is_kps=False,
             cross_attn_interval=2, cross_attn_dim_head=8, cross_attn_num_heads=2, LFE_id_dim=16, LFE_vit_dim=16,
             LFE_depth=5, LFE_dim_head=8, LFE_num_heads=2, LFE_num_id_token=2, LFE_num_querie=4, LFE_output_dim=21,
             LFE_ff_mult=2, LFE_num_scale=5),
        4, 6, 2,
    ),
}
