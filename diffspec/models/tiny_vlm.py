"""``tiny-vlm``: a trained tiny LLaVA that captions :func:`~diffspec.data.scenes.render_scenes` images,
with its two drafters (a 1-layer VLM drafter and a 1-layer text-only Llama), all on one tokenizer.

Everything is a plain transformers object built from configs (no hub): the target is a
``LlavaForConditionalGeneration`` (2-layer CLIP tower on 32x32 images, patch 8: 16 visual
tokens; 16-layer Llama, hidden 128), the VLM drafter shares the target's vision tower weights
(1-layer Llama, hidden 128), the text drafter is a ``LlamaForCausalLM`` (1 layer, hidden 128).
The processor is a ``LlavaProcessor`` over a word-level ``PreTrainedTokenizerFast`` (built with
``tokenizers``) and a CLIP image processor built from its config. Weights ship in
``diffspec/weights/tiny-vlm`` (drafters as fp16 safetensors; the 16-layer target as per-row int8,
:mod:`~diffspec.models.int8_weights`, to stay a few MB; all loaded as float32);
``scripts/train_tiny_vlm.py`` trains them.

Example:
    >>> model, processor, drafter, text_drafter = load_tiny_vlm()  # doctest: +SKIP
    >>> images, captions = render_scenes(2, seed=123)  # doctest: +SKIP
    >>> inputs = processor(text=[PROMPT] * 2, images=scene_pil(images), return_tensors="pt")  # doctest: +SKIP
    >>> model.generate(**inputs, max_new_tokens=MAX_CAPTION_TOKENS)  # doctest: +SKIP
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from ..data.scenes import CAPTION_WORDS

IMAGE_SIZE, PATCH = 32, 8
PROMPT = "<image> describe the picture :"
"""The captioning prompt (the processor expands ``<image>`` to the 16 visual tokens)."""
SPECIAL_TOKENS = ("<pad>", "<s>", "</s>", "<unk>", "<image>")
PAD_ID, BOS_ID, EOS_ID, UNK_ID, IMAGE_ID = range(5)
VOCAB: tuple[str, ...] = (*SPECIAL_TOKENS, "describe", "picture", ":", *CAPTION_WORDS)
MAX_CAPTION_TOKENS = 32
"""Longest caption (27 words) plus EOS, rounded up: the ``max_new_tokens`` of a full caption."""

ROLES = ("target", "drafter", "text-drafter")
SIZES: dict[str, dict[str, int]] = {  # text decoder sizes per role
    "target": {"hidden_size": 128, "intermediate_size": 384, "num_hidden_layers": 16, "num_attention_heads": 4,
               "num_key_value_heads": 2},
    "drafter": {"hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 1, "num_attention_heads": 4,
                "num_key_value_heads": 2},
    "text-drafter": {"hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 1, "num_attention_heads": 4,
                     "num_key_value_heads": 2},
}


def build_tokenizer() -> Any:
    """The word-level tokenizer (``tokenizers`` ``WordLevel`` + whitespace split), left padding.

    Example:
        >>> tok = build_tokenizer()
        >>> tok("a red circle .")["input_ids"]
        [8, 15, 21, 12]
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    core = Tokenizer(models.WordLevel({w: i for i, w in enumerate(VOCAB)}, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    core.decoder = decoders.WordPiece(prefix="##", cleanup=False)  # joins words with single spaces
    return PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", bos_token="<s>", eos_token="</s>",
                                   unk_token="<unk>", extra_special_tokens={"image_token": "<image>"},
                                   padding_side="left", model_max_length=256)


def build_processor() -> Any:
    """``LlavaProcessor``: the word-level tokenizer plus a CLIP image processor from its config
    (no resize or crop; uint8 images map to ``[-1, 1]`` as :func:`pixel_values` does)."""
    from transformers import LlavaProcessor
    from transformers.models.clip.image_processing_pil_clip import CLIPImageProcessorPil

    images = CLIPImageProcessorPil(do_resize=False, do_center_crop=False, do_rescale=True, rescale_factor=1 / 255,
                                   do_normalize=True, image_mean=[0.5] * 3, image_std=[0.5] * 3, do_convert_rgb=True,
                                   size={"height": IMAGE_SIZE, "width": IMAGE_SIZE},
                                   crop_size={"height": IMAGE_SIZE, "width": IMAGE_SIZE})
    return LlavaProcessor(image_processor=images, tokenizer=build_tokenizer(), patch_size=PATCH,
                          vision_feature_select_strategy="default", num_additional_image_tokens=1)


def _text_config(role: str) -> Any:
    from transformers import LlamaConfig

    return LlamaConfig(vocab_size=len(VOCAB), max_position_embeddings=128, pad_token_id=PAD_ID, bos_token_id=BOS_ID,
                       eos_token_id=EOS_ID, tie_word_embeddings=False, **SIZES[role])


def build_model(role: str) -> Any:
    """A randomly initialised ``role`` model (``"target"``, ``"drafter"`` or ``"text-drafter"``), in eval mode."""
    from transformers import CLIPVisionConfig, LlamaForCausalLM, LlavaConfig, LlavaForConditionalGeneration

    if role not in ROLES:
        raise ValueError(f"role={role!r} is not supported; choose one of {ROLES}")
    if role == "text-drafter":
        model = LlamaForCausalLM(_text_config(role))
    else:
        vision = CLIPVisionConfig(hidden_size=96, intermediate_size=192, num_hidden_layers=2, num_attention_heads=4,
                                  image_size=IMAGE_SIZE, patch_size=PATCH, projection_dim=96)
        model = LlavaForConditionalGeneration(LlavaConfig(
            vision_config=vision, text_config=_text_config(role), image_token_index=IMAGE_ID, vision_feature_layer=-1,
            vision_feature_select_strategy="default"))
    model.generation_config.pad_token_id = PAD_ID
    model.generation_config.eos_token_id = EOS_ID
    model.generation_config.bos_token_id = BOS_ID
    return model.eval()


def pixel_values(images: torch.Tensor) -> torch.Tensor:
    """[-1, 1] scene images → the processor's ``pixel_values`` (through uint8, as saved images are)."""
    from ..data import to_uint8

    return to_uint8(images).float().div(255).sub(0.5).div(0.5)


def scene_pil(images: torch.Tensor) -> list[Any]:
    """[-1, 1] scene images (n, 3, H, W) → PIL images (what a user hands the processor)."""
    from PIL import Image

    from ..data import to_uint8

    return [Image.fromarray(x.permute(1, 2, 0).numpy()) for x in to_uint8(images)]


def caption_inputs(processor: Any, images: torch.Tensor) -> dict[str, torch.Tensor]:
    """Processor inputs for captioning ``images`` ([-1, 1], (n, 3, 32, 32)) with :data:`PROMPT`."""
    return dict(processor(text=[PROMPT] * len(images), images=scene_pil(images), return_tensors="pt", padding=True))


def default_dir() -> Path:
    """The shipped ``tiny-vlm`` folder."""
    return Path(__file__).resolve().parent.parent / "weights" / "tiny-vlm"


def save_tiny_vlm(folder: str | Path, target: Any, drafter: Any, text_drafter: Any, processor: Any) -> None:
    """Write ``target/`` (int8, :func:`~diffspec.models.int8_weights.save_int8`), ``drafter/``,
    ``text-drafter/`` (fp16 safetensors) and the processor files."""
    import copy

    from .int8_weights import save_int8

    folder = Path(folder)
    save_int8(target, folder / "target")
    for name, model in (("drafter", drafter), ("text-drafter", text_drafter)):
        copy.deepcopy(model).half().save_pretrained(folder / name)
    processor.save_pretrained(folder)


def load_tiny_vlm(folder: str | Path | None = None, *, device: Any = None,
                  dtype: torch.dtype = torch.float32) -> tuple[Any, Any, Any, Any]:
    """Load ``(target, processor, drafter, text_drafter)`` from the shipped folder (or ``folder``).

    Raises:
        ValueError: the folder lacks one of ``target/``, ``drafter/``, ``text-drafter/``.

    Example:
        >>> model, processor, drafter, text_drafter = load_tiny_vlm()
        >>> type(model).__name__, model.config.text_config.num_hidden_layers, drafter.config.text_config.num_hidden_layers
        ('LlavaForConditionalGeneration', 16, 1)
    """
    from transformers import LlamaForCausalLM, LlavaForConditionalGeneration, LlavaProcessor

    from .int8_weights import load_int8

    folder = Path(folder) if folder is not None else default_dir()
    missing = [r for r in ROLES if not (folder / r / "config.json").is_file()]
    if missing:
        raise ValueError(f"{folder} is not a tiny-vlm folder: missing {', '.join(m + '/' for m in missing)} "
                         "(train it with scripts/train_tiny_vlm.py)")
    device = device or "cpu"
    target = load_int8(LlavaForConditionalGeneration, folder / "target", dtype=dtype).to(device)
    drafter = LlavaForConditionalGeneration.from_pretrained(folder / "drafter", dtype=dtype).to(device).eval()
    text_drafter = LlamaForCausalLM.from_pretrained(folder / "text-drafter", dtype=dtype).to(device).eval()
    return target, LlavaProcessor.from_pretrained(folder), drafter, text_drafter


@torch.inference_mode()
def caption_accuracy(model: Any, processor: Any, images: torch.Tensor, captions: list[str], *,
                     text_only: bool = False, batch: int = 64) -> dict[str, float]:
    """Greedy captions vs the true ones: exact-match rate and word accuracy (position-wise, over
    the longer of the two captions).

    ``text_only`` captions with a text LM from the prompt's text alone (the text drafter's guess).
    """
    tok = processor.tokenizer
    exact, right, total = 0, 0, 0
    for i in range(0, len(images), batch):
        if text_only:
            ids = tok([PROMPT.replace("<image> ", "")] * len(images[i: i + batch]), return_tensors="pt")
            inputs = dict(ids)
        else:
            inputs = caption_inputs(processor, images[i: i + batch])
        inputs = {k: v.to(model.device) for k, v in inputs.items()}
        out = model.generate(**inputs, max_new_tokens=MAX_CAPTION_TOKENS, do_sample=False)
        texts = tok.batch_decode(out[:, inputs["input_ids"].shape[1]:], skip_special_tokens=True)
        for got, want in zip(texts, captions[i: i + batch]):
            g, w = got.split(), want.split()
            exact += g == w
            right += sum(a == b for a, b in zip(g, w))
            total += max(len(g), len(w))
    return {"exact_match": exact / len(images), "word_accuracy": right / max(total, 1)}
