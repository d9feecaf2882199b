"""Tiny random-weight text-to-video (and text-to-image) pipelines built from configs, offline
(tests, demos, CLI smoke runs).

Every component is built from a config with seeded random weights: the transformer, the VAE, the
text encoder (a transformers config) and a word-level tokenizer made with the ``tokenizers``
library from a fixed word list. Nothing is downloaded. Saved with ``save_pretrained``, a folder
loads back with ``DiffusionPipeline.from_pretrained`` and drives ``diffspec generate`` like a
real checkpoint.

Example:
    >>> from diffspec.models.tiny_pipelines import save_tiny_pipeline
    >>> folder = save_tiny_pipeline("tiny-wan", "/tmp/tiny-wan")  # doctest: +SKIP
    >>> # diffspec generate --model /tmp/tiny-wan --prompt-file prompts.txt --height 32 --width 32 \\
    >>> #     --num-frames 5 --steps 8 --out out/
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

WORDS = (
    "a an the of in on at with and to under over near by through red green blue yellow white black orange "
    "purple small large old young fast slow bright dark cat dog fox bird fish horse car boat tree flower "
    "river sea sky cloud mountain city street forest field snow rain sun moon night day runs walks flies "
    "swims jumps sits glows falls video photo scene camera close wide shot"
).split()
"""The tokenizers' vocabulary (other words map to ``<unk>``)."""


def build_word_tokenizer(max_length: int = 512) -> Any:
    """A lower-casing word-level ``PreTrainedTokenizerFast`` over :data:`WORDS` (pad 0, eos 1, unk 2).

    Example:
        >>> tok = build_word_tokenizer()
        >>> tok("A red fox")["input_ids"]
        [3, 18, 36]
    """
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "</s>": 1, "<unk>": 2, **{w: i + 3 for i, w in enumerate(WORDS)}}
    core = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    core.normalizer = normalizers.Lowercase()
    core.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", eos_token="</s>", unk_token="<unk>",
                                   model_max_length=max_length)


def _vocab_size() -> int:
    return len(WORDS) + 3


def _t5_encoder(d_model: int, *, umt5: bool = False) -> Any:
    from transformers import T5Config, T5EncoderModel, UMT5Config, UMT5EncoderModel

    kw = dict(vocab_size=_vocab_size(), d_model=d_model, d_kv=8, d_ff=32, num_layers=1, num_heads=2,
              relative_attention_num_buckets=8, decoder_start_token_id=0, pad_token_id=0, eos_token_id=1)
    model = UMT5EncoderModel(UMT5Config(**kw)) if umt5 else T5EncoderModel(T5Config(**kw))
    return model.eval()


def _wan_vae() -> Any:
    """The 4-channel ``AutoencoderKLWan`` of the Wan-family builders (8x spatial, 4x temporal)."""
    from diffusers import AutoencoderKLWan

    return AutoencoderKLWan(base_dim=8, z_dim=4, dim_mult=[1, 1, 1, 1], num_res_blocks=1,
                            temperal_downsample=[False, True, True], latents_mean=[0.0] * 4,
                            latents_std=[1.0] * 4).eval()


def _kl_vae(blocks: int = 2) -> Any:
    """A 4-channel ``AutoencoderKL`` of ``blocks`` blocks (``2 ** (blocks - 1)``x spatial): two for the
    Flux-family builders (2x), four for Lumina 2 (8x, the scale its pipeline assumes)."""
    from diffusers import AutoencoderKL

    return AutoencoderKL(in_channels=3, out_channels=3, down_block_types=("DownEncoderBlock2D",) * blocks,
                         up_block_types=("UpDecoderBlock2D",) * blocks, block_out_channels=(8,) * blocks,
                         layers_per_block=1, latent_channels=4, norm_num_groups=8, use_quant_conv=False,
                         use_post_quant_conv=False, shift_factor=0.0, scaling_factor=1.0).eval()


def build_tiny_wan(seed: int = 0) -> Any:
    """``WanPipeline``: 3-block ``WanTransformer3DModel``, 4-channel ``AutoencoderKLWan`` (8x spatial,
    4x temporal), one-layer UMT5 encoder, flow-matching Euler scheduler. Frames: ``4k + 1``;
    height and width: multiples of 16.
    """
    from diffusers import FlowMatchEulerDiscreteScheduler, WanPipeline, WanTransformer3DModel

    torch.manual_seed(seed)
    transformer = WanTransformer3DModel(patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=16,
                                        in_channels=4, out_channels=4, text_dim=24, freq_dim=32, ffn_dim=64,
                                        num_layers=3, rope_max_seq_len=32).eval()
    vae = _wan_vae()
    return WanPipeline(tokenizer=build_word_tokenizer(), text_encoder=_t5_encoder(24, umt5=True), vae=vae,
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
    return WanImageToVideoPipeline(tokenizer=build_word_tokenizer(), text_encoder=_t5_encoder(24, umt5=True),
                                   vae=_wan_vae(), scheduler=FlowMatchEulerDiscreteScheduler(shift=3.0),
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
    vae = _wan_vae()
    scheduler = UniPCMultistepScheduler(prediction_type="flow_prediction", use_flow_sigmas=True, flow_shift=8.0)
    return SkyReelsV2Pipeline(tokenizer=build_word_tokenizer(), text_encoder=_t5_encoder(24, umt5=True), vae=vae,
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
    return CogVideoXPipeline(tokenizer=build_word_tokenizer(226), text_encoder=_t5_encoder(24), vae=vae,
                             transformer=transformer, scheduler=scheduler)


def build_tiny_ltx(seed: int = 0) -> Any:
    """``LTXPipeline``: 3-block ``LTXVideoTransformer3DModel``, 8-channel ``AutoencoderKLLTXVideo``
    (4x spatial, 4x temporal), one-layer T5 encoder, flow-matching Euler. Frames: ``4k + 1``;
    height and width: multiples of 32 (the pipeline's own rule).
    """
    from diffusers import (
        AutoencoderKLLTXVideo,
        FlowMatchEulerDiscreteScheduler,
        LTXPipeline,
        LTXVideoTransformer3DModel,
    )

    torch.manual_seed(seed)
    transformer = LTXVideoTransformer3DModel(in_channels=8, out_channels=8, patch_size=1, patch_size_t=1,
                                             num_attention_heads=2, attention_head_dim=16, cross_attention_dim=32,
                                             num_layers=3, caption_channels=24).eval()
    vae = AutoencoderKLLTXVideo(in_channels=3, out_channels=3, latent_channels=8, block_out_channels=(8, 8, 8, 8),
                                decoder_block_out_channels=(8, 8, 8, 8), layers_per_block=(1, 1, 1, 1, 1),
                                decoder_layers_per_block=(1, 1, 1, 1, 1),
                                spatio_temporal_scaling=(True, True, False, False),
                                decoder_spatio_temporal_scaling=(True, True, False, False),
                                decoder_inject_noise=(False,) * 5, upsample_residual=(False,) * 4,
                                upsample_factor=(1,) * 4, timestep_conditioning=False, patch_size=1,
                                patch_size_t=1, encoder_causal=True, decoder_causal=False).eval()
    return LTXPipeline(scheduler=FlowMatchEulerDiscreteScheduler(), vae=vae, text_encoder=_t5_encoder(24),
                       tokenizer=build_word_tokenizer(128), transformer=transformer)


def build_tiny_hunyuanvideo(seed: int = 0) -> Any:
    """``HunyuanVideoPipeline``: 2+2-block transformer with embedded guidance, 4-channel
    ``AutoencoderKLHunyuanVideo`` (8x spatial, 4x temporal), a 3-layer Llama and a one-layer CLIP
    text encoder, flow-matching Euler. Frames: ``4k + 1``; height and width: multiples of 16.
    """
    from diffusers import (
        AutoencoderKLHunyuanVideo,
        FlowMatchEulerDiscreteScheduler,
        HunyuanVideoPipeline,
        HunyuanVideoTransformer3DModel,
    )
    from transformers import CLIPTextConfig, CLIPTextModel, LlamaConfig, LlamaModel

    torch.manual_seed(seed)
    transformer = HunyuanVideoTransformer3DModel(in_channels=4, out_channels=4, num_attention_heads=2,
                                                 attention_head_dim=16, num_layers=2, num_single_layers=2,
                                                 num_refiner_layers=1, patch_size=2, patch_size_t=1,
                                                 text_embed_dim=24, pooled_projection_dim=16,
                                                 rope_axes_dim=(4, 6, 6), guidance_embeds=True).eval()
    vae = AutoencoderKLHunyuanVideo(in_channels=3, out_channels=3, latent_channels=4,
                                    down_block_types=("HunyuanVideoDownBlock3D",) * 4,
                                    up_block_types=("HunyuanVideoUpBlock3D",) * 4, block_out_channels=(8, 8, 8, 8),
                                    layers_per_block=1, norm_num_groups=4, spatial_compression_ratio=8,
                                    temporal_compression_ratio=4).eval()
    llama = LlamaModel(LlamaConfig(vocab_size=_vocab_size(), hidden_size=24, intermediate_size=32, num_hidden_layers=3,
                                   num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=512,
                                   pad_token_id=0)).eval()
    clip = CLIPTextModel(CLIPTextConfig(vocab_size=_vocab_size(), hidden_size=16, intermediate_size=32,
                                        num_hidden_layers=1, num_attention_heads=2, max_position_embeddings=77,
                                        projection_dim=16)).eval()
    return HunyuanVideoPipeline(text_encoder=llama, tokenizer=build_word_tokenizer(512), transformer=transformer,
                                vae=vae, scheduler=FlowMatchEulerDiscreteScheduler(shift=7.0), text_encoder_2=clip,
                                tokenizer_2=build_word_tokenizer(77))


def build_tiny_flux(seed: int = 0) -> Any:
    """``FluxPipeline`` (text to image): 1+2-block ``FluxTransformer2DModel``, 4-channel
    ``AutoencoderKL`` (2x spatial, latents packed 2x2), one-layer CLIP and T5 encoders,
    flow-matching Euler. Height and width: multiples of 4.
    """
    from diffusers import FlowMatchEulerDiscreteScheduler, FluxPipeline, FluxTransformer2DModel
    from transformers import CLIPTextConfig, CLIPTextModel

    torch.manual_seed(seed)
    transformer = FluxTransformer2DModel(patch_size=1, in_channels=16, num_layers=1, num_single_layers=2,
                                         attention_head_dim=16, num_attention_heads=2, joint_attention_dim=24,
                                         pooled_projection_dim=16, guidance_embeds=False,
                                         axes_dims_rope=(4, 6, 6)).eval()
    vae = _kl_vae()
    clip = CLIPTextModel(CLIPTextConfig(vocab_size=_vocab_size(), hidden_size=16, intermediate_size=32,
                                        num_hidden_layers=1, num_attention_heads=2, max_position_embeddings=77,
                                        projection_dim=16)).eval()
    return FluxPipeline(scheduler=FlowMatchEulerDiscreteScheduler(), vae=vae, text_encoder=clip,
                        tokenizer=build_word_tokenizer(77), text_encoder_2=_t5_encoder(24),
                        tokenizer_2=build_word_tokenizer(512), transformer=transformer)


def build_tiny_chroma(seed: int = 0) -> Any:
    """``ChromaPipeline`` (text to image): 1+2-block ``ChromaTransformer2DModel`` (its modulations from a
    2-layer approximator), the Flux builder's 4-channel ``AutoencoderKL`` (2x spatial, latents packed
    2x2), one-layer T5 encoder (Chroma has no CLIP), flow-matching Euler. Height and width: multiples
    of 4.
    """
    from diffusers import ChromaPipeline, ChromaTransformer2DModel, FlowMatchEulerDiscreteScheduler

    torch.manual_seed(seed)
    transformer = ChromaTransformer2DModel(patch_size=1, in_channels=16, num_layers=1, num_single_layers=2,
                                           attention_head_dim=16, num_attention_heads=2, joint_attention_dim=24,
                                           axes_dims_rope=(4, 6, 6), approximator_num_channels=16,
                                           approximator_hidden_dim=32, approximator_layers=2).eval()
    vae = _kl_vae()
    return ChromaPipeline(scheduler=FlowMatchEulerDiscreteScheduler(), vae=vae, text_encoder=_t5_encoder(24),
                          tokenizer=build_word_tokenizer(512), transformer=transformer)


def build_tiny_lumina2(seed: int = 0) -> Any:
    """``Lumina2Pipeline`` (text to image): ``Lumina2Transformer2DModel`` with 2 joint blocks and 1-block
    noise and context refiners (grouped-query attention), 4-channel ``AutoencoderKL`` with four blocks
    (8x spatial: the pipeline fixes its VAE scale at 8), a 2-layer ``Gemma2Model`` (the pipeline reads
    its second-to-last hidden states), flow-matching Euler. The pipeline prepends its system prompt as plain text, whose words the word
    tokenizer maps to ``<unk>``, and pads to 256 tokens. Height and width: multiples of 16, at most
    512 (the rope tables).
    """
    from diffusers import FlowMatchEulerDiscreteScheduler, Lumina2Pipeline, Lumina2Transformer2DModel
    from transformers import Gemma2Config, Gemma2Model

    torch.manual_seed(seed)
    # axes_lens[0] covers the 256 caption positions, which come before the image tokens' on that axis;
    # axes_lens[1:] the 2x2 patch rows and columns
    transformer = Lumina2Transformer2DModel(sample_size=4, patch_size=2, in_channels=4, hidden_size=32, num_layers=2,
                                            num_refiner_layers=1, num_attention_heads=2, num_kv_heads=1,
                                            multiple_of=16, axes_dim_rope=(4, 6, 6), axes_lens=(288, 32, 32),
                                            cap_feat_dim=24).eval()
    vae = _kl_vae(4)
    gemma = Gemma2Model(Gemma2Config(vocab_size=_vocab_size(), hidden_size=24, intermediate_size=32, num_hidden_layers=2,
                                     num_attention_heads=2, num_key_value_heads=1, head_dim=12,
                                     max_position_embeddings=512, pad_token_id=0, eos_token_id=1,
                                     bos_token_id=None)).eval()
    return Lumina2Pipeline(transformer=transformer, scheduler=FlowMatchEulerDiscreteScheduler(), vae=vae,
                           text_encoder=gemma, tokenizer=build_word_tokenizer(256))


def build_tiny_auraflow(seed: int = 0) -> Any:
    """``AuraFlowPipeline`` (text to image): 2 joint + 2 single-block ``AuraFlowTransformer2DModel`` (8
    register tokens, a learned 8x8 table of patch positions), the Flux builder's 4-channel ``AutoencoderKL``
    (2x spatial; the pipeline patchifies nothing, the model does, 2x2), one-layer UMT5 encoder (the
    pipeline zeroes its states past the prompt and pads to 256 tokens), flow-matching Euler. Height and
    width: multiples of 4 (the pipeline's rule, ``2 * vae_scale_factor``), at most 32 (the position table).
    """
    from diffusers import AuraFlowPipeline, AuraFlowTransformer2DModel, FlowMatchEulerDiscreteScheduler

    torch.manual_seed(seed)
    # pos_embed_max_size: 64 positions = an 8x8 grid of 2x2 patches = a 16x16 latent = 32x32 pixels
    transformer = AuraFlowTransformer2DModel(sample_size=8, patch_size=2, in_channels=4, num_mmdit_layers=2,
                                             num_single_dit_layers=2, attention_head_dim=16, num_attention_heads=2,
                                             joint_attention_dim=24, caption_projection_dim=32, out_channels=4,
                                             pos_embed_max_size=64).eval()
    vae = _kl_vae()
    return AuraFlowPipeline(tokenizer=build_word_tokenizer(256), text_encoder=_t5_encoder(24, umt5=True), vae=vae,
                            transformer=transformer, scheduler=FlowMatchEulerDiscreteScheduler())


def build_tiny_cogview3plus(seed: int = 0) -> Any:
    """``CogView3PlusPipeline`` (text to image): 2-block ``CogView3PlusTransformer2DModel`` (SDXL-like size
    and crop micro-conditioning, a sincos table of 8x8 patch positions), 4-channel ``AutoencoderKL`` with
    four blocks (8x spatial, the checkpoints' scale), one-layer T5 encoder (the pipeline pads to 224 tokens
    and uses zeros as the negative prompt when none is given), ``CogVideoXDDIMScheduler`` (v-prediction,
    zero terminal SNR, the checkpoints' settings). Height and width: multiples of 16 (the pipeline asks for
    multiples of 8; the model patchifies the 8x latent 2x2), at most 128 (the position table).
    """
    from diffusers import CogVideoXDDIMScheduler, CogView3PlusPipeline, CogView3PlusTransformer2DModel

    torch.manual_seed(seed)
    # pos_embed_max_size: the side of the patch grid, 8 patches = a 16-wide latent = 128 pixels
    transformer = CogView3PlusTransformer2DModel(patch_size=2, in_channels=4, num_layers=2, attention_head_dim=16,
                                                 num_attention_heads=2, out_channels=4, text_embed_dim=24,
                                                 time_embed_dim=32, condition_dim=8, pos_embed_max_size=8,
                                                 sample_size=8).eval()
    vae = _kl_vae(4)
    scheduler = CogVideoXDDIMScheduler(timestep_spacing="trailing", prediction_type="v_prediction",
                                       rescale_betas_zero_snr=True, beta_schedule="scaled_linear",
                                       beta_start=0.00085, beta_end=0.012, clip_sample=False, set_alpha_to_one=True,
                                       snr_shift_scale=4.0)
    return CogView3PlusPipeline(tokenizer=build_word_tokenizer(224), text_encoder=_t5_encoder(24), vae=vae,
                                transformer=transformer, scheduler=scheduler)


def build_tiny_hidream(seed: int = 0) -> Any:
    """``HiDreamImagePipeline`` (text to image): 2 double + 2 single-stream ``HiDreamImageTransformer2DModel``
    (mixture-of-experts feed-forwards, 4 experts, 2 active; every block reads one Llama hidden layer), the
    Flux builder's 4-channel ``AutoencoderKL`` (2x spatial), four text encoders as the pipeline expects: two
    one-layer ``CLIPTextModelWithProjection`` (their pooled projections concatenated), a one-layer T5 and a
    3-layer ``LlamaForCausalLM`` (the stack of its hidden layers), each fed 128 tokens; flow-matching Euler.
    Sizes: the pipeline rescales any height and width to the area of its default ``128 * vae_scale_factor``
    square (256 x 256 here, as 1024 x 1024 at real scale), keeping the aspect ratio and rounding down to
    multiples of 4, so only sizes of that area come out as asked (256 x 256, 128 x 512, ...). The model
    patchifies the latent 4x4 (1024 tokens at 256 x 256); non-square latents are padded to its
    ``max_resolution`` of 128 x 128 latent pixels, so they must fit in 1024 patches.
    """
    from diffusers import (
        FlowMatchEulerDiscreteScheduler,
        HiDreamImagePipeline,
        HiDreamImageTransformer2DModel,
    )
    from transformers import CLIPTextConfig, CLIPTextModelWithProjection, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    # rope axes (8, 4, 4) sum to the head dim; llama_layers: the Llama hidden layer each of the 4 blocks reads;
    # text_emb_dim: the two CLIP projections (8 each) concatenated; caption_channels: (T5 dim, Llama dim)
    transformer = HiDreamImageTransformer2DModel(patch_size=4, in_channels=4, out_channels=4, num_layers=2,
                                                 num_single_layers=2, attention_head_dim=16, num_attention_heads=2,
                                                 caption_channels=[24, 20], text_emb_dim=16, num_routed_experts=4,
                                                 num_activated_experts=2, axes_dims_rope=(8, 4, 4),
                                                 max_resolution=(128, 128), llama_layers=[0, 1, 2, 2]).eval()
    vae = _kl_vae()

    def clip() -> Any:
        return CLIPTextModelWithProjection(CLIPTextConfig(vocab_size=_vocab_size(), hidden_size=16, intermediate_size=32,
                                                          num_hidden_layers=1, num_attention_heads=2,
                                                          max_position_embeddings=128, projection_dim=8,
                                                          pad_token_id=0, bos_token_id=None, eos_token_id=1)).eval()

    llama = LlamaForCausalLM(LlamaConfig(vocab_size=_vocab_size(), hidden_size=20, intermediate_size=32,
                                         num_hidden_layers=3, num_attention_heads=2, num_key_value_heads=2,
                                         max_position_embeddings=128, pad_token_id=0, eos_token_id=1)).eval()
    return HiDreamImagePipeline(scheduler=FlowMatchEulerDiscreteScheduler(shift=3.0), vae=vae, text_encoder=clip(),
                                tokenizer=build_word_tokenizer(128), text_encoder_2=clip(),
                                tokenizer_2=build_word_tokenizer(128), text_encoder_3=_t5_encoder(24),
                                tokenizer_3=build_word_tokenizer(128), text_encoder_4=llama,
                                tokenizer_4=build_word_tokenizer(128), transformer=transformer)
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
    return MochiPipeline(scheduler=scheduler, vae=vae, text_encoder=_t5_encoder(24),
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
    return AllegroPipeline(tokenizer=build_word_tokenizer(512), text_encoder=_t5_encoder(24), vae=vae,
                           transformer=transformer, scheduler=scheduler)


def _qwen2vl_encoder(hidden: int) -> Any:
    """A 2-layer ``Qwen2VLForConditionalGeneration`` (``hidden`` wide, multimodal RoPE sections of
    2 + 2 + 2 frequencies) with a one-block vision tower that text prompts never reach; its image
    and video tokens lie outside the word vocabulary."""
    from transformers import Qwen2VLConfig, Qwen2VLForConditionalGeneration

    vocab = _vocab_size()
    text = dict(vocab_size=vocab, hidden_size=hidden, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2,
                num_key_value_heads=1, max_position_embeddings=512, pad_token_id=0, eos_token_id=1, bos_token_id=None,
                rope_parameters={"rope_type": "default", "mrope_section": [2, 2, 2], "rope_theta": 10000.0})
    vision = dict(depth=1, embed_dim=16, hidden_size=hidden, num_heads=2, mlp_ratio=2, patch_size=2,
                  spatial_merge_size=1, temporal_patch_size=1)
    config = Qwen2VLConfig(text_config=text, vision_config=vision, image_token_id=vocab + 10,
                           video_token_id=vocab + 11, vision_start_token_id=vocab + 12, vision_end_token_id=vocab + 13)
    return Qwen2VLForConditionalGeneration(config).eval()


def build_tiny_easyanimate(seed: int = 0) -> Any:
    """``EasyAnimatePipeline`` (V5.1 style): 2-block ``EasyAnimateTransformer3DModel`` (every block
    MMDiT; head dim 16 = RoPE axes of 4, 6, 6), 4-channel ``AutoencoderKLMagvit`` with four 8-channel
    blocks (8x spatial, 4x temporal), a 2-layer ``Qwen2VLForConditionalGeneration`` (the pipeline
    reads its second-to-last hidden states; see :func:`_qwen2vl_encoder`), flow-matching Euler. The
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
    return EasyAnimatePipeline(vae=vae, text_encoder=_qwen2vl_encoder(24), tokenizer=tokenizer,
                               transformer=transformer, scheduler=FlowMatchEulerDiscreteScheduler())


TINY_PIPELINES: dict[str, Callable[[int], Any]] = {
    "tiny-flux": build_tiny_flux,
    "tiny-wan": build_tiny_wan,
    "tiny-wan22": build_tiny_wan22,
    "tiny-wan22-i2v": build_tiny_wan22_i2v,
    "tiny-cogvideox": build_tiny_cogvideox,
    "tiny-ltx": build_tiny_ltx,
    "tiny-hunyuanvideo": build_tiny_hunyuanvideo,
    "tiny-skyreelsv2": build_tiny_skyreelsv2,
    "tiny-chroma": build_tiny_chroma,
    "tiny-lumina2": build_tiny_lumina2,
    "tiny-auraflow": build_tiny_auraflow,
    "tiny-cogview3plus": build_tiny_cogview3plus,
    "tiny-hidream": build_tiny_hidream,
    "tiny-mochi": build_tiny_mochi,
    "tiny-allegro": build_tiny_allegro,
    "tiny-easyanimate": build_tiny_easyanimate,
}
"""Builders of the tiny pipelines by name."""


def build_tiny_pipeline(name: str, seed: int = 0) -> Any:
    """The named tiny pipeline (see :data:`TINY_PIPELINES`), progress bars off.

    Raises:
        ValueError: an unknown name (lists the known ones).
    """
    if name not in TINY_PIPELINES:
        raise ValueError(f"unknown tiny pipeline {name!r}; choose one of {', '.join(TINY_PIPELINES)}")
    pipe = TINY_PIPELINES[name](seed)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def save_tiny_pipeline(name: str, folder: str | Path, seed: int = 0) -> Path:
    """Build the named tiny pipeline and ``save_pretrained`` it into ``folder``; returns the folder."""
    from .dit import quiet_diffusers

    with quiet_diffusers():
        build_tiny_pipeline(name, seed).save_pretrained(str(folder))
    return Path(folder)
