"""Sampling exactness of the loop: the law of generated tokens equals the target's (chi-square).

A 16-token Llama target samples at temperature 0.8 (a logits processor on the path); the drafter
is another random model, so rejections and residual draws both happen. The exact law of the
2nd and 3rd generated tokens (the first speculative positions) is computed from the target.
"""

from __future__ import annotations

import pytest
import torch
from mm_tiny import accept_without_residual, chi2_fit, llama

import diffspec.multimodal.loop as loop
from diffspec.stats import SpecStats

V, N, TEMP = 16, 3000, 0.8


@pytest.fixture(scope="module")
def pair():
    return llama(layers=1, hidden=32, seed=0, vocab=V), llama(layers=1, hidden=32, seed=7, vocab=V)


def _exact_pair_law(target, prompt):
    with torch.no_grad():
        p1 = torch.softmax(target(prompt).logits[0, -1] / TEMP, -1)
        x1 = torch.arange(V)[:, None]
        ctx1 = torch.cat([prompt.expand(V, -1), x1], 1)
        p2 = torch.softmax(target(ctx1).logits[:, -1] / TEMP, -1)  # (x1, x2)
        x12 = torch.cartesian_prod(torch.arange(V), torch.arange(V))
        ctx2 = torch.cat([prompt.expand(V * V, -1), x12], 1)
        p3 = torch.softmax(target(ctx2).logits[:, -1] / TEMP, -1).reshape(V, V, V)  # (x1, x2, x3)
    joint = p1[:, None, None] * p2[:, :, None] * p3
    return joint.sum(0).reshape(-1)  # law of (x2, x3)


def _sample(target, drafter, prompt, seed):
    g = torch.Generator().manual_seed(seed)
    stats = SpecStats()
    out = target.generate(input_ids=prompt.expand(N, -1), attention_mask=torch.ones(N, prompt.shape[1], dtype=torch.long),
                          max_new_tokens=3, do_sample=True, temperature=TEMP, top_k=0, eos_token_id=None,
                          custom_generate=loop.speculative_generate, drafter=drafter, num_draft_tokens=2,
                          generator=g, spec_stats=stats)
    new = out[:, prompt.shape[1]:]
    return new[:, 1] * V + new[:, 2], stats


def test_sampling_law_matches_target(pair):
    target, drafter = pair
    prompt = torch.tensor([[1, 5, 9, 3]])
    cells, stats = _sample(target, drafter, prompt, seed=0)
    assert 0.1 < stats.acceptance_rate < 0.95  # rejections and acceptances both exercised
    assert chi2_fit(cells, _exact_pair_law(target, prompt))[2] > 1e-3


def test_planted_bias_is_detected(pair, monkeypatch):
    """Drawing the correction from p instead of the residual (p - q)_+ biases the law: caught."""
    target, drafter = pair
    prompt = torch.tensor([[1, 5, 9, 3]])
    monkeypatch.setattr(loop, "sampling_accept", accept_without_residual)
    cells, _ = _sample(target, drafter, prompt, seed=0)
    assert chi2_fit(cells, _exact_pair_law(target, prompt))[2] < 1e-4
