"""LANTERN's relaxed acceptance: a draft also counts the target mass of its latent neighbours.

For a draft ``x`` drawn from ``q``, walk its neighbourhood ``A_k(x)`` nearest first and add each
neighbour's target mass while the running total stays ``<= cap``; ``p~(x) = p(x) + total``. Moving
``total`` onto ``x`` changes ``p`` by exactly ``total`` in total variation, so the per-token budget
is ``TV(p, p~_x) = total <= cap``. ``cap`` is ``delta`` (LANTERN) or also ``(lam - 1) p(x)``
(LANTERN++'s multiplicative cap). The draft is accepted with ``min(1, p~(x)/q(x))``; a rejection
draws from ``(p - q)_+`` as in exact speculative sampling, so ``delta = 0`` is exact.

That ``"residual"`` rule bounds each draft's ``TV(p, p~_x)``, not the emitted token's law: with a
broad ``q`` and a peaked ``p`` the emitted law can sit ``TV(p, q)`` away from ``p``.
:func:`certain_mrs` is LANTERN's official rule (``"certain"``): the draft is treated as a certain
candidate (``q = 1`` at ``x``), accepted with ``p~(x)``, and a rejection samples ``p`` with ``x``
*and the neighbours whose mass was moved onto it* zeroed. The emitted law is then ``p`` with that
mass moved onto ``x``: ``TV(emitted, p) <= cap`` whatever ``q`` is.

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
from ..speculation.sampling import Generators, uniform


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


def neighbour_take(p: torch.Tensor, draft: torch.Tensor, neighbours: torch.Tensor, delta: float | torch.Tensor,
                   lam: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(taken (..., k) bool, budget (...))``: the neighbours whose mass is moved onto the draft, and that mass.

    Neighbours are taken nearest first while the running total is ``<= cap``; ``cap = delta`` (a
    float, or a tensor of the draft's shape), and ``min(delta, (lam - 1) p(draft))`` when ``lam`` is given.

    Example:
        >>> nb = torch.tensor([[1, 2], [0, 2], [1, 0]])
        >>> taken, m = neighbour_take(torch.tensor([0.5, 0.05, 0.45]), torch.tensor(1), nb, 0.5)
        >>> taken.tolist(), round(m.item(), 2)
        ([True, False], 0.5)
    """
    mass = p.gather(-1, neighbours[draft])  # (..., k) neighbour masses, nearest first
    cum = mass.cumsum(-1)
    if isinstance(delta, torch.Tensor):
        cap = delta.to(cum.dtype).unsqueeze(-1)
    else:
        cap = torch.full_like(cum[..., :1], delta)
    if lam is not None:
        cap = torch.minimum(cap, (lam - 1.0) * p.gather(-1, draft.unsqueeze(-1)))
    taken = cum <= cap  # cum is non-decreasing: a prefix of the neighbourhood
    return taken, (mass * taken).sum(-1)


def neighbour_budget(p: torch.Tensor, draft: torch.Tensor, neighbours: torch.Tensor, delta: float | torch.Tensor,
                     lam: float | None = None) -> torch.Tensor:
    """Mass of the draft's nearest neighbours added while the running total is ``<= cap`` (shape of ``draft``).

    ``cap = delta``, and ``min(delta, (lam - 1) p(draft))`` when ``lam`` is given (see :func:`neighbour_take`).
    """
    return neighbour_take(p, draft, neighbours, delta, lam)[1]


def certain_mrs(p: torch.Tensor, draft: torch.Tensor, neighbours: torch.Tensor, delta: float | torch.Tensor,
                lam: float | None, u_accept: torch.Tensor, u_residual: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """LANTERN's official test of a certain candidate ``draft`` against ``p``, at every position.

    Accept with ``(p(x) + m) / sum(p)`` (``m``: the neighbour mass moved onto ``x``,
    :func:`neighbour_take`); on rejection draw from ``p`` with ``x`` and the moved neighbours
    zeroed. Any ``x``, however chosen, emits ``p`` with ``m`` moved onto ``x``: ``TV <= delta``;
    ``delta = 0`` is exact. ``p`` may be unnormalised (a tree's sibling laws): ``delta`` and ``m``
    are then in ``p``'s own units, so siblings tested in turn spend one shared budget.

    Args:
        p: ``(..., V)`` target probabilities, possibly unnormalised.
        draft: ``(...)`` candidate tokens.
        neighbours, delta, lam: see :func:`neighbour_take`.
        u_accept, u_residual: ``(...)`` uniforms of the test and of the residual draw.

    Returns:
        ``(accepted, tokens, budget, rest)``: ``budget`` is ``m``; ``rest`` ``(..., V)`` is ``p``
        with ``x`` and the moved neighbours zeroed (the next sibling's law, unnormalised).

    Example:
        >>> p = torch.tensor([[0.5, 0.05, 0.45]])
        >>> nb = torch.tensor([[1, 2], [0, 2], [1, 0]])
        >>> acc, tok, m, rest = certain_mrs(p, torch.tensor([1]), nb, 0.5, None, torch.tensor([0.9]),
        ...                                 torch.tensor([0.5]))
        >>> acc.tolist(), tok.tolist(), rest.tolist()  # p~(1) = 0.55 < 0.9: token 0 is zeroed with 1
        ([False], [2], [[0.0, 0.0, 0.44999998807907104]])
    """
    taken, budget = neighbour_take(p, draft, neighbours, delta, lam)
    zero = torch.zeros_like(p).scatter_(-1, neighbours[draft], taken.to(p.dtype))
    zero.scatter_(-1, draft.unsqueeze(-1), 1.0)
    rest = p * (1 - zero)
    px = p.gather(-1, draft.unsqueeze(-1)).squeeze(-1)
    accepted = u_accept * p.sum(-1) < px + budget
    draw = kernels.inverse_cdf(torch.where(rest.sum(-1, keepdim=True) > 0, rest, p), u_residual)
    return accepted, torch.where(accepted, draft, draw), budget, rest


ACCEPTANCE = ("certain", "residual")


def relaxed_mrs(p: torch.Tensor, q: torch.Tensor, draft: torch.Tensor, neighbours: torch.Tensor, delta: float,
                lam: float | None, generator: Generators, acceptance: str = "certain") -> RelaxedResult:
    """Relaxed speculative sampling of ``draft`` (drawn from ``q``) against ``p``, at every position.

    Args:
        p: ``(..., V)`` target probabilities.
        q: ``(..., V)`` the law each draft was drawn from.
        draft: ``(...)`` draft tokens.
        neighbours: ``(V, k)`` latent neighbourhoods (:func:`~diffspec.ar_image.neighbours.latent_neighbours`).
        delta: additive TV budget per token (0: exact speculative sampling).
        lam: LANTERN++ multiplicative cap (``None``: none).
        generator: randomness (fresh uniforms for the test and the residual draw).
        acceptance: ``"certain"`` (:func:`certain_mrs`, ``q`` unused: emitted law within ``delta``
            of ``p``) or ``"residual"`` (``min(1, p~(x)/q(x))``, residual ``(p - q)_+``).
    """
    u = uniform((*draft.shape, 2), generator, p.device)
    if acceptance == "certain":
        acc, tok, budget, _ = certain_mrs(p, draft, neighbours, delta, lam, u[..., 0], u[..., 1])
        return RelaxedResult(acc, tok, budget)
    if acceptance != "residual":
        raise ValueError(f"acceptance={acceptance!r}; allowed: {ACCEPTANCE}")
    idx = draft.unsqueeze(-1)
    px, qx = p.gather(-1, idx).squeeze(-1), q.gather(-1, idx).squeeze(-1)
    budget = neighbour_budget(p, draft, neighbours, delta, lam)
    accepted, tokens = kernels.rejection_sample(p, q, draft, u[..., 0], u[..., 1], accept_mass=(px + budget, qx))
    return RelaxedResult(accepted, tokens, budget)
