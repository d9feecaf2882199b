"""The shared draft/verify loop over transformers generative models, batched with ragged acceptance.

:func:`speculative_generate` is a ``custom_generate`` callable: ``model.generate(**inputs,
custom_generate=speculative_generate, drafter=small_model)`` lets transformers prepare everything
(pixels, cache, M-RoPE positions, logits processors, special tokens, max length), then runs:

1. target prefill, first token from the processed logits (as plain decoding);
2. per round, the drafter proposes ``k`` tokens per row (its processed distributions kept);
3. one target call verifies ``[last, d_1..d_k]`` (``k + 1`` logits kept) with explicit positions;
   the processors are applied at each position with the prefix plain decoding would have had;
4. greedy: longest prefix matching the argmax plus one target token; sampling: Leviathan
   rejection sampling with the residual ``(p - q)_+`` (:mod:`diffspec.speculation.chain`);
5. EOS / max-length cut, then rollback: rows keep different numbers of slots
   (:class:`~diffspec.multimodal.slots.SlotState`: rejected slots masked, gap-free positions,
   the tail rejected by all rows cropped).

Steps 2-6 are one :class:`DraftRound`, run by the shared loop (:func:`~diffspec.multimodal.rounds.run_rounds`)
until its one host sync per round finds every row finished.

Batch strategy: masked slots rather than "crop to the shortest row and re-feed" because re-feeding
makes the rows' inputs ragged again on the next call; with masks every call feeds exactly
``k + 1`` tokens per row, positions stay those of plain decoding (1-D or M-RoPE), and batch 1 is
the usual crop. The price is up to ``k`` masked slots per row per round of cache memory.

Encoder-decoder targets (Whisper, called through its own ``generate``, which keeps its prompt,
language, timestamp and long-form logic) feed only the decoder here: the encoder outputs are passed
on every call and the ``EncoderDecoderCache`` is cropped on its self-attention part
(:mod:`~diffspec.multimodal.seq2seq`, which also prepares seq2seq drafters).

Supported stopping: EOS ids and ``max_length`` / ``max_new_tokens`` (other stopping criteria,
e.g. stop strings, are not evaluated). The return value is the sequences tensor, as plain
``generate`` with ``return_dict_in_generate=False``.

Example:
    >>> ids = target.generate(**inputs, max_new_tokens=32, custom_generate=speculative_generate,  # doctest: +SKIP
    ...                       drafter=drafter, num_draft_tokens=4)
"""


from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from typing import Any

import torch
from transformers import DynamicCache, EncoderDecoderCache

from ..speculation.chain import greedy_accept, sampling_accept
from ..stats import SpecStats
from .drafter import prepare_drafter
from .rounds import process, run_rounds
from .seq2seq import is_seq2seq, prepare_seq2seq_drafter
from .slots import SlotState, takes_logits_to_keep


def _pick(scores: torch.Tensor, do_sample: bool, generator: torch.Generator | None) -> tuple[torch.Tensor, torch.Tensor | None]:
    if not do_sample:
        return scores.argmax(-1), None
    probs = torch.softmax(scores, dim=-1)
    return torch.multinomial(probs, 1, generator=generator)[:, 0], probs


def _fit_vocab(logits: torch.Tensor, vocab: int) -> torch.Tensor:
    """Drafter logits cut or padded (``-inf``) to the target's vocabulary size."""
    if logits.shape[-1] >= vocab:
        return logits[..., :vocab]
    pad = logits.new_full((*logits.shape[:-1], vocab - logits.shape[-1]), float("-inf"))
    return torch.cat([logits, pad], dim=-1)


class DraftRound:
    """One round of the draft/verify loop over every row (the module docstring's steps 2-6), and its state.

    Built after the target's prefill: :meth:`start` takes the first token from the prefill's logits.

    Args:
        model, drafter: the target and the drafter model (the target itself for ``self-draft``).
        draft: the drafter's prepared state (``forward``/``rollback``, optionally ``round_start``).
        target: the target's :class:`~diffspec.multimodal.slots.SlotState` after the prefill.
        logits_processor, generation_config: prepared by ``generate``.
        generator, stats: as :func:`speculative_generate`.
        k, schedule, max_k: drafts per round to start with, ``"constant"``/``"heuristic"``, the schedule's cap.
    """

    def __init__(self, model: Any, drafter: Any, draft: Any, target: SlotState, logits_processor: Any,
                 generation_config: Any, generator: torch.Generator | None, stats: SpecStats, k: int, schedule: str,
                 max_k: int) -> None:
        self.model, self.drafter, self.draft, self.target = model, drafter, draft, target
        self.logits_processor, self.generator, self.stats = logits_processor, generator, stats
        self.k, self.schedule, self.max_k = k, schedule, max_k
        self.do_sample = bool(generation_config.do_sample)
        self.max_len = int(generation_config.max_length)
        pad = generation_config._pad_token_tensor
        self.pad_id = 0 if pad is None else int(pad.reshape(-1)[0])
        self.eos = generation_config._eos_token_tensor
        self.row_rounds, self.done = 0, False

    def start(self, input_ids: torch.Tensor, logits: torch.Tensor) -> None:
        """The first new token of every row from the prefill's last ``logits`` (B, V), as plain decoding."""
        batch, t0 = input_ids.shape
        dev = input_ids.device
        self.batch, self.vocab = batch, logits.shape[-1]
        self.eos = None if self.eos is None else self.eos.reshape(-1).to(dev)
        self.seqs = input_ids.new_full((batch, self.max_len + self.max_k + 2), self.pad_id)
        self.seqs[:, :t0] = input_ids
        self.lengths = torch.full((batch,), t0, device=dev, dtype=torch.long)
        last, _ = _pick(process(self.logits_processor, self.seqs, self.lengths, logits.float()), self.do_sample,
                        self.generator)
        self.seqs[:, t0] = last
        self.lengths += 1
        self.finished = self.lengths >= self.max_len
        if self.eos is not None:
            self.finished |= torch.isin(last, self.eos)
        self.last, self.hole_tok, self.hole_valid = last, last.clone(), torch.zeros_like(last)
        self.holes = "none"  # which rows' previous last draft is still unfed to the drafter: "all", "some", "none"
        self.arange = torch.arange(self.max_k + 2, device=dev)
        done, self.room = torch.stack([self.finished.all().long(), self._room()]).tolist()
        self.done = bool(done)

    def _room(self) -> torch.Tensor:
        """The most tokens an unfinished row may still add (0 when none is left)."""
        return torch.where(self.finished, 0, self.max_len - self.lengths).max()

    def draft_tokens(self, k: int) -> tuple[torch.Tensor, torch.Tensor, int]:
        """``k`` drafts per row and their processed scores; the first drafter call also feeds the previous round's
        unfed last draft. Returns ``(drafts (B, k), scores (B, k, V), drafter slots fed at the round start)``."""
        draft, drafter, last = self.draft, self.drafter, self.last
        start = getattr(draft, "round_start", None)
        if start is not None:  # a strategy that opens its own per-round drafter state
            logits = start(drafter, self.hole_tok, self.hole_valid, last)[:, -1]
        elif self.holes == "none":  # no row's previous last draft is unfed: feed ``last`` alone
            logits = draft.forward(drafter, last[:, None], logits_to_keep=1)[:, -1]
        else:
            valid = None if self.holes == "all" else torch.stack([self.hole_valid, torch.ones_like(last)], 1)
            logits = draft.forward(drafter, torch.stack([self.hole_tok, last], 1), valid, logits_to_keep=1)[:, -1]
        drafts, qs = [], []
        for i in range(k):  # the drafter is autoregressive: one call per draft
            scores = process(self.logits_processor, self.seqs, self.lengths + i, _fit_vocab(logits.float(), self.vocab))
            d, _ = _pick(scores, self.do_sample, self.generator)
            self.seqs.scatter_(1, (self.lengths + i)[:, None], d[:, None])
            drafts.append(d)
            qs.append(scores)  # the draft law's logits: the accept kernel takes its softmax
            if i < k - 1:
                logits = draft.forward(drafter, d[:, None], logits_to_keep=1)[:, -1]
        self.stats.draft_calls += k
        return torch.stack(drafts, 1), torch.stack(qs, 1), 1 if start is None and self.holes == "none" else 2

    def verify(self, drafts: torch.Tensor, qs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """One target call on ``[last, d_1..d_k]``, the processors at each position, and the acceptance rule.
        Returns ``(m (B,) drafts accepted, tokens (B, k + 1) whose first m + 1 are emitted)``."""
        k = drafts.shape[1]
        t_logits = self.target.forward(self.model, torch.cat([self.last[:, None], drafts], 1), logits_to_keep=k + 1)
        p = torch.stack([process(self.logits_processor, self.seqs, self.lengths + j, t_logits[:, j].float())
                         for j in range(k + 1)], 1)
        if self.do_sample:
            return sampling_accept(drafts, p, qs, self.generator, draft_logits=True)
        return greedy_accept(drafts, p)

    def write(self, m: torch.Tensor, tokens: torch.Tensor, active: torch.Tensor) -> None:
        """Emit each row's ``m + 1`` tokens, cut at EOS and at the maximum length; mark the rows that finish."""
        k = tokens.shape[1] - 1
        pos, count = self.arange[: k + 1], m + 1
        if self.eos is not None:
            hit = torch.isin(tokens, self.eos) & (pos < count[:, None])
            first = torch.where(hit, pos, k + 1).amin(1)
            finished_eos = hit.any(1)
            count = torch.where(finished_eos, first + 1, count)
        else:
            finished_eos = torch.zeros_like(self.finished)
        count = torch.minimum(count, self.max_len - self.lengths).masked_fill(self.finished, 0)
        self.seqs.scatter_(1, self.lengths[:, None] + pos, torch.where(pos < count[:, None], tokens, self.pad_id))
        self.lengths = self.lengths + count
        self.finished = self.finished | (active & finished_eos) | (self.lengths >= self.max_len)

    def __call__(self) -> None:
        k = max(1, min(self.k, self.room - 1))
        active = ~self.finished
        drafts, qs, fed = self.draft_tokens(k)
        m, tokens = self.verify(drafts, qs)
        self.write(m, tokens, active)
        # roll both caches back to the accepted slots
        self.target.rollback(k + 1, torch.where(active, m + 1, 0))
        draft_keep = (self.hole_valid if fed == 2 else 0) + 1 + m.clamp(max=k - 1)
        self.draft.rollback(fed + k - 1, torch.where(active, draft_keep, 0))
        self.hole_tok, self.hole_valid = drafts[:, -1], (m == k).long()
        self.last = tokens.gather(1, m[:, None])[:, 0]
        # bookkeeping, the schedule and the loop's decision, from one host sync
        n_acc, n_active, n_full, n_hole, done, self.room = torch.stack([
            (m * active).sum(), active.sum(), ((m == k) & active).sum(), self.hole_valid.sum(),
            self.finished.all().long(), self._room()]).tolist()
        self.done = bool(done)
        self.holes = "all" if n_hole == self.batch else "none" if n_hole == 0 else "some"
        self.stats.accepted += n_acc
        self.stats.proposed += k * n_active
        self.row_rounds += n_active
        if self.schedule == "heuristic":
            self.k = min(self.k + 2, self.max_k) if n_full == n_active else max(1, self.k - 1)


def _check_supported(generation_config: Any, model_kwargs: dict[str, Any]) -> None:
    cache = model_kwargs.get("past_key_values")
    self_cache = cache.self_attention_cache if isinstance(cache, EncoderDecoderCache) else cache
    if self_cache is not None and not isinstance(self_cache, DynamicCache):
        raise ValueError(f"past_key_values={type(cache).__name__} is not supported: the loop crops the cache, "
                         "use the default DynamicCache")
    if generation_config.num_beams > 1 or generation_config.return_dict_in_generate:
        raise ValueError("speculative_generate supports greedy and sampling with num_beams=1 and returns the "
                         "sequences tensor: set num_beams=1 and return_dict_in_generate=False")


def _prefill(model: Any, input_ids: torch.Tensor, model_kwargs: dict[str, Any], draft_strategy: Any
             ) -> tuple[Any, SlotState, AbstractContextManager]:
    """The target's prefill (transformers' own input preparation; pixels only reach it). An encoder-decoder
    (Whisper) has run its encoder already: only its decoder is fed from here on. Returns ``(output, target state,
    the strategy's probe)``."""
    prefix = "decoder_" if is_seq2seq(model) else ""
    mask = model_kwargs.get(f"{prefix}attention_mask")
    mask = torch.ones_like(input_ids) if mask is None else mask.long()
    inputs = model.prepare_inputs_for_generation(input_ids, is_first_iteration=True, **model_kwargs)
    if takes_logits_to_keep(model):
        inputs["logits_to_keep"] = 1
    probe = nullcontext() if draft_strategy is None else draft_strategy.probe(model, input_ids, model_kwargs)
    with probe:  # a strategy may score the visual tokens during the prefill
        out = model(**inputs)
    return out, SlotState.after_prefill(out.past_key_values, mask, model_kwargs.get(f"{prefix}position_ids")), probe


def speculative_generate(model: Any, input_ids: torch.Tensor, logits_processor: Any, stopping_criteria: Any,
                         generation_config: Any, drafter: Any = None, num_draft_tokens: int = 5,
                         draft_schedule: str = "constant", max_draft_tokens: int = 16, text_only_draft: bool = False,
                         drafter_inputs: dict[str, Any] | None = None, generator: torch.Generator | None = None, spec_stats: SpecStats | None = None,
                         draft_strategy: Any = None, **model_kwargs: Any) -> torch.Tensor:
    """Exact speculative decoding as a transformers ``custom_generate`` callable (batch 1-8 and more).

    Args:
        model: the target (called by ``generate``; do not pass it).
        input_ids, logits_processor, stopping_criteria, generation_config, model_kwargs: prepared
            by ``generate``.
        drafter: the draft model (same vocabulary ids as the target).
        num_draft_tokens: ``k`` (the start value of the heuristic schedule).
        draft_schedule: ``"constant"`` or ``"heuristic"`` (+2 after a full accept of every row, else -1).
        max_draft_tokens: cap of the heuristic schedule.
        text_only_draft: the drafter sees the prompt's text tokens only (no pixels, placeholders masked).
        drafter_inputs: the processor's outputs again (pixels, grids, ``mm_token_type_ids``) for a VLM
            drafter (see :func:`~diffspec.multimodal.drafter.prepare_drafter`); without them a VLM
            drafter sees the text tokens only. For a Whisper drafter with its own encoder: the dict
            :func:`~diffspec.multimodal.seq2seq.record_encoder_inputs` yields.
        generator: RNG of every draw (drafts, uniforms, corrections).
        spec_stats: counters to fill (target/draft calls, accepted/proposed, rounds).
        draft_strategy: how the drafter sees the prompt (:mod:`~diffspec.multimodal.strategies`:
            ``compressed-draft``'s pruned visual tokens, ``self-draft``'s view of the target's own
            cache, where ``drafter=None`` means the target); ``None``: :func:`prepare_drafter`.

    Returns:
        (B, T0 + n) token ids: the prompt, then each row's tokens, padded after its EOS.
    """
    if drafter is None and draft_strategy is None:
        raise ValueError("speculative_generate needs drafter=<a transformers model with the target's vocabulary>")
    _check_supported(generation_config, model_kwargs)
    stats = spec_stats if spec_stats is not None else SpecStats(method="draft")
    out, target, probe = _prefill(model, input_ids, model_kwargs, draft_strategy)
    if is_seq2seq(model):
        if draft_strategy is not None:
            raise ValueError("compressed-draft / self-draft need a decoder-only VLM target, not an encoder-decoder")
        target.seq2seq, target.static = True, {"encoder_outputs": model_kwargs["encoder_outputs"]}
        draft = prepare_seq2seq_drafter(drafter, model, input_ids, model_kwargs, drafter_inputs)
    elif draft_strategy is None:
        draft = prepare_drafter(drafter, model, input_ids, model_kwargs, text_only=text_only_draft,
                                drafter_inputs=drafter_inputs)
    else:
        drafter = model if drafter is None else drafter
        draft = draft_strategy.prepare(drafter, model, input_ids, model_kwargs, target, drafter_inputs, probe)
    stats.target_calls += 1
    stats.target_evals += input_ids.shape[0]
    stats.draft_calls += getattr(draft, "prefill_calls", 1)
    one_round = DraftRound(model, drafter, draft, target, logits_processor, generation_config, generator, stats,
                           num_draft_tokens, draft_schedule, max(max_draft_tokens, num_draft_tokens))
    one_round.start(input_ids, out.logits[:, -1])
    rounds = run_rounds(one_round, stats)
    stats.extra["rounds"] = rounds
    stats.extra["accepted_per_round"] = stats.accepted / one_round.row_rounds if one_round.row_rounds else 0.0
    new_tokens = float((one_round.lengths - input_ids.shape[1]).sum())
    stats.extra["tokens_per_target_call"] = new_tokens / (input_ids.shape[0] * stats.target_calls)
    return one_round.seqs[:, : int(one_round.lengths.max())]
