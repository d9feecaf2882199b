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

from contextlib import nullcontext
from typing import Any

import torch
from transformers import DynamicCache, EncoderDecoderCache

from ..speculation.chain import greedy_accept, sampling_accept
from ..stats import SpecStats
from .drafter import prepare_drafter
from .seq2seq import is_seq2seq, prepare_seq2seq_drafter
from .slots import SlotState, takes_logits_to_keep


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
    cache = model_kwargs.get("past_key_values")
    self_cache = cache.self_attention_cache if isinstance(cache, EncoderDecoderCache) else cache
    if self_cache is not None and not isinstance(self_cache, DynamicCache):
        raise ValueError(f"past_key_values={type(cache).__name__} is not supported: the loop crops the cache, "
                         "use the default DynamicCache")
    if generation_config.num_beams > 1 or generation_config.return_dict_in_generate:
        raise ValueError("speculative_generate supports greedy and sampling with num_beams=1 and returns the "
                         "sequences tensor: set num_beams=1 and return_dict_in_generate=False")
    stats = spec_stats if spec_stats is not None else SpecStats(method="draft")
    max_draft_tokens = max(max_draft_tokens, num_draft_tokens)
    do_sample = bool(generation_config.do_sample)
    B, T0 = input_ids.shape
    dev = input_ids.device
    max_len = int(generation_config.max_length)
    pad = generation_config._pad_token_tensor
    pad_id = 0 if pad is None else int(pad.reshape(-1)[0])
    eos = generation_config._eos_token_tensor
    eos = None if eos is None else eos.reshape(-1).to(dev)

    # 1. prefills (transformers' own input preparation; pixels only reach the prefill). An
    # encoder-decoder (Whisper) has run its encoder already: only its decoder is fed from here on.
    seq2seq = is_seq2seq(model)
    prefix = "decoder_" if seq2seq else ""
    mask = model_kwargs.get(f"{prefix}attention_mask")
    mask = torch.ones_like(input_ids) if mask is None else mask.long()
    inputs = model.prepare_inputs_for_generation(input_ids, is_first_iteration=True, **model_kwargs)
    if takes_logits_to_keep(model):
        inputs["logits_to_keep"] = 1
    probe = nullcontext() if draft_strategy is None else draft_strategy.probe(model, input_ids, model_kwargs)
    with probe:  # a strategy may score the visual tokens during the prefill
        out = model(**inputs)
    target = SlotState.after_prefill(out.past_key_values, mask, model_kwargs.get(f"{prefix}position_ids"))
    vocab = out.logits.shape[-1]
    if seq2seq:
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
    stats.target_evals += B
    stats.draft_calls += getattr(draft, "prefill_calls", 1)

    seqs = input_ids.new_full((B, max_len + max_draft_tokens + 2), pad_id)
    seqs[:, :T0] = input_ids
    lengths = torch.full((B,), T0, device=dev, dtype=torch.long)
    last, _ = _pick(process(logits_processor, seqs, lengths, out.logits[:, -1].float()), do_sample, generator)
    seqs[:, T0] = last
    lengths += 1
    finished = lengths >= max_len
    if eos is not None:
        finished |= torch.isin(last, eos)
    hole_tok, hole_valid = last.clone(), torch.zeros_like(last)
    holes = "none"  # which rows' previous last draft is still unfed to the drafter: "all", "some", "none"
    k, rounds, row_rounds = num_draft_tokens, 0, 0
    arange = torch.arange(max_draft_tokens + 2, device=dev)

    while not bool(finished.all()):
        active = ~finished
        k_round = max(1, min(k, int((max_len - lengths[active]).max()) - 1))
        # 2. draft k tokens per row (the first call also feeds the previous round's unfed draft)
        start = getattr(draft, "round_start", None)
        if start is not None:  # a strategy that opens its own per-round drafter state
            logits = start(drafter, hole_tok, hole_valid, last)[:, -1]
        elif holes == "none":  # no row's previous last draft is unfed: feed ``last`` alone
            logits = draft.forward(drafter, last[:, None], logits_to_keep=1)[:, -1]
        else:
            valid = None if holes == "all" else torch.stack([hole_valid, torch.ones_like(last)], 1)
            logits = draft.forward(drafter, torch.stack([hole_tok, last], 1), valid, logits_to_keep=1)[:, -1]
        fed = 1 if start is None and holes == "none" else 2  # drafter slots fed at the round start
        drafts, qs = [], []
        for i in range(k_round):
            scores = process(logits_processor, seqs, lengths + i, _fit_vocab(logits.float(), vocab))
            d, _ = _pick(scores, do_sample, generator)
            seqs.scatter_(1, (lengths + i)[:, None], d[:, None])
            drafts.append(d)
            qs.append(scores)  # the draft law's logits: the accept kernel takes its softmax
            if i < k_round - 1:
                logits = draft.forward(drafter, d[:, None], logits_to_keep=1)[:, -1]
        drafts_t = torch.stack(drafts, 1)
        stats.draft_calls += k_round
        # 3. verify [last, d_1..d_k] in one target call
        t_logits = target.forward(model, torch.cat([last[:, None], drafts_t], 1), logits_to_keep=k_round + 1)
        p = torch.stack([process(logits_processor, seqs, lengths + j, t_logits[:, j].float())
                         for j in range(k_round + 1)], 1)
        stats.target_calls += 1
        stats.target_evals += B
        # 4. accept
        if do_sample:
            m, tokens = sampling_accept(drafts_t, p, torch.stack(qs, 1), generator, draft_logits=True)
        else:
            m, tokens = greedy_accept(drafts_t, p)
        # 5. EOS / max-length cut and write
        pos = arange[: k_round + 1]
        count = m + 1
        if eos is not None:
            hit = torch.isin(tokens, eos) & (pos < count[:, None])
            first = torch.where(hit, pos, k_round + 1).amin(1)
            finished_eos = hit.any(1)
            count = torch.where(finished_eos, first + 1, count)
        else:
            finished_eos = torch.zeros_like(finished)
        count = torch.minimum(count, max_len - lengths).masked_fill(finished, 0)
        idx = lengths[:, None] + pos
        seqs.scatter_(1, idx, torch.where(pos < count[:, None], tokens, pad_id))
        lengths = lengths + count
        finished = finished | (active & finished_eos) | (lengths >= max_len)
        # 6. rollback both caches
        target.rollback(k_round + 1, torch.where(active, m + 1, 0))
        draft_keep = (hole_valid if fed == 2 else 0) + 1 + m.clamp(max=k_round - 1)
        draft.rollback(fed + k_round - 1, torch.where(active, draft_keep, 0))
        hole_tok, hole_valid = drafts_t[:, -1], (m == k_round).long()
        last = tokens.gather(1, m[:, None])[:, 0]
        # bookkeeping and schedule, from one host sync
        n_acc, n_active, n_full, n_hole = torch.stack([m[active].sum(), active.sum(), (m[active] == k_round).sum(),
                                                       hole_valid.sum()]).tolist()
        holes = "all" if n_hole == B else "none" if n_hole == 0 else "some"
        stats.accepted += n_acc
        stats.proposed += k_round * n_active
        rounds += 1
        row_rounds += n_active
        if draft_schedule == "heuristic":
            k = min(k + 2, max_draft_tokens) if n_full == n_active else max(1, k - 1)

    stats.extra["rounds"] = rounds
    stats.extra["accepted_per_round"] = stats.accepted / row_rounds if row_rounds else 0.0
    stats.extra["tokens_per_target_call"] = float((lengths - T0).sum()) / (B * stats.target_calls)
    return seqs[:, : int(lengths.max())]
