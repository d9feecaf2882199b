"""LANTERN++ static-tree drafting: a drafter token tree verified in one target call, relaxed acceptance.

The tree is a :class:`~diffspec.ar_image.tree.StaticTree` (per-depth branching factors, nodes flat level by
level, parent-major). One round (:class:`LanternTreeRound`, run by the shared loop
:func:`~diffspec.ar_image.rounds.run_rounds`), for every batch row and CFG branch at once:

1. drafting, one drafter call per depth: the children of a node are drawn from the drafter's law
   ``q`` at that node *without replacement* (sibling ``r`` from ``q`` with siblings ``< r`` removed,
   renormalised: its exact conditional law); greedy decoding (temperature 0) takes the top-``b``
   tokens of the drafter's logits instead. Nodes at one depth share an image position; the drafter
   and the target keep them in scratch cache slots and attend to their ancestors only;
2. one :meth:`~diffspec.ar_image.targets.llamagen_session.LlamaGenSession.step_tree` call verifies the last
   committed token and every node (tree attention mask, rotary position = the node's position);
3. the walk, depth by depth: the current node's children are tested in order by recursive
   rejection sampling with LANTERN's relaxed test (:func:`~diffspec.ar_image.relaxed.neighbour_budget`
   on the current target law ``p_r``, accept with ``min(1, p~_r(x)/q_r(x))``, on rejection
   ``p_{r+1} = (p_r - q_r)_+`` normalised); the first accepted child is followed; if none is, the
   residual draw ends the round; after a fully accepted path, a bonus draw from its leaf's row.
   The accepted nodes' keys/values are then copied into their real cache slots
   (:meth:`~diffspec.ar_image.targets.llamagen_session.LlamaGenSession.commit_tree`).

With ``delta = 0`` (no ``lam``) this is exact: recursive rejection sampling of draws without
replacement outputs ``p``. A chain (all factors 1) is :func:`~diffspec.ar_image.lantern.lantern_sample`
with ``draft_length = D``, draw for draw. One host sync per round.

Example:
    >>> tokens = lantern_tree_sample(session, 64, head, neighbours, StaticTree((4, 2, 1)), 0.1, 2.0,
    ...                              {"temperature": 1.0}, torch.Generator())  # doctest: +SKIP
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from .. import kernels
from ..speculation.sampling import Generators, force, residual_law, sample, uniform, warp
from ..stats import SpecStats
from .relaxed import certain_mrs, neighbour_budget
from .rounds import RoundState, run_rounds, window_forced, write_committed
from .target import mix_cfg
from .tree import StaticTree

if TYPE_CHECKING:
    from .drafter import FeatureDrafter
    from .targets.llamagen_session import LlamaGenSession


def _draft_tree(head: FeatureDrafter, session: LlamaGenSession, tokens: torch.Tensor, feats: torch.Tensor,
                cache: list[tuple[torch.Tensor, torch.Tensor]], commit: torch.Tensor, tree: StaticTree,
                ancestors: torch.Tensor, sampling: dict[str, Any], generator: Generators, top: bool = False
                ) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]:
    """Draft the tree from position ``commit`` (one drafter call per depth).

    Returns:
        ``(nodes (B, M), valid (B, M) bool, q)``: ``q[d]`` ``(B, level_sizes[d - 1], V)`` is the
        drafter law at the parents of level ``d + 1`` (``q[0]``: the root).
    """
    batch, branches = session.batch_size, session.cfg_branches
    scale = getattr(session, "guidance_scale", 1.0)
    greedy = top or sampling.get("temperature", 1.0) == 0
    dim, size, depth = feats.shape[-1], feats.shape[1], tree.depth
    # depth 1: the chain's first call (re-feed the pairs the last verification may have changed)
    first = (commit - depth - 2).clamp(min=0)
    fed = (first.unsqueeze(1) + torch.arange(depth + 2, device=commit.device)).repeat(branches, 1)
    out = head.features(tokens.repeat(branches, 1).gather(1, fed),
                        feats.gather(1, fed.unsqueeze(-1).expand(-1, -1, dim)), fed, cache)
    rows = (commit - 1).repeat(branches)
    f = out.gather(1, (rows - fed[:, 0]).view(-1, 1, 1).expand(-1, 1, dim))  # (R, 1, dim)
    keys = torch.arange(cache[0][0].shape[2], device=commit.device)
    real = (keys[None, None, :] <= rows[:, None, None])  # (R, 1, S): committed pairs only
    nodes, valid, qs = [], [], []
    for d in range(depth):  # a loop over depth; every node of a level at once
        pos = commit.unsqueeze(1) + d  # image position of this level's nodes
        logits = mix_cfg(head.logits(f), batch, scale)  # (B, parents, V)
        forced = window_forced(session, pos.expand(-1, logits.shape[1]))
        q = force(warp(logits, **sampling), forced)
        qs.append(q)
        b = int(tree.branching[d])
        if b > q.shape[-1]:
            raise ValueError(f"tree branching {b} exceeds the codebook size {q.shape[-1]}")
        if greedy:  # deterministic candidates: the drafter's top-b
            kids = logits.topk(b, -1).indices
            kids[..., 0] = q.argmax(-1)
            ok = torch.ones_like(kids, dtype=torch.bool)
            if forced is not None:
                ok[..., 1:] = (forced < 0).unsqueeze(-1)
        else:  # b draws without replacement, each from its conditional law
            taken = torch.zeros_like(q)
            picks, oks = [], []
            for r in range(b):
                rem = q if r == 0 else q * (1 - taken)
                x = sample(rem, generator)
                picks.append(x)
                oks.append(rem.sum(-1) > 0)
                taken = taken.scatter(-1, x.unsqueeze(-1), 1.0)
            kids, ok = torch.stack(picks, -1), torch.stack(oks, -1)
        kids, ok = kids.flatten(1), ok.flatten(1)  # (B, level size): parent-major
        nodes.append(kids)
        valid.append(ok)
        if d + 1 == depth:
            break
        lo, n = tree.offsets[d], tree.level_sizes[d]
        par_f = f.repeat_interleave(b, 1)  # each child pairs with its parent's predicted feature
        slot = (size + lo + torch.arange(n, device=commit.device)).expand(branches * batch, -1)
        anc = torch.zeros(n, keys.shape[0], dtype=torch.bool, device=commit.device)
        anc[:, size: size + ancestors.shape[0]] = ancestors[lo: lo + n]
        f = head.features_at(kids.repeat(branches, 1), par_f, (pos + 0).repeat(branches, 1).expand(-1, n),
                             slot, real | anc[None], cache)
    return torch.cat(nodes, 1), torch.cat(valid, 1), qs


class LanternTreeRound:
    """One LANTERN++ static-tree round (the module docstring's steps 1-3) on a
    :class:`~diffspec.ar_image.rounds.RoundState` whose token buffer holds ``num_tokens + depth + 1`` positions.

    Args:
        head, neighbours, tree, delta, lam, sampling, generator, acceptance: as :func:`lantern_tree_sample`.
    """

    def __init__(self, head: FeatureDrafter, neighbours: torch.Tensor, tree: StaticTree, delta: float,
                 lam: float | None, sampling: dict[str, Any], generator: Generators, acceptance: str = "certain"
                 ) -> None:
        self.head, self.neighbours, self.tree, self.delta, self.lam = head, neighbours, tree, delta, lam
        self.sampling, self.generator = sampling, generator
        self.certain = acceptance == "certain"
        self.greedy = self.certain or sampling.get("temperature", 1.0) == 0
        self.draft_calls = 0
        self.budget_sum: torch.Tensor | float = 0.0  # neighbour mass moved onto the tested candidates
        self.tested: torch.Tensor | float = 0.0  # candidates tested

    def start(self, state: RoundState) -> None:
        """The tree layout, the drafter's feature buffer (prefill feature at 0) and its static KV cache."""
        dev, size, rows = state.device, state.tokens.shape[1], state.batch * state.session.cfg_branches
        hidden = state.session.last_hidden
        self.node_depth, _, self.ancestors = self.tree.layout(dev)
        self.rel = torch.cat([self.node_depth.new_zeros(1), self.node_depth])  # logits row r: position commit + rel[r]
        self.feats = torch.zeros(rows, size, hidden.shape[-1], device=dev, dtype=hidden.dtype)
        self.feats[:, 0] = hidden[:, -1]
        self.cache = self.head.new_cache(rows, size + self.tree.size)
        self.rows = torch.arange(state.batch, device=dev)
        self.budget_sum, self.tested = torch.zeros((), device=dev), torch.zeros((), device=dev)

    def test_children(self, pr: torch.Tensor, x: torch.Tensor, ok: torch.Tensor, q_par: torch.Tensor,
                      u: torch.Tensor, alive: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Recursive rejection over one node's children ``x`` ``(B, b)`` (``ok``: drawn) against the current target
        law ``pr`` ``(B, V)``, with uniforms ``u`` ``(B, >= b, 2)``; counts the budget of the ``alive`` rows.

        Returns:
            ``(chosen (B,) the accepted child or -1, resid (B,) the last residual draw)``.
        """
        chosen = torch.full((x.shape[0],), -1, dtype=torch.long, device=x.device)
        resid, taken = torch.zeros_like(chosen), torch.zeros_like(q_par)
        spent = torch.zeros(x.shape[0], device=x.device)
        for r in range(x.shape[1]):  # siblings: each test needs the last residual
            xr, searching = x[:, r], (chosen < 0) & ok[:, r]
            if self.certain:  # pr: unnormalised rest of p; the siblings share one budget
                acc, tok, budget, rest = certain_mrs(pr, xr, self.neighbours, (self.delta - spent).clamp_min(0),
                                                     self.lam, u[:, r, 0], u[:, r, 1])
                spent = spent + torch.where(searching, budget, 0.0)
            else:
                qr = self.sibling_law(q_par, taken, xr, r)
                budget = neighbour_budget(pr, xr, self.neighbours, self.delta, self.lam)
                px, qx = pr.gather(-1, xr.unsqueeze(-1)).squeeze(-1), qr.gather(-1, xr.unsqueeze(-1)).squeeze(-1)
                acc, tok = kernels.rejection_sample(pr, qr, xr, u[:, r, 0], u[:, r, 1], accept_mass=(px + budget, qx))
                rest = residual_law(pr, qr)
                taken = taken.scatter(-1, xr.unsqueeze(-1), 1.0)
            self.budget_sum += (budget * (searching & alive)).sum()
            self.tested += (searching & alive).sum()
            chosen = torch.where(searching & acc, r, chosen)
            rejected = searching & ~acc
            resid = torch.where(rejected, tok, resid)
            pr = torch.where(rejected.unsqueeze(-1), rest, pr)
        return chosen, resid

    def sibling_law(self, q_par: torch.Tensor, taken: torch.Tensor, x: torch.Tensor, r: int) -> torch.Tensor:
        """The law sibling ``r`` was drawn from: one-hot on it (greedy), ``q`` without the earlier siblings."""
        if self.greedy:
            return torch.zeros_like(q_par).scatter_(-1, x.unsqueeze(-1), 1.0)
        if r == 0:
            return q_par
        qr = q_par * (1 - taken)
        return qr / qr.sum(-1, keepdim=True).clamp_min(torch.finfo(qr.dtype).tiny)

    def walk(self, state: RoundState, p: torch.Tensor, nodes: torch.Tensor, valid: torch.Tensor,
             qs: list[torch.Tensor], u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """The walk down the tree, one depth at a time, all rows at once.

        Returns:
            ``(out (B, D + 1) token per depth (last column: left for the bonus), path (B, D) node per depth,
            lead (B,) depths accepted inside the image, leaf_p (B, V) the row after the last node)``.
        """
        batch, depth_n = state.batch, self.tree.depth
        cur_p, cur = p[:, 0], torch.zeros(batch, dtype=torch.long, device=p.device)
        alive = torch.ones(batch, dtype=torch.bool, device=p.device)
        lead = torch.zeros_like(cur)
        path = torch.zeros(batch, depth_n, dtype=torch.long, device=p.device)
        out = torch.zeros(batch, depth_n + 1, dtype=torch.long, device=p.device)
        for d in range(depth_n):
            b, lo = int(self.tree.branching[d]), self.tree.offsets[d]
            kids = lo + cur.unsqueeze(1) * b + torch.arange(b, device=p.device)  # (B, b) flat node indices
            chosen, resid = self.test_children(cur_p, nodes.gather(1, kids), valid.gather(1, kids),
                                               qs[d][self.rows, cur], u[:, d], alive)
            hit = chosen >= 0
            node = kids.gather(1, chosen.clamp(min=0).unsqueeze(1)).squeeze(1)
            out[:, d] = torch.where(hit, nodes.gather(1, node.unsqueeze(1)).squeeze(1), resid)
            path[:, d] = node
            in_image = state.commit + d < state.num_tokens
            state.proposed.add_(in_image.sum())
            alive = alive & hit & in_image
            lead += alive.long()
            cur = node - lo
            cur_p = p[self.rows, 1 + node]
        return out, path, lead, cur_p

    def __call__(self, state: RoundState) -> None:
        n, session, commit, tree = state.num_tokens, state.session, state.commit, self.tree
        nodes, valid, qs = _draft_tree(self.head, session, state.tokens, self.feats, self.cache, commit, tree,
                                       self.ancestors, self.sampling, self.generator, top=self.certain)
        self.draft_calls += tree.depth
        start = commit - 1
        logits = session.step_tree(state.tokens.gather(1, start.unsqueeze(1)).squeeze(1), start, nodes, self.node_depth,
                                   self.ancestors)
        hidden = session.last_hidden
        p = force(warp(logits, **self.sampling), window_forced(session, commit.unsqueeze(1) + self.rel))
        bmax = max(int(b) for b in tree.branching)
        u = uniform((state.batch, tree.depth, bmax, 2), self.generator, state.device)
        out, path, lead, leaf_p = self.walk(state, p, nodes, valid, qs, u)
        out[:, tree.depth] = sample(leaf_p, self.generator)  # bonus after a full path (drawn every round)
        state.accepted.add_(lead.sum())
        new_commit = commit + torch.minimum(lead + 1, n - commit)
        session.commit_tree(start, path)
        tokens = write_committed(state.tokens, commit, new_commit, out)
        # target features of positions commit .. commit + D along the path (real up to the new commit)
        branches = session.cfg_branches
        frow = torch.cat([torch.zeros_like(path[:, :1]), 1 + path], 1).repeat(branches, 1)
        real = hidden.gather(1, frow.unsqueeze(-1).expand(-1, -1, hidden.shape[-1]))
        fpos = (commit.unsqueeze(1) + torch.arange(tree.depth + 1, device=state.device)).repeat(branches, 1)
        self.feats.scatter_(1, fpos.unsqueeze(-1).expand(-1, -1, self.feats.shape[-1]), real.to(self.feats.dtype))
        state.advance(tokens, new_commit)


def lantern_tree_sample(session: LlamaGenSession, num_tokens: int, head: FeatureDrafter, neighbours: torch.Tensor,
                        tree: StaticTree, delta: float, lam: float | None, sampling: dict[str, Any],
                        generator: Generators, stats: SpecStats | None = None, bar: Any = None,
                        acceptance: str = "certain") -> torch.Tensor:
    """Sample ``(B, num_tokens)`` image tokens with LANTERN++ static-tree drafting.

    Args:
        session: an open :class:`~diffspec.ar_image.targets.llamagen_session.LlamaGenSession` (``step_tree``).
        num_tokens: image tokens per image.
        head: the drafter bound to the target's GPT.
        neighbours: ``(V, k)`` latent neighbourhoods of the target's codebook.
        tree: the static tree.
        delta, lam: relaxation (see :func:`~diffspec.ar_image.relaxed.relaxed_mrs`); ``0``/``None`` = exact.
        sampling: keyword arguments of :func:`~diffspec.speculation.sampling.warp`.
        generator: ``None``, a generator, or one per batch row.
        stats: counters as :func:`~diffspec.ar_image.lantern.lantern_sample` (``proposed`` counts
            path positions, ``tv_budget_mean`` is over tested candidates); ``extra["tree_nodes"]``.
        bar: a tqdm bar advanced by the tokens committed each round.
        acceptance: ``"certain"``: the children are the drafter's top tokens, tested in turn with
            :func:`~diffspec.ar_image.relaxed.certain_mrs` on the unnormalised rest of ``p``, one
            budget ``delta`` shared by the siblings (emitted law within ``delta`` of ``p``);
            ``"residual"``: the walk described above.

    Raises:
        ValueError: the session cannot verify trees or exposes no hidden states.
    """
    if not hasattr(session, "step_tree") or session.last_hidden is None:
        raise ValueError(f"{type(session).__name__} cannot verify token trees (step_tree/last_hidden): LANTERN++ "
                         "trees need a LlamaGen-style session")
    if acceptance not in ("certain", "residual"):
        raise ValueError(f"acceptance={acceptance!r}; allowed: ('certain', 'residual')")
    state = RoundState.start(session, num_tokens, sampling, generator, bar, width=num_tokens + tree.depth + 1)
    one_round = LanternTreeRound(head, neighbours, tree, delta, lam, sampling, generator, acceptance)
    run_rounds(state, one_round, bar)
    state.record(stats)
    if stats is not None:
        stats.draft_calls += one_round.draft_calls
        stats.extra["tv_budget_mean"] = float(one_round.budget_sum) / max(float(one_round.tested), 1.0)
        stats.extra["tree_nodes"] = tree.size
    return state.image_tokens
