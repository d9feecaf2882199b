"""Tiny random-weight text-to-image pipelines (FLUX, Chroma, Lumina 2, AuraFlow, CogView3-Plus, HiDream)
and a class-conditional ``DiTPipeline``.

Example:
    >>> pipe = build_tiny_flux()  # doctest: +SKIP
    >>> type(pipe).__name__  # doctest: +SKIP
    'FluxPipeline'
"""

from __future__ import annotations

from typing import Any

import torch

from .pipeline_parts import build_word_tokenizer, kl_vae, t5_encoder, word_vocab_size
from .random_transformers import build_transformer


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
    vae = kl_vae()
    clip = CLIPTextModel(CLIPTextConfig(vocab_size=word_vocab_size(), hidden_size=16, intermediate_size=32,
                                        num_hidden_layers=1, num_attention_heads=2, max_position_embeddings=77,
                                        projection_dim=16)).eval()
    return FluxPipeline(scheduler=FlowMatchEulerDiscreteScheduler(), vae=vae, text_encoder=clip,
                        tokenizer=build_word_tokenizer(77), text_encoder_2=t5_encoder(24),
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
    vae = kl_vae()
    return ChromaPipeline(scheduler=FlowMatchEulerDiscreteScheduler(), vae=vae, text_encoder=t5_encoder(24),
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
    vae = kl_vae(4)
    gemma = Gemma2Model(Gemma2Config(vocab_size=word_vocab_size(), hidden_size=24, intermediate_size=32, num_hidden_layers=2,
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
    vae = kl_vae()
    return AuraFlowPipeline(tokenizer=build_word_tokenizer(256), text_encoder=t5_encoder(24, umt5=True), vae=vae,
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
    vae = kl_vae(4)
    scheduler = CogVideoXDDIMScheduler(timestep_spacing="trailing", prediction_type="v_prediction",
                                       rescale_betas_zero_snr=True, beta_schedule="scaled_linear",
                                       beta_start=0.00085, beta_end=0.012, clip_sample=False, set_alpha_to_one=True,
                                       snr_shift_scale=4.0)
    return CogView3PlusPipeline(tokenizer=build_word_tokenizer(224), text_encoder=t5_encoder(24), vae=vae,
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
    vae = kl_vae()

    def clip() -> Any:
        return CLIPTextModelWithProjection(CLIPTextConfig(vocab_size=word_vocab_size(), hidden_size=16, intermediate_size=32,
                                                          num_hidden_layers=1, num_attention_heads=2,
                                                          max_position_embeddings=128, projection_dim=8,
                                                          pad_token_id=0, bos_token_id=None, eos_token_id=1)).eval()

    llama = LlamaForCausalLM(LlamaConfig(vocab_size=word_vocab_size(), hidden_size=20, intermediate_size=32,
                                         num_hidden_layers=3, num_attention_heads=2, num_key_value_heads=2,
                                         max_position_embeddings=128, pad_token_id=0, eos_token_id=1)).eval()
    return HiDreamImagePipeline(scheduler=FlowMatchEulerDiscreteScheduler(shift=3.0), vae=vae, text_encoder=clip(),
                                tokenizer=build_word_tokenizer(128), text_encoder_2=clip(),
                                tokenizer_2=build_word_tokenizer(128), text_encoder_3=t5_encoder(24),
                                tokenizer_3=build_word_tokenizer(128), text_encoder_4=llama,
                                tokenizer_4=build_word_tokenizer(128), transformer=transformer)


def build_random_dit_pipeline(seed: int = 0, num_classes: int = 4) -> Any:
    """A tiny random-weight ``DiTPipeline`` (DiT + AutoencoderKL + DDIM) for tests and examples.

    Example:
        >>> pipe = build_random_dit_pipeline()
        >>> pipe(class_labels=[0], num_inference_steps=2, output_type="np").images.shape
        (1, 16, 16, 3)
    """
    from diffusers import AutoencoderKL, DDIMScheduler, DiTPipeline

    transformer = build_transformer("tiny-dit-random", seed=seed)
    torch.manual_seed(seed)
    vae = AutoencoderKL(
        in_channels=3, out_channels=3, down_block_types=("DownEncoderBlock2D", "DownEncoderBlock2D"),
        up_block_types=("UpDecoderBlock2D", "UpDecoderBlock2D"), block_out_channels=(8, 8),
        layers_per_block=1, latent_channels=4, norm_num_groups=8, sample_size=16,
    ).eval()
    scheduler = DDIMScheduler(num_train_timesteps=1000, beta_schedule="linear", clip_sample=False)
    id2label = {i: f"class{i}" for i in range(num_classes)}
    pipe = DiTPipeline(transformer=transformer, vae=vae, scheduler=scheduler, id2label=id2label)
    pipe.set_progress_bar_config(disable=True)
    return pipe
