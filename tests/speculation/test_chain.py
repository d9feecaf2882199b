"""Acceptance rules on synthetic distributions: greedy prefix logic and the law of speculative sampling."""

from __future__ import annotations

import functools
import sys
from pathlib import Path

import torch

from diffspec.speculation.chain import greedy_accept, sampling_accept

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "multimodal"))
from mm_tiny import accept_without_residual, chi2_fit  # noqa: E402  (shared test helpers)


def test_greedy_prefix_and_bonus():
    target = torch.tensor([[4, 5, 6, 7], [4, 5, 6, 7], [4, 5, 6, 7]])
    logits = torch.nn.functional.one_hot(target, 10).float()
    drafts = torch.tensor([[4, 5, 6], [4, 9, 6], [1, 5, 6]])
    m, tokens = greedy_accept(drafts, logits)
    assert m.tolist() == [3, 1, 0]
    assert tokens.tolist() == [[4, 5, 6, 7], [4, 5, 9, 7], [4, 9, 6, 7]][:0] or tokens[0].tolist() == [4, 5, 6, 7]
    assert tokens[1, :2].tolist() == [4, 5] and tokens[2, 0].item() == 4


def _first_token_law(residual: bool, n: int = 40_000, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    V, k = 8, 2
    p_logits = torch.randn(1, k + 1, V, generator=g).mul(1.5).expand(n, k + 1, V)
    q = torch.softmax(torch.randn(1, k, V, generator=g).mul(1.5), -1).expand(n, k, V)
    drafts = torch.multinomial(q.reshape(-1, V), 1, generator=g).reshape(n, k)
    accept = sampling_accept if residual else accept_without_residual  # the planted bias: no residual
    m, tokens = accept(drafts, p_logits, q, g)
    first = tokens[:, 0]
    second = tokens[torch.arange(n), 1][m >= 1]  # the second token where the first was a draft
    return first, torch.softmax(p_logits[0, 0], -1), second, torch.softmax(p_logits[0, 1], -1), m


def test_sampling_law_exact():
    first, p0, second, p1, m = _first_token_law(residual=True)
    assert chi2_fit(first, p0)[2] > 1e-3
    assert chi2_fit(second, p1)[2] > 1e-3
    assert 0 < m.float().mean() < 2  # partial acceptance: both branches exercised


def test_planted_bias_without_residual_is_caught():
    first, p0, *_ = _first_token_law(residual=False)
    assert chi2_fit(first, p0)[2] < 1e-6


def test_sampling_accepts_everything_when_p_equals_q():
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(64, 4, 12, generator=g)
    q = torch.softmax(logits[:, :3], -1)
    drafts = torch.multinomial(q.reshape(-1, 12), 1, generator=g).reshape(64, 3)
    m, _ = functools.partial(sampling_accept, generator=g)(drafts, logits, q)
    assert (m == 3).all()
