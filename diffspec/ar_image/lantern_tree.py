"""LANTERN++ static-tree drafting: a drafter token tree verified in one target call, relaxed acceptance.

A static tree is given by per-depth branching factors ``(b_1, .., b_D)``: every node at depth
``d - 1`` has ``b_d`` children, so level ``d`` holds ``b_1 * .. * b_d`` nodes (flat index: level by
level, parent-major). One round, for every batch row and CFG branch at once:

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
    >>> StaticTree((2, 2, 1)).level_sizes
    [2, 4, 4]
    >>> tokens = lantern_tree_sample(session, 64, head, neighbours, StaticTree((4, 2, 1)), 0.1, 2.0,
    ...                              {"temperature": 1.0}, torch.Generator())  # doctest: +SKIP
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from .. import kernels
from ..speculation.sampling import Generators, force, sample, uniform, warp
from ..stats import SpecStats
from .plain import record_rounds, round_progress, window_forced
from .relaxed import certain_mrs, neighbour_budget
from .target import mix_cfg

if TYPE_CHECKING:
    from .drafter import FeatureDrafter
    from .targets.llamagen_session import LlamaGenSession


@dataclass(frozen=True)
class StaticTree:
    """A static draft tree: ``branching[d - 1]`` children per node at depth ``d - 1`` (the root is depth 0).

    Example:
        >>> tree = StaticTree((2, 1))
        >>> tree.size, tree.offsets, tree.layout("cpu")[1].tolist()
        (4, [0, 2], [-1, -1, 0, 1])
    """

    branching: tuple[int, ...]

    def __post_init__(self) -> None:
        if not self.branching or any(int(b) < 1 for b in self.branching):
            raise ValueError(f"tree={self.branching!r} must be a non-empty tuple of branching factors >= 1")

    @property
    def depth(self) -> int:
        """Draft depth ``D`` (tokens on a full path)."""
        return len(self.branching)

    @property
    def level_sizes(self) -> list[int]:
        """Nodes per depth ``1..D``."""
        sizes, n = [], 1
        for b in self.branching:
            n *= int(b)
            sizes.append(n)
        return sizes

    @property
    def offsets(self) -> list[int]:
        """Flat index of each level's first node."""
        return [sum(self.level_sizes[:d]) for d in range(self.depth)]

    @property
    def size(self) -> int:
        """Total nodes ``M``."""
        return sum(self.level_sizes)

    def layout(self, device: torch.device | str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(depth (M,), parent (M,) flat index or -1, ancestors (M, M) bool, self included)``."""
        depth = torch.cat([torch.full((n,), d + 1) for d, n in enumerate(self.level_sizes)])
        parent = torch.full((self.size,), -1)
        anc = torch.eye(self.size, dtype=torch.bool)
        for d in range(1, self.depth):  # a level at a time: its parents' rows are complete
            lo, n, b = self.offsets[d], self.level_sizes[d], int(self.branching[d])
            parent[lo: lo + n] = self.offsets[d - 1] + torch.arange(n) // b
            anc[lo: lo + n] |= anc[parent[lo: lo + n]]
        return depth.to(device), parent.to(device), anc.to(device)


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
    batch, n, branches = session.batch_size, num_tokens, session.cfg_branches
    dev = session.first_logits.device
    certain = acceptance == "certain"
    if not certain and acceptance != "residual":
        raise ValueError(f"acceptance={acceptance!r}; allowed: ('certain', 'residual')")
    greedy = certain or sampling.get("temperature", 1.0) == 0
    depth_n = tree.depth
    depth, _, ancestors = tree.layout(dev)
    size = n + depth_n + 1
    hid = session.last_hidden
    tokens = torch.zeros(batch, size, dtype=torch.long, device=dev)
    feats = torch.zeros(batch * branches, size, hid.shape[-1], device=dev, dtype=hid.dtype)
    feats[:, 0] = hid[:, -1]
    cache = head.new_cache(batch * branches, size + tree.size)
    p0 = force(warp(session.first_logits, **sampling), window_forced(session, torch.zeros(batch, dtype=torch.long,
                                                                                           device=dev)))
    tokens[:, 0] = sample(p0, generator)
    commit = torch.ones(batch, dtype=torch.long, device=dev)
    calls, draft_calls = 1, 0
    row_calls = torch.ones(batch, device=dev)
    accepted = torch.zeros((), dtype=torch.long, device=dev)
    proposed = torch.zeros((), dtype=torch.long, device=dev)
    budget_sum, tested = torch.zeros((), device=dev), torch.zeros((), device=dev)
    bmax = max(int(b) for b in tree.branching)
    rows_b = torch.arange(batch, device=dev)
    done, total = 1, batch
    if bar is not None:
        bar.update(batch)
    while done < n:
        nodes, valid, qs = _draft_tree(head, session, tokens, feats, cache, commit, tree, ancestors, sampling,
                                       generator, top=certain)
        draft_calls += depth_n
        start = commit - 1
        logits = session.step_tree(tokens.gather(1, start.unsqueeze(1)).squeeze(1), start, nodes, depth, ancestors)
        hidden = session.last_hidden
        calls += 1
        row_calls += (commit < n).float()
        rel = torch.cat([depth.new_zeros(1), depth])  # row offset from `commit` of each logits row
        p = force(warp(logits, **sampling), window_forced(session, commit.unsqueeze(1) + rel))
        u = uniform((batch, depth_n, bmax, 2), generator, dev)
        cur_p, cur = p[:, 0], torch.zeros(batch, dtype=torch.long, device=dev)
        alive = torch.ones(batch, dtype=torch.bool, device=dev)
        lead = torch.zeros(batch, dtype=torch.long, device=dev)
        path = torch.zeros(batch, depth_n, dtype=torch.long, device=dev)
        out = torch.zeros(batch, depth_n + 1, dtype=torch.long, device=dev)
        for d in range(depth_n):  # walk one depth at a time, all rows at once
            b, lo = int(tree.branching[d]), tree.offsets[d]
            kids = lo + cur.unsqueeze(1) * b + torch.arange(b, device=dev)  # (B, b) flat node indices
            x, ok = nodes.gather(1, kids), valid.gather(1, kids)
            q_par = qs[d][rows_b, cur]  # (B, V) drafter law at the current node
            chosen = torch.full((batch,), -1, dtype=torch.long, device=dev)
            resid = torch.zeros(batch, dtype=torch.long, device=dev)
            pr, taken = cur_p, torch.zeros_like(q_par)
            spent = torch.zeros(batch, device=dev)
            for r in range(b):  # siblings: recursive rejection, each test needs the last residual
                xr = x[:, r]
                searching = (chosen < 0) & ok[:, r]
                if certain:  # pr: unnormalised rest of p; the siblings share one budget
                    acc, tok, budget, rest = certain_mrs(pr, xr, neighbours, (delta - spent).clamp_min(0), lam,
                                                         u[:, d, r, 0], u[:, d, r, 1])
                    budget_sum += (budget * (searching & alive)).sum()
                    tested += (searching & alive).sum()
                    chosen = torch.where(searching & acc, r, chosen)
                    rejected = searching & ~acc
                    resid = torch.where(rejected, tok, resid)
                    spent = spent + torch.where(searching, budget, 0.0)
                    pr = torch.where(rejected.unsqueeze(-1), rest, pr)
                    continue
                if greedy:
                    qr = torch.zeros_like(q_par).scatter_(-1, xr.unsqueeze(-1), 1.0)
                elif r == 0:
                    qr = q_par
                else:
                    qr = q_par * (1 - taken)
                    qr = qr / qr.sum(-1, keepdim=True).clamp_min(torch.finfo(qr.dtype).tiny)
                budget = neighbour_budget(pr, xr, neighbours, delta, lam)
                px, qx = pr.gather(-1, xr.unsqueeze(-1)).squeeze(-1), qr.gather(-1, xr.unsqueeze(-1)).squeeze(-1)
                acc, tok = kernels.rejection_sample(pr, qr, xr, u[:, d, r, 0], u[:, d, r, 1],
                                                    accept_mass=(px + budget, qx))
                budget_sum += (budget * (searching & alive)).sum()
                tested += (searching & alive).sum()
                chosen = torch.where(searching & acc, r, chosen)
                rejected = searching & ~acc
                resid = torch.where(rejected, tok, resid)
                res = (pr - qr).clamp_min(0)
                mass = res.sum(-1, keepdim=True)
                res = torch.where(mass > 0, res / mass.clamp_min(torch.finfo(res.dtype).tiny), pr)
                pr = torch.where(rejected.unsqueeze(-1), res, pr)
                taken = taken.scatter(-1, xr.unsqueeze(-1), 1.0)
            hit = chosen >= 0
            node = kids.gather(1, chosen.clamp(min=0).unsqueeze(1)).squeeze(1)
            out[:, d] = torch.where(hit, nodes.gather(1, node.unsqueeze(1)).squeeze(1), resid)
            path[:, d] = node
            in_image = commit + d < n
            proposed += in_image.sum()
            alive = alive & hit & in_image
            lead += alive.long()
            cur = node - lo
            cur_p = p[rows_b, 1 + node]
        out[:, depth_n] = sample(cur_p, generator)  # bonus after a full path (drawn every round)
        accepted += lead.sum()
        new_commit = commit + torch.minimum(lead + 1, n - commit)
        session.commit_tree(start, path)
        ar = torch.arange(depth_n + 1, device=dev)
        cols = torch.arange(size, device=dev)
        rel_c = cols - commit.unsqueeze(1)
        is_commit = (rel_c >= 0) & (cols < new_commit.unsqueeze(1))
        tokens = torch.where(is_commit, out.gather(1, rel_c.clamp(0, depth_n)), tokens)
        # target features of positions commit .. commit + D along the path (real up to the new commit)
        frow = torch.cat([torch.zeros_like(path[:, :1]), 1 + path], 1).repeat(branches, 1)
        real = hidden.gather(1, frow.unsqueeze(-1).expand(-1, -1, hidden.shape[-1]))
        fpos = (commit.unsqueeze(1) + ar).repeat(branches, 1)
        feats.scatter_(1, fpos.unsqueeze(-1).expand(-1, -1, feats.shape[-1]), real.to(feats.dtype))
        commit = new_commit
        done, total = round_progress(commit, bar, total)  # the round's one host sync
    record_rounds(stats, session, n, calls, row_calls, accepted, proposed)
    if stats is not None:
        stats.draft_calls += draft_calls
        stats.extra["tv_budget_mean"] = float(budget_sum) / max(float(tested), 1.0)
        stats.extra["tree_nodes"] = tree.size
    return tokens[:, :n]
