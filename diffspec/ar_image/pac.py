"""``sjd-pac``: MC-SJD plus a tree of proactive alternatives at the window start, exact.

SJD-PAC (https://arxiv.org/abs/2603.18599) adds to MC-SJD's vectorised MRS ("adaptive
continuation", :func:`~diffspec.ar_image.jacobi.jacobi_sample` with ``coupling="maximal"``)
*proactive drafting*: where the last round's first rejection left the window, it also drafts
alternatives from the stale rows. Here, one round (:class:`PACRound`, run by the shared loop
:func:`~diffspec.ar_image.rounds.run_rounds`), for every batch row at once:

1. the window's main chain (``L`` drafts at ``c .. c + L - 1``, mc-sjd's drafts with their laws
   ``q``) is sibling 0 of a static ``width``-ary tree of ``depth`` levels
   (:class:`~diffspec.ar_image.tree.StaticTree` layout) hung on positions ``c .. c + D - 1``;
   every tree node's children at position ``c + d`` are drawn from the stale row ``q_d`` (the main
   draft's own law): sibling 0 by a fresh draw (the main draft on the main path), the others
   without replacement;
2. one target call (``session.step_tree``, tree attention mask) verifies the last committed token,
   the tree and the chain's tail past the tree;
3. the tree is walked level by level by recursive rejection sampling over siblings (sibling ``r``
   tested with ``MRS(p_r, q_r, x_r)``, ``q_r`` = ``q_d`` without the earlier siblings,
   ``p_{r+1} = (p_r - q_r)_+`` normalised after a rejection; no sibling accepted: commit the last
   residual draw), as SpecInfer / :func:`~diffspec.ar_image.lantern_tree.lantern_tree_sample` at
   ``delta = 0``: the committed token's law is the target's. A path that stays on the main chain
   continues with the chain's vectorised MRS (mc-sjd's rule); one that leaves it gets a bonus draw
   from its leaf's row;
4. the window moves as in mc-sjd (:func:`~diffspec.ar_image.jacobi.shift_window`): positions left
   are re-drafted by the chain's MRS outputs with ``q`` = their new rows.

Each round's first rejection is where mc-sjd loses most: the re-draft after it was drawn from a
stale context, so ``width - 1`` more candidates per level raise the chance of getting past it.
The cost is ``width + .. + width^depth - depth`` extra tokens per call (81 for 4 x 3).

Example:
    >>> from diffspec.ar_image.targets.toy import ToyTableTarget
    >>> target = ToyTableTarget(seed=0)
    >>> session = target.start(class_labels=[0, 1])
    >>> pac_sample(session, target.num_tokens, window=4, width=2, depth=2, init="uniform",
    ...            sampling={"temperature": 1.0}, generator=torch.Generator().manual_seed(0)).shape
    torch.Size([2, 6])
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from ..speculation.sampling import Generators, force, mrs, residual_law, sample, warp
from ..stats import SpecStats
from .jacobi import first_window, shift_window, window_drafts
from .rounds import RoundState, run_rounds, window_forced
from .tree import StaticTree

if TYPE_CHECKING:
    from .target import ARSession


def pac_layout(tree: StaticTree, length: int, device: torch.device | str
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Nodes fed per round: the tree (flat, level by level) then the chain's tail past the tree.

    Returns:
        ``(depth (M,), ancestors (M, M) bool, chain (length,))``: ``chain[k]`` is the node holding
        the main chain's draft ``k`` (sibling 0 at every tree level, then the tail).

    Example:
        >>> depth, anc, chain = pac_layout(StaticTree((2, 2)), 4, "cpu")
        >>> depth.tolist(), chain.tolist()
        ([1, 1, 2, 2, 2, 2, 3, 4], [0, 2, 6, 7])
    """
    tdepth, _, tanc = tree.layout(device)
    size, tail = tree.size, length - tree.depth
    main = torch.tensor(tree.offsets, device=device)  # index 0 of every level: the main path
    anc = torch.zeros(size + tail, size + tail, dtype=torch.bool, device=device)
    anc[:size, :size] = tanc
    anc[size:, :size] = tanc[main[-1]]
    anc[size:, size:] = torch.ones(tail, tail, dtype=torch.bool, device=device).tril()
    depth = torch.cat([tdepth, torch.arange(tree.depth + 1, length + 1, device=device)])
    return depth, anc, torch.cat([main, torch.arange(size, size + tail, device=device)])


def draft_alternatives(draft: torch.Tensor, q: torch.Tensor, tree: StaticTree, generator: Generators
                       ) -> tuple[torch.Tensor, torch.Tensor]:
    """The tree's nodes: at level ``d`` every parent gets ``width`` children from ``q[:, d]``.

    Sibling 0 is a fresh draw (the main draft ``draft[:, d]`` under the main parent), siblings
    ``r >= 1`` are drawn without replacement (from ``q`` without the earlier siblings).

    Returns:
        ``(nodes (B, tree.size), ok (B, tree.size) bool)``; ``ok`` is False where no mass was left.
    """
    nodes, oks = [], []
    for d, parents in enumerate([1, *tree.level_sizes[:-1]]):  # a loop over levels and siblings only
        qd = q[:, d].unsqueeze(1).expand(-1, parents, -1)
        x = sample(qd, generator)
        x[:, 0] = draft[:, d]
        taken = torch.zeros_like(qd).scatter_(-1, x.unsqueeze(-1), 1.0)
        picks, ok = [x], [torch.ones_like(x, dtype=torch.bool)]
        for _ in range(1, int(tree.branching[d])):
            rem = qd * (1 - taken)
            x = sample(rem, generator)
            picks.append(x)
            ok.append(rem.sum(-1) > 0)
            taken = taken.scatter(-1, x.unsqueeze(-1), 1.0)
        nodes.append(torch.stack(picks, -1).flatten(1))  # parent-major
        oks.append(torch.stack(ok, -1).flatten(1))
    return torch.cat(nodes, 1), torch.cat(oks, 1)


def walk_tree(p: torch.Tensor, q: torch.Tensor, nodes: torch.Tensor, ok: torch.Tensor, tree: StaticTree,
              in_image: torch.Tensor, generator: Generators
              ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Recursive rejection sampling down the tree (all rows at once, a loop over levels and siblings).

    Args:
        p: ``(B, 1 + M, V)`` target rows (row 0: the first tree level; row ``1 + j``: node ``j``'s children).
        q: ``(B, >= D, V)`` the stale row of each level (the law siblings are drawn from).
        in_image: ``(B, D)`` level ``d`` is inside the image.

    Returns:
        ``(out (B, D) token per level, path (B, D) node per level, lead (B,) levels accepted,
        cur (B,) index of the last node in its level (0 = main path), leaf_p (B, V) row after it)``.
    """
    batch, depth = nodes.shape[0], tree.depth
    rows = torch.arange(batch, device=p.device)
    cur_p, cur = p[:, 0], torch.zeros(batch, dtype=torch.long, device=p.device)
    alive = torch.ones(batch, dtype=torch.bool, device=p.device)
    lead = torch.zeros_like(cur)
    out = torch.zeros(batch, depth, dtype=torch.long, device=p.device)
    path = torch.zeros_like(out)
    tiny = torch.finfo(p.dtype).tiny
    for d in range(depth):
        width, lo = int(tree.branching[d]), tree.offsets[d]
        kids = lo + cur.unsqueeze(1) * width + torch.arange(width, device=p.device)
        x, okk = nodes.gather(1, kids), ok.gather(1, kids)
        qd, pr, taken = q[:, d], cur_p, torch.zeros_like(cur_p)
        chosen, resid = torch.full_like(cur, -1), torch.zeros_like(cur)
        for r in range(width):  # siblings: each test needs the last residual
            qr = qd * (1 - taken) if r else qd
            qr = qr / qr.sum(-1, keepdim=True).clamp_min(tiny)
            test = mrs(pr, qr, x[:, r], generator)
            searching = (chosen < 0) & okk[:, r]
            chosen = torch.where(searching & test.accepted, r, chosen)
            rejected = searching & ~test.accepted
            resid = torch.where(rejected, test.tokens, resid)
            pr = torch.where(rejected.unsqueeze(-1), residual_law(pr, qr), pr)
            taken = taken.scatter(-1, x[:, r].unsqueeze(-1), 1.0)
        hit = chosen >= 0
        node = kids.gather(1, chosen.clamp(min=0).unsqueeze(1)).squeeze(1)
        out[:, d] = torch.where(hit, nodes.gather(1, node.unsqueeze(1)).squeeze(1), resid)
        path[:, d] = node
        alive = alive & hit & in_image[:, d]
        lead += alive.long()
        cur = node - lo
        cur_p = p[rows, 1 + node]
    return out, path, lead, torch.where(alive, cur, -1), cur_p


def check_tree_session(session: ARSession, method: str) -> None:
    """Raise ``ValueError`` unless ``session`` verifies token trees (``step_tree``), as ``method``'s rounds need."""
    if not hasattr(session, "step_tree"):
        raise ValueError(f"{type(session).__name__} cannot verify token trees (step_tree): {method} needs a "
                         "LlamaGen-style or toy session; use mc-sjd")


class PACRound:
    """One ``sjd-pac`` round (the module docstring's steps 1-4) on a :class:`~diffspec.ar_image.rounds.RoundState`.

    Args:
        length: main-chain drafts per call (``>= 1``).
        tree: the alternatives tree (depth at most ``length``).
        init, sampling, generator: as :func:`pac_sample`.
    """

    def __init__(self, length: int, tree: StaticTree, init: str, sampling: dict[str, Any], generator: Generators
                 ) -> None:
        self.length, self.tree, self.init, self.sampling, self.generator = length, tree, init, sampling, generator
        self.alt_hits: torch.Tensor | int = 0  # tree levels accepted off the main chain

    def start(self, state: RoundState) -> None:
        """The layout fed per round and the first window."""
        dev = state.device
        self.node_depth, self.anc, self.chain = pac_layout(self.tree, self.length, dev)
        self.ar = torch.arange(self.length + 1, device=dev)
        self.offsets = torch.tensor(self.tree.offsets, device=dev)
        self.rel = torch.cat([self.node_depth.new_zeros(1), self.node_depth])  # logits row r predicts commit + rel[r]
        self.chain_rows = torch.cat([self.chain.new_zeros(1), 1 + self.chain])  # row of chain position commit + k
        self.alt_hits = torch.zeros((), dtype=torch.long, device=dev)
        self.q = first_window(state.session, state.tokens, self.length, self.init, self.generator)

    def __call__(self, state: RoundState) -> None:
        n, length, d_tree, commit = state.num_tokens, self.length, self.tree.depth, state.commit
        _, valid, draft = window_drafts(state.tokens, commit, length)
        tree_nodes, ok = draft_alternatives(draft, self.q, self.tree, self.generator)
        nodes = torch.cat([tree_nodes, draft[:, d_tree:]], 1)
        ok = torch.cat([ok, torch.ones_like(draft[:, d_tree:], dtype=torch.bool)], 1)
        start = commit - 1
        logits = state.session.step_tree(state.tokens.gather(1, start.unsqueeze(1)).squeeze(1), start, nodes,
                                         self.node_depth, self.anc)
        p = force(warp(logits, **self.sampling), window_forced(state.session, commit.unsqueeze(1) + self.rel))
        p_chain = p[:, self.chain_rows]  # (B, L + 1, V): the main chain's rows, as mc-sjd's window
        res = mrs(p_chain[:, :length], self.q, draft, self.generator)
        out, path, lead, cur, leaf_p = walk_tree(p, self.q, nodes, ok, self.tree, valid[:, :d_tree], self.generator)
        self.alt_hits += (path - self.offsets > 0).logical_and(self.ar[:d_tree] < lead.unsqueeze(1)).sum()
        main = cur == 0  # the whole tree passed on the main chain: continue as mc-sjd
        tail = (res.accepted[:, d_tree:] & valid[:, d_tree:]).long().cumprod(1).sum(1)
        lead = lead + torch.where(main, tail, 0)
        state.accepted.add_(lead.sum())
        state.proposed.add_(valid.sum())
        bonus = sample(p_chain[:, length], self.generator)
        commit_vals = torch.cat([out, res.tokens[:, d_tree:], bonus.unsqueeze(1)], 1)
        leaf = sample(leaf_p, self.generator)
        past = commit_vals[:, d_tree] if d_tree < length else leaf
        commit_vals[:, d_tree] = torch.where(main, past, leaf)
        state.session.commit_tree(start, torch.cat([path, self.chain[d_tree:].expand(state.batch, -1)], 1))
        new_commit = commit + torch.minimum(lead + 1, n - commit)
        tokens, self.q = shift_window(state.session, state.tokens, commit, new_commit, commit_vals, res.tokens,
                                      p_chain[:, :length], self.init, self.generator)
        state.advance(tokens, new_commit)


def pac_sample(session: ARSession, num_tokens: int, window: int, width: int, depth: int, init: str,
               sampling: dict[str, Any], generator: Generators, stats: SpecStats | None = None, bar: Any = None
               ) -> torch.Tensor:
    """Sample ``(B, num_tokens)`` image tokens with ``sjd-pac`` (see the module docstring); exact.

    Args:
        session: an open session with ``step_tree``/``commit_tree`` (LlamaGen-style, the toy target).
        num_tokens: image tokens per image.
        window: main-chain drafts per call (clipped to ``num_tokens - 1``).
        width, depth: the alternatives tree (``depth`` clipped to the window).
        init: first-draft rule (:func:`~diffspec.ar_image.jacobi.init_drafts`).
        sampling: keyword arguments of :func:`~diffspec.speculation.sampling.warp`.
        generator: ``None``, a generator, or one per batch row.
        stats: counters as mc-sjd, plus ``extra["tree_nodes"]`` (tokens fed per call) and
            ``extra["alternative_hits"]`` (tree levels accepted off the main chain).
        bar: a tqdm bar advanced by the tokens committed each round.

    Raises:
        ValueError: the session cannot verify token trees.
    """
    check_tree_session(session, "sjd-pac")
    state = RoundState.start(session, num_tokens, sampling, generator, bar)
    length = min(window, num_tokens - 1)
    tree = StaticTree((width,) * min(depth, max(length, 1)))
    one_round = PACRound(length, tree, init, sampling, generator)
    run_rounds(state, one_round, bar)
    state.record(stats)
    if stats is not None:
        stats.extra["tree_nodes"] = tree.size + max(length - tree.depth, 0)
        stats.extra["alternative_hits"] = int(one_round.alt_hits)
    return state.image_tokens
