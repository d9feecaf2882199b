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

Example:
    >>> rule = ClusterAcceptance(torch.tensor([0, 0, 1]))
    >>> p, q = torch.tensor([[0.5, 0.3, 0.2]]), torch.tensor([[0.1, 0.8, 0.1]])
    >>> res = rule(p, q, torch.tensor([1]), torch.Generator().manual_seed(0))
    >>> bool(res.accepted[0]), round(float(res.relaxation[0]), 3)  # P = 0.8, Q = 0.9 for cluster {0, 1}
    (True, 0.411)
"""

from __future__ import annotations

import torch

from .patch_vq import kmeans, nearest_code
from .sampling import Generators, MRSResult, acceptance_prob, mrs

KMEANS_ITERS = 50
"""Lloyd iterations of :meth:`ClusterAcceptance.fit` (seeded, deterministic)."""


class ClusterAcceptance:
    """Lumped rejection sampling over a fixed token partition, an :data:`~diffspec.ar_image.jacobi.Acceptance`.

    Args:
        assignment: ``(codebook_size,)`` cluster id of each token, in ``[0, K)``.

    Raises:
        ValueError: ``assignment`` not 1-D or with negative ids.
    """

    def __init__(self, assignment: torch.Tensor) -> None:
        if assignment.dim() != 1 or assignment.numel() == 0 or int(assignment.min()) < 0:
            raise ValueError(f"assignment must be a non-empty 1-D tensor of cluster ids >= 0; "
                             f"got shape {tuple(assignment.shape)}")
        self.assignment = assignment.detach().long()
        self.num_clusters = int(self.assignment.max()) + 1

    @classmethod
    def fit(cls, vectors: torch.Tensor, clusters: int, seed: int = 0) -> ClusterAcceptance:
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
            return cls(torch.arange(v.shape[0]))
        centroids = kmeans(v, clusters, KMEANS_ITERS, torch.Generator().manual_seed(seed))
        return cls(nearest_code(v, centroids))

    def __call__(self, p: torch.Tensor, q: torch.Tensor, draft: torch.Tensor, generator: Generators) -> MRSResult:
        """Cluster test of ``draft`` against ``p`` (signature of :func:`~diffspec.ar_image.sampling.mrs`)."""
        if p.shape[-1] != self.assignment.numel():
            raise ValueError(f"the partition covers {self.assignment.numel()} tokens; p has {p.shape[-1]}")
        if self.assignment.device != p.device:  # moved once, not copied on every call
            self.assignment = self.assignment.to(p.device)
        ids = self.assignment
        lumped = (*p.shape[:-1], self.num_clusters)
        big_p = p.new_zeros(lumped).index_add_(-1, ids, p)  # (..., K): P and Q of each cluster
        big_q = p.new_zeros(lumped).index_add_(-1, ids, q.to(p.dtype))
        ratio = torch.where(big_p > 0, big_q / big_p.clamp_min(torch.finfo(p.dtype).tiny), 0.0)
        # the token law whose residual (p - q~)_+ is p (1 - Q/P)_+: q lumped, redistributed by p in each cluster
        q_lumped = p * ratio.gather(-1, ids.expand(p.shape))
        cx = ids[draft].unsqueeze(-1)
        masses = (big_p.gather(-1, cx).squeeze(-1), big_q.gather(-1, cx).squeeze(-1))
        res = mrs(p, q_lumped, draft, generator, accept_mass=masses)
        # emitted o = q min(1, P/Q) + (p - q~)_+, so o - p = (q - q~) min(1, P/Q) token by token: TV per cluster
        gap = p.new_zeros(lumped).index_add_(-1, ids, (q - q_lumped).abs_())
        return MRSResult(res.accepted, res.tokens, 0.5 * (gap * acceptance_prob(big_p, big_q)).sum(-1))
