"""LANTERN sampling loop: chain drafts from a feature drafter, verified with relaxed acceptance.

One round (:class:`LanternRound`, run by the shared loop :func:`~diffspec.ar_image.rounds.run_rounds`), for
every batch row at once (row ``b`` has committed ``c_b`` tokens and knows the
target's features ``F_0 .. F_{c_b - 1}``):

1. the drafter proposes ``L`` tokens autoregressively (``L`` drafter calls over the whole feature
   buffer, causal), each drawn from its CFG-mixed, warped law ``q`` which is recorded;
2. one ``session.step`` feeds the last committed token and the drafts; its rows give ``p`` for
   positions ``c_b .. c_b + L`` and the target's features there;
3. :func:`~diffspec.ar_image.relaxed.relaxed_mrs` over the window; the accepted prefix is
   committed, plus the residual draw at the first rejection, or a bonus draw after a fully
   accepted window. Target features of the accepted positions replace the drafted ones.

The static per-row KV cache makes rollback free; rows near the image end feed from an earlier
start so every row feeds the same number of tokens. One host sync per round.
``delta = 0`` (and no ``lam``) is exact speculative sampling: the output law is the plain loop's.

Example:
    >>> tokens = lantern_sample(session, 64, head, neighbours, draft_length=4, delta=0.1, lam=None,
    ...                         sampling={"temperature": 1.0}, generator=torch.Generator())  # doctest: +SKIP
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from ..speculation.sampling import Generators, force, sample, warp
from ..stats import SpecStats
from .relaxed import relaxed_mrs
from .rounds import RoundState, run_rounds, window_forced, write_committed
from .target import mix_cfg

if TYPE_CHECKING:
    from .drafter import FeatureDrafter
    from .target import ARSession


def draft_chain(head: FeatureDrafter, session: ARSession, tokens: torch.Tensor, feats: torch.Tensor,
                cache: list[tuple[torch.Tensor, torch.Tensor]], commit: torch.Tensor, length: int,
                sampling: dict[str, Any], generator: Generators, top: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Draft ``length`` tokens per row from position ``commit``; writes them into ``tokens``/``feats``.

    The first drafter call re-feeds the ``length + 2`` pairs ending at ``commit - 1`` (every pair
    the last verification may have changed), the next ones one new pair each, over the drafter's
    static KV cache ``cache``.

    Args:
        top: draft the drafter's most likely token (certain candidates) instead of a draw from ``q``.
        tokens: ``(B, S)`` token buffer (committed tokens before ``commit``); drafts are written in place.
        feats: ``(R, S, dim)`` feature buffer, ``R = cfg_branches * B`` (real features before ``commit``).

    Returns:
        ``(drafts (B, length), q (B, length, V))``.
    """
    batch, branches = session.batch_size, session.cfg_branches
    scale = getattr(session, "guidance_scale", 1.0)
    dim = feats.shape[-1]
    drafts, qs = [], []
    for k in range(length):  # the drafter is autoregressive: one call per draft
        pos = commit - 1 + k
        first = (commit - length - 2).clamp(min=0) if k == 0 else pos
        fed = (first.unsqueeze(1) + torch.arange(length + 2 if k == 0 else 1, device=pos.device)).repeat(branches, 1)
        out = head.features(tokens.repeat(branches, 1).gather(1, fed),
                            feats.gather(1, fed.unsqueeze(-1).expand(-1, -1, dim)), fed, cache)
        rows = pos.repeat(branches)
        f = out.gather(1, (rows - fed[:, 0]).view(-1, 1, 1).expand(-1, 1, dim))  # (R, 1, dim)
        q = warp(mix_cfg(head.logits(f[:, 0]), batch, scale), **sampling)
        q = force(q, window_forced(session, pos + 1))
        d = q.argmax(-1) if top else sample(q, generator)
        tokens.scatter_(1, (pos + 1).unsqueeze(1), d.unsqueeze(1))
        feats.scatter_(1, (rows + 1).view(-1, 1, 1).expand(-1, 1, f.shape[-1]), f.to(feats.dtype))
        drafts.append(d)
        qs.append(q)
    return torch.stack(drafts, 1), torch.stack(qs, 1)


class LanternRound:
    """One LANTERN round (the module docstring's steps 1-3) on a :class:`~diffspec.ar_image.rounds.RoundState`
    whose token buffer holds ``num_tokens + length + 1`` positions.

    Args:
        length: drafts per round (``>= 1``).
        head, neighbours, delta, lam, sampling, generator, acceptance: as :func:`lantern_sample`.
    """

    def __init__(self, head: FeatureDrafter, neighbours: torch.Tensor, length: int, delta: float, lam: float | None,
                 sampling: dict[str, Any], generator: Generators, acceptance: str = "certain") -> None:
        self.head, self.neighbours, self.length, self.delta, self.lam = head, neighbours, length, delta, lam
        self.sampling, self.generator, self.acceptance = sampling, generator, acceptance
        self.draft_calls = 0
        self.budget_sum: torch.Tensor | float = 0.0  # neighbour mass moved onto the verified drafts

    def start(self, state: RoundState) -> None:
        """The drafter's feature buffer (the prefill's feature at position 0) and its static KV cache."""
        session, rows, size = state.session, state.batch * state.session.cfg_branches, state.tokens.shape[1]
        hidden = session.last_hidden
        self.feats = torch.zeros(rows, size, hidden.shape[-1], device=state.device, dtype=hidden.dtype)
        self.feats[:, 0] = hidden[:, -1]
        self.cache = self.head.new_cache(rows, size)
        self.ar = torch.arange(self.length + 1, device=state.device)
        self.budget_sum = torch.zeros((), device=state.device)

    def real_features(self, state: RoundState, hidden: torch.Tensor, idx: torch.Tensor) -> None:
        """Replace the drafted features at positions ``commit .. commit + L`` by the target's (``hidden`` rows
        ``idx``; valid up to the first rejection, the rest is overwritten before it is read)."""
        branches, length = state.session.cfg_branches, self.length
        real = hidden.gather(1, idx.repeat(branches, 1).unsqueeze(-1).expand(-1, -1, hidden.shape[-1]))
        cols = torch.arange(state.tokens.shape[1], device=state.device)
        rel = (cols - state.commit.unsqueeze(1)).repeat(branches, 1)
        in_win = ((rel >= 0) & (rel <= length)).unsqueeze(-1)
        self.feats = torch.where(in_win, real.gather(1, rel.clamp(0, length).unsqueeze(-1).expand(
            -1, -1, real.shape[-1])), self.feats)

    def __call__(self, state: RoundState) -> None:
        n, length, ar, commit, session = state.num_tokens, self.length, self.ar, state.commit, state.session
        drafts, q = draft_chain(self.head, session, state.tokens, self.feats, self.cache, commit, length,
                                self.sampling, self.generator, top=self.acceptance == "certain")
        self.draft_calls += length
        start = torch.clamp(commit - 1, max=n - length - 1)
        logits = session.step(state.tokens.gather(1, start.unsqueeze(1) + ar), start)
        hidden = session.last_hidden
        idx = ((commit - 1 - start).unsqueeze(1) + ar).clamp(max=length)  # row of position commit + k
        p = warp(logits.gather(1, idx.unsqueeze(-1).expand(-1, -1, logits.shape[-1])), **self.sampling)
        pos = commit.unsqueeze(1) + ar
        p = force(p, window_forced(session, pos))
        valid = pos[:, :length] < n
        res = relaxed_mrs(p[:, :length], q, drafts, self.neighbours, self.delta, self.lam, self.generator,
                          self.acceptance)
        lead = (res.accepted & valid).long().cumprod(1).sum(1)
        state.accepted.add_(lead.sum())
        state.proposed.add_(valid.sum())
        self.budget_sum += (res.budget * valid).sum()
        commit_vals = torch.cat([res.tokens, sample(p[:, length], self.generator).unsqueeze(1)], 1)
        new_commit = commit + torch.minimum(lead + 1, n - commit)
        tokens = write_committed(state.tokens, commit, new_commit, commit_vals)
        self.real_features(state, hidden, idx)
        state.advance(tokens, new_commit)


def lantern_sample(session: ARSession, num_tokens: int, head: FeatureDrafter, neighbours: torch.Tensor,
                   draft_length: int, delta: float, lam: float | None, sampling: dict[str, Any],
                   generator: Generators, stats: SpecStats | None = None, bar: Any = None,
                   acceptance: str = "certain") -> torch.Tensor:
    """Sample ``(B, num_tokens)`` image tokens with LANTERN (relaxed unless ``delta = 0`` and no ``lam``).

    Args:
        session: an open session exposing ``last_hidden`` (LlamaGen targets).
        num_tokens: image tokens per image.
        head: the drafter bound to the target's GPT.
        neighbours: ``(V, k)`` latent neighbourhoods of the target's codebook.
        draft_length: drafts per round (clipped to ``num_tokens - 1``).
        delta, lam: relaxation (see :func:`~diffspec.ar_image.relaxed.relaxed_mrs`).
        sampling: keyword arguments of :func:`~diffspec.speculation.sampling.warp`.
        generator: ``None``, a generator, or one per batch row.
        stats: counters (``target_calls`` with the prefill, ``draft_calls``, ``accepted``/``proposed``,
            ``extra``: ``step_compression``, ``tokens_per_call``, ``tv_budget_mean`` over verified drafts).
        bar: a tqdm bar advanced by the tokens committed each round.
        acceptance: ``"certain"`` (drafts = the drafter's argmax, emitted law within ``delta``) or
            ``"residual"`` (drafts from ``q``); see :func:`~diffspec.ar_image.relaxed.relaxed_mrs`.

    Raises:
        ValueError: the session does not expose its hidden states.
    """
    if session.last_hidden is None:
        raise ValueError(f"{type(session).__name__} exposes no last_hidden: LANTERN's drafter needs the target's "
                         "features (LlamaGen targets provide them)")
    length = max(1, min(draft_length, num_tokens - 1))
    state = RoundState.start(session, num_tokens, sampling, generator, bar, width=num_tokens + length + 1)
    one_round = LanternRound(head, neighbours, length, delta, lam, sampling, generator, acceptance)
    run_rounds(state, one_round, bar)
    state.record(stats)
    if stats is not None:
        stats.draft_calls += one_round.draft_calls
        stats.extra["tv_budget_mean"] = float(one_round.budget_sum) / max(int(state.proposed), 1)
    return state.image_tokens
