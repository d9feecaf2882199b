"""LANTERN sampling loop: chain drafts from a feature drafter, verified with relaxed acceptance.

One round, for every batch row at once (row ``b`` has committed ``c_b`` tokens and knows the
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
from .plain import record_rounds, round_progress, window_forced
from .relaxed import relaxed_mrs
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
    batch, n, branches = session.batch_size, num_tokens, session.cfg_branches
    dev = session.first_logits.device
    length = max(1, min(draft_length, n - 1))
    size = n + length + 1
    tokens = torch.zeros(batch, size, dtype=torch.long, device=dev)
    feats = torch.zeros(batch * branches, size, session.last_hidden.shape[-1], device=dev,
                        dtype=session.last_hidden.dtype)
    feats[:, 0] = session.last_hidden[:, -1]
    cache = head.new_cache(batch * branches, size)
    p0 = force(warp(session.first_logits, **sampling), window_forced(session, torch.zeros(batch, dtype=torch.long,
                                                                                           device=dev)))
    tokens[:, 0] = sample(p0, generator)
    commit = torch.ones(batch, dtype=torch.long, device=dev)
    calls, draft_calls = 1, 0
    row_calls = torch.ones(batch, device=dev)
    accepted = torch.zeros((), dtype=torch.long, device=dev)
    proposed = torch.zeros((), dtype=torch.long, device=dev)
    budget_sum = torch.zeros((), device=dev)
    ar = torch.arange(length + 1, device=dev)
    cols = torch.arange(size, device=dev)
    done, total = 1, batch
    if bar is not None:
        bar.update(batch)
    while done < n:
        drafts, q = draft_chain(head, session, tokens, feats, cache, commit, length, sampling, generator,
                                top=acceptance == "certain")
        draft_calls += length
        start = torch.clamp(commit - 1, max=n - length - 1)
        logits = session.step(tokens.gather(1, start.unsqueeze(1) + ar), start)
        hidden = session.last_hidden
        calls += 1
        row_calls += (commit < n).float()
        idx = ((commit - 1 - start).unsqueeze(1) + ar).clamp(max=length)  # row of position commit + k
        vocab = logits.shape[-1]
        p = warp(logits.gather(1, idx.unsqueeze(-1).expand(-1, -1, vocab)), **sampling)
        pos = commit.unsqueeze(1) + ar
        p = force(p, window_forced(session, pos))
        valid = pos[:, :length] < n
        res = relaxed_mrs(p[:, :length], q, drafts, neighbours, delta, lam, generator, acceptance)
        lead = (res.accepted & valid).long().cumprod(1).sum(1)
        accepted += lead.sum()
        proposed += valid.sum()
        budget_sum += (res.budget * valid).sum()
        commit_vals = torch.cat([res.tokens, sample(p[:, length], generator).unsqueeze(1)], 1)
        new_commit = commit + torch.minimum(lead + 1, n - commit)
        rel = cols - commit.unsqueeze(1)
        is_commit = (rel >= 0) & (cols < new_commit.unsqueeze(1))
        tokens = torch.where(is_commit, commit_vals.gather(1, rel.clamp(0, length)), tokens)
        # target features at positions commit .. commit + L (valid up to the first rejection)
        real = hidden.gather(1, idx.repeat(branches, 1).unsqueeze(-1).expand(-1, -1, hidden.shape[-1]))
        rel_r = rel.repeat(branches, 1)
        in_win = ((rel_r >= 0) & (rel_r <= length)).unsqueeze(-1)
        feats = torch.where(in_win, real.gather(1, rel_r.clamp(0, length).unsqueeze(-1).expand(-1, -1, real.shape[-1])),
                            feats)
        commit = new_commit
        done, total = round_progress(commit, bar, total)  # the round's one host sync
    record_rounds(stats, session, n, calls, row_calls, accepted, proposed)
    if stats is not None:
        stats.draft_calls += draft_calls
        stats.extra["tv_budget_mean"] = float(budget_sum) / max(int(proposed), 1)
    return tokens[:, :n]
