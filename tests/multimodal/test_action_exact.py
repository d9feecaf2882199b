"""relaxed-action decoding: r=0 is plain greedy ``generate`` (LM, LLaVA, Qwen2-VL, batch 1-8); r>0 stays within r bins."""

from __future__ import annotations

import mm_tiny
import pytest
import torch

from diffspec.multimodal.action_loop import relaxed_action_generate
from diffspec.multimodal.action_map import ActionTokenMap
from diffspec.stats import SpecStats

AMAP = ActionTokenMap(vocab_size=90, n_bins=60, n_dof=7)  # ids 30..89 of the tiny models' 96
NON_ACTION = list(range(AMAP.first_id)) + mm_tiny.SPECIAL


@pytest.fixture(scope="module")
def lm():
    return mm_tiny.llama()


def _plain(model, inputs, **kw):
    ref = model.generate(**inputs, max_new_tokens=7, do_sample=False, **kw)
    new = ref[:, inputs["input_ids"].shape[1]:]
    return torch.nn.functional.pad(new, (0, 7 - new.shape[1]), value=0)  # all rows stopped at EOS early


def _drafts(ref, mode, g):
    good = torch.where(AMAP.is_action(ref), ref, AMAP.first_id + 5)
    rand = torch.randint(AMAP.first_id, AMAP.vocab_size, ref.shape, generator=g)
    return {"random": rand, "oracle": good, "noisy": torch.where(torch.rand(ref.shape, generator=g) < 0.6, good, rand)}[mode]


def _spec(model, inputs, drafts, tolerance=0, **kw):
    stats = SpecStats(method="relaxed-action")
    out = model.generate(**inputs, max_new_tokens=7, do_sample=False, custom_generate=relaxed_action_generate,
                         action_map=AMAP, drafts=drafts, tolerance=tolerance, spec_stats=stats, **kw)
    return out[:, inputs["input_ids"].shape[1]:], stats


@pytest.mark.parametrize("mode", ["random", "oracle", "noisy"])
def test_r0_identical_to_greedy_lm(lm, mode):
    passes = []
    for seed in range(24):
        batch = 1 + seed % 8
        inputs = mm_tiny.text_prompts(batch, seed)
        ref = _plain(lm, inputs)
        got, stats = _spec(lm, inputs, _drafts(ref, mode, torch.Generator().manual_seed(seed)))
        assert torch.equal(got, ref), (seed, mode)
        assert 1 <= stats.target_calls <= 7 and stats.accepted <= stats.proposed
        passes.append(stats.target_calls)
    if mode == "random":
        assert max(passes) == 7


@pytest.mark.parametrize("family", ["llava", "qwen2_vl"])
def test_r0_identical_to_greedy_vlm(family):
    model, make = (mm_tiny.llava(), mm_tiny.llava_inputs) if family == "llava" else (mm_tiny.qwen2_vl(), mm_tiny.qwen_inputs)
    for seed in range(6):
        inputs = make(1 + 3 * (seed % 3), seed)
        ref = _plain(model, inputs, suppress_tokens=mm_tiny.SPECIAL)
        got, _ = _spec(model, inputs, _drafts(ref, "noisy", torch.Generator().manual_seed(seed)),
                       suppress_tokens=mm_tiny.SPECIAL)
        assert torch.equal(got, ref), (family, seed)


def _greedy_given_prefix(model, inputs, tokens):
    """Target argmax over action ids at each of the 7 positions, teacher forced on ``tokens``."""
    ids = torch.cat([inputs["input_ids"], tokens], 1)
    mask = torch.cat([inputs["attention_mask"], torch.ones_like(tokens)], 1)
    pos = (mask.cumsum(1) - 1).masked_fill(mask == 0, 1)
    logits = model(input_ids=ids, attention_mask=mask, position_ids=pos).logits[:, -8:-1]
    logits[..., NON_ACTION] = float("-inf")
    return logits.argmax(-1)


@pytest.mark.parametrize("tolerance", [0, 2, 9])
def test_relaxed_tokens_within_tolerance(lm, tolerance):
    relaxed, passes = 0, 0
    for seed in range(12):
        inputs = mm_tiny.text_prompts(1 + seed % 4, 100 + seed)
        ref = _plain(lm, inputs, suppress_tokens=NON_ACTION)
        g = torch.Generator().manual_seed(seed)
        shift = torch.randint(-tolerance - 2, tolerance + 3, ref.shape, generator=g)
        drafts = AMAP.bins_to_tokens(AMAP.tokens_to_bins(ref) + shift)
        got, stats = _spec(lm, inputs, drafts, tolerance, suppress_tokens=NON_ACTION)
        greedy = _greedy_given_prefix(lm, inputs, got)
        dist = (AMAP.tokens_to_bins(got) - AMAP.tokens_to_bins(greedy)).abs()
        assert int(dist.max()) <= tolerance, seed
        if tolerance == 0:
            assert torch.equal(got, ref)
        relaxed += stats.extra["relaxed_tokens"]
        passes += stats.target_calls
        assert stats.extra["relaxed_tokens"] == int((dist > 0).sum())
    if tolerance == 9:
        assert relaxed > 0 and passes < 12 * 7


def test_oracle_drafts_take_one_pass(lm):
    inputs = mm_tiny.text_prompts(4, 7)
    ref = _plain(lm, inputs, suppress_tokens=NON_ACTION)
    got, stats = _spec(lm, inputs, ref, suppress_tokens=NON_ACTION)
    assert torch.equal(got, ref) and stats.target_calls == 1 and stats.accepted == stats.proposed == 28


def test_bad_drafts_shape(lm):
    with pytest.raises(ValueError, match=r"expected \(batch=2, n_dof=7\)"):
        _spec(lm, mm_tiny.text_prompts(2, 0), torch.zeros(2, 5, dtype=torch.long))
