"""The parts the tiny random-weight pipelines share: a word-level tokenizer, small text encoders, VAEs.

Example:
    >>> tok = build_word_tokenizer()
    >>> tok("A red fox")["input_ids"]
    [3, 18, 36]
"""

from __future__ import annotations

from typing import Any

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


def word_vocab_size() -> int:
    return len(WORDS) + 3


def t5_encoder(d_model: int, *, umt5: bool = False) -> Any:
    from transformers import T5Config, T5EncoderModel, UMT5Config, UMT5EncoderModel

    kw = dict(vocab_size=word_vocab_size(), d_model=d_model, d_kv=8, d_ff=32, num_layers=1, num_heads=2,
              relative_attention_num_buckets=8, decoder_start_token_id=0, pad_token_id=0, eos_token_id=1)
    model = UMT5EncoderModel(UMT5Config(**kw)) if umt5 else T5EncoderModel(T5Config(**kw))
    return model.eval()


def wan_vae() -> Any:
    """The 4-channel ``AutoencoderKLWan`` of the Wan-family builders (8x spatial, 4x temporal)."""
    from diffusers import AutoencoderKLWan

    return AutoencoderKLWan(base_dim=8, z_dim=4, dim_mult=[1, 1, 1, 1], num_res_blocks=1,
                            temperal_downsample=[False, True, True], latents_mean=[0.0] * 4,
                            latents_std=[1.0] * 4).eval()


def kl_vae(blocks: int = 2) -> Any:
    """A 4-channel ``AutoencoderKL`` of ``blocks`` blocks (``2 ** (blocks - 1)``x spatial): two for the
    Flux-family builders (2x), four for Lumina 2 (8x, the scale its pipeline assumes)."""
    from diffusers import AutoencoderKL

    return AutoencoderKL(in_channels=3, out_channels=3, down_block_types=("DownEncoderBlock2D",) * blocks,
                         up_block_types=("UpDecoderBlock2D",) * blocks, block_out_channels=(8,) * blocks,
                         layers_per_block=1, latent_channels=4, norm_num_groups=8, use_quant_conv=False,
                         use_post_quant_conv=False, shift_factor=0.0, scaling_factor=1.0).eval()


def qwen2vl_encoder(hidden: int) -> Any:
    """A 2-layer ``Qwen2VLForConditionalGeneration`` (``hidden`` wide, multimodal RoPE sections of
    2 + 2 + 2 frequencies) with a one-block vision tower that text prompts never reach; its image
    and video tokens lie outside the word vocabulary."""
    from transformers import Qwen2VLConfig, Qwen2VLForConditionalGeneration

    vocab = word_vocab_size()
    text = dict(vocab_size=vocab, hidden_size=hidden, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2,
                num_key_value_heads=1, max_position_embeddings=512, pad_token_id=0, eos_token_id=1, bos_token_id=None,
                rope_parameters={"rope_type": "default", "mrope_section": [2, 2, 2], "rope_theta": 10000.0})
    vision = dict(depth=1, embed_dim=16, hidden_size=hidden, num_heads=2, mlp_ratio=2, patch_size=2,
                  spatial_merge_size=1, temporal_patch_size=1)
    config = Qwen2VLConfig(text_config=text, vision_config=vision, image_token_id=vocab + 10,
                           video_token_id=vocab + 11, vision_start_token_id=vocab + 12, vision_end_token_id=vocab + 13)
    return Qwen2VLForConditionalGeneration(config).eval()
