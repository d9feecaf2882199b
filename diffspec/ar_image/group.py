"""Grouped acceptance (method ``gsd``, So et al. 2025): a relaxed verification rule for the Jacobi engine.

Instead of testing the draft ``x`` alone, the test ``min(1, p(C)/q(C))`` uses the mass of a
cluster ``C`` of tokens the target row ``p`` finds interchangeable with ``x``:

1. the ``group_size`` tokens ranked nearest to ``x`` when ``p`` is sorted (``group_size // 2``
   ranks above ``x``, the rest below, ``x`` included; ties ranked by token id, as a stable sort;
   found by two ``topk`` on a tie-free integer key, no sort, vectorised over rows and positions);
2. minus the members whose probability differs from ``p(x)`` by ``delta_p`` or more, or whose
   token embedding (the target's :meth:`~diffspec.ar_image.target.ARImageTarget.token_embeddings`)
   lies at squared L2 distance ``embed_dist`` or more from ``x``'s (no embeddings: no such filter).
   ``x`` itself always stays, so ``group_size=1``, ``delta_p=0`` or ``embed_dist=0`` give the
   exact test of :func:`~diffspec.speculation.sampling.mrs`, bit for bit. For codebooks of up to
   ``NEAR_TABLE_MAX_CODES`` tokens the distance filter is a ``(V, V)`` boolean table built once per
   device, so a round gathers ``G`` flags per draft instead of ``G`` embedding rows.

A draft whose ``q`` is a point mass (a first draft under ``init="repeat"`` or ``"uniform-onehot"``,
or a forced token) takes the exact test unless ``group_onehot=True``: against ``q(C) = 1`` the group
test accepts the draft with ``p(C)``, i.e. wherever any token like it is likely, which pulls the
image towards its first drafts (``init="repeat"``: towards copies of the left token).

On rejection the residual is the plain ``(p - q)_+``, as in the paper: the output law is no longer
``p``. The rule reports the per-position relaxation ``|a(x) - min(1, p(x)/q(x))|``, whose mean over
drafts bounds the per-token TV spent (``stats.extra["relaxed_tv"]``). ``max_tv`` (not in the paper)
clamps the group acceptance ``a(x)`` to within ``max_tv`` of the exact one, so each token's law
moves at most ``max_tv`` from ``p`` in total variation, whatever the group (``max_tv=0`` is the
exact test; ``None``, the default, is the paper's rule).

``min_run`` (not in the paper) spends the relaxation only where it pays. The last axis of the
drafts is the Jacobi window, in order, and every draft after ``x`` was drafted given ``x``. A draft
the exact test rejects but the group test accepts is kept only if the exact test accepts the next
``min_run`` drafts of its window (or all of them, up to the window's end); otherwise it is
rejected as the exact test would be. A group acceptance that would only buy a token or two
before the next rejection is not taken. Drafts the exact test accepts are always kept. With
``min_run`` set, ``relaxation`` is ``(a(x) - a_exact(x))_+`` where the group acceptance was
allowed, 0 elsewhere. Because a decision looks at the drafts after it, the drafts left after a
rejection are biased towards those the exact test fails; no coupling of them follows ``p``, so their
re-drafts (``exact_tokens``) are fresh draws from ``p``.

Example:
    >>> rule = GroupAcceptance(group_size=3, delta_p=1.0)
    >>> p = torch.tensor([[0.5, 0.3, 0.2]])
    >>> q = torch.tensor([[0.1, 0.8, 0.1]])
    >>> res = rule(p, q, torch.tensor([1]), torch.Generator().manual_seed(0))
    >>> bool(res.accepted[0]), round(float(res.relaxation[0]), 3)  # p(C) = 1 = q(C), vs p(x)/q(x) = 0.375
    (True, 0.625)
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
    sample,
    uniform,
)

NEAR_TABLE_MAX_CODES = 8192
"""Largest codebook whose ``(V, V)`` "within ``embed_dist``" table is precomputed (64 MiB at 8192)."""


def distance_quantile(vectors: torch.Tensor, quantile: float, max_rows: int = 2048) -> float:
    """The ``quantile`` of squared L2 distances between distinct rows of ``vectors`` (``gsd``'s scale-free filter).

    Sets of more than ``max_rows`` rows use a fixed sample of ``max_rows`` of them (seed 0), so a
    16384-code vocabulary costs a 2048 x 2048 distance matrix.

    Example:
        >>> distance_quantile(torch.tensor([[0.0], [1.0], [3.0]]), 0.0)
        1.0
    """
    v = vectors.detach().float()
    if v.shape[0] > max_rows:
        v = v[torch.randperm(v.shape[0], generator=torch.Generator().manual_seed(0))[:max_rows].to(v.device)]
    d = torch.cdist(v, v).square()
    off = d[~torch.eye(len(v), dtype=torch.bool, device=v.device)]
    return float(off.quantile(float(quantile)))


class GroupAcceptance:
    """The ``gsd`` verification rule, an :data:`~diffspec.ar_image.jacobi.Acceptance` for :func:`jacobi_sample`.

    Args:
        group_size: ranks considered around the draft (``x`` included); 1 = exact test.
        delta_p: members need ``|p(y) - p(x)| < delta_p``.
        embed_dist: members need ``||e_y - e_x||^2 < embed_dist`` (when ``embeddings`` is given).
        embeddings: ``(codebook_size, dim)`` token embeddings, or None (rank and probability filters only).
        group_onehot: also group-test drafts whose ``q`` is one-hot (the paper's rule); False tests
            them exactly.
        max_tv: when set, the group acceptance is clamped to ``[a_exact - max_tv, a_exact + max_tv]``
            (a hard per-token TV budget); None: unclamped, the paper's rule.
        min_run: when set, a group-only acceptance is kept only where the exact test accepts the
            next ``min_run`` drafts of the window (see the module docstring); None: the paper's rule.

    Raises:
        ValueError: ``group_size < 1``, negative thresholds, ``max_tv`` outside ``[0, 1]``,
            ``min_run < 0``, or embeddings of the wrong shape (named).
    """

    def __init__(self, group_size: int, delta_p: float, embed_dist: float = 0.5,
                 embeddings: torch.Tensor | None = None, group_onehot: bool = False,
                 max_tv: float | None = None, min_run: int | None = None) -> None:
        if group_size < 1:
            raise ValueError(f"group_size={group_size!r} is out of range: allowed [1, inf)")
        if delta_p < 0 or embed_dist < 0:
            raise ValueError(f"delta_p={delta_p!r} and embed_dist={embed_dist!r} must be >= 0")
        if max_tv is not None and not 0 <= max_tv <= 1:
            raise ValueError(f"max_tv={max_tv!r} is out of range: allowed [0, 1] or None")
        if min_run is not None and min_run < 0:
            raise ValueError(f"min_run={min_run!r} is out of range: allowed [0, inf) or None")
        if embeddings is not None and embeddings.dim() != 2:
            raise ValueError(f"embeddings must be (codebook_size, dim); got shape {tuple(embeddings.shape)}")
        self.group_size, self.delta_p, self.embed_dist = int(group_size), float(delta_p), float(embed_dist)
        self.embeddings = None if embeddings is None else embeddings.detach().float()
        self.group_onehot = bool(group_onehot)
        self.max_tv = None if max_tv is None else float(max_tv)
        self.min_run = None if min_run is None else int(min_run)
        self._near: torch.Tensor | None = None  # (V, V) bool, ||e_y - e_x||^2 < embed_dist, built on first use

    def _near_table(self, device: torch.device) -> torch.Tensor | None:
        """The precomputed distance filter on ``device``, or None where the codebook is too large for it."""
        emb = self.embeddings
        if emb is None or emb.shape[0] > NEAR_TABLE_MAX_CODES:
            return None
        if self._near is None or self._near.device != device:
            emb = emb.to(device)
            rows = max(1, (1 << 24) // max(1, emb.numel()))  # keep each chunk's (rows, V, D) block near 64 MiB
            # the same expression as the gathered path below, so both give the same flags bit for bit
            self._near = torch.cat([(emb - emb[i:i + rows].unsqueeze(-2)).square().sum(-1) < self.embed_dist
                                    for i in range(0, emb.shape[0], rows)])
        return self._near

    def cluster(self, p: torch.Tensor, draft: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Members of each draft's cluster.

        Args:
            p: ``(..., V)`` target probabilities.
            draft: ``(...)`` draft tokens.

        Returns:
            ``(tokens (..., G'), keep (..., G') bool)``: the rank window around the draft
            (``G' = min(G, 2V - 1)``-ish: ranks beyond the vocabulary are dropped, slots outside it
            are marked not kept) and which members pass the filters (the draft always does).
        """
        vocab = p.shape[-1]
        if self.embeddings is not None and self.embeddings.shape[0] < vocab:
            raise ValueError(f"embeddings have {self.embeddings.shape[0]} rows for a codebook of {vocab}")
        # rank order as one int64 key per token: fp32 bits of p >= 0 sort like p; ties go to the lower id
        ids = torch.arange(vocab, device=p.device)
        key = (p.float().clamp_min(0) + 0.0).contiguous().view(torch.int32).long() * vocab + (vocab - 1 - ids)
        kx = key.gather(-1, draft.unsqueeze(-1))
        none = torch.iinfo(torch.int64).min
        up, down = min(self.group_size // 2, vocab - 1), min(self.group_size - 1 - self.group_size // 2, vocab - 1)
        above = torch.where(key > kx, -key, none).topk(up, -1).values  # nearest ranks above x
        below = torch.where(key < kx, key, none).topk(down, -1).values  # nearest ranks below x
        keys = torch.cat([-above, kx, below], -1)
        inside = torch.cat([above != none, torch.ones_like(kx, dtype=torch.bool), below != none], -1)
        tokens = torch.where(inside, vocab - 1 - keys.remainder(vocab), draft.unsqueeze(-1))
        px = p.gather(-1, draft.unsqueeze(-1))
        keep = inside & ((p.gather(-1, tokens) - px).abs() < self.delta_p)
        near = self._near_table(p.device)
        if near is not None:
            keep &= near[draft.unsqueeze(-1), tokens]
        elif self.embeddings is not None:
            emb = self.embeddings.to(p.device)
            dist = (emb[tokens] - emb[draft].unsqueeze(-2)).square().sum(-1)
            keep &= dist < self.embed_dist
        keep[..., up] = True  # x itself
        return tokens, keep

    def __call__(self, p: torch.Tensor, q: torch.Tensor, draft: torch.Tensor, generator: Generators) -> MRSResult:
        """Group test of ``draft`` against ``p`` (signature of :func:`~diffspec.speculation.sampling.mrs`)."""
        tokens, keep = self.cluster(p, draft)
        if not self.group_onehot:  # point-mass drafts: the cluster shrinks to the draft (exact test)
            keep &= ~point_mass(q).unsqueeze(-1) | (tokens == draft.unsqueeze(-1))
        w = keep.to(p.dtype)
        masses = ((p.gather(-1, tokens) * w).sum(-1), (q.gather(-1, tokens) * w).sum(-1))
        idx = draft.unsqueeze(-1)
        px, qx = p.gather(-1, idx).squeeze(-1), q.gather(-1, idx).squeeze(-1)
        if self.max_tv is not None:  # the test "u < a" with a within max_tv of the exact acceptance
            exact = acceptance_prob(px, qx)
            a = torch.minimum(torch.maximum(acceptance_prob(*masses), exact - self.max_tv), exact + self.max_tv)
            masses = (a, torch.ones_like(a))
        if self.min_run is None:
            u = uniform((*draft.shape, 2), generator, p.device)
            return exact_twin(mrs(p, q, draft, None, accept_mass=masses, uniforms=u), p, q, draft, u)
        return self._paying(p, q, draft, px, qx, masses, generator)

    def _paying(self, p: torch.Tensor, q: torch.Tensor, draft: torch.Tensor, px: torch.Tensor, qx: torch.Tensor,
                masses: tuple[torch.Tensor, torch.Tensor], generator: Generators) -> MRSResult:
        """``min_run``: the exact decision, or the group's where the next ``min_run`` drafts pass exactly."""
        u = uniform((*draft.shape, 2), generator, p.device)
        exact = u[..., 0] * qx < px  # the test of mrs, on the same uniform
        group = u[..., 0] * masses[1] < masses[0]
        rejects = (~exact).long().cumsum(-1)
        length = draft.shape[-1]
        ahead = (torch.arange(length, device=p.device) + self.min_run).clamp(max=length - 1)
        paying = rejects.gather(-1, ahead.expand_as(rejects)) == rejects  # no exact rejection in (j, j + min_run]
        keep = exact | (group & paying)
        ones = torch.ones_like(px)
        res = mrs(p, q, draft, generator, accept_mass=(keep.to(px.dtype), ones), uniforms=u)
        gain = (acceptance_prob(*masses) - acceptance_prob(px, qx)).clamp_min(0)
        # the decisions look ahead at the next drafts, so the drafts left after a rejection are those the exact
        # test failed more often: no coupling of them follows p, and the window is re-drafted by fresh draws
        return MRSResult(res.accepted, res.tokens, gain * paying.to(gain.dtype), sample(p, generator))
