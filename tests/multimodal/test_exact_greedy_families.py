"""Greedy exactness on LLaVA-NeXT (anyres, real processor), LLaVA-NeXT-Video and Qwen2.5-VL (image, video).

``draft`` (VLM drafter seeing the pixels) and ``text-draft`` (text-only drafter) against plain
``generate``: batches of 1, 3 and 8 rows with ragged acceptance, forced accept rates 0 / partial / full.
"""

from __future__ import annotations

import pytest
import torch
from mm_tiny import SPECIAL, llama, noisy
from mm_tiny_next import (
    llava_next,
    llava_next_inputs,
    llava_next_processor,
    llava_next_video,
    llava_next_video_inputs,
    qwen2_5_vl,
    qwen2_5_vl_inputs,
)

from diffspec import SpeculativePipeline
from diffspec.multimodal.loop import speculative_generate
from diffspec.stats import SpecStats

FAMILIES = {
    "llava-next": (llava_next, lambda b, s: llava_next_inputs(b, s)),
    "llava-next-video": (llava_next_video, lambda b, s: llava_next_video_inputs(b, s)),
    "qwen2.5-vl-image": (qwen2_5_vl, lambda b, s: qwen2_5_vl_inputs(b, s)),
    "qwen2.5-vl-video": (qwen2_5_vl, lambda b, s: qwen2_5_vl_inputs(b, s, video=True)),
}
_models: dict = {}


def _target(name):
    build = FAMILIES[name][0]
    if build not in _models:
        _models[build] = build()
    return _models[build]


def check_exact(target, drafter, inputs, *, k=3, text_only=False, new=10, **extra):
    """Speculative ``generate`` == plain ``generate`` (token for token); returns the stats."""
    kw = dict(**inputs, max_new_tokens=new, do_sample=False, suppress_tokens=SPECIAL)
    ref = target.generate(**kw)
    stats = SpecStats(method="draft")
    out = target.generate(**kw, custom_generate=speculative_generate, drafter=drafter, num_draft_tokens=k,
                          text_only_draft=text_only, drafter_inputs=inputs, spec_stats=stats, **extra)
    assert torch.equal(out, ref), (ref[:, -new:], out[:, -new:])
    assert stats.proposed > 0
    return stats


@pytest.mark.parametrize("name", list(FAMILIES))
@pytest.mark.parametrize("batch", [1, 3, 8])
@pytest.mark.parametrize("regime", ["zero", "partial", "full"])
def test_family_greedy_identical(name, batch, regime):
    target = _target(name)
    scale = {"zero": float("inf"), "partial": 0.3, "full": 0.0}[regime]
    stats = check_exact(target, noisy(target, scale, batch), FAMILIES[name][1](batch, batch))
    rate = stats.acceptance_rate
    assert rate == 1.0 if regime == "full" else (rate < 0.1 if regime == "zero" else 0.0 < rate < 1.0)


@pytest.mark.parametrize("name", list(FAMILIES))
def test_family_text_only_and_small_vlm_drafters(name):
    target = _target(name)
    inputs = FAMILIES[name][1](3, 7)
    check_exact(target, llama(layers=1, hidden=32, seed=3), inputs, text_only=True)
    check_exact(target, FAMILIES[name][0](layers=1, hidden=32, seed=5), inputs)


def test_llava_next_processor_round_trip(tmp_path):
    """save_pretrained / from_pretrained of model and processor (local), then the pipeline's text= + images= path."""
    from transformers import AutoProcessor, LlavaNextForConditionalGeneration

    llava_next(seed=2).save_pretrained(tmp_path / "m")
    llava_next_processor().save_pretrained(tmp_path / "m")
    model = LlavaNextForConditionalGeneration.from_pretrained(tmp_path / "m").eval()
    processor = AutoProcessor.from_pretrained(tmp_path / "m")
    spec = SpeculativePipeline.from_pipe((model, processor), method="draft", draft=noisy(model, 0.3, 1),
                                         num_draft_tokens=3)
    rng = torch.Generator().manual_seed(0)
    images = [(torch.rand(h, w, 3, generator=rng) * 255).to(torch.uint8).numpy() for h, w in ((16, 28), (24, 24))]
    text = ["w4 <image> w9 w10", "<image> w5"]
    out = spec(text=text, images=images, max_new_tokens=10, do_sample=False, suppress_tokens=SPECIAL)
    assert 0 < spec.stats.accepted < spec.stats.proposed
    ref = spec.plain(text=text, images=images, max_new_tokens=10, do_sample=False, suppress_tokens=SPECIAL)
    assert torch.equal(out.sequences, ref.sequences) and out.text == ref.text and len(out.text) == 2
