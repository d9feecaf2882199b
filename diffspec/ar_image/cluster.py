"""Cluster acceptance (``gsd`` with ``clusters=K``, ours): lumped rejection sampling over a fixed partition.

The codebook is split once into ``K`` clusters by k-means on token vectors (the VQ decoder's code
vectors or the target's input embeddings), so tokens of one cluster decode to similar patches. A
draft ``x ~ q`` in cluster ``c`` is then tested as if only its cluster mattered:

1. ``P(c) = sum of p over c``, ``Q(c)`` likewise; accept ``x`` with ``min(1, P(c)/Q(c))``;
2. on rejection draw a cluster from ``(P - Q)_+`` and, inside it, a token from ``p`` restricted to
   it (one inverse-CDF draw from the token residual ``p(y) (1 - Q(c_y)/P(c_y))_+``).

This is modified rejection sampling on the cluster variable, so the law of the emitted token's
cluster, given the tokens before it, is exactly ``P`` whatever ``q`` is: only the choice inside a
cluster is relaxed (a mix of ``q``'s and ``p``'s). The joint law of a whole sequence of clusters is
not kept: the relaxed choice inside one cluster changes the target's law for the next tokens. The grouped test of the paper (:mod:`~diffspec.ar_image.group`) lets clusters
overlap and resamples the token residual ``(p - q)_+``, so its cluster-level law drifts towards the
drafts. Per position the emitted law is, in closed form,
``o(y) = q(y) min(1, P/Q) + p(y) (1 - Q/P)_+`` (``P, Q`` of ``y``'s cluster), and the rule reports
its exact total variation from ``p`` as ``relaxation``. ``K`` = codebook size is the exact test;
fewer, larger clusters accept more.

A draft whose ``q`` is one-hot (a first draft under ``init="repeat"``, which copies the token to its
left, or a forced token) is not a model sample: testing it by its cluster would keep it with the
cluster's whole mass and pull images towards their first drafts (flat images under ``"repeat"``). It
takes the exact test unless ``group_onehot=True``, as in the grouped test.

``rule="min-tv"`` keeps the acceptance ``sum_c min(P, Q)`` and the exact cluster law but emits,
among all laws with that acceptance, the one closest to ``p`` (:func:`min_tv_law`, run through plain
rejection sampling): inside a cluster it moves only the mass the acceptance forces, so it spends the
least TV any rule with this acceptance can, ``sum_c min(P, Q) - sum_x min(p, q)``.

Example:
    >>> p, q = torch.tensor([[0.5, 0.3, 0.2]]), torch.tensor([[0.1, 0.8, 0.1]])
    >>> for name in ("lumped", "min-tv"):  # P = 0.8, Q = 0.9 for cluster {0, 1}: same acceptance, less TV
    ...     rule = ClusterAcceptance(torch.tensor([0, 0, 1]), name)
    ...     res = rule(p, q, torch.tensor([1]), torch.Generator().manual_seed(0))
    ...     print(name, bool(res.accepted[0]), round(float(res.relaxation[0]), 3))
    lumped True 0.411
    min-tv True 0.4
"""

from __future__ import annotations

import torch

from ..speculation.sampling import (
    Generators,
    MRSResult,
    acceptance_prob,
    exact_twin,
    mrs,
    point_mass,
    uniform,
)
from .config import CLUSTER_RULES
from .targets.patch_vq import kmeans, nearest_code

KMEANS_ITERS = 50
"""Lloyd iterations of :meth:`ClusterAcceptance.fit` (seeded, deterministic)."""


def cluster_sum(x: torch.Tensor, ids: torch.Tensor, clusters: int) -> torch.Tensor:
    """``(..., V)`` token values summed per cluster → ``(..., clusters)``."""
    return x.new_zeros((*x.shape[:-1], clusters)).index_add_(-1, ids, x)


def min_tv_law(p: torch.Tensor, q: torch.Tensor, ids: torch.Tensor, clusters: int) -> torch.Tensor:
    """The law closest to ``p`` in TV among those a draft ``x ~ q`` can be kept under with ``sum_c min(P, Q)``.

    Any rule that keeps the draft with probability ``A`` emits a law ``o`` with
    ``TV(o, p) >= A - (1 - TV(p, q))``. With ``m = min(p, q)``, cluster by cluster:

    - ``Q <= P``: ``o = q + (P - Q) (p - q)_+ / (P - m(c))``: every draft is kept and the missing
      mass goes to the tokens ``p`` favours over ``q``;
    - ``Q > P``: ``o = m + (P - m(c)) (q - p)_+ / (Q - m(c))``: only the surplus of the drafts over
      ``p`` is scaled down.

    So ``o(c) = P`` exactly, the acceptance ``sum_x min(q, o)`` is the lumped test's ``sum_c min(P, Q)``,
    and the bound is met: ``TV(o, p) = sum_c (min(P, Q) - m(c))``, the least any rule with that
    acceptance can spend. Standard rejection sampling of ``x ~ q`` against ``o`` emits it.

    Example:
        >>> p, q = torch.tensor([[0.5, 0.3, 0.2]]), torch.tensor([[0.1, 0.8, 0.1]])
        >>> min_tv_law(p, q, torch.tensor([0, 0, 1]), 2)  # cluster {0, 1}: P = 0.8 < Q = 0.9
        tensor([[0.1000, 0.7000, 0.2000]])
    """
    m = torch.minimum(p, q)
    big_p, big_q, big_m = (cluster_sum(t, ids, clusters) for t in (p, q, m))
    tiny = torch.finfo(p.dtype).tiny
    up_scale = torch.where(big_p > big_q, (big_p - big_q) / (big_p - big_m).clamp_min(tiny), 0.0)
    down_scale = torch.where(big_q > big_p, (big_p - big_m) / (big_q - big_m).clamp_min(tiny), 1.0)
    per_token = ids.expand(p.shape)
    return (m + (p - m) * up_scale.gather(-1, per_token) + (q - m) * down_scale.gather(-1, per_token))


class ClusterAcceptance:
    """Lumped rejection sampling over a fixed token partition, an :data:`~diffspec.ar_image.jacobi.Acceptance`.

    Args:
        assignment: ``(codebook_size,)`` cluster id of each token, in ``[0, K)``.
        rule: ``"min-tv"`` (default: the emitted law closest to ``p`` among those with the lumped
            test's acceptance and cluster law, :func:`min_tv_law`) or ``"lumped"`` (steps 1-2 above:
            inside a cluster the emitted law mixes ``q`` and ``p``).
        group_onehot: also cluster-test drafts whose ``q`` is one-hot; False (default) tests them exactly.

    Raises:
        ValueError: ``assignment`` not 1-D or with negative ids, or an unknown ``rule`` (named).
    """

    def __init__(self, assignment: torch.Tensor, rule: str = "min-tv", group_onehot: bool = False) -> None:
        if assignment.dim() != 1 or assignment.numel() == 0 or int(assignment.min()) < 0:
            raise ValueError(f"assignment must be a non-empty 1-D tensor of cluster ids >= 0; "
                             f"got shape {tuple(assignment.shape)}")
        if rule not in CLUSTER_RULES:
            raise ValueError(f"rule={rule!r} is not supported: allowed {CLUSTER_RULES}")
        self.assignment = assignment.detach().long()
        self.num_clusters = int(self.assignment.max()) + 1
        self.rule = rule
        self.group_onehot = bool(group_onehot)

    @classmethod
    def fit(cls, vectors: torch.Tensor, clusters: int, seed: int = 0, rule: str = "min-tv",
            group_onehot: bool = False) -> ClusterAcceptance:
        """Partition the rows of ``vectors`` ``(codebook_size, dim)`` into ``clusters`` by seeded k-means.

        Raises:
            ValueError: ``clusters`` outside ``[1, codebook_size]`` (named).

        Example:
            >>> v = torch.tensor([[0.0], [0.1], [5.0], [5.1]])
            >>> ClusterAcceptance.fit(v, 2).assignment.tolist() in ([0, 0, 1, 1], [1, 1, 0, 0])
            True
        """
        v = vectors.detach().float().cpu()
        if v.dim() != 2:
            raise ValueError(f"vectors must be (codebook_size, dim); got shape {tuple(v.shape)}")
        if not 1 <= clusters <= v.shape[0]:
            raise ValueError(f"clusters={clusters!r} is out of range: allowed [1, {v.shape[0]}] (the codebook size)")
        if clusters == v.shape[0]:  # one token per cluster: the exact test
            return cls(torch.arange(v.shape[0]), rule, group_onehot)
        centroids = kmeans(v, clusters, KMEANS_ITERS, torch.Generator().manual_seed(seed))
        return cls(nearest_code(v, centroids), rule, group_onehot)

    def _ids(self, p: torch.Tensor) -> torch.Tensor:
        """The assignment on ``p``'s device (moved once, not copied on every call), checked against its codebook."""
        if p.shape[-1] != self.assignment.numel():
            raise ValueError(f"the partition covers {self.assignment.numel()} tokens; p has {p.shape[-1]}")
        if self.assignment.device != p.device:
            self.assignment = self.assignment.to(p.device)
        return self.assignment

    def emitted_law(self, p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
        """``(..., V)`` the law the ``"min-tv"`` rule emits for drafts drawn from ``q``: :func:`min_tv_law`, or ``p``
        where ``q`` is one-hot (unless ``group_onehot``). The rule is plain modified rejection sampling against it,
        so a sampler may run that test itself (the residual alternatives of :mod:`~diffspec.ar_image.residual`).

        Raises:
            ValueError: the rule is ``"lumped"``, whose test is not rejection sampling against its emitted law.
        """
        if self.rule != "min-tv":
            raise ValueError(f"rule={self.rule!r} has no rejection-sampling law; only 'min-tv' does")
        q = q.to(p.dtype)
        law = min_tv_law(p, q, self._ids(p), self.num_clusters)
        return law if self.group_onehot else torch.where(point_mass(q).unsqueeze(-1), p, law)

    def __call__(self, p: torch.Tensor, q: torch.Tensor, draft: torch.Tensor, generator: Generators) -> MRSResult:
        """Cluster test of ``draft`` against ``p`` (signature of :func:`~diffspec.speculation.sampling.mrs`)."""
        ids = self._ids(p)
        q = q.to(p.dtype)
        exact = None if self.group_onehot else point_mass(q)  # one-hot drafts: the exact test
        u = uniform((*draft.shape, 2), generator, p.device)
        if self.rule == "min-tv":
            law = self.emitted_law(p, q)
            res = mrs(law, q, draft, None, uniforms=u)
            return exact_twin(MRSResult(res.accepted, res.tokens, 0.5 * (law - p).abs().sum(-1)), p, q, draft, u)
        big_p = cluster_sum(p, ids, self.num_clusters)  # (..., K): P and Q of each cluster
        big_q = cluster_sum(q, ids, self.num_clusters)
        ratio = torch.where(big_p > 0, big_q / big_p.clamp_min(torch.finfo(p.dtype).tiny), 0.0)
        # the token law whose residual (p - q~)_+ is p (1 - Q/P)_+: q lumped, redistributed by p in each cluster
        q_lumped = p * ratio.gather(-1, ids.expand(p.shape))
        cx = ids[draft].unsqueeze(-1)
        masses = (big_p.gather(-1, cx).squeeze(-1), big_q.gather(-1, cx).squeeze(-1))
        # emitted o = q min(1, P/Q) + (p - q~)_+, so o - p = (q - q~) min(1, P/Q) token by token: TV per cluster
        gap = cluster_sum((q - q_lumped).abs_(), ids, self.num_clusters)
        tv = 0.5 * (gap * acceptance_prob(big_p, big_q)).sum(-1)
        if exact is not None:  # the plain test of x against p: masses p(x), q(x) = 1 and residual (p - q)_+
            q_lumped = torch.where(exact.unsqueeze(-1), q, q_lumped)
            masses = (torch.where(exact, p.gather(-1, draft.unsqueeze(-1)).squeeze(-1), masses[0]),
                      torch.where(exact, torch.ones_like(masses[1]), masses[1]))
            tv = torch.where(exact, torch.zeros_like(tv), tv)
        res = mrs(p, q_lumped, draft, None, accept_mass=masses, uniforms=u)
        return exact_twin(MRSResult(res.accepted, res.tokens, tv), p, q, draft, u)
