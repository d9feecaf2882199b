"""Tiny random-weight text-to-video pipelines (Wan, CogVideoX, LTX, HunyuanVideo, Mochi, Allegro, ...).

Example:
    >>> pipe = build_tiny_wan()  # doctest: +SKIP
    >>> type(pipe).__name__  # doctest: +SKIP
    'WanPipeline'
"""

from __future__ import annotations

from typing import Any

import torch

from .pipeline_parts import build_word_tokenizer, qwen2vl_encoder, t5_encoder, wan_vae, word_vocab_size
from .random_transformers import build_transformer


def build_tiny_wan(seed: int = 0) -> Any:
    """``WanPipeline``: 3-block ``WanTransformer3DModel``, 4-channel ``AutoencoderKLWan`` (8x spatial,
    4x temporal), one-layer UMT5 encoder, flow-matching Euler scheduler. Frames: ``4k + 1``;
    height and width: multiples of 16.
    """
    from diffusers import FlowMatchEulerDiscreteScheduler, WanPipeline

    transformer = build_transformer("tiny-wan", seed=seed)
    vae = wan_vae()
    return WanPipeline(tokenizer=build_word_tokenizer(), text_encoder=t5_encoder(24, umt5=True), vae=vae,
                       transformer=transformer, scheduler=FlowMatchEulerDiscreteScheduler(shift=3.0))


def build_tiny_wan22(seed: int = 0) -> Any:
    """``WanPipeline`` in Wan 2.2 A14B's two-expert form: the :func:`build_tiny_wan` parts with a second 3-block
    transformer as ``transformer_2`` (other weights), which denoises the steps below ``boundary_ratio = 0.9``
    (timestep 900: about the last two thirds of the steps at shift 3).
    """
    from diffusers import WanTransformer3DModel

    pipe = build_tiny_wan(seed)
    torch.manual_seed(seed + 1)
    expert = WanTransformer3DModel(**pipe.transformer.config).eval()
    pipe.register_modules(transformer_2=expert)
    pipe.register_to_config(boundary_ratio=0.9)
    return pipe


def build_tiny_wan22_i2v(seed: int = 0) -> Any:
    """``WanImageToVideoPipeline`` in Wan 2.2 I2V A14B's form: no image encoder, two 3-block experts reading the noisy
    latents, the first frame's latents and a 4-channel frame mask (``in_channels`` 12), ``transformer_2`` below
    ``boundary_ratio = 0.9``; the :func:`build_tiny_wan` VAE, encoder and scheduler. Calls need an ``image``. Its
    prompt cleaning calls ``ftfy`` whether or not it is installed (diffusers 0.42), so prompts need ``ftfy``.
    """
    from diffusers import FlowMatchEulerDiscreteScheduler, WanImageToVideoPipeline, WanTransformer3DModel

    config = dict(patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=16, in_channels=12, out_channels=4,
                  text_dim=24, freq_dim=32, ffn_dim=64, num_layers=3, rope_max_seq_len=32)
    torch.manual_seed(seed)
    high = WanTransformer3DModel(**config).eval()
    torch.manual_seed(seed + 1)
    low = WanTransformer3DModel(**config).eval()
    return WanImageToVideoPipeline(tokenizer=build_word_tokenizer(), text_encoder=t5_encoder(24, umt5=True),
                                   vae=wan_vae(), scheduler=FlowMatchEulerDiscreteScheduler(shift=3.0),
                                   transformer=high, transformer_2=low, boundary_ratio=0.9)


def build_tiny_skyreelsv2(seed: int = 0) -> Any:
    """``SkyReelsV2Pipeline`` (text to video): 2-block ``SkyReelsV2Transformer3DModel`` (T2V: no image
    embedder, no fps embedding), the Wan builder's 4-channel ``AutoencoderKLWan`` (8x spatial, 4x
    temporal), one-layer UMT5 encoder, UniPC with flow sigmas (the checkpoints' scheduler). Frames:
    ``4k + 1``; height and width: multiples of 16. Its prompt cleaning calls ``ftfy`` whether or not
    it is installed (diffusers 0.42; ``WanPipeline`` checks), so prompts need ``ftfy``.
    """
    from diffusers import SkyReelsV2Pipeline, SkyReelsV2Transformer3DModel, UniPCMultistepScheduler

    torch.manual_seed(seed)
    transformer = SkyReelsV2Transformer3DModel(patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=16,
                                               in_channels=4, out_channels=4, text_dim=24, freq_dim=32, ffn_dim=64,
                                               num_layers=2, rope_max_seq_len=32).eval()
    vae = wan_vae()
    scheduler = UniPCMultistepScheduler(prediction_type="flow_prediction", use_flow_sigmas=True, flow_shift=8.0)
    return SkyReelsV2Pipeline(tokenizer=build_word_tokenizer(), text_encoder=t5_encoder(24, umt5=True), vae=vae,
                              transformer=transformer, scheduler=scheduler)


def build_tiny_cogvideox(seed: int = 0) -> Any:
    """``CogVideoXPipeline`` (2b style: sincos positions): 3-block transformer reading 226 text tokens,
    4-channel ``AutoencoderKLCogVideoX`` (8x spatial, 4x temporal), one-layer T5 encoder, DDIM.
    Frames: ``8k + 1`` (an odd number of latent frames decodes to the frames asked for); height and
    width: multiples of 16.
    """
    from diffusers import (
        AutoencoderKLCogVideoX,
        CogVideoXDDIMScheduler,
        CogVideoXPipeline,
        CogVideoXTransformer3DModel,
    )

    torch.manual_seed(seed)
    transformer = CogVideoXTransformer3DModel(num_attention_heads=2, attention_head_dim=16, in_channels=4,
                                              out_channels=4, time_embed_dim=32, text_embed_dim=24, num_layers=3,
                                              sample_width=4, sample_height=4, sample_frames=5, patch_size=2,
                                              temporal_compression_ratio=4, max_text_seq_length=226).eval()
    vae = AutoencoderKLCogVideoX(in_channels=3, out_channels=3, down_block_types=("CogVideoXDownBlock3D",) * 4,
                                 up_block_types=("CogVideoXUpBlock3D",) * 4, block_out_channels=(8, 8, 8, 8),
                                 latent_channels=4, layers_per_block=1, norm_num_groups=2,
                                 temporal_compression_ratio=4).eval()
    scheduler = CogVideoXDDIMScheduler(timestep_spacing="trailing", prediction_type="v_prediction",
                                       rescale_betas_zero_snr=True, beta_schedule="scaled_linear",
                                       beta_start=0.00085, beta_end=0.012, clip_sample=False, set_alpha_to_one=True)
    return CogVideoXPipeline(tokenizer=build_word_tokenizer(226), text_encoder=t5_encoder(24), vae=vae,
                             transformer=transformer, scheduler=scheduler)


def build_tiny_ltx(seed: int = 0) -> Any:
    """``LTXPipeline``: 3-block ``LTXVideoTransformer3DModel``, 8-channel ``AutoencoderKLLTXVideo``
    (4x spatial, 4x temporal), one-layer T5 encoder, flow-matching Euler. Frames: ``4k + 1``;
    height and width: multiples of 32 (the pipeline's own rule).
    """
    from diffusers import AutoencoderKLLTXVideo, FlowMatchEulerDiscreteScheduler, LTXPipeline

    transformer = build_transformer("tiny-ltx", seed=seed)
    vae = AutoencoderKLLTXVideo(in_channels=3, out_channels=3, latent_channels=8, block_out_channels=(8, 8, 8, 8),
                                decoder_block_out_channels=(8, 8, 8, 8), layers_per_block=(1, 1, 1, 1, 1),
                                decoder_layers_per_block=(1, 1, 1, 1, 1),
                                spatio_temporal_scaling=(True, True, False, False),
                                decoder_spatio_temporal_scaling=(True, True, False, False),
                                decoder_inject_noise=(False,) * 5, upsample_residual=(False,) * 4,
                                upsample_factor=(1,) * 4, timestep_conditioning=False, patch_size=1,
                                patch_size_t=1, encoder_causal=True, decoder_causal=False).eval()
    return LTXPipeline(scheduler=FlowMatchEulerDiscreteScheduler(), vae=vae, text_encoder=t5_encoder(24),
                       tokenizer=build_word_tokenizer(128), transformer=transformer)


def build_tiny_hunyuanvideo(seed: int = 0) -> Any:
    """``HunyuanVideoPipeline``: 2+2-block transformer with embedded guidance, 4-channel
    ``AutoencoderKLHunyuanVideo`` (8x spatial, 4x temporal), a 3-layer Llama and a one-layer CLIP
    text encoder, flow-matching Euler. Frames: ``4k + 1``; height and width: multiples of 16.
    """
    from diffusers import AutoencoderKLHunyuanVideo, FlowMatchEulerDiscreteScheduler, HunyuanVideoPipeline
    from transformers import CLIPTextConfig, CLIPTextModel, LlamaConfig, LlamaModel

    transformer = build_transformer("tiny-hunyuanvideo", seed=seed)
    vae = AutoencoderKLHunyuanVideo(in_channels=3, out_channels=3, latent_channels=4,
                                    down_block_types=("HunyuanVideoDownBlock3D",) * 4,
                                    up_block_types=("HunyuanVideoUpBlock3D",) * 4, block_out_channels=(8, 8, 8, 8),
                                    layers_per_block=1, norm_num_groups=4, spatial_compression_ratio=8,
                                    temporal_compression_ratio=4).eval()
    llama = LlamaModel(LlamaConfig(vocab_size=word_vocab_size(), hidden_size=24, intermediate_size=32, num_hidden_layers=3,
                                   num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=512,
                                   pad_token_id=0)).eval()
    clip = CLIPTextModel(CLIPTextConfig(vocab_size=word_vocab_size(), hidden_size=16, intermediate_size=32,
                                        num_hidden_layers=1, num_attention_heads=2, max_position_embeddings=77,
                                        projection_dim=16)).eval()
    return HunyuanVideoPipeline(text_encoder=llama, tokenizer=build_word_tokenizer(512), transformer=transformer,
                                vae=vae, scheduler=FlowMatchEulerDiscreteScheduler(shift=7.0), text_encoder_2=clip,
                                tokenizer_2=build_word_tokenizer(77))


def build_tiny_mochi(seed: int = 0) -> Any:
    """``MochiPipeline``: 2-block ``MochiTransformer3DModel`` (rotary frequencies drawn at random: the
    class initialises them to zero), ``AutoencoderKLMochi`` with 32-channel blocks (its group norms
    have 32 groups) and 12 latent channels (the pipeline fixes its VAE scales at 8x spatial, 6x
    temporal, and reshapes the latents' mean and std to 12 channels), one-layer T5 encoder,
    flow-matching Euler with inverted sigmas (Mochi's scheduler). The pipeline pads prompts to 256
    tokens. Frames: ``6k + 1``; height and width: multiples of 16.
    """
    from diffusers import (
        AutoencoderKLMochi,
        FlowMatchEulerDiscreteScheduler,
        MochiPipeline,
        MochiTransformer3DModel,
    )

    torch.manual_seed(seed)
    # the caption pooler has 8 heads: text_embed_dim is a multiple of 8; the last block is context_pre_only
    transformer = MochiTransformer3DModel(patch_size=2, num_attention_heads=2, attention_head_dim=16, num_layers=2,
                                          pooled_projection_dim=16, in_channels=12, text_embed_dim=24,
                                          time_embed_dim=32, max_sequence_length=256).eval()
    torch.nn.init.normal_(transformer.pos_frequencies, std=0.1)
    # in_channels 15: the encoder's Fourier features (3 + 12); neither the 3 spatial (2x) nor the 3
    # temporal (1x, 2x, 3x) stages attend
    vae = AutoencoderKLMochi(in_channels=15, out_channels=3, encoder_block_out_channels=(32,) * 4,
                             decoder_block_out_channels=(32,) * 4, latent_channels=12, layers_per_block=(1,) * 5,
                             temporal_expansions=(1, 2, 3), spatial_expansions=(2, 2, 2),
                             add_attention_block=(False,) * 5, latents_mean=(0.0,) * 12, latents_std=(1.0,) * 12,
                             scaling_factor=1.0).eval()
    scheduler = FlowMatchEulerDiscreteScheduler(invert_sigmas=True)
    return MochiPipeline(scheduler=scheduler, vae=vae, text_encoder=t5_encoder(24),
                         tokenizer=build_word_tokenizer(256), transformer=transformer)


def build_tiny_allegro(seed: int = 0) -> Any:
    """``AllegroPipeline``: 2-block ``AllegroTransformer3DModel`` (head dim 18: its RoPE splits heads into
    even (t, h, w) thirds), 4-channel ``AutoencoderKLAllegro`` with four 8-channel blocks (8x spatial,
    4x temporal), one-layer T5 encoder, Euler ancestral (Allegro's scheduler). The pipeline pads
    prompts to 512 tokens.

    The VAE decodes only in tiles (``enable_tiling``, which ``load_pipeline`` turns on; without it
    ``decode`` raises ``NotImplementedError``) of 24 frames by ``sample_size`` (128) pixels square,
    overlapping by 8 frames, 120 rows and 80 columns (fixed by the class). Frames: ``24 + 16k`` (6 +
    4k latent frames; counts the pipeline rounds up to those, such as 21, are cropped); height: at
    least 128, a multiple of 16; width: ``128 + 48k``. Smaller videos cannot be decoded, and other
    sizes leave the parts no tile reaches black.
    """
    from diffusers import (
        AllegroPipeline,
        AllegroTransformer3DModel,
        AutoencoderKLAllegro,
        EulerAncestralDiscreteScheduler,
    )

    torch.manual_seed(seed)
    # cross_attention_dim is the inner dim (captions are projected to it); sample_* size only the
    # default video (the learned positional table is unused with RoPE)
    transformer = AllegroTransformer3DModel(patch_size=2, patch_size_t=1, num_attention_heads=2, attention_head_dim=18,
                                            in_channels=4, out_channels=4, num_layers=2, cross_attention_dim=36,
                                            sample_height=16, sample_width=16, sample_frames=6, caption_channels=24,
                                            interpolation_scale_h=2.0, interpolation_scale_w=2.0,
                                            interpolation_scale_t=2.2).eval()
    vae = AutoencoderKLAllegro(in_channels=3, out_channels=3, block_out_channels=(8, 8, 8, 8), latent_channels=4,
                               layers_per_block=1, norm_num_groups=2, temporal_compression_ratio=4, sample_size=128,
                               scaling_factor=1.0).eval()
    scheduler = EulerAncestralDiscreteScheduler(beta_schedule="linear", beta_start=0.0001, beta_end=0.02,
                                                timestep_spacing="linspace", prediction_type="epsilon")
    return AllegroPipeline(tokenizer=build_word_tokenizer(512), text_encoder=t5_encoder(24), vae=vae,
                           transformer=transformer, scheduler=scheduler)


def build_tiny_easyanimate(seed: int = 0) -> Any:
    """``EasyAnimatePipeline`` (V5.1 style): 2-block ``EasyAnimateTransformer3DModel`` (every block
    MMDiT; head dim 16 = RoPE axes of 4, 6, 6), 4-channel ``AutoencoderKLMagvit`` with four 8-channel
    blocks (8x spatial, 4x temporal), a 2-layer ``Qwen2VLForConditionalGeneration`` (the pipeline
    reads its second-to-last hidden states; see :func:`qwen2vl_encoder`), flow-matching Euler. The
    pipeline formats prompts with the tokenizer's chat template (here: the messages' text, as the
    Qwen2-VL markers would all be ``<unk>`` words) and pads them to 256 tokens. With classifier-free
    guidance on (the default) it needs a negative prompt: it iterates over ``None`` otherwise (the
    batch CLI passes ``""``). Frames: ``4k + 1``; height and width: multiples of 16 (it rounds others
    down).
    """
    from diffusers import (
        AutoencoderKLMagvit,
        EasyAnimatePipeline,
        EasyAnimateTransformer3DModel,
        FlowMatchEulerDiscreteScheduler,
    )

    torch.manual_seed(seed)
    transformer = EasyAnimateTransformer3DModel(num_attention_heads=2, attention_head_dim=16, in_channels=4,
                                                out_channels=4, patch_size=2, sample_width=4, sample_height=4,
                                                num_layers=2, mmdit_layers=2, time_embed_dim=32,
                                                text_embed_dim=24).eval()
    vae = AutoencoderKLMagvit(in_channels=3, latent_channels=4, out_channels=3, block_out_channels=(8, 8, 8, 8),
                              down_block_types=("SpatialDownBlock3D",) + ("SpatialTemporalDownBlock3D",) * 3,
                              up_block_types=("SpatialUpBlock3D",) + ("SpatialTemporalUpBlock3D",) * 3,
                              layers_per_block=1, norm_num_groups=2, scaling_factor=1.0).eval()
    tokenizer = build_word_tokenizer(256)
    tokenizer.chat_template = ("{% for message in messages %}{% for part in message['content'] %}{{ part['text'] }} "
                               "{% endfor %}{% endfor %}")
    return EasyAnimatePipeline(vae=vae, text_encoder=qwen2vl_encoder(24), tokenizer=tokenizer,
                               transformer=transformer, scheduler=FlowMatchEulerDiscreteScheduler())
