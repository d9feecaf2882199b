"""LANTERN's official ("certain") acceptance: the emitted token's law is within delta of p, whatever q."""

from __future__ import annotations

import pytest
import torch
from ar_checks import chi2_fit

from diffspec.ar_image.lantern_config import LanternConfig, LanternPPConfig
from diffspec.ar_image.neighbours import latent_neighbours
from diffspec.ar_image.relaxed import certain_mrs, neighbour_take, relaxed_mrs

VOCAB = 32


def _toy(seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Peaked p with a thin tail, broad q, k = V - 1 neighbourhoods (the tiny-ar failure case)."""
    g = torch.Generator().manual_seed(seed)
    p = torch.full((VOCAB,), 0.1 / (VOCAB - 1))
    p[0] = 0.9
    q = torch.full((VOCAB,), 1.0 / VOCAB)
    return p, q, latent_neighbours(torch.randn(VOCAB, 3, generator=g), VOCAB - 1)


def _siblings_law(p: torch.Tensor, cands: list[int], nb: torch.Tensor, delta: float) -> torch.Tensor:
    """Closed form of the emitted law when ``cands`` are tested in turn with one shared budget."""
    law, w, spent = torch.zeros_like(p), p.clone(), 0.0
    for x in cands:
        taken, m = neighbour_take(w, torch.tensor(x), nb, torch.tensor(delta - spent))
        law[x] += w[x] + m
        w[nb[x][taken]] = 0
        w[x] = 0
        spent += float(m)
    return law + w


def _walk(p: torch.Tensor, cands: list[int], nb: torch.Tensor, delta: float, n: int,
          g: torch.Generator) -> torch.Tensor:
    """Monte Carlo of the tree's sibling walk (as lantern_tree_sample runs it), ``n`` rows at once."""
    w, spent = p.expand(n, -1).clone(), torch.zeros(n)
    out = torch.full((n,), -1)
    for x in cands:
        u = torch.rand(n, 2, generator=g)
        acc, tok, m, rest = certain_mrs(w, torch.full((n,), x), nb, (delta - spent).clamp_min(0), None, u[:, 0],
                                        u[:, 1])
        searching = out < 0
        out = torch.where(searching & acc, x, out)
        last = tok
        spent = spent + torch.where(searching, m, 0.0)
        w = torch.where((searching & ~acc).unsqueeze(-1), rest, w)
    return torch.where(out < 0, last, out)


@pytest.mark.parametrize("delta", [0.05, 0.1, 0.3])
def test_certain_chain_emits_within_delta_of_p(delta: float) -> None:
    p, q, nb = _toy(3)
    g = torch.Generator().manual_seed(11)
    laws = torch.stack([_siblings_law(p, [x], nb, delta) for x in range(VOCAB)])  # law given draft x
    law = (q.unsqueeze(1) * laws).sum(0)  # drafts from the broad q
    assert float(0.5 * (laws - p).abs().sum(-1).max()) <= delta + 1e-6  # every draft's law, hence the mixture
    assert float(0.5 * (law - p).abs().sum()) <= delta + 1e-6
    n = 60_000
    draft = torch.multinomial(q, n, replacement=True, generator=g)
    res = relaxed_mrs(p.expand(n, -1), q.expand(n, -1), draft, nb, delta, None, g, "certain")
    assert chi2_fit(res.tokens, law)[2] > 1e-3  # the sampler follows the closed form
    assert chi2_fit(res.tokens, p)[2] < 1e-6  # and the test has power: that law is not p


def test_certain_siblings_share_one_budget() -> None:
    p, _, nb = _toy(5)
    g = torch.Generator().manual_seed(2)
    delta, cands = 0.1, [3, 7, 0, 12]
    law = _siblings_law(p, cands, nb, delta)
    assert float(0.5 * (law - p).abs().sum()) <= delta + 1e-6
    assert float(0.5 * (law - p).abs().sum()) > 0.5 * delta  # the budget is actually spent
    tokens = _walk(p, cands, nb, delta, 80_000, g)
    assert chi2_fit(tokens, law)[2] > 1e-3
    assert chi2_fit(tokens, p)[2] < 1e-6


def test_certain_delta_zero_is_exact_and_a_planted_bias_fails() -> None:
    g = torch.Generator().manual_seed(7)
    p = torch.softmax(torch.randn(VOCAB, generator=g) * 1.5, -1)
    nb = latent_neighbours(torch.randn(VOCAB, 3, generator=g), 6)
    tokens = _walk(p, [int(p.argmin()), 4, int(p.argmax())], nb, 0.0, 80_000, g)
    assert chi2_fit(tokens, p)[2] > 1e-3
    biased = p.clone()
    biased[int(p.argmax())] += 0.02  # 2% of the mass moved: the same test must reject it
    biased[int(p.argmin())] = 0.0
    biased = biased / biased.sum()
    assert chi2_fit(tokens, biased)[2] < 1e-6


def test_acceptance_field_validated() -> None:
    assert LanternConfig().acceptance == "certain" and LanternPPConfig().acceptance == "certain"
    with pytest.raises(ValueError, match="acceptance='official'"):
        LanternConfig(acceptance="official")
    with pytest.raises(ValueError, match="acceptance"):
        relaxed_mrs(torch.ones(1, 2) / 2, torch.ones(1, 2) / 2, torch.zeros(1, dtype=torch.long),
                    torch.tensor([[1], [0]]), 0.1, None, None, "bogus")
