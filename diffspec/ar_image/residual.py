"""Residual alternatives: MC-SJD whose first rejection often comes with a fresh row for the next token (exact; or
relaxed under ``gsd``'s cluster test).

Where does MC-SJD lose? A round ends at its first rejected draft ``j``: the token committed there is a
residual draw, so every draft after it was drafted in a context that is now wrong. The next round's
first draft (``j + 1``, the new window start) is rejected most often of all (on ``tiny-ar-noisy`` 40%
of rounds end there). This sampler prepares, in the same target call, the rows that the residual
draw will need (one round: :class:`ResidualRound`, run by the shared loop
:func:`~diffspec.ar_image.rounds.run_rounds`):

1. before the call, one fresh Gumbel vector ``g_k`` per window offset ``k < depth``; the ``width``
   siblings of the draft at offset ``k`` are the tokens ranking highest on ``log q_k + g_k`` (the
   draft itself excluded), fed as extra tree nodes whose parent is the draft chain up to ``k - 1``
   (``session.step_tree``), each followed by copies of the chain's next ``follow`` drafts: the group's
   rows are the laws of offsets ``k + 1 .. k + 1 + follow`` given the sibling;
2. the chain is verified as in mc-sjd (vectorised modified rejection sampling), but at offsets
   ``k < depth`` the residual token of a rejected draft is drawn as ``argmax(log (p_k - q_k)_+ + g_k)``:
   a Gumbel-max draw of the residual law, since ``g_k`` is independent of the acceptance test;
3. when the residual token at the first rejection ``j`` is one of its siblings (``g_k`` drives both
   the ranking and the draw, so on flat laws it often is), that sibling's rows are the exact laws of
   the next tokens: the round walks the copied drafts against them (modified rejection sampling, so the
   chain's tokens are kept as often as possible and the next drafts' context changes little), commits
   the accepted ones plus the draw at the first rejection, and the group's keys/values (``session.commit_tree``);
4. the window then moves as in mc-sjd: positions left are re-drafted by the chain's outputs with
   ``q`` = their new rows.

Every committed token is drawn from its exact conditional law, so the output law is the target's.

Relaxed (``gsd`` with ``clusters`` and ``width > 0``): with ``gsd``'s cluster rule (``"min-tv"``), every test
above, the chain's, the residual draw's and the walk after a sibling, is run against the rule's emitted law
instead of ``p`` (:meth:`~diffspec.ar_image.cluster.ClusterAcceptance.emitted_law`), so each committed token has
the law the cluster test in the Jacobi loop would give it (its cluster exact given its prefix) while the
alternatives add their tokens per call. The window is re-drafted by the exact test on the same uniforms and
Gumbel draws, whose tokens follow ``p``; with one token per cluster the output is the exact sampler's bit for bit.

The cost is ``depth * width * (1 + follow)`` extra tokens per call (128 at the defaults, 4 x 8 x 4), and the
work is batched: one Gumbel table, one top-k and one modified-rejection pass per round, no loop over tokens.

Example:
    >>> from diffspec.ar_image.targets.toy import ToyTableTarget
    >>> stats = SpecStats()
    >>> out = residual_sample(ToyTableTarget(seed=0).start(class_labels=[0, 1]), 6, window=4, width=2, depth=2,
    ...                       follow=1, init="uniform", sampling={"temperature": 1.0},
    ...                       generator=torch.Generator().manual_seed(0), stats=stats)
    >>> out.shape, stats.extra["tree_nodes"]
    (torch.Size([2, 6]), 12)
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from ..speculation.sampling import (
    Generators,
    MRSResult,
    force,
    gumbel,
    mrs,
    point_mass,
    sample,
    uniform,
    warp,
)
from ..stats import SpecStats
from .jacobi import first_window, shift_window, window_drafts
from .pac import check_tree_session
from .rounds import RoundState, run_rounds, window_forced

if TYPE_CHECKING:
    from .cluster import ClusterAcceptance
    from .target import ARSession


def sibling_layout(length: int, depth: int, width: int, follow: int, device: torch.device | str
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """Nodes fed per round: the draft chain (``length`` nodes), then ``width`` sibling groups per offset ``< depth``.

    Group ``g = k * width + i`` (sibling ``i`` of offset ``k``) holds ``1 + follow`` nodes from
    ``length + g * (1 + follow)``: the sibling (depth ``k + 1``) and copies of the chain's next
    ``follow`` drafts under it. A group hangs under chain nodes ``< k`` and never sees another group.

    Returns:
        ``(depth (M,), ancestors (M, M) bool)`` in :meth:`step_tree`'s convention (ancestors include self).

    Example:
        >>> d, anc = sibling_layout(3, 2, 1, 1, "cpu")
        >>> d.tolist(), anc[6].nonzero().flatten().tolist()
        ([1, 2, 3, 1, 2, 2, 3], [0, 5, 6])
    """
    size = 1 + follow
    groups = depth * width
    offset = torch.arange(depth, device=device).repeat_interleave(width * size)  # offset of each group node's sibling
    level = torch.arange(size, device=device).repeat(groups)
    group = torch.arange(groups, device=device).repeat_interleave(size)
    anc = torch.zeros(length + groups * size, length + groups * size, dtype=torch.bool, device=device)
    anc[:length, :length] = torch.ones(length, length, dtype=torch.bool, device=device).tril()
    anc[length:, :length] = torch.arange(length, device=device) < offset.unsqueeze(1)
    anc[length:, length:] = (group.unsqueeze(1) == group) & (level.unsqueeze(0) <= level.unsqueeze(1))
    return torch.cat([torch.arange(1, length + 1, device=device), offset + level + 1]), anc


def residual_gumbel(p: torch.Tensor, q: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
    """``argmax(log (p - q)_+ + noise)``: a draw of the residual law (``p`` where it has no mass) when ``noise`` is
    fresh standard Gumbel noise, independent of everything else."""
    res = (p - q).clamp_min(0)
    res = torch.where(res.sum(-1, keepdim=True) > 0, res, p)
    return (res.log() + noise).argmax(-1)


def emitted_law(rule: ClusterAcceptance | None, p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """The law the tests emit for drafts drawn from ``q``: ``p`` (exact) or ``rule``'s relaxed law."""
    return p if rule is None else rule.emitted_law(p, q)


def unreachable(rule: ClusterAcceptance | None, q: torch.Tensor, draft: torch.Tensor) -> torch.Tensor:
    """``(..., V)`` bool: tokens the residual draw after rejecting ``draft`` cannot give, never fed as siblings.

    The exact residual ``(p - q)_+`` is 0 at a rejected draft. Under the cluster rule's emitted law it is 0 on
    the draft's whole cluster (a draft is rejected only where its cluster has more ``q`` mass than ``p`` mass,
    and there the law lies under ``q``), except for one-hot ``q``, which takes the exact test.
    """
    same = torch.arange(q.shape[-1], device=q.device) == draft.unsqueeze(-1)
    if rule is None:
        return same
    ids = rule.assignment.to(q.device)
    cluster = ids == ids[draft].unsqueeze(-1)
    return cluster if rule.group_onehot else torch.where(point_mass(q).unsqueeze(-1), same, cluster)


def verify(p: torch.Tensor, law: torch.Tensor, q: torch.Tensor, draft: torch.Tensor, generator: Generators
           ) -> tuple[MRSResult, MRSResult, torch.Tensor | None]:
    """Modified rejection sampling of ``draft`` against ``law`` (:func:`emitted_law`), and against ``p``.

    Returns:
        ``(result, exact result, relaxation)``: the test against ``law``; the exact test on the same uniforms (its
        tokens follow ``p``, so they re-draft the window); the TV of ``law`` from ``p`` per position (None if ``law``
        is ``p``, the same tensor).
    """
    u = uniform((*draft.shape, 2), generator, p.device)
    exact = mrs(p, q, draft, None, uniforms=u)
    if law is p:
        return exact, exact, None
    return mrs(law, q, draft, None, uniforms=u), exact, 0.5 * (law - p).abs().sum(-1)


def with_residual_draws(res: MRSResult, law: torch.Tensor, q: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
    """``res.tokens`` whose rejections at the first ``noise.shape[1]`` offsets are the Gumbel residual draws of
    ``law`` (:func:`residual_gumbel`), the ones that can hit a sibling."""
    d = noise.shape[1]
    drawn = residual_gumbel(law[:, :d], q[:, :d], noise)
    return torch.cat([torch.where(res.accepted[:, :d], res.tokens[:, :d], drawn), res.tokens[:, d:]], 1)


def follow_sibling(p: torch.Tensor, q: torch.Tensor, draft: torch.Tensor, base: torch.Tensor, j: torch.Tensor,
                   follow: int, in_image: torch.Tensor, generator: Generators, rule: ClusterAcceptance | None = None
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Tokens after a sibling that the residual draw at offset ``j`` picked, from its group's fresh rows.

    The chain's drafts at offsets ``j + 1 .. j + 1 + follow`` are tested (modified rejection sampling,
    so the output keeps the chain's tokens as often as it can) against the group's rows, which hold
    their laws given the sibling; the walk stops at the first rejection.

    Args:
        p: ``(B, 1 + M, V)`` the round's rows; ``base`` ``(B,)``: the group's first node.
        q, draft: ``(B, L, V)`` / ``(B, L)`` the chain's laws and drafts.
        j: ``(B,)`` offset of the sibling.
        in_image: ``(B, L + 1)`` offset is inside the image.
        rule: a relaxed rule (:meth:`~diffspec.ar_image.cluster.ClusterAcceptance.emitted_law`); None: exact.

    Returns:
        ``(tokens (B, 1 + follow) at offsets j + 1 + l, count (B,), relaxation (B, 1 + follow) or None)``: the
        first ``count`` tokens are drawn.
    """
    batch, length = draft.shape
    rows = torch.arange(batch, device=p.device).unsqueeze(1)
    lv = torch.arange(follow + 1, device=p.device)
    off = j.unsqueeze(1) + 1 + lv  # (B, 1 + follow) offsets of the tested drafts
    idx = 1 + base.unsqueeze(1) + lv  # group node r's row: 1 + r
    law = p[rows, idx.clamp(max=p.shape[1] - 1)]
    in_window = off < length
    o = off.clamp(max=length - 1)
    q_o = q[rows, o]
    test, _, tv = verify(law, emitted_law(rule, law, q_o), q_o, draft[rows, o], generator)
    tokens = torch.where(in_window, test.tokens, sample(law, generator))
    go = (test.accepted & in_window & in_image.gather(1, off.clamp(max=length)))[:, :follow]
    return tokens, go.long().cumprod(1).sum(1) + 1, None if tv is None else torch.where(in_window, tv, 0.0)


class ResidualRound:
    """One ``mc-sjd-ra`` round (the module docstring's steps 1-4) on a :class:`~diffspec.ar_image.rounds.RoundState`.

    Args:
        length: chain drafts per call (``>= 1``); ``depth``: offsets with siblings (``<= length - 1``).
        width, follow, init, sampling, generator, acceptance: as :func:`residual_sample`.
    """

    def __init__(self, length: int, width: int, depth: int, follow: int, init: str, sampling: dict[str, Any],
                 generator: Generators, acceptance: ClusterAcceptance | None = None) -> None:
        self.length, self.width, self.depth, self.follow = length, width, depth, follow
        self.init, self.sampling, self.generator, self.rule = init, sampling, generator, acceptance
        self.hits: torch.Tensor | int = 0  # rounds whose first rejection drew a sibling

    def start(self, state: RoundState) -> None:
        """The layout fed per round and the first window."""
        dev, length, depth, size = state.device, self.length, self.depth, 1 + self.follow
        self.node_depth, self.anc = sibling_layout(length, depth, self.width, self.follow, dev)
        self.ar = torch.arange(length + 1, device=dev)
        self.rel = torch.cat([self.node_depth.new_zeros(1), self.node_depth])  # logits row r predicts commit + rel[r]
        self.chain = torch.arange(length, device=dev)
        self.copies = (torch.arange(depth, device=dev).unsqueeze(1) + torch.arange(1, size, device=dev)
                       ).clamp(max=length - 1)
        self.rows = torch.arange(state.batch, device=dev)
        self.hits = torch.zeros((), dtype=torch.long, device=dev)
        self.q = first_window(state.session, state.tokens, length, self.init, self.generator)

    def siblings(self, draft: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(noise (B, D, V), siblings (B, D, width), nodes (B, M))``: the Gumbel vectors of offsets ``< D``, the
        siblings they rank highest (never a token the residual draw cannot give), and the nodes fed (chain, then
        each sibling followed by copies of the chain's next drafts)."""
        q, depth = self.q, self.depth
        noise = gumbel(uniform((q.shape[0], depth, q.shape[-1]), self.generator, q.device))
        score = q[:, :depth].clamp_min(torch.finfo(q.dtype).tiny).log() + noise
        siblings = score.masked_fill(unreachable(self.rule, q[:, :depth], draft[:, :depth]),
                                     float("-inf")).topk(self.width, -1).indices
        follows = draft[:, self.copies].unsqueeze(2).expand(-1, -1, self.width, -1)  # (B, D, width, follow)
        groups = torch.cat([siblings.unsqueeze(-1), follows], -1).flatten(1)
        return noise, siblings, torch.cat([draft, groups], 1)

    def hit_sibling(self, state: RoundState, siblings: torch.Tensor, out: torch.Tensor, lead: torch.Tensor
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(j, hit, base)`` per row: the first rejection's offset (clipped into the siblings' offsets), whether its
        residual draw is one of its siblings (and the image goes on), and that sibling's group's first node."""
        depth = self.depth
        j = lead.clamp(max=max(depth - 1, 0))
        match = (siblings[self.rows, j] == out[self.rows, j].unsqueeze(1)) if depth else torch.zeros(
            state.batch, 1, dtype=torch.bool, device=state.device)
        hit = (lead < depth) & match.any(1) & (state.commit + lead + 1 < state.num_tokens)
        return j, hit, self.length + (j * self.width + match.long().argmax(1)) * (1 + self.follow)

    def __call__(self, state: RoundState) -> None:
        n, length, follow, commit, q = state.num_tokens, self.length, self.follow, state.commit, self.q
        pos, valid, draft = window_drafts(state.tokens, commit, length)
        noise, siblings, nodes = self.siblings(draft)
        start = commit - 1
        logits = state.session.step_tree(state.tokens.gather(1, start.unsqueeze(1)).squeeze(1), start, nodes,
                                         self.node_depth, self.anc)
        p = force(warp(logits, **self.sampling), window_forced(state.session, commit.unsqueeze(1) + self.rel))
        p_chain = p[:, :length]
        law = emitted_law(self.rule, p_chain, q)
        res, exact, tv = verify(p_chain, law, q, draft, self.generator)
        out = with_residual_draws(res, law, q, noise)
        lead = (res.accepted & valid).long().cumprod(1).sum(1)
        j, hit, base = self.hit_sibling(state, siblings, out, lead)  # the sibling's group holds the next laws
        after, count, tv_after = follow_sibling(p, q, draft, base, j, follow, pos < n, self.generator, self.rule)
        count = torch.where(hit, count, 0)
        if tv is not None:  # the TV of the committed positions' emitted laws
            chain_done = (self.chain <= lead.unsqueeze(1)) & valid
            walk_done = torch.arange(follow + 1, device=state.device) < count.unsqueeze(1)
            state.relaxed.add_(torch.stack([(tv * chain_done).sum() + (tv_after * walk_done).sum(),
                                            (chain_done.sum() + walk_done.sum()).float()]))
        self.hits += hit.sum()
        state.accepted.add_((lead + (count - 1).clamp(min=0)).sum())
        state.proposed.add_(valid.sum())
        commit_vals = torch.cat([out, sample(p[:, length], self.generator).unsqueeze(1)], 1)
        lv = self.ar - j.unsqueeze(1) - 1  # commit_vals column -> index into `after`
        mine = (lv >= 0) & (lv < count.unsqueeze(1))
        commit_vals = torch.where(mine, after.gather(1, lv.clamp(0, follow)), commit_vals)
        chain = self.chain
        in_group = hit.unsqueeze(1) & (chain >= j.unsqueeze(1)) & (chain <= (j + follow).unsqueeze(1))
        state.session.commit_tree(start, torch.where(in_group, base.unsqueeze(1) + chain - j.unsqueeze(1), chain))
        new_commit = commit + torch.minimum(lead + 1 + count, n - commit)
        # a relaxed rule's outputs do not follow p: the exact test's (same uniforms and Gumbel draws) re-draft
        redraft = out if self.rule is None else with_residual_draws(exact, p_chain, q, noise)
        tokens, self.q = shift_window(state.session, state.tokens, commit, new_commit, commit_vals, redraft, p_chain,
                                      self.init, self.generator)
        state.advance(tokens, new_commit)


def residual_sample(session: ARSession, num_tokens: int, window: int, width: int, depth: int, follow: int, init: str,
                    sampling: dict[str, Any], generator: Generators, stats: SpecStats | None = None,
                    bar: Any = None, acceptance: ClusterAcceptance | None = None) -> torch.Tensor:
    """Sample ``(B, num_tokens)`` image tokens with residual alternatives (see the module docstring); exact.

    Args:
        session: an open session with ``step_tree``/``commit_tree`` (LlamaGen-style, the toy target).
        num_tokens: image tokens per image.
        window: chain drafts per call (clipped to ``num_tokens - 1``).
        width: siblings per offset.
        depth: offsets with siblings (clipped to ``window - 1``).
        follow: copies of the chain's next drafts fed under each sibling (0: the sibling alone).
        init: first-draft rule (:func:`~diffspec.ar_image.jacobi.init_drafts`).
        sampling: keyword arguments of :func:`~diffspec.speculation.sampling.warp`.
        generator: ``None``, a generator, or one per batch row.
        stats: counters as mc-sjd, plus ``extra["tree_nodes"]`` (tokens fed per call) and
            ``extra["residual_hits"]`` (rounds whose first rejection drew a sibling).
        bar: a tqdm bar advanced by the tokens committed each round.
        acceptance: a relaxed rule with an emitted law (``gsd``'s cluster test, ``"min-tv"``): every test, and the
            residual draw at a rejection, is then against that law; the window is re-drafted by the exact test's
            tokens (same uniforms), which follow ``p``. None (default): exact. The mean TV of the emitted law over
            the committed positions goes to ``stats.extra["relaxed_tv"]``.

    Raises:
        ValueError: the session cannot verify token trees.
    """
    check_tree_session(session, "mc-sjd-ra")
    vocab = session.first_logits.shape[-1]
    if width >= vocab:
        raise ValueError(f"width={width} is out of range for a codebook of {vocab} tokens; must be in [1, {vocab - 1}]")
    state = RoundState.start(session, num_tokens, sampling, generator, bar)
    length = min(window, num_tokens - 1)
    d_sib = min(depth, max(length - 1, 0))
    one_round = ResidualRound(length, width, d_sib, follow, init, sampling, generator, acceptance)
    run_rounds(state, one_round, bar)
    state.record(stats)
    if stats is not None:
        stats.extra["tree_nodes"] = length + d_sib * width * (1 + follow)
        stats.extra["residual_hits"] = int(one_round.hits)
        if acceptance is not None:
            stats.extra["relaxed_tv"] = state.relaxed_tv()
    return state.image_tokens
