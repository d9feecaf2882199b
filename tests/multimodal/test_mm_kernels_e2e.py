"""End to end: the same methods with the torch reference kernels and with the Triton kernels (interpreter on CPU)."""

from __future__ import annotations

import mm_tiny
import pytest
import torch

import diffspec.kernels.accept as accept_kernels
import diffspec.kernels.tolerance as tolerance_kernels
from diffspec.multimodal.action_loop import relaxed_action_generate
from diffspec.multimodal.action_map import ActionTokenMap
from diffspec.multimodal.loop import speculative_generate
from diffspec.stats import SpecStats

pytest.importorskip("triton")
AMAP = ActionTokenMap(vocab_size=90, n_bins=60, n_dof=7)


def _force_triton(monkeypatch, module, kernel_module, launcher):
    """Auto dispatch in ``module`` resolves to the Triton kernel (interpreted on CPU); returns its call log."""
    from diffspec.kernels import dispatch

    monkeypatch.setattr(module, "use_triton", lambda tensors, backend: dispatch.use_triton(tensors, "triton"))
    calls, original = [], getattr(kernel_module, launcher)
    monkeypatch.setattr(kernel_module, launcher, lambda *a, **k: calls.append(1) or original(*a, **k))
    return calls


def _relaxed_action(model, inputs, drafts):
    stats = SpecStats(method="relaxed-action")
    out = model.generate(**inputs, max_new_tokens=7, do_sample=False, custom_generate=relaxed_action_generate,
                         action_map=AMAP, drafts=drafts, tolerance=3, spec_stats=stats)
    return out, (stats.target_calls, stats.accepted, stats.proposed, stats.extra["relaxed_tokens"])


def test_relaxed_action_same_with_and_without_kernels(monkeypatch):
    model = mm_tiny.llama()
    g = torch.Generator().manual_seed(0)
    inputs = mm_tiny.text_prompts(5, 3)
    drafts = torch.randint(AMAP.first_id, AMAP.vocab_size, (5, 7), generator=g)
    ref = _relaxed_action(model, inputs, drafts)
    from diffspec.kernels import _tolerance_triton

    calls = _force_triton(monkeypatch, tolerance_kernels, _tolerance_triton, "tolerance_rows")
    out = _relaxed_action(model, inputs, drafts)
    assert calls and torch.equal(out[0], ref[0]) and out[1] == ref[1]
    assert 0 < ref[1][1] < ref[1][2]  # some drafts accepted, some rejected


def _sampled(target, drafter, inputs):
    stats = SpecStats()
    out = target.generate(**inputs, max_new_tokens=6, do_sample=True, temperature=0.9, top_k=0, eos_token_id=None,
                          custom_generate=speculative_generate, drafter=drafter, num_draft_tokens=3,
                          generator=torch.Generator().manual_seed(1), spec_stats=stats)
    return out, (stats.accepted, stats.proposed)


def test_draft_sampling_same_with_and_without_kernels(monkeypatch):
    target, drafter = mm_tiny.llama(layers=1, hidden=32, seed=0), mm_tiny.llama(layers=1, hidden=32, seed=7)
    inputs = mm_tiny.text_prompts(6, 5)
    ref = _sampled(target, drafter, inputs)
    from diffspec.kernels import _accept_triton

    calls = _force_triton(monkeypatch, accept_kernels, _accept_triton, "accept_rows")
    out = _sampled(target, drafter, inputs)
    assert calls and torch.equal(out[0], ref[0]) and out[1] == ref[1]
    assert 0 < ref[1][0] < ref[1][1]
