"""LANTERN's per-draft budget ``<= delta`` does not bound the emitted token's law (the tiny-ar finding)."""

from __future__ import annotations

import torch
from ar_checks import chi2_fit

from diffspec.ar_image.neighbours import latent_neighbours
from diffspec.ar_image.relaxed import neighbour_budget, relaxed_mrs


def _law(p: torch.Tensor, q: torch.Tensor, budget: torch.Tensor) -> torch.Tensor:
    keep = torch.minimum(q, p + budget)
    residual = (p - q).clamp_min(0)
    return keep + (1 - keep.sum()) * residual / residual.sum()


def test_peaked_target_broad_drafter_emits_far_from_p_at_small_delta() -> None:
    g = torch.Generator().manual_seed(3)
    vocab, n, delta = 32, 60_000, 0.1
    p = torch.full((vocab,), 0.1 / (vocab - 1))
    p[0] = 0.9  # peaked target, thin tail (like tiny-ar)
    q = torch.full((vocab,), 1.0 / vocab)  # broad drafter
    nb = latent_neighbours(torch.randn(vocab, 3, generator=g), vocab - 1)  # k = V - 1 (tiny-ar's k = 1000)
    budget = neighbour_budget(p.expand(vocab, -1), torch.arange(vocab), nb, delta)
    assert float(budget.max()) <= delta + 1e-6  # each draft's TV(p, p~_x) is within the budget ...
    law = _law(p, q, budget)
    assert float(0.5 * (law - p).abs().sum()) > 0.5  # ... yet the emitted law is > 5 delta from p
    draft = torch.multinomial(q, n, replacement=True, generator=g)
    res = relaxed_mrs(p.expand(n, -1), q.expand(n, -1), draft, nb, delta, None, g, "residual")
    assert chi2_fit(res.tokens, law)[2] > 1e-3  # the sampler follows that law
    capped = _law(p, q, neighbour_budget(p.expand(vocab, -1), torch.arange(vocab), nb, delta, lam=2.0))
    assert float(capped[1:].sum()) <= 2 * float(p[1:].sum()) + 1e-6  # lantern++'s cap: tail mass at most doubled
