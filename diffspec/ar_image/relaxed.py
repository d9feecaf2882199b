"""LANTERN's relaxed acceptance: a draft also counts the target mass of its latent neighbours.

For a draft ``x`` drawn from ``q``, walk its neighbourhood ``A_k(x)`` nearest first and add each
neighbour's target mass while the running total stays ``<= cap``; ``p~(x) = p(x) + total``. Moving
``total`` onto ``x`` changes ``p`` by exactly ``total`` in total variation, so the per-token budget
is ``TV(p, p~_x) = total <= cap``. ``cap`` is ``delta`` (LANTERN) or also ``(lam - 1) p(x)``
(LANTERN++'s multiplicative cap). The draft is accepted with ``min(1, p~(x)/q(x))``; a rejection
draws from ``(p - q)_+`` as in exact speculative sampling, so ``delta = 0`` is exact.

Example:
    >>> p = torch.tensor([[0.5, 0.05, 0.45]])
    >>> q = torch.tensor([[0.0, 1.0, 0.0]])
    >>> nb = torch.tensor([[1, 2], [0, 2], [1, 0]])
    >>> res = relaxed_mrs(p, q, torch.tensor([1]), nb, 0.5, None, torch.Generator().manual_seed(0))
    >>> round(res.budget.item(), 2), res.accepted.tolist()  # 0.5 moved onto token 1: p~ = 0.55
    (0.5, [True])
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .. import kernels
from .sampling import Generators, uniform


@dataclass(frozen=True)
class RelaxedResult:
    """Per-position outcome of :func:`relaxed_mrs`.

    Attributes:
        accepted: bool, the draft was kept.
        tokens: the draft where accepted, a residual draw from ``(p - q)_+`` otherwise.
        budget: the neighbour mass moved onto the draft (``TV(p, p~) <= cap``).
    """

    accepted: torch.Tensor
    tokens: torch.Tensor
    budget: torch.Tensor


def neighbour_budget(p: torch.Tensor, draft: torch.Tensor, neighbours: torch.Tensor, delta: float,
                     lam: float | None = None) -> torch.Tensor:
    """Mass of the draft's nearest neighbours added while the running total is ``<= cap`` (shape of ``draft``).

    ``cap = delta``, and ``min(delta, (lam - 1) p(draft))`` when ``lam`` is given.
    """
    mass = p.gather(-1, neighbours[draft])  # (..., k) neighbour masses, nearest first
    cum = mass.cumsum(-1)
    cap = torch.full_like(cum[..., :1], delta)
    if lam is not None:
        cap = torch.minimum(cap, (lam - 1.0) * p.gather(-1, draft.unsqueeze(-1)))
    taken = cum <= cap  # cum is non-decreasing: a prefix of the neighbourhood
    return (mass * taken).sum(-1)


def relaxed_mrs(p: torch.Tensor, q: torch.Tensor, draft: torch.Tensor, neighbours: torch.Tensor, delta: float,
                lam: float | None, generator: Generators) -> RelaxedResult:
    """Relaxed speculative sampling of ``draft`` (drawn from ``q``) against ``p``, at every position.

    Args:
        p: ``(..., V)`` target probabilities.
        q: ``(..., V)`` the law each draft was drawn from.
        draft: ``(...)`` draft tokens.
        neighbours: ``(V, k)`` latent neighbourhoods (:func:`~diffspec.ar_image.neighbours.latent_neighbours`).
        delta: additive TV budget per token (0: exact speculative sampling).
        lam: LANTERN++ multiplicative cap (``None``: none).
        generator: randomness (fresh uniforms for the test and the residual draw).
    """
    u = uniform((*draft.shape, 2), generator, p.device)
    idx = draft.unsqueeze(-1)
    px, qx = p.gather(-1, idx).squeeze(-1), q.gather(-1, idx).squeeze(-1)
    budget = neighbour_budget(p, draft, neighbours, delta, lam)
    accepted, tokens = kernels.rejection_sample(p, q, draft, u[..., 0], u[..., 1], accept_mass=(px + budget, qx))
    return RelaxedResult(accepted, tokens, budget)
