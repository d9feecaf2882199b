"""Greedy exactness: ``generate(custom_generate=speculative_generate)`` == plain ``generate``, token for token.

Targets: a Llama-style LM, LLaVA (image) and Qwen2-VL (image, video; M-RoPE), left-padded batches
of 1, 3 and 8 rows, with drafters at forced acceptance 0 (logits rolled), partial (noisy oracle,
a real smaller model) and full (the target itself).
"""

from __future__ import annotations

import pytest
import torch
from mm_tiny import SPECIAL, llama, llava, llava_inputs, noisy, qwen2_vl, qwen_inputs, text_prompts

from diffspec.multimodal.loop import speculative_generate
from diffspec.stats import SpecStats

TARGETS = {"llama": llama, "llava": llava, "qwen2-vl": qwen2_vl}
_cache: dict = {}


def _target(name):
    if name not in _cache:
        _cache[name] = TARGETS[name]()
    return _cache[name]


def _inputs(name, batch, seed, video=False):
    if name == "llama":
        return text_prompts(batch, seed)
    return llava_inputs(batch, seed) if name == "llava" else qwen_inputs(batch, seed, video=video)


def _check(target, drafter, inputs, *, k=3, schedule="constant", text_only=False, new=10):
    kw = dict(**inputs, max_new_tokens=new, do_sample=False, suppress_tokens=SPECIAL)
    ref = target.generate(**kw)
    stats = SpecStats(method="draft")
    out = target.generate(**kw, custom_generate=speculative_generate, drafter=drafter, num_draft_tokens=k,
                          draft_schedule=schedule, text_only_draft=text_only, drafter_inputs=inputs, spec_stats=stats)
    assert out.shape == ref.shape
    assert torch.equal(out, ref), (ref[:, -new:], out[:, -new:])
    assert stats.proposed > 0
    return stats


@pytest.mark.parametrize("name", ["llama", "llava", "qwen2-vl"])
@pytest.mark.parametrize("batch", [1, 3, 8])
@pytest.mark.parametrize("regime", ["zero", "partial", "full"])
def test_greedy_identical(name, batch, regime):
    target = _target(name)
    scale = {"zero": float("inf"), "partial": 0.3, "full": 0.0}[regime]
    for seed in (0, 1):
        stats = _check(target, noisy(target, scale, seed), _inputs(name, batch, seed))
        rate = stats.acceptance_rate
        if regime == "full":
            assert rate == 1.0
        elif regime == "zero":
            assert rate < 0.1
        else:
            assert 0.0 < rate < 1.0


@pytest.mark.parametrize("video", [False, True])
@pytest.mark.parametrize("batch", [1, 3])
def test_qwen2_vl_text_only_drafter(video, batch):
    """A text-only LM drafts for Qwen2-VL (assisted generation fails here on ``mm_token_type_ids``)."""
    target = _target("qwen2-vl")
    for drafter in (llama(layers=1, hidden=32, seed=3), noisy(target, 0.0)):
        _check(target, drafter, _inputs("qwen2-vl", batch, 5, video=video), text_only=True)


def test_llava_text_and_vlm_drafters():
    target = _target("llava")
    _check(target, llava(layers=1, hidden=32, seed=4), _inputs("llava", 3, 2))
    _check(target, llama(layers=1, hidden=32, seed=4), _inputs("llava", 3, 2), text_only=True)


@pytest.mark.parametrize("k", [1, 2, 6])
def test_draft_lengths_and_heuristic(k):
    target = _target("llama")
    _check(target, noisy(target, 1.0, k), _inputs("llama", 3, k), k=k)
    stats = _check(target, noisy(target, 0.0), _inputs("llama", 3, k), k=k, schedule="heuristic", new=24)
    assert stats.extra["accepted_per_round"] > k  # the schedule grew k after full accepts


def test_eos_cut_and_pad_after_eos():
    """A target that emits EOS mid-batch: rows stop at different rounds, padded like plain generate."""
    target = _target("llama")
    found = 0
    for seed in range(12):
        if found == 2:
            break
        inputs = _inputs("llama", 3, seed)
        ref = target.generate(**inputs, max_new_tokens=30, do_sample=False, eos_token_id=[2, 5, 7, 11])
        if (ref[:, -30:] == 0).any():
            found += 1
            out = target.generate(**inputs, max_new_tokens=30, do_sample=False, eos_token_id=[2, 5, 7, 11],
                                  custom_generate=speculative_generate, drafter=noisy(target, 0.5, seed),
                                  num_draft_tokens=4)
            assert torch.equal(out, ref)
    assert found > 0


@pytest.mark.parametrize("name", ["llama", "qwen2-vl"])
def test_content_and_length_dependent_processors(name):
    """Repetition penalty (reads the prefix) and min_new_tokens (reads its length) see, at every
    verified position, the prefix plain decoding had, also when rows are out of step."""
    target = _target(name)
    inputs = _inputs(name, 3, 11)
    kw = dict(**inputs, max_new_tokens=14, do_sample=False, suppress_tokens=SPECIAL, repetition_penalty=1.5,
              no_repeat_ngram_size=2, min_new_tokens=6, eos_token_id=[2, 5, 7, 11, 13])
    ref = target.generate(**kw)
    out = target.generate(**kw, custom_generate=speculative_generate, drafter=noisy(target, 0.3, 1),
                          num_draft_tokens=3, drafter_inputs=inputs)
    assert torch.equal(out, ref)
