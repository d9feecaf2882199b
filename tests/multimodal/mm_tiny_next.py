"""Tiny LLaVA-NeXT, LLaVA-NeXT-Video and Qwen2.5-VL targets with locally built tokenizers/processors.

No hub: the tokenizer is a word-level ``tokenizers`` model over ``w3 .. w89`` plus the family's
placeholder strings at ids 90-95 (the ids of :mod:`mm_tiny`). LLaVA-NeXT inputs come from a real
``LlavaNextProcessor`` (anyres tiling, so rows get different numbers of image tokens); Qwen2.5-VL
image inputs come from its real image processor, with the placeholder expansion done here (the
``Qwen2_5_VLProcessor`` and both video processors need torchvision, which the CPU env lacks), and
video inputs are built as tensors the way the video processors lay them out.

Example:
    >>> model, inputs = llava_next(), llava_next_inputs(3, seed=0)  # doctest: +SKIP
"""

from __future__ import annotations

import numpy as np
import torch
from mm_tiny import IMAGE_ID, VIDEO_ID, VOCAB, VSTART, _pad_left, _text

PINPOINTS = [[16, 16], [16, 32], [32, 16], [32, 32]]
QWEN_TOKENS = ["<|image_pad|>", "<|video_pad|>", "<|vision_start|>", "<|vision_end|>", "<x94>", "<x95>"]
LLAVA_TOKENS = ["<image>", "<video>", "<x92>", "<x93>", "<x94>", "<x95>"]


def tokenizer(specials: list[str]):
    """A left-padding fast tokenizer: ``<pad>``=0, ``<s>``=1, ``</s>``=2, ``w3``..``w89``, ``specials`` at 90-95."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "<s>": 1, "</s>": 2} | {f"w{i}": i for i in range(3, IMAGE_ID)}
    vocab |= {name: IMAGE_ID + i for i, name in enumerate(specials)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", bos_token="<s>", eos_token="</s>",
                                   padding_side="left")
    fast.add_special_tokens({"additional_special_tokens": list(specials)})
    return fast


def _clip():
    from transformers import CLIPVisionConfig

    return CLIPVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                            image_size=16, patch_size=4, projection_dim=32)


def _ready(model):
    model.generation_config.pad_token_id = 0
    model.generation_config.eos_token_id = 2
    return model.eval()


def llava_next(layers: int = 2, hidden: int = 64, seed: int = 0):
    """LLaVA-NeXT (anyres tiles of 16x16, 16 tokens per tile plus row newlines) on a Llama LM."""
    from transformers import LlamaConfig, LlavaNextConfig, LlavaNextForConditionalGeneration

    torch.manual_seed(seed)
    cfg = LlavaNextConfig(vision_config=_clip(), text_config=LlamaConfig(**_text(VOCAB, hidden, layers)),
                          image_token_index=IMAGE_ID, image_grid_pinpoints=PINPOINTS, vision_feature_layer=-1,
                          vision_feature_select_strategy="default", initializer_range=0.3)
    return _ready(LlavaNextForConditionalGeneration(cfg))


def llava_next_processor():
    """A real ``LlavaNextProcessor`` (PIL image backend) around :func:`tokenizer`."""
    from transformers import LlavaNextImageProcessorPil, LlavaNextProcessor

    images = LlavaNextImageProcessorPil(size={"shortest_edge": 16}, crop_size={"height": 16, "width": 16},
                                        image_grid_pinpoints=PINPOINTS)
    return LlavaNextProcessor(image_processor=images, tokenizer=tokenizer(LLAVA_TOKENS), patch_size=4,
                              vision_feature_select_strategy="default", num_additional_image_tokens=1)


def _words(g: torch.Generator, lo: int = 1, hi: int = 5) -> str:
    n = int(torch.randint(lo, hi, (1,), generator=g))
    return " ".join(f"w{int(i)}" for i in torch.randint(3, IMAGE_ID, (n,), generator=g))


def llava_next_inputs(batch: int, seed: int, processor=None) -> dict:
    """One image per row, of a different size per row (different token counts: ragged rows)."""
    processor = processor or llava_next_processor()
    g = torch.Generator().manual_seed(seed)
    rng = np.random.default_rng(seed)
    sizes = [(16, 16), (16, 28), (30, 16), (24, 24)]
    images = [rng.integers(0, 255, (*sizes[i % 4], 3), dtype=np.uint8) for i in range(batch)]
    text = [f"{_words(g)} <image> {_words(g)}" for _ in range(batch)]
    return dict(processor(text=text, images=images, return_tensors="pt", padding=True))


def llava_next_video(layers: int = 2, hidden: int = 64, seed: int = 0):
    """LLaVA-NeXT-Video: 16x16 frames, 16 patches pooled 2x2 to 4 tokens per frame."""
    from transformers import LlamaConfig, LlavaNextVideoConfig, LlavaNextVideoForConditionalGeneration

    torch.manual_seed(seed)
    cfg = LlavaNextVideoConfig(vision_config=_clip(), text_config=LlamaConfig(**_text(VOCAB, hidden, layers)),
                               image_token_index=IMAGE_ID, video_token_index=VIDEO_ID, image_grid_pinpoints=PINPOINTS,
                               vision_feature_layer=-1, vision_feature_select_strategy="default",
                               spatial_pool_stride=2, initializer_range=0.3)
    return _ready(LlavaNextVideoForConditionalGeneration(cfg))


def llava_next_video_inputs(batch: int, seed: int, frames: int = 3) -> dict:
    """A ``frames``-frame video per row (4 ``<video>`` tokens per frame) between random text, left padded."""
    g = torch.Generator().manual_seed(seed)
    rows = []
    for _ in range(batch):
        pre, post = (torch.randint(3, IMAGE_ID, (int(n),), generator=g) for n in torch.randint(1, 5, (2,), generator=g))
        rows.append(torch.cat([pre, torch.full((4 * frames,), VIDEO_ID), post]))
    ids, mask = _pad_left(rows)
    return {"input_ids": ids, "attention_mask": mask,
            "pixel_values_videos": torch.randn(batch, frames, 3, 16, 16, generator=g)}


def qwen2_5_vl(layers: int = 2, hidden: int = 64, seed: int = 0, heads: int = 4, kv_heads: int = 2):
    """Qwen2.5-VL (M-RoPE, windowed vision tower of one full-attention block), patch 4, merge 2."""
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    torch.manual_seed(seed)
    text = dict(_text(VOCAB, hidden, layers), num_attention_heads=heads, num_key_value_heads=kv_heads,
                max_position_embeddings=8192, rope_parameters={"rope_type": "default", "mrope_section": [2, 3, 3]})
    if hidden // heads != 16:
        sec = hidden // heads // 2
        text["rope_parameters"]["mrope_section"] = [sec - 2 * (sec // 3), sec // 3, sec // 3]
    vision = dict(depth=1, hidden_size=32, out_hidden_size=hidden, intermediate_size=64, num_heads=4, patch_size=4,
                  spatial_merge_size=2, temporal_patch_size=2, in_channels=3, window_size=8, fullatt_block_indexes=[0])
    cfg = Qwen2_5_VLConfig(text_config=text, vision_config=vision, image_token_id=IMAGE_ID, video_token_id=VIDEO_ID,
                           vision_start_token_id=VSTART, vision_end_token_id=VSTART + 1)
    return _ready(Qwen2_5_VLForConditionalGeneration(cfg))


def qwen2_5_vl_inputs(batch: int, seed: int, video: bool = False, frames: int = 4, side: int = 16) -> dict:
    """Image rows of different sizes through the real Qwen2-VL image processor, or a ``frames``-frame
    ``side`` x ``side`` video per row as video tensors (patches of 2 frames x 4 x 4 pixels)."""
    g = torch.Generator().manual_seed(seed)
    tok = tokenizer(QWEN_TOKENS)
    if video:
        grid = torch.tensor([[frames // 2, side // 4, side // 4]] * batch)
        vis = {"pixel_values_videos": torch.randn(int(grid.prod(-1).sum()), 3 * 2 * 4 * 4, generator=g),
               "video_grid_thw": grid, "second_per_grid_ts": torch.ones(batch)}
    else:
        from transformers import Qwen2VLImageProcessorPil

        rng = np.random.default_rng(seed)
        sizes = [(16, 16), (16, 24), (32, 16), (24, 24)]
        images = [rng.integers(0, 255, (*sizes[i % 4], 3), dtype=np.uint8) for i in range(batch)]
        proc = Qwen2VLImageProcessorPil(patch_size=4, merge_size=2, temporal_patch_size=2, min_pixels=16 * 16,
                                        max_pixels=64 * 64)
        vis = dict(proc(images=images, return_tensors="pt"))
        grid = vis["image_grid_thw"]
    pad = QWEN_TOKENS[1] if video else QWEN_TOKENS[0]
    counts = (grid.prod(-1) // 4).tolist()
    text = [f"{_words(g)} {QWEN_TOKENS[2]}{pad * n}{QWEN_TOKENS[3]} {_words(g)}" for n in counts]
    out = dict(tok(text, return_tensors="pt", padding=True))
    token = VIDEO_ID if video else IMAGE_ID
    out["mm_token_type_ids"] = torch.where(out["input_ids"] == token, 2 if video else 1, 0)
    out.pop("token_type_ids", None)
    return out | vis
