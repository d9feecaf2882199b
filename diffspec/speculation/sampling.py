"""Token sampling primitives of the speculative samplers: warpers, draws, modified rejection sampling.

Everything works on probability tensors ``(..., V)`` in fp32 and is vectorised over every
leading dimension (batch rows, window positions). Randomness comes from :func:`uniform`, which
takes ``None``, one ``torch.Generator`` or a list with one generator per batch row (diffusers
convention); with a list, row ``b`` only consumes its own generator, so its result does not
depend on the rest of the batch.

- :func:`warp`: logits → probabilities (temperature, top-k, top-p; temperature 0 = greedy one-hot).
- :func:`sample`: inverse-CDF draws from probabilities.
- :func:`mrs`: modified rejection sampling of a draft ``x ~ q`` against ``p`` at every position
  at once: accept with ``min(1, p(x)/q(x))``, else draw from ``(p - q)_+`` normalised (``p`` if that
  mass is 0). The output is distributed as ``p`` for any ``q``; the residual is never re-warped.
- :func:`residual_law`: that residual law itself, the target of the next test after a rejection
  (recursive rejection sampling over the siblings of a token tree).
- :class:`GumbelTable`: one Gumbel vector per absolute image position, fixed while the position is
  in flight, for Gumbel-sharing drafts ``argmax(log p + g)``.

Example:
    >>> g = torch.Generator().manual_seed(0)
    >>> p = warp(torch.tensor([[2.0, 1.0, 0.0]]), temperature=1.0, top_k=2)
    >>> p[0, 2].item()
    0.0
    >>> res = mrs(p, torch.full((1, 3), 1 / 3), torch.tensor([1]), g)
    >>> res.tokens.shape, res.accepted.dtype
    (torch.Size([1]), torch.bool)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from .. import kernels

Generators = torch.Generator | Sequence[torch.Generator] | None
"""``None``, one generator, or one generator per batch row."""


def uniform(shape: Sequence[int], generator: Generators, device: torch.device | str = "cpu") -> torch.Tensor:
    """fp32 uniforms in ``[0, 1)`` of ``shape``; ``shape[0]`` is the batch when ``generator`` is a list.

    Example:
        >>> uniform((2, 3), [torch.Generator().manual_seed(i) for i in range(2)]).shape
        torch.Size([2, 3])
    """
    shape = tuple(shape)
    if isinstance(generator, (list, tuple)):
        if len(generator) != shape[0]:
            raise ValueError(f"got {len(generator)} generators for a batch of {shape[0]}: pass one per row")
        rows = [torch.rand(shape[1:], generator=g, device=g.device) for g in generator]
        return torch.stack(rows).to(device)
    if generator is None:
        return torch.rand(shape, device=device)
    return torch.rand(shape, generator=generator, device=generator.device).to(device)


def warp(logits: torch.Tensor, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0) -> torch.Tensor:
    """Sampling probabilities from logits ``(..., V)``: temperature, then top-k, then top-p.

    Args:
        logits: raw (CFG-mixed) logits.
        temperature: divides the logits; 0 gives the greedy one-hot on the argmax.
        top_k: keep the ``k`` largest logits (ties at the k-th value kept); 0 = whole vocabulary.
        top_p: keep the smallest most-probable set whose mass reaches ``top_p``; 1 = all.

    Returns:
        fp32 probabilities, rows summing to 1.

    Example:
        >>> warp(torch.tensor([0.0, 3.0, 1.0]), temperature=0).tolist()
        [0.0, 1.0, 0.0]
    """
    logits = logits.float()
    if temperature == 0:
        return torch.zeros_like(logits).scatter_(-1, logits.argmax(-1, keepdim=True), 1.0)
    logits = logits / temperature
    if 0 < top_k < logits.shape[-1]:
        kth = logits.topk(top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = logits.softmax(-1)
    if top_p < 1.0:
        sorted_p, order = probs.sort(-1, descending=True)
        before = sorted_p.cumsum(-1) - sorted_p  # mass strictly above each entry
        drop = torch.zeros_like(probs, dtype=torch.bool).scatter(-1, order, before >= top_p)
        probs = probs.masked_fill(drop, 0.0)
        probs = probs / probs.sum(-1, keepdim=True)
    return probs


def sample(probs: torch.Tensor, generator: Generators) -> torch.Tensor:
    """One draw per row of ``probs`` ``(..., V)`` by inverse CDF (a zero-probability token is never drawn).

    Example:
        >>> sample(torch.tensor([[0.0, 1.0, 0.0]]), torch.Generator().manual_seed(0)).tolist()
        [1]
    """
    u = uniform(probs.shape[:-1], generator, probs.device)
    return sample_with(probs, u)


def sample_with(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Inverse-CDF draw of each row of ``probs`` at the given uniforms ``u`` (shape ``probs.shape[:-1]``):
    :func:`diffspec.kernels.inverse_cdf`."""
    return kernels.inverse_cdf(probs, u)


@dataclass(frozen=True)
class MRSResult:
    """Per-position outcome of :func:`mrs`.

    Attributes:
        accepted: bool, the draft was kept.
        tokens: the draft where accepted, a residual draw otherwise (distributed as ``p``).
        relaxation: ``None`` for the exact test; for a relaxed test (``accept_mass``), the
            per-position ``|a_relaxed(x) - min(1, p(x)/q(x))|``, whose mean over drafts ``x ~ q``
            bounds the TV between the output law and ``p`` (the per-token TV budget spent).
        exact_tokens: relaxed rules of the Jacobi loop: the exact test of the same draft against ``p``
            on the same uniforms (:func:`exact_twin`). Those tokens follow ``p``, which a relaxed rule's
            ``tokens`` do not, so they are the window's ``maximal`` re-drafts.
    """

    accepted: torch.Tensor
    tokens: torch.Tensor
    relaxation: torch.Tensor | None = None
    exact_tokens: torch.Tensor | None = None


def mrs(p: torch.Tensor, q: torch.Tensor, draft: torch.Tensor, generator: Generators,
        accept_mass: tuple[torch.Tensor, torch.Tensor] | None = None, uniforms: torch.Tensor | None = None) -> MRSResult:
    """Modified rejection sampling of ``draft`` (drawn from ``q``) against ``p``, at every position.

    Args:
        p: ``(..., V)`` target probabilities.
        q: ``(..., V)`` the law each draft was drawn from.
        draft: ``(...)`` draft tokens.
        generator: randomness (fresh uniforms for the test and the residual draw).
        accept_mass: relaxed rules only: ``(p_mass, q_mass)`` ``(...)`` replacing ``p(x)`` and
            ``q(x)`` in the test (accept with ``min(1, p_mass/q_mass)``); the residual stays
            ``(p - q)_+`` and the same uniforms are used, so masses equal to ``(p(x), q(x))``
            give bit-identical results.
        uniforms: ``(..., 2)`` the test's and the residual's uniforms, when the caller drew them
            already (a rule that decides from them first); None: drawn here from ``generator``.

    Returns:
        :class:`MRSResult`; ``tokens`` is distributed as ``p`` whatever ``q`` is, and equals the
        draft with probability ``1 - TV(p, q)`` when ``draft ~ q`` (a maximal coupling). With
        ``accept_mass`` the law is relaxed and ``relaxation`` is set.

    Example:
        >>> p, q = torch.tensor([[0.5, 0.5]]), torch.tensor([[1.0, 0.0]])
        >>> mrs(p, q, torch.tensor([0]), torch.Generator().manual_seed(1)).tokens.shape
        torch.Size([1])
    """
    u = uniform((*draft.shape, 2), generator, p.device) if uniforms is None else uniforms
    relaxation = None
    if accept_mass is not None:
        idx = draft.unsqueeze(-1)
        px, qx = p.gather(-1, idx).squeeze(-1), q.gather(-1, idx).squeeze(-1)
        pm, qm = accept_mass
        relaxation = (acceptance_prob(pm, qm) - acceptance_prob(px, qx)).abs()
    accepted, tokens = kernels.rejection_sample(p, q, draft, u[..., 0], u[..., 1], accept_mass=accept_mass)
    return MRSResult(accepted, tokens, relaxation)


def exact_twin(res: MRSResult, p: torch.Tensor, q: torch.Tensor, draft: torch.Tensor, uniforms: torch.Tensor
               ) -> MRSResult:
    """``res`` (a relaxed rule's outcome on ``uniforms``) with ``exact_tokens``: :func:`mrs` of ``draft`` against ``p``
    on the same uniforms, so where the rule's test is the exact one both agree bit for bit."""
    return MRSResult(res.accepted, res.tokens, res.relaxation, mrs(p, q, draft, None, uniforms=uniforms).tokens)


def residual_law(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """``(p - q)_+`` normalised, or ``p`` where that has no mass: the law a draft from ``q`` rejected against ``p`` is
    replaced from (a sibling tested next is tested against it).

    Example:
        >>> residual_law(torch.tensor([[0.5, 0.5, 0.0]]), torch.tensor([[1.0, 0.0, 0.0]])).tolist()
        [[0.0, 1.0, 0.0]]
    """
    res = (p - q).clamp_min(0)
    mass = res.sum(-1, keepdim=True)
    return torch.where(mass > 0, res / mass.clamp_min(torch.finfo(res.dtype).tiny), p)


def acceptance_prob(p_mass: torch.Tensor, q_mass: torch.Tensor) -> torch.Tensor:
    """``min(1, p_mass / q_mass)`` as the test ``u * q_mass < p_mass`` uses it (1 where ``q_mass`` is 0 < ``p_mass``)."""
    return torch.where(q_mass > 0, (p_mass / q_mass.clamp_min(torch.finfo(q_mass.dtype).tiny)).clamp(max=1.0),
                       (p_mass > 0).to(p_mass.dtype))


def point_mass(q: torch.Tensor) -> torch.Tensor:
    """``(...)`` bool: the draft law ``q`` ``(..., V)`` is one-hot (a first draft under ``init="repeat"`` or
    ``"uniform-onehot"``, or a forced token), so the draft is not a sample of any model law."""
    return q.amax(-1) >= 1


def gumbel(u: torch.Tensor) -> torch.Tensor:
    """Standard Gumbel noise from uniforms in ``[0, 1)``."""
    tiny = torch.finfo(u.dtype).tiny
    return -torch.log(-torch.log(u.clamp(min=tiny)))


def gumbel_argmax(probs: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
    """``argmax(log p + g)``: a draw from ``probs`` when ``noise`` is fresh standard Gumbel noise."""
    return (probs.log() + noise).argmax(-1)


class GumbelTable:
    """One Gumbel vector per absolute position, held for the positions in flight (a ring buffer).

    Position ``j`` of row ``b`` uses slot ``j % slots``. Positions ``[c_b, c_b + slots)`` are in
    flight; when a row commits positions ``[c_b, c_b')`` their slots get fresh noise (they next
    serve positions ``c_b + slots, ...``), so no two positions ever share a vector and a position
    keeps its vector for as long as it is drafted.

    Example:
        >>> table = GumbelTable(batch=2, slots=4, vocab=3, generator=torch.Generator().manual_seed(0))
        >>> table.noise(torch.tensor([[0, 1], [2, 3]])).shape
        torch.Size([2, 2, 3])
    """

    def __init__(self, batch: int, slots: int, vocab: int, generator: Generators,
                 device: torch.device | str = "cpu") -> None:
        self.slots, self.generator, self.device = slots, generator, device
        self.table = gumbel(uniform((batch, slots, vocab), generator, device))

    def noise(self, positions: torch.Tensor) -> torch.Tensor:
        """``(B, K, V)`` noise of absolute ``positions`` ``(B, K)``."""
        slot = (positions % self.slots).unsqueeze(-1).expand(-1, -1, self.table.shape[-1])
        return self.table.gather(1, slot)

    def advance(self, old: torch.Tensor, new: torch.Tensor) -> None:
        """Rows committed positions ``[old_b, new_b)``: refresh those positions' slots."""
        s = torch.arange(self.slots, device=self.table.device)
        stale = ((s - old.unsqueeze(1)) % self.slots) < (new - old).unsqueeze(1)
        fresh = gumbel(uniform(self.table.shape, self.generator, self.table.device))
        self.table = torch.where(stale.unsqueeze(-1), fresh, self.table)


def force(probs: torch.Tensor, forced: torch.Tensor | None) -> torch.Tensor:
    """Replace ``probs`` ``(..., V)`` by a one-hot where ``forced`` (shape ``probs.shape[:-1]``) is ``>= 0``.

    Forced tokens (end-of-row tokens, prefix constraints) are deterministic: one-hot ``p`` and ``q``.

    Example:
        >>> force(torch.full((2, 3), 1 / 3), torch.tensor([-1, 2]))[1].tolist()
        [0.0, 0.0, 1.0]
    """
    if forced is None:
        return probs
    hit = forced >= 0
    onehot = torch.zeros_like(probs).scatter_(-1, forced.clamp(min=0).unsqueeze(-1), 1.0)
    return torch.where(hit.unsqueeze(-1), onehot, probs)
