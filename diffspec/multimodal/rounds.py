"""The loop every multimodal sampler shares: rounds of drafting, one verifying target call and acceptance.

A sampler (``draft`` and its variants: :func:`~diffspec.multimodal.loop.speculative_generate`; ``relaxed-action``:
:func:`~diffspec.multimodal.action_loop.relaxed_action_generate`; ``relaxed-codec``:
:func:`~diffspec.multimodal.codec.codec_generate`) runs its prefill, then keeps its per-call state in a *round*
object (:class:`Round`). :func:`run_rounds` calls it until the round's own host sync says every row is
finished, and counts each round's target call. :func:`process` applies transformers' logits processors with the
prefix each row would have had under plain decoding.

Example:
    >>> class Countdown:  # a round that finishes after three target calls
    ...     batch, done, left = 2, False, 3
    ...     def __call__(self):
    ...         self.left -= 1
    ...         self.done = self.left == 0
    >>> stats = SpecStats()
    >>> run_rounds(Countdown(), stats), stats.target_calls, stats.target_evals
    (3, 3, 6)
"""

from __future__ import annotations

from typing import Any, Protocol

import torch

from ..stats import SpecStats


class Round(Protocol):
    """One round over every row of a batch: draft, verify with one target call, accept, roll back."""

    batch: int
    """Rows verified by each target call."""
    done: bool
    """Every row is finished (set by the round's host sync; may be true before the first round)."""

    def __call__(self) -> None:
        """Run one round."""


def run_rounds(one_round: Round, stats: SpecStats) -> int:
    """Run ``one_round`` until it is done; each round counts one target call over its batch. Returns the rounds run."""
    rounds = 0
    while not one_round.done:
        one_round()
        stats.target_calls += 1
        stats.target_evals += one_round.batch
        rounds += 1
    return rounds


def process(logits_processor: Any, seqs: torch.Tensor, lengths: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
    """Apply ``logits_processor`` to ``scores`` (B, V) with row ``b``'s prefix ``seqs[b, :lengths[b]]``.

    Processors take one ``input_ids`` width per call, and some keep per-row state sized to the
    batch (``repetition_penalty``'s prompt mask), so each distinct prefix length gets one
    full-batch call whose rows of that length are kept (a single call when rows are in step, as
    at batch 1).
    """
    if not logits_processor:
        return scores
    if bool((lengths == lengths[0]).all()):
        return logits_processor(seqs[:, : int(lengths[0])], scores.clone())
    out = scores.clone()
    for length in lengths.unique().tolist():  # one full-batch call per distinct prefix length
        rows = lengths == length
        out[rows] = logits_processor(seqs[:, :length], scores.clone())[rows]
    return out
