"""Speculative Jacobi decoding engine (``sjd``, ``mc-sjd``), batched over images, exact.

One round (:class:`JacobiRound`, run by the shared loop :func:`~diffspec.ar_image.rounds.run_rounds`), for
every batch row at once (row ``b`` has committed ``c_b`` tokens and holds drafts
for positions ``c_b .. c_b + L - 1``, clipped at the image end):

1. one ``session.step`` feeds the last committed token and the ``L`` drafts; its rows give
   ``p^t`` for positions ``c_b .. c_b + L`` (forced tokens made one-hot);
2. modified rejection sampling of every draft against ``p^t`` with its recorded ``q``
   (:func:`~diffspec.speculation.sampling.mrs`); the accepted prefix is committed, plus the MRS
   output at the first rejection, or a bonus draw from the row after a fully accepted window;
3. the positions left in the window are re-drafted from ``p^t`` (``independent``: fresh draws;
   ``maximal``: the MRS outputs of step 2, i.e. the old draft kept with probability ``1 - TV``; under a
   relaxed rule, those of the exact test on the same uniforms, since the rule's outputs do not follow ``p^t``;
   ``gumbel``: ``argmax(log p^t + g_j)`` with one fixed Gumbel vector per position) and their
   ``q`` set to ``p^t`` (kept or not); positions entering the window get ``init`` drafts.

The static per-row KV cache makes rollback free: the next round simply feeds from the new commit
point. Rows near the image end feed from an earlier start (re-feeding committed tokens) so every
row feeds the same number of tokens. The only host sync is one per round (loop end / progress).

Example:
    >>> from diffspec.ar_image.targets.toy import ToyTableTarget
    >>> target = ToyTableTarget(seed=0)
    >>> session = target.start(class_labels=[0, 1, 0])
    >>> tokens = jacobi_sample(session, target.num_tokens, window=4, coupling="maximal", init="uniform",
    ...                        sampling={"temperature": 1.0}, generator=torch.Generator().manual_seed(0))
    >>> tokens.shape
    torch.Size([3, 6])
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from ..speculation.sampling import (
    Generators,
    GumbelTable,
    MRSResult,
    force,
    gumbel_argmax,
    mrs,
    sample,
    uniform,
    warp,
)
from ..stats import SpecStats
from .rounds import RoundState, generator_list, run_rounds, window_forced, write_committed

if TYPE_CHECKING:
    from .target import ARSession


Acceptance = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, Generators], MRSResult]
"""The verification rule ``(p, q, drafts, generator) -> MRSResult`` (signature of
:func:`~diffspec.speculation.sampling.mrs`, the exact default); relaxed rules (``gsd``) return a ``relaxation`` per
position and ``exact_tokens``."""


def init_drafts(init: str, batch: int, length: int, vocab: int, left: torch.Tensor, generator: Generators,
                forced: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """First drafts of ``length`` positions per row and the law each was drawn from.

    Args:
        init: ``"uniform"`` (uniform token, q uniform), ``"uniform-onehot"`` (uniform token, q
            one-hot) or ``"repeat"`` (``left`` token, q one-hot).
        left: ``(B,)`` token copied by ``"repeat"``.
        forced: ``(B, length)`` forced token or -1 at those positions (None: nothing forced).

    Returns:
        ``(drafts (B, length), q (B, length, vocab))``.
    """
    u = uniform((batch, length), generator, left.device)
    if init == "repeat":
        drafts = left.unsqueeze(1).expand(batch, length).clone()
    else:
        drafts = (u * vocab).long().clamp_(max=vocab - 1)
    if forced is not None:
        drafts = torch.where(forced >= 0, forced, drafts)
    onehot = torch.zeros(batch, length, vocab, device=left.device).scatter_(-1, drafts.unsqueeze(-1), 1.0)
    if init != "uniform":
        return drafts, onehot
    q = torch.full_like(onehot, 1.0 / vocab)
    return drafts, q if forced is None else torch.where((forced >= 0).unsqueeze(-1), onehot, q)


def first_window(session: ARSession, tokens: torch.Tensor, length: int, init: str,
                 generator: Generators) -> torch.Tensor:
    """Fill positions ``1 .. length`` of ``tokens`` ``(B, N)`` (one committed token so far) with first drafts.

    Returns:
        ``(B, length, V)`` the law each draft was drawn from (:func:`init_drafts`).
    """
    batch, vocab = tokens.shape[0], session.first_logits.shape[-1]
    pos = 1 + torch.arange(length, device=tokens.device).expand(batch, -1)
    drafts, q = init_drafts(init, batch, length, vocab, tokens[:, 0], generator, window_forced(session, pos))
    tokens[:, 1:length + 1] = drafts
    return q


def window_drafts(tokens: torch.Tensor, commit: torch.Tensor, length: int
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The window of each row: ``(pos (B, L + 1) absolute positions from the commit point, valid (B, L) inside the
    image, draft (B, L) tokens)``."""
    n = tokens.shape[1]
    pos = commit.unsqueeze(1) + torch.arange(length + 1, device=tokens.device)
    return pos, pos[:, :length] < n, tokens.gather(1, pos[:, :length].clamp(max=n - 1))


def shift_window(session: ARSession, tokens: torch.Tensor, commit: torch.Tensor, new_commit: torch.Tensor,
                 commit_vals: torch.Tensor, redraft: torch.Tensor, q_re: torch.Tensor, init: str,
                 generator: Generators) -> tuple[torch.Tensor, torch.Tensor]:
    """After a round: commit ``commit_vals`` and move the window of ``L`` drafts to ``new_commit``.

    Args:
        tokens: ``(B, N)`` committed tokens, then the window's drafts.
        commit, new_commit: ``(B,)`` commit points before and after the round.
        commit_vals: ``(B, L + 1)`` values of positions ``commit + k`` (those below ``new_commit`` are committed).
        redraft: ``(B, L)`` next draft of old window slot ``k`` (position ``commit + k``), with law ``q_re`` ``(B, L, V)``.
        init: rule for positions entering the window (:func:`init_drafts`).

    Returns:
        ``(tokens, q)``: the updated tokens and the ``(B, L, V)`` law of each draft of the new window.
    """
    batch, n = tokens.shape
    length, vocab = redraft.shape[1], q_re.shape[-1]
    ar = torch.arange(length, device=tokens.device)
    cols = torch.arange(n, device=tokens.device)
    step = new_commit - commit
    # window slot k' of the new window was slot k' + step of the old one, or is new
    src = ar + step.unsqueeze(1)
    from_old = src < length
    src = src.clamp(max=length - 1)
    kept = redraft.gather(1, src)
    q_kept = q_re.gather(1, src.unsqueeze(-1).expand(-1, -1, vocab))
    tokens = write_committed(tokens, commit, new_commit, commit_vals)
    rel_w = cols - new_commit.unsqueeze(1)
    in_win = (rel_w >= 0) & (rel_w < length)
    rel_w = rel_w.clamp(0, length - 1)
    tokens = torch.where(in_win & from_old.gather(1, rel_w), kept.gather(1, rel_w), tokens)
    first_new = torch.maximum(commit + length, new_commit)
    left = tokens.gather(1, (first_new - 1).clamp(max=n - 1).unsqueeze(1)).squeeze(1)
    new_pos = new_commit.unsqueeze(1) + ar
    fresh, q_fresh = init_drafts(init, batch, length, vocab, left, generator, window_forced(session, new_pos))
    drafts = torch.where(from_old, kept, fresh)
    q = torch.where(from_old.unsqueeze(-1), q_kept, q_fresh)
    return torch.where(in_win, drafts.gather(1, rel_w), tokens), q


class JacobiRound:
    """One round of speculative Jacobi decoding (the module docstring's steps 1-3) on a :class:`RoundState`.

    Args:
        window: drafts verified per call (clipped to ``num_tokens - 1``).
        coupling, init, sampling, generator, acceptance: as :func:`jacobi_sample`.
    """

    def __init__(self, window: int, coupling: str, init: str, sampling: dict[str, Any], generator: Generators,
                 acceptance: Acceptance | None = None) -> None:
        self.window, self.coupling, self.init = window, coupling, init
        self.sampling, self.generator = sampling, generator
        self.verify = mrs if acceptance is None else acceptance

    def start(self, state: RoundState) -> None:
        """Draw the first window (and the Gumbel table of ``gumbel``)."""
        self.length = min(self.window, state.num_tokens - 1)
        self.ar = torch.arange(self.length + 1, device=state.device)
        self.vocab = state.session.first_logits.shape[-1]
        q = first_window(state.session, state.tokens, self.length, self.init, self.generator)
        self.table = (GumbelTable(state.batch, self.length, self.vocab, self.generator, state.device)
                      if self.coupling == "gumbel" else None)
        self.q = q.contiguous().clone() if state.graphed else q  # written in place: its own dense storage

    def window_laws(self, state: RoundState) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """The round's target call: ``(p (B, L + 1, V) at positions commit + k, pos, valid, draft)``
        (:func:`window_drafts`); rows near the image end feed from an earlier start, so all feed ``L + 1`` tokens."""
        n, length, ar, commit = state.num_tokens, self.length, self.ar, state.commit
        start = torch.clamp(commit - 1, max=n - length - 1)
        logits = state.session.step(state.tokens.gather(1, start.unsqueeze(1) + ar), start)
        idx = (commit - 1 - start).unsqueeze(1) + ar  # logits row of position commit + k
        logits = logits.gather(1, idx.clamp(max=length).unsqueeze(-1).expand(-1, -1, self.vocab))
        pos, valid, draft = window_drafts(state.tokens, commit, length)
        return force(warp(logits, **self.sampling), window_forced(state.session, pos)), pos, valid, draft

    def redraft(self, p: torch.Tensor, res: MRSResult, pos: torch.Tensor) -> torch.Tensor:
        """Next drafts of the window's positions, each drawn from its row of ``p`` ``(B, L, V)``: fresh draws
        (``independent``), the verification's outputs (``maximal``; a relaxed rule's exact twin, since the rule's
        own outputs do not follow ``p``) or Gumbel-max draws with the positions' fixed noise (``gumbel``)."""
        if self.coupling == "independent":
            return sample(p, self.generator)
        if self.coupling == "maximal":
            return res.tokens if res.relaxation is None else res.exact_tokens
        return gumbel_argmax(p, self.table.noise(pos[:, : self.length]))  # type: ignore[union-attr]

    def __call__(self, state: RoundState) -> None:
        n, length, commit = state.num_tokens, self.length, state.commit
        p, pos, valid, draft = self.window_laws(state)
        res = self.verify(p[:, :length], self.q, draft, self.generator)
        lead = (res.accepted & valid).long().cumprod(1).sum(1)
        if res.relaxation is not None:
            decided = (self.ar[:length] <= lead.unsqueeze(1)) & valid
            state.relaxed.add_(torch.stack([(res.relaxation * decided).sum(), decided.sum().float()]))
        state.accepted.add_(lead.sum())
        state.proposed.add_(valid.sum())
        commit_vals = torch.cat([res.tokens, sample(p[:, length], self.generator).unsqueeze(1)], 1)
        new_commit = commit + torch.minimum(lead + 1, n - commit)
        redraft = self.redraft(p[:, :length], res, pos)
        tokens, q = shift_window(state.session, state.tokens, commit, new_commit, commit_vals, redraft,
                                 p[:, :length], self.init, self.generator)
        if self.table is not None:
            self.table.advance(commit, new_commit)
        if state.graphed:
            self.q.copy_(q)
        else:
            self.q = q
        state.advance(tokens, new_commit)


def jacobi_sample(session: ARSession, num_tokens: int, window: int, coupling: str, init: str,
                  sampling: dict[str, Any], generator: Generators, stats: SpecStats | None = None,
                  bar: Any = None, acceptance: Acceptance | None = None, cuda_graphs: bool = False) -> torch.Tensor:
    """Sample ``(B, num_tokens)`` image tokens by speculative Jacobi decoding (exact with the default acceptance).

    Args:
        session: an open session (CFG is inside it).
        num_tokens: image tokens per image.
        window: drafts verified per call (clipped to ``num_tokens - 1``).
        coupling: ``"independent"`` (SJD), ``"maximal"`` or ``"gumbel"`` (MC-SJD).
        init: first-draft rule (see :func:`init_drafts`).
        sampling: keyword arguments of :func:`~diffspec.speculation.sampling.warp`.
        generator: ``None``, a generator, or one per batch row (row ``b``'s result then does
            not depend on the other rows).
        stats: counters to fill (``target_calls`` counts the prefill as one call).
        bar: a tqdm bar advanced by the tokens committed each round.
        acceptance: the verification rule (default :func:`~diffspec.speculation.sampling.mrs`, exact);
            its outputs are also the ``maximal`` re-drafts. A relaxed rule (one that reports
            ``relaxation``) must also return ``exact_tokens``
            (:func:`~diffspec.speculation.sampling.exact_twin`): its own outputs do not follow ``p``, so the
            re-drafts are the exact test's, every draft's ``q`` stays the law it was drawn from, and the
            relaxation is spent only on the tokens the rule commits. Its mean ``relaxation`` over the
            positions it decided (accepted prefix + first rejection) goes to ``stats.extra["relaxed_tv"]``.
        cuda_graphs: run the first round eagerly, then replay every later round (target call, acceptance,
            re-drafts and window bookkeeping) from one CUDA graph, so a round costs one replay and the one
            host sync (see :func:`check_graphable`: CUDA session, CUDA generators or ``None``, no ``gumbel``).

    Returns:
        Image tokens, distributed exactly as the plain loop's (default acceptance).
    """
    if cuda_graphs:
        check_graphable(session, coupling, generator)
    state = RoundState.start(session, num_tokens, sampling, generator, bar, graphed=cuda_graphs)
    one_round = JacobiRound(window, coupling, init, sampling, generator, acceptance)
    run_rounds(state, one_round, bar, generator)
    state.record(stats)
    if stats is not None and acceptance is not None:
        stats.extra["relaxed_tv"] = state.relaxed_tv()
    return state.image_tokens


def check_graphable(session: ARSession, coupling: str, generator: Generators) -> None:
    """Raise ``ValueError`` unless a Jacobi round of ``session`` can be captured in a CUDA graph.

    A captured round must not copy host data to the device (CPU generators draw on the host, forced tokens kept
    on the host would be copied) nor replace state it keeps between rounds (the ``gumbel`` coupling's table is
    rebuilt each round; a session's cache must be static: :attr:`~diffspec.ar_image.target.ARSession.graph_safe`).
    """
    device = session.first_logits.device
    if device.type != "cuda":
        raise ValueError(f"cuda_graphs=True needs a CUDA session, got device={str(device)!r}")
    if not getattr(session, "graph_safe", False):
        raise ValueError(f"cuda_graphs=True needs a session whose step can be replayed from a CUDA graph (a static "
                         f"KV cache, e.g. LlamaGen's); {type(session).__name__} is not graph_safe")
    forced = session.forced_tokens()
    if forced is not None and forced.device != device:
        raise ValueError(f"cuda_graphs=True: the session's forced tokens are on {forced.device}, not {device}")
    if coupling == "gumbel":
        raise ValueError("cuda_graphs=True does not support coupling='gumbel'; use 'maximal' or 'independent'")
    if any(g.device.type != "cuda" for g in generator_list(generator)):
        raise ValueError("cuda_graphs=True needs CUDA generators (torch.Generator('cuda')) or generator=None; "
                         "a CPU generator draws on the host, which a CUDA graph cannot replay")
