"""SANA-WM (``SanaWMTransformer3DModel``, as ``SanaWMPipeline`` calls it: camera-controlled image-to-video).

The first latent frame is the (clean) image; the camera trajectory enters as a per-frame raymap (the UCPE attention
branch) and chunked Plücker coordinates (added after each block's self-attention), both built with the pipeline's own
``prepare_camera``.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from ..transformer_spec import Call, Family, Rand, TransformerSpec, text_mask

VAE_STRIDE = (8, 32, 32)  # the LTX-2 VAE's (temporal, spatial, spatial) compression, as the pipeline reads it
ACTION = "w-8,jw-8"  # a camera trajectory in the pipeline's action DSL (forward, then forward while turning)


def _call(spec: TransformerSpec, batch: int, rand: Rand, device: str | torch.device,
          dtype: torch.dtype) -> tuple[torch.Tensor, Call]:
    from diffusers.pipelines.sana_wm.cam_utils import action_string_to_c2w, prepare_camera

    cfg, hw, frames = spec.config, spec.latent_hw, spec.frames
    latents = rand(batch, cfg["in_channels"], frames, hw, hw)  # (B, C, T, H, W); frame 0 stands for the image latent
    # Gemma-2 states (B, 1, L, D), right-padded, and the tokenizer's mask, passed as ``mask``
    text = rand(batch, 1, spec.text_tokens, cfg["caption_channels"])
    mask = text_mask(batch, spec.text_tokens, device)
    # camera tensors from an action trajectory and fixed intrinsics, as _build_camera_kwargs (one copy per row)
    num_frames = (frames - 1) * VAE_STRIDE[0] + 1
    c2w = action_string_to_c2w(ACTION)[:num_frames].astype(np.float32)
    px = hw * VAE_STRIDE[1]
    intrinsics = np.broadcast_to(np.array([px, px, px / 2, px / 2], dtype=np.float32), (num_frames, 4)).copy()
    cam = prepare_camera(c2w, intrinsics, target_size=(px, px), vae_stride=VAE_STRIDE)
    raymap = cam["raymap"].to(device, dtype).expand(batch, -1, -1)  # (B, T, 20)
    plucker = cam["chunk_plucker"].to(device, dtype).expand(batch, -1, -1, -1, -1)  # (B, 6 * 8, T, H, W)
    # per-frame timesteps, pinned to 0 on the conditioning frame: min(t, (1 - condition_mask) * 1000)
    clean = torch.zeros(frames, device=device)
    clean[0] = 1.0
    data_info = {"img_hw": torch.tensor([[px, px]], dtype=torch.float, device=device)}

    def call(model: nn.Module, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        timestep = torch.minimum(t.float(), (1.0 - clean) * 1000.0).expand(x.shape[0], 1, frames)  # (B, 1, T)
        out = model(x, timestep, text, return_dict=False, data_info=data_info, mask=mask, camera_conditions=raymap,
                    chunk_plucker=plucker)[0]
        # the pipeline steps the scheduler with -prediction and keeps the conditioning frame clean (its prediction
        # is discarded): zeroed here, so the update leaves it
        return -out * (1.0 - clean).view(1, 1, frames, 1, 1)

    return latents, call


def _init(model: nn.Module) -> None:
    """Random values for the Plücker embedder, which the class initialises to zero (the camera's post-attention
    input would be a constant)."""
    if hasattr(model, "plucker_embedder"):
        model.plucker_embedder.proj.reset_parameters()


FAMILIES = {"sanawm": Family(cls="SanaWMTransformer3DModel", make_call=_call, timesteps="flow1000", init=_init)}

SPECS = {
    # GDN linear attention (heads of linear_head_dim=16) with a softmax block every softmax_every_n (the last here, 1 in 4
    # released); the camera branch on every block; 3 latent frames (17 video frames), the first the image
    "tiny-sanawm": TransformerSpec(
        "tiny-sanawm", "sanawm",
        dict(in_channels=4, num_layers=3, hidden_size=32, num_attention_heads=2, softmax_every_n=3, linear_head_dim=16,
             caption_channels=24, mlp_ratio=2.0, chunk_plucker_channels=6 * VAE_STRIDE[0], image_size=128),
        4, 6, 3,
    ),
}
