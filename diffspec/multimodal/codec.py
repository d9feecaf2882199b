"""Frame-level speculative decoding of multi-codebook codec LMs (MusicGen), relaxed on later codebooks.

A MusicGen decoder predicts one token per codebook per step (``K`` parallel heads over one
hidden state) with the *delay pattern*: codebook ``c`` lags ``c`` steps, and the positions the
pattern fixes are overwritten by pad/prompt tokens before every forward. :func:`codec_generate`
replays what ``MusicgenForCausalLM.generate`` does step by step (same delay-pattern masking, same
attention mask and cache calls, same post-processing), but per round:

1. the drafter (a smaller MusicGen decoder with the same codebooks and vocabulary) proposes
   ``k`` steps (``k`` tokens per codebook, greedy);
2. one target call verifies ``[last, d_1..d_k]`` (``k + 1`` steps);
3. step ``i`` is accepted when every codebook passes: the first ``exact_codebooks`` need
   ``d == argmax p``; the others need ``p(d) >= beta * max p`` (kept as drafted); positions the
   delay pattern fixes always pass (their token is overwritten anyway);
4. the batch advances in lockstep by the smallest accepted count plus one target step (MusicGen
   derives positions from the cache length, so rows cannot keep ragged caches), then both
   caches are cropped.

Each round is one :class:`CodecRound`, run by the shared loop (:func:`~diffspec.multimodal.rounds.run_rounds`).
``beta=1`` reproduces plain greedy ``generate`` exactly (tested, batch 1-3, audio-code prompts
included; like transformers 5.23's ``generate``, the first call goes through the model's own
``prepare_inputs_for_generation``, which feeds only the last prompt column). Supported subset:
``MusicgenForCausalLM`` (a MusicGen decoder), unconditional or with an audio-code prompt, or
cross-attending to given ``encoder_hidden_states`` (text conditioning: the decoder of a
``MusicgenForConditionalGeneration`` with ``enc_to_dec_proj(text_encoder(...))``; both models get
the same states, so the drafter needs the target's hidden size there). With
``encoder_hidden_states`` the reference is greedy decoding without a cache, because 5.23's
``generate`` shares one ``DynamicCache`` between self- and cross-attention in that case; this loop
uses an ``EncoderDecoderCache``. Greedy only; no classifier-free guidance, no logits processors,
no sampling (SSD's sampled rule A4 is not implemented).

Example:
    >>> codes = codec_generate(decoder, small_decoder, prompt_ids, max_new_tokens=64, beta=0.5)  # doctest: +SKIP
    >>> codes.shape  # (batch, codebooks, frames), as MusicgenForCausalLM.generate  # doctest: +SKIP
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import DynamicCache, EncoderDecoderCache

from .. import kernels
from ..stats import SpecStats
from .rounds import run_rounds
from .slots import drop_tail


class _Stream:
    """One model's cache over the shared token buffer: columns ``[0, fed)`` are in its cache."""

    def __init__(self, model: Any, seqs: torch.Tensor, mask: torch.Tensor, pattern: torch.Tensor,
                 static: dict[str, Any]) -> None:
        self.model, self.static = model, static
        cross = static.get("encoder_hidden_states") is not None
        self.cache = EncoderDecoderCache(DynamicCache(), DynamicCache()) if cross else DynamicCache()
        # the first call is generate's: prepare_inputs_for_generation on the whole prompt
        inputs = model.prepare_inputs_for_generation(seqs, attention_mask=mask[:, : seqs.shape[1]],
                                                     past_key_values=self.cache, delay_pattern_mask=pattern,
                                                     use_cache=True, **static)
        out = model(**inputs)
        self.cache, self.logits, self.fed = out.past_key_values, out.logits[:, -1:], seqs.shape[1]

    def feed(self, seqs: torch.Tensor, end: int, mask: torch.Tensor, pattern: torch.Tensor) -> torch.Tensor:
        """Feed columns ``[fed, end)`` (delay pattern applied); logits (B*K, end - fed, V)."""
        ids = seqs[:, self.fed:end]
        fixed = pattern[:, self.fed:end]
        ids = torch.where(fixed == -1, ids, fixed)
        out = self.model(input_ids=ids, attention_mask=mask[:, :end], past_key_values=self.cache, use_cache=True,
                         **self.static)
        self.cache, self.fed = out.past_key_values, end
        return out.logits

    def keep(self, columns: int) -> None:
        """Roll the cache back to the first ``columns`` columns."""
        if columns < self.fed:
            drop_tail(self.cache, self.fed - columns)
            self.fed = columns


def _prompt_mask(input_ids: torch.Tensor, pad: int, eos: Any) -> torch.Tensor:
    """The attention mask ``generate`` infers for the prompt (pad positions 0 when pad != eos)."""
    eos_ids = [] if eos is None else ([eos] if isinstance(eos, int) else list(eos))
    if bool((input_ids == pad).any()) and pad not in eos_ids:
        return (input_ids != pad).long()
    return torch.ones_like(input_ids)


class CodecRound:
    """One round over the whole batch (the module docstring's steps 1-4): ``k`` drafted steps, one verifying call,
    the batch's smallest accepted count plus one target step, both caches cropped.

    Args:
        target, draft: the two models' streams after their prefill.
        buf: ``(B * K, S)`` the shared token buffer (columns ``< n`` final); ``n``: its first open column.
        mask, pattern: the attention mask and the delay pattern over ``buf``'s columns.
        max_len: columns to fill; ``k_max``: steps drafted per round.
        beta, relaxed: the tolerance and the ``(B * K,)`` rows (codebooks) it applies to.
        codebooks: ``K``; ``stats``: counters.
    """

    def __init__(self, target: _Stream, draft: _Stream, buf: torch.Tensor, n: int, mask: torch.Tensor,
                 pattern: torch.Tensor, max_len: int, k_max: int, beta: float, relaxed: torch.Tensor, codebooks: int,
                 stats: SpecStats) -> None:
        self.target, self.draft, self.buf, self.n, self.mask, self.pattern = target, draft, buf, n, mask, pattern
        self.max_len, self.k_max, self.beta, self.relaxed, self.stats = max_len, k_max, beta, relaxed, stats
        self.codebooks, self.batch = codebooks, buf.shape[0] // codebooks
        self.relaxed_tokens = torch.zeros((), dtype=torch.long, device=buf.device)  # summed on the device, read once
        self.done = n >= max_len

    def __call__(self) -> None:
        buf, n, pattern, batch = self.buf, self.n, self.pattern, self.batch
        k = min(self.k_max, self.max_len - n - 1)
        for i in range(k):  # the drafter first catches up on the columns it has not seen
            buf[:, n + i] = self.draft.feed(buf, n + i, self.mask, pattern)[:, -1].argmax(-1)
        self.stats.draft_calls += k
        drafts = buf[:, n:n + k].clone()
        t_logits = self.target.feed(buf, n + k, self.mask, pattern)[:, -(k + 1):]  # [last, d_1..d_k]
        # accept: exact on the first codebooks, p(d) >= beta * max p on the others, fixed slots pass
        greedy, passed = kernels.beta_tolerance(t_logits, drafts, beta=self.beta, relaxed=self.relaxed)
        same = drafts == greedy[:, :k]
        ok = (pattern[:, n:n + k] != -1) | passed
        m_rows = ok.view(batch, self.codebooks, k).all(1).long().cumprod(1).sum(1)
        m = int(m_rows.min()) if k else 0  # the one host sync per round: lockstep advance
        buf[:, n + m] = greedy[:, m]
        self.relaxed_tokens += (~same[:, :m] & (pattern[:, n:n + m] == -1)).sum()
        # roll back: columns [0, n + m) are final; the correction at n + m is fed next round
        self.target.keep(n + m)
        self.draft.keep(n + m)
        self.stats.accepted += m * batch
        self.stats.proposed += k * batch
        self.n = n + m + 1
        self.done = self.n >= self.max_len


def codec_generate(model: Any, drafter: Any, input_ids: torch.Tensor, *, max_new_tokens: int,
                   num_draft_tokens: int = 4, beta: float = 1.0, exact_codebooks: int = 1,
                   encoder_hidden_states: torch.Tensor | None = None, spec_stats: SpecStats | None = None,
                   ) -> torch.Tensor:
    """Speculative greedy decoding of a MusicGen decoder; ``beta=1`` equals ``model.generate(do_sample=False)``.

    Args:
        model: the target ``MusicgenForCausalLM``.
        drafter: a smaller ``MusicgenForCausalLM`` with the same ``num_codebooks`` and vocabulary.
        input_ids: (B * K, T0) prompt codes, first column the start (pad) token, as for ``generate``.
        max_new_tokens: decoding steps (``generate``'s ``max_new_tokens``).
        num_draft_tokens: ``k`` steps drafted per round.
        beta: tolerance in (0, 1] on codebooks >= ``exact_codebooks`` (1: exact).
        exact_codebooks: leading codebooks verified exactly.
        encoder_hidden_states: optional cross-attention states (B, S, H) given to both models.
        spec_stats: counters to fill (target/draft calls, accepted/proposed steps per row,
            ``extra["relaxed_tokens"]``: accepted tokens that differ from the target's greedy token).

    Returns:
        (B, K, frames) audio codes, as ``MusicgenForCausalLM.generate`` returns them.
    """
    stats = spec_stats if spec_stats is not None else SpecStats(method="relaxed-codec")
    gc = model.generation_config
    K = int(model.num_codebooks)
    if getattr(drafter, "num_codebooks", None) != K:
        raise ValueError(f"the drafter must be a codec LM with num_codebooks={K} (got {type(drafter).__name__} with "
                         f"num_codebooks={getattr(drafter, 'num_codebooks', None)})")
    pad = int(gc.pad_token_id)
    start = int(gc.decoder_start_token_id if gc.decoder_start_token_id is not None else pad)
    BK, T0 = input_ids.shape
    max_len, k_max = T0 + max_new_tokens, num_draft_tokens
    static = {} if encoder_hidden_states is None else {"encoder_hidden_states": encoder_hidden_states}
    seqs, pattern = model.build_delay_pattern_mask(input_ids, pad_token_id=start, max_length=max_len)
    n = seqs.shape[1]
    mask = torch.cat([_prompt_mask(input_ids, pad, gc.eos_token_id),
                      input_ids.new_ones(BK, max_len + k_max + 2 - T0)], 1)
    buf = seqs.new_full((BK, max_len + k_max + 2), pad)
    buf[:, :n] = seqs
    target, draft = _Stream(model, seqs, mask, pattern, static), _Stream(drafter, seqs, mask, pattern, static)
    stats.target_calls += 1
    stats.target_evals += BK // K
    stats.draft_calls += 1
    buf[:, n] = target.logits[:, -1].argmax(-1)
    relaxed = torch.arange(BK, device=buf.device) % K >= exact_codebooks
    pattern = torch.cat([pattern, pattern.new_full((BK, k_max + 2), pad)], 1)  # past max_len: never fed
    one_round = CodecRound(target, draft, buf, n + 1, mask, pattern, max_len, k_max, beta, relaxed, K, stats)
    run_rounds(one_round, stats)
    out = model.apply_delay_pattern_mask(buf[:, :max_len], pattern[:, :max_len])
    stats.extra["relaxed_tokens"] = int(one_round.relaxed_tokens)
    stats.extra["frames_per_target_call"] = (max_len - T0) / stats.target_calls
    return out[out != pad].reshape(BK // K, K, -1)
