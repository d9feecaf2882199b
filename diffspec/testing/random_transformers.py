"""Random-weight diffusers transformers from configs, tiny (tests) or real size (GPU benchmarks).

Speed does not depend on weight values, so real-size architectures with random weights give
honest timings without a model hub; quality is measured on the trained ``tiny-dit``.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from .families import RECENT_FAMILIES, RECENT_SPECS
from .transformer_spec import Call, Rand, TransformerSpec, text_mask

SPECS: dict[str, TransformerSpec] = {
    # real-size architectures (GPU benchmarks)
    "dit-xl-2-256": TransformerSpec(
        "dit-xl-2-256", "dit",
        dict(num_attention_heads=16, attention_head_dim=72, in_channels=4, out_channels=8, num_layers=28,
             sample_size=32, patch_size=2, num_embeds_ada_norm=1000),
        32,
    ),
    "pixart-1024": TransformerSpec(
        "pixart-1024", "pixart",
        dict(num_attention_heads=16, attention_head_dim=72, in_channels=4, out_channels=8, num_layers=28,
             sample_size=128, patch_size=2, cross_attention_dim=1152, caption_channels=4096,
             norm_type="ada_norm_single", use_additional_conditions=False),
        128, 120,
    ),
    "sd3-1024": TransformerSpec(
        "sd3-1024", "sd3",
        dict(sample_size=128, patch_size=2, in_channels=16, num_layers=24, attention_head_dim=64,
             num_attention_heads=24, joint_attention_dim=4096, caption_projection_dim=1536,
             pooled_projection_dim=2048, out_channels=16),
        128, 333,
    ),
    "flux-1024": TransformerSpec(
        "flux-1024", "flux",
        dict(patch_size=1, in_channels=64, num_layers=19, num_single_layers=38, attention_head_dim=128,
             num_attention_heads=24, joint_attention_dim=4096, pooled_projection_dim=768,
             guidance_embeds=True, axes_dims_rope=(16, 56, 56)),
        64, 512,
    ),
    # Wan 2.1 T2V-1.3B's transformer at reduced size: 512x512, 17 frames (5 latent frames, 5120 tokens)
    "wan-1.3b-512-17f": TransformerSpec(
        "wan-1.3b-512-17f", "wan",
        dict(patch_size=(1, 2, 2), num_attention_heads=12, attention_head_dim=128, in_channels=16, out_channels=16,
             text_dim=4096, freq_dim=256, ffn_dim=8960, num_layers=30, cross_attn_norm=True,
             qk_norm="rms_norm_across_heads", eps=1e-6, rope_max_seq_len=1024),
        64, 512, 5,
    ),
    # tiny configs (tests, CPU)
    "tiny-dit-random": TransformerSpec(
        "tiny-dit-random", "dit",
        dict(num_attention_heads=2, attention_head_dim=16, in_channels=4, out_channels=4, num_layers=3,
             sample_size=8, patch_size=2, num_embeds_ada_norm=1000),
        8,
    ),
    "tiny-pixart": TransformerSpec(
        "tiny-pixart", "pixart",
        dict(num_attention_heads=2, attention_head_dim=16, in_channels=4, out_channels=4, num_layers=3,
             sample_size=8, patch_size=2, cross_attention_dim=32, caption_channels=24,
             norm_type="ada_norm_single", use_additional_conditions=False),
        8, 6,
    ),
    "tiny-sd3": TransformerSpec(
        "tiny-sd3", "sd3",
        dict(sample_size=8, patch_size=2, in_channels=4, num_layers=3, attention_head_dim=16,
             num_attention_heads=2, joint_attention_dim=24, caption_projection_dim=32,
             pooled_projection_dim=16, out_channels=4),
        8, 6,
    ),
    "tiny-flux-random": TransformerSpec(
        "tiny-flux-random", "flux",
        dict(patch_size=1, in_channels=8, num_layers=2, num_single_layers=3, attention_head_dim=16,
             num_attention_heads=2, joint_attention_dim=24, pooled_projection_dim=16,
             guidance_embeds=False, axes_dims_rope=(4, 6, 6)),
        4, 6,
    ),
    "tiny-sana": TransformerSpec(
        "tiny-sana", "sana",
        dict(in_channels=4, out_channels=4, num_attention_heads=2, attention_head_dim=16, num_layers=3,
             num_cross_attention_heads=2, cross_attention_head_dim=16, cross_attention_dim=32,
             caption_channels=24, sample_size=8, patch_size=1),
        8, 6,
    ),
    # text_len (CLIP/BERT tokens) and text_len_t5 are fixed by the config; num_layers must be even
    # for the long skips (block i < n/2 - 1 feeds block n - 1 - i).
    "tiny-hunyuandit": TransformerSpec(
        "tiny-hunyuandit", "hunyuandit",
        dict(num_attention_heads=2, attention_head_dim=16, in_channels=4, patch_size=2, sample_size=8,
             hidden_size=32, num_layers=4, cross_attention_dim=24, cross_attention_dim_t5=32,
             pooled_projection_dim=16, text_len=6, text_len_t5=8),
        8, 6,
    ),
    # CogVideoX-2b style (sincos positions); text tokens must equal max_text_seq_length
    "tiny-cogvideox": TransformerSpec(
        "tiny-cogvideox", "cogvideox",
        dict(num_attention_heads=2, attention_head_dim=16, in_channels=4, out_channels=4, time_embed_dim=32,
             text_embed_dim=24, num_layers=3, sample_width=4, sample_height=4, sample_frames=5, patch_size=2,
             max_text_seq_length=6),
        4, 6, 2,
    ),
    "tiny-wan": TransformerSpec(
        "tiny-wan", "wan",
        dict(patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=16, in_channels=4, out_channels=4,
             text_dim=24, freq_dim=32, ffn_dim=64, num_layers=3, rope_max_seq_len=32),
        4, 6, 2,
    ),
    "tiny-hunyuanvideo": TransformerSpec(
        "tiny-hunyuanvideo", "hunyuanvideo",
        dict(in_channels=4, out_channels=4, num_attention_heads=2, attention_head_dim=16, num_layers=2,
             num_single_layers=2, num_refiner_layers=1, patch_size=2, patch_size_t=1, text_embed_dim=24,
             pooled_projection_dim=16, rope_axes_dim=(4, 6, 6), guidance_embeds=True),
        4, 6, 2,
    ),
    "tiny-ltx": TransformerSpec(
        "tiny-ltx", "ltx",
        dict(in_channels=8, out_channels=8, patch_size=1, patch_size_t=1, num_attention_heads=2,
             attention_head_dim=16, cross_attention_dim=32, num_layers=3, caption_channels=24),
        4, 6, 2,
    ),
}

SPECS.update(RECENT_SPECS)
TINY_MODELS = tuple(n for n in SPECS if n.startswith("tiny-"))
"""The tiny random-weight configs (tests, CPU), in registration order."""

FAMILY_CLASSES: dict[str, str] = {
    "dit": "DiTTransformer2DModel", "pixart": "PixArtTransformer2DModel", "sd3": "SD3Transformer2DModel",
    "flux": "FluxTransformer2DModel", "sana": "SanaTransformer2DModel", "hunyuandit": "HunyuanDiT2DModel",
    "cogvideox": "CogVideoXTransformer3DModel", "wan": "WanTransformer3DModel",
    "hunyuanvideo": "HunyuanVideoTransformer3DModel", "ltx": "LTXVideoTransformer3DModel",
    **{family: f.cls for family, f in RECENT_FAMILIES.items()},
}
"""diffusers class of each family."""

FLOW_1000_FAMILIES = ("sana", "wan", "hunyuanvideo", "ltx",
                      *(family for family, f in RECENT_FAMILIES.items() if f.timesteps == "flow1000"))
"""Flow-matching families whose pipelines pass ``1000 * sigma`` as the timestep."""
SIGMA_FAMILIES = ("flux", *(family for family, f in RECENT_FAMILIES.items() if f.timesteps == "sigma"))
"""Flow-matching families whose pipelines pass sigma in 0..1 as the timestep."""
AUDIO_FAMILIES = tuple(family for family, f in RECENT_FAMILIES.items() if f.audio)
"""Families with 1-D latents ``(B, C, T)`` (audio DiTs): no pixel resolution."""


def build_transformer(name: str, *, seed: int = 0, dtype: torch.dtype = torch.float32,
                      device: str | torch.device = "cpu") -> nn.Module:
    """A random-weight transformer of the named spec (see :data:`SPECS`)."""
    import diffusers

    if name not in SPECS:
        raise ValueError(f"unknown model {name!r}; choose one of {', '.join(SPECS)}")
    spec = SPECS[name]
    cls = getattr(diffusers, FAMILY_CLASSES[spec.family])
    torch.manual_seed(seed)
    with torch.device(device):
        model = cls(**spec.config)
        family = RECENT_FAMILIES.get(spec.family)
        if family is not None and family.init is not None:
            family.init(model)
    if dtype != torch.float32:
        from diffusers.utils import logging as diffusers_logging

        level = diffusers_logging.get_verbosity()
        diffusers_logging.set_verbosity_error()  # its fp32-modules note does not apply to random weights
        model = model.to(dtype)
        diffusers_logging.set_verbosity(level)
    return model.eval()


def make_call(name: str, batch: int = 1, *, seed: int = 0, dtype: torch.dtype = torch.float32,
              device: str | torch.device = "cpu") -> tuple[torch.Tensor, Callable[[nn.Module, torch.Tensor, torch.Tensor], torch.Tensor]]:
    """Initial latents and ``call(model, latents, t) -> prediction`` with fixed random conditioning.

    ``t`` is a scalar tensor in the model's own timestep units (DiT/PixArt/HunyuanDiT/CogVideoX:
    0..999; SD3/Sana/Wan/HunyuanVideo/LTX: 0..1000; Flux: sigma in 0..1). Latents are laid out as
    the model takes them: ``(B, C, H, W)`` for images, ``(B, F, C, H, W)`` for CogVideoX,
    ``(B, C, F, H, W)`` for Wan and HunyuanVideo, packed ``(B, F*H*W, C)`` for LTX.
    """
    spec = SPECS[name]
    g = torch.Generator("cpu").manual_seed(seed)
    cfg = spec.config

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g).to(device=device, dtype=dtype)

    hw = spec.latent_hw
    if spec.family in _EXTRA_CALLS:
        return _EXTRA_CALLS[spec.family](spec, batch, rand, device, dtype)
    if spec.family in RECENT_FAMILIES:
        return RECENT_FAMILIES[spec.family].make_call(spec, batch, rand, device, dtype)
    if spec.family == "flux":
        latents = rand(batch, hw * hw, cfg["in_channels"])
        text = rand(batch, spec.text_tokens, cfg["joint_attention_dim"])
        pooled = rand(batch, cfg["pooled_projection_dim"])
        img_ids = torch.stack(torch.meshgrid(torch.zeros(1), torch.arange(hw.__float__()), torch.arange(hw.__float__()), indexing="ij"),
                              -1).reshape(-1, 3).to(device=device, dtype=dtype)
        txt_ids = torch.zeros(spec.text_tokens, 3, device=device, dtype=dtype)
        guidance = torch.full((batch,), 3.5, device=device, dtype=dtype) if cfg.get("guidance_embeds") else None

        def call(model: nn.Module, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
            return model(hidden_states=x, encoder_hidden_states=text, pooled_projections=pooled,
                         timestep=t.expand(x.shape[0]).to(dtype), img_ids=img_ids, txt_ids=txt_ids,
                         guidance=guidance, return_dict=False)[0]

        return latents, call

    latents = rand(batch, cfg["in_channels"], hw, hw)
    if spec.family == "dit":
        labels = torch.randint(0, 10, (batch,), generator=g).to(device)

        def call(model: nn.Module, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
            out = model(x, timestep=t.expand(x.shape[0]), class_labels=labels, return_dict=False)[0]
            return out[:, : x.shape[1]]

        return latents, call
    if spec.family == "pixart":
        text = rand(batch, spec.text_tokens, cfg["caption_channels"])

        def call(model: nn.Module, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
            out = model(x, encoder_hidden_states=text, timestep=t.expand(x.shape[0]),
                        added_cond_kwargs={"resolution": None, "aspect_ratio": None}, return_dict=False)[0]
            return out[:, : x.shape[1]]

        return latents, call
    text = rand(batch, spec.text_tokens, cfg["joint_attention_dim"])
    pooled = rand(batch, cfg["pooled_projection_dim"])

    def call(model: nn.Module, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        return model(hidden_states=x, encoder_hidden_states=text, pooled_projections=pooled,
                     timestep=t.expand(x.shape[0]), return_dict=False)[0]

    return latents, call


def _sana_call(spec: TransformerSpec, batch: int, rand: Rand, device: str | torch.device,
               dtype: torch.dtype) -> tuple[torch.Tensor, Call]:
    cfg, hw = spec.config, spec.latent_hw
    latents = rand(batch, cfg["in_channels"], hw, hw)
    text = rand(batch, spec.text_tokens, cfg["caption_channels"])
    mask = text_mask(batch, spec.text_tokens, device)

    def call(model: nn.Module, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        timestep = t.expand(x.shape[0]) * cfg.get("timestep_scale", 1.0)  # as SanaPipeline
        return model(x, encoder_hidden_states=text, encoder_attention_mask=mask, timestep=timestep,
                     return_dict=False)[0]

    return latents, call


def _hunyuandit_call(spec: TransformerSpec, batch: int, rand: Rand, device: str | torch.device,
                     dtype: torch.dtype) -> tuple[torch.Tensor, Call]:
    from diffusers.models.embeddings import get_2d_rotary_pos_embed

    cfg, hw = spec.config, spec.latent_hw
    latents = rand(batch, cfg["in_channels"], hw, hw)
    text = rand(batch, cfg["text_len"], cfg["cross_attention_dim"])  # CLIP/BERT stream
    text_t5 = rand(batch, cfg["text_len_t5"], cfg["cross_attention_dim_t5"])
    mask, mask_t5 = text_mask(batch, cfg["text_len"], device), text_mask(batch, cfg["text_len_t5"], device)
    px = hw * 8
    meta = torch.tensor([[px, px, px, px, 0, 0]] * batch, device=device, dtype=dtype)  # original, target, crop
    style = torch.zeros(batch, dtype=torch.long, device=device)
    grid = hw // cfg["patch_size"]
    # HunyuanDiTPipeline's RoPE; the crop region is the whole grid (the image is at the base resolution)
    rope = get_2d_rotary_pos_embed(cfg["attention_head_dim"], ((0, 0), (grid, grid)), (grid, grid), device=device,
                                   output_type="pt")

    def call(model: nn.Module, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        out = model(x, t.expand(x.shape[0]).to(dtype), encoder_hidden_states=text, text_embedding_mask=mask,
                    encoder_hidden_states_t5=text_t5, text_embedding_mask_t5=mask_t5, image_meta_size=meta,
                    style=style, image_rotary_emb=rope, return_dict=False)[0]
        return out[:, : x.shape[1]]  # learnt sigma channels dropped

    return latents, call


def _cogvideox_call(spec: TransformerSpec, batch: int, rand: Rand, device: str | torch.device,
                    dtype: torch.dtype) -> tuple[torch.Tensor, Call]:
    cfg, hw = spec.config, spec.latent_hw
    latents = rand(batch, spec.frames, cfg["in_channels"], hw, hw)  # (B, F, C, H, W)
    text = rand(batch, spec.text_tokens, cfg["text_embed_dim"])

    def call(model: nn.Module, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        return model(hidden_states=x, encoder_hidden_states=text, timestep=t.expand(x.shape[0]),
                     return_dict=False)[0]

    return latents, call


def _wan_call(spec: TransformerSpec, batch: int, rand: Rand, device: str | torch.device,
              dtype: torch.dtype) -> tuple[torch.Tensor, Call]:
    cfg, hw = spec.config, spec.latent_hw
    latents = rand(batch, cfg["in_channels"], spec.frames, hw, hw)  # (B, C, F, H, W)
    text = rand(batch, spec.text_tokens, cfg["text_dim"])

    def call(model: nn.Module, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        return model(hidden_states=x, timestep=t.expand(x.shape[0]), encoder_hidden_states=text,
                     return_dict=False)[0]

    return latents, call


def _hunyuanvideo_call(spec: TransformerSpec, batch: int, rand: Rand, device: str | torch.device,
                       dtype: torch.dtype) -> tuple[torch.Tensor, Call]:
    cfg, hw = spec.config, spec.latent_hw
    latents = rand(batch, cfg["in_channels"], spec.frames, hw, hw)  # (B, C, F, H, W)
    text = rand(batch, spec.text_tokens, cfg["text_embed_dim"])
    pooled = rand(batch, cfg["pooled_projection_dim"])
    mask = text_mask(batch, spec.text_tokens, device)
    # HunyuanVideoPipeline: embedded guidance = guidance_scale * 1000 (default scale 6.0)
    guidance = torch.full((batch,), 6000.0, device=device, dtype=dtype) if cfg.get("guidance_embeds") else None

    def call(model: nn.Module, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        return model(hidden_states=x, timestep=t.expand(x.shape[0]).to(dtype), encoder_hidden_states=text,
                     encoder_attention_mask=mask, pooled_projections=pooled, guidance=guidance,
                     return_dict=False)[0]

    return latents, call


def _ltx_call(spec: TransformerSpec, batch: int, rand: Rand, device: str | torch.device,
              dtype: torch.dtype) -> tuple[torch.Tensor, Call]:
    cfg, hw, frames = spec.config, spec.latent_hw, spec.frames
    latents = rand(batch, frames * hw * hw, cfg["in_channels"])  # packed (B, F*H*W, C), patch size 1
    text = rand(batch, spec.text_tokens, cfg["caption_channels"])
    mask = text_mask(batch, spec.text_tokens, device)
    rope_scale = (8 / 25, 32, 32)  # LTXPipeline: (VAE temporal ratio / frame rate, spatial ratio, spatial ratio)

    def call(model: nn.Module, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        return model(hidden_states=x, encoder_hidden_states=text, timestep=t.expand(x.shape[0]),
                     encoder_attention_mask=mask, num_frames=frames, height=hw, width=hw,
                     rope_interpolation_scale=rope_scale, return_dict=False)[0]

    return latents, call


_EXTRA_CALLS: dict[str, Callable[..., tuple[torch.Tensor, Call]]] = {
    "sana": _sana_call, "hunyuandit": _hunyuandit_call, "cogvideox": _cogvideox_call, "wan": _wan_call,
    "hunyuanvideo": _hunyuanvideo_call, "ltx": _ltx_call,
}
"""``make_call`` for the families added after dit / pixart / sd3 / flux (their inputs differ more)."""


def timesteps_for(name: str, steps: int, device: str | torch.device = "cpu") -> torch.Tensor:
    """A decreasing schedule in the model's timestep units (uniform; enough for timing loops)."""
    if SPECS[name].family in SIGMA_FAMILIES:
        return torch.linspace(1.0, 1.0 / steps, steps, device=device)
    if SPECS[name].family in FLOW_1000_FAMILIES:  # unshifted flow-matching sigmas, as timesteps
        return torch.linspace(1.0, 1.0 / steps, steps, device=device) * 1000
    return torch.linspace(999, 0, steps, device=device).round()


def build_flux_controlnet(transformer: nn.Module, double: int, single: int, *, std: float | None = None,
                          seed: int = 0) -> nn.Module:
    """A random-weight ``FluxControlNetModel`` of ``double`` + ``single`` blocks shaped for a FLUX ``transformer``.

    Its output projections start at zero (a fresh ControlNet adds nothing): they are drawn with ``std``, or by
    default ``0.1 / sqrt(fan_in)`` (residuals about a tenth of the stream).

    Example:
        >>> controlnet = build_flux_controlnet(build_transformer("tiny-flux-random"), 1, 2)
        >>> len(controlnet.transformer_blocks), len(controlnet.single_transformer_blocks)
        (1, 2)
    """
    from diffusers import FluxControlNetModel

    cfg = transformer.config
    torch.manual_seed(seed)
    controlnet = FluxControlNetModel(
        patch_size=cfg.patch_size, in_channels=cfg.in_channels, num_layers=double, num_single_layers=single,
        attention_head_dim=cfg.attention_head_dim, num_attention_heads=cfg.num_attention_heads,
        joint_attention_dim=cfg.joint_attention_dim, pooled_projection_dim=cfg.pooled_projection_dim,
        guidance_embeds=cfg.guidance_embeds, axes_dims_rope=list(cfg.axes_dims_rope))
    with torch.no_grad():
        for lin in (*controlnet.controlnet_blocks, *controlnet.controlnet_single_blocks, controlnet.controlnet_x_embedder):
            nn.init.normal_(lin.weight, std=std if std is not None else 0.1 / lin.in_features ** 0.5)
    return controlnet.eval()
