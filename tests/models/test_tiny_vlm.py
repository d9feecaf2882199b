"""The shipped tiny-vlm pair: loads from its folder (no hub), captions held-out scenes, drafters ranked."""

from __future__ import annotations

import pytest
import torch

from diffspec.data import render_scenes
from diffspec.models.tiny_vlm import (
    PROMPT,
    build_processor,
    caption_accuracy,
    caption_inputs,
    load_tiny_vlm,
)

HELD_OUT = 10**6 + 5000  # past the bench's scenes; training never uses seeds >= 10**6
# Measured on these 48 scenes with the shipped weights (16-layer target): target exact 0.938, words 0.997;
# drafter words 0.989; text drafter words 0.568 (scripts/runs/tiny_vlm.json: 0.941 / 0.997 / 0.993 / 0.543 on 256).
TARGET_EXACT, TARGET_WORDS, DRAFTER_WORDS = 0.85, 0.98, 0.97


@pytest.fixture(scope="module")
def tiny_vlm():
    return load_tiny_vlm()


def test_loader_and_processor_round_trip(tiny_vlm, tmp_path):
    target, processor, drafter, text_drafter = tiny_vlm
    assert type(target).__name__ == "LlavaForConditionalGeneration" and not target.training
    assert type(text_drafter).__name__ == "LlamaForCausalLM"
    assert target.config.text_config.vocab_size == drafter.config.text_config.vocab_size == text_drafter.config.vocab_size
    n_target = sum(p.numel() for p in target.model.language_model.parameters())
    n_drafter = sum(p.numel() for p in drafter.model.language_model.parameters())
    assert n_target > 4 * n_drafter  # the drafter's decoder is several times cheaper
    images, _ = render_scenes(2, seed=HELD_OUT)
    inputs = caption_inputs(processor, images)
    assert int((inputs["input_ids"] == target.config.image_token_index).sum()) == 2 * 16
    processor.save_pretrained(tmp_path)
    from transformers import AutoProcessor

    again = caption_inputs(AutoProcessor.from_pretrained(tmp_path), images)
    assert all(torch.equal(again[k], inputs[k]) for k in inputs)
    fresh = caption_inputs(build_processor(), images)  # the shipped files equal the code's builder
    assert all(torch.equal(fresh[k], inputs[k]) for k in inputs)
    assert processor.tokenizer.decode(processor.tokenizer(PROMPT.split(" ", 1)[1])["input_ids"]) == "describe the picture :"


def test_missing_folder_is_a_clear_error(tmp_path):
    with pytest.raises(ValueError, match="not a tiny-vlm folder: missing target/, drafter/, text-drafter/"):
        load_tiny_vlm(tmp_path)


def test_captions_held_out_scenes(tiny_vlm):
    """Thresholds sit a few points under the accuracy recorded in scripts/runs/tiny_vlm.json."""
    target, processor, drafter, text_drafter = tiny_vlm
    images, captions = render_scenes(48, seed=HELD_OUT)
    with torch.inference_mode():
        t = caption_accuracy(target, processor, images, captions)
        d = caption_accuracy(drafter, processor, images, captions)
        x = caption_accuracy(text_drafter, processor, images, captions, text_only=True)
    assert t["exact_match"] >= TARGET_EXACT and t["word_accuracy"] >= TARGET_WORDS, t
    assert d["word_accuracy"] >= DRAFTER_WORDS, d
    assert x["word_accuracy"] < d["word_accuracy"] - 0.1, (x, d)  # without the image it can only guess
