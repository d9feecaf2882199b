"""JoyImage Edit (``JoyImageEditTransformer3DModel``, ``JoyImageEditPipeline``) and JoyImage Edit Plus
(``JoyImageEditPlusTransformer3DModel``, ``JoyImageEditPlusPipeline``), each editing with reference images."""

from __future__ import annotations

import torch
from torch import nn

from ..transformer_spec import Call, Family, Rand, TransformerSpec, text_mask


def _edit_call(spec: TransformerSpec, batch: int, rand: Rand, device: str | torch.device,
               dtype: torch.dtype) -> tuple[torch.Tensor, Call]:
    cfg, hw = spec.config, spec.latent_hw
    # JoyImageEditPipeline with one reference image: items (B, 2, C, T=1, H, W) = [reference, target]; the reference
    # slot is restored before every step, so the loop carries the target slot only and the call puts them together
    latents = rand(batch, 1, cfg["in_channels"], 1, hw, hw)
    reference = rand(batch, 1, cfg["in_channels"], 1, hw, hw)  # normalised VAE latents of the reference image
    # Qwen-VL states past the system prefix, zero-padded to the longest prompt; no mask reaches the transformer
    text = rand(batch, spec.text_tokens, cfg["text_dim"]) * text_mask(batch, spec.text_tokens, device)[..., None]

    def call(model: nn.Module, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        items = torch.cat([reference, x], dim=1)
        out = model(hidden_states=items, timestep=t.repeat(x.shape[0]), encoder_hidden_states=text,
                    return_dict=False)[0]
        return out[:, -1:]  # the target slot's prediction (the reference slot's is overwritten)

    return latents, call


def _patchify(item: torch.Tensor, patch: tuple[int, int, int]) -> torch.Tensor:
    """``(C, T, H, W)`` -> ``(T*H*W / prod(patch), C, pt, ph, pw)``, as ``JoyImageEditPlusPipeline.prepare_latents``."""
    (c, t, h, w), (pt, ph, pw) = item.shape, patch
    patches = item.reshape(c, t // pt, pt, h // ph, ph, w // pw, pw)
    return patches.permute(1, 3, 5, 0, 2, 4, 6).reshape(-1, c, pt, ph, pw)


def _plus_call(spec: TransformerSpec, batch: int, rand: Rand, device: str | torch.device,
               dtype: torch.dtype) -> tuple[torch.Tensor, Call]:
    cfg, hw = spec.config, spec.latent_hw
    patch, c = tuple(cfg["patch_size"]), cfg["in_channels"]
    # JoyImageEditPlusPipeline: per sample, the target noise's patches then each reference image's (its own size),
    # zero-padded to the longest sample: (B, max_patches, C, pt, ph, pw). References of different sizes per row (the
    # second row's is half as tall), so rows differ in length and padding. The references are restored before
    # every step: the loop carries the target patches, the call puts the rest back.
    target = (hw // patch[1]) * (hw // patch[2])
    latents = torch.stack([_patchify(rand(c, 1, hw, hw), patch) for _ in range(batch)])
    ref_heights = [hw if i == 0 else hw // 2 for i in range(batch)]
    refs = [_patchify(rand(c, 1, h, hw), patch) for h in ref_heights]
    rest = torch.zeros(batch, max(len(r) for r in refs), c, *patch, device=device, dtype=dtype)
    for i, r in enumerate(refs):
        rest[i, :len(r)] = r
    # per sample, each component's (t, h, w) in patches: the rotary table and the padding mask
    shape_list = [[(1, hw // patch[1], hw // patch[2]), (1, h // patch[1], hw // patch[2])] for h in ref_heights]
    # Qwen3-VL states past the system prefix, padded to the longest prompt (pad positions not zeroed), with the mask
    text = rand(batch, spec.text_tokens, cfg["text_dim"])
    mask = text_mask(batch, spec.text_tokens, device)

    def call(model: nn.Module, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        out = model(hidden_states=torch.cat([x, rest], dim=1), timestep=t.repeat(x.shape[0]),
                    encoder_hidden_states=text, encoder_hidden_states_mask=mask, shape_list=shape_list,
                    return_dict=False)[0]
        return out[:, :target]  # the target patches' prediction

    return latents, call


FAMILIES = {
    "joyimage": Family(cls="JoyImageEditTransformer3DModel", make_call=_edit_call, timesteps="flow1000"),
    "joyimageplus": Family(cls="JoyImageEditPlusTransformer3DModel", make_call=_plus_call, timesteps="flow1000"),
}

_CONFIG = dict(patch_size=[1, 2, 2], in_channels=4, hidden_size=32, num_attention_heads=2, text_dim=24,
               mlp_width_ratio=2.0, num_layers=3, rope_dim_list=[4, 6, 6])

SPECS = {
    # double-stream blocks (image and text streams); rope axes (t, h, w) sum to the head dim (32 / 2 heads)
    "tiny-joyimage": TransformerSpec("tiny-joyimage", "joyimage", dict(_CONFIG), 8, 6),
    "tiny-joyimage-plus": TransformerSpec("tiny-joyimage-plus", "joyimageplus", dict(_CONFIG), 8, 6),
}
