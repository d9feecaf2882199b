"""The ``relaxed-action`` decode of one VLA action step: drafts verified inside the prefill.

:func:`relaxed_action_generate` is a transformers ``custom_generate`` callable (transformers
prepares pixels, cache, positions, processors), decoding exactly ``n_dof`` tokens per row:

1. **one pass** over ``prompt + drafts[:n_dof - 1]``: ``n_dof`` logits are kept, the target's
   (processed) argmax ``t_j`` for every DoF ``j`` given the prompt and the drafted ``d_<j``;
2. accept the longest prefix with ``|bin(t_j) - bin(d_j)| <= r`` (the **draft** token is kept;
   a non-action ``t_j`` never accepts) and emit ``t`` at the first rejection;
3. the cache keeps the accepted slots (:class:`~diffspec.multimodal.slots.SlotState`: ragged rows
   masked, gap-free positions); the next pass feeds the emitted token plus the remaining drafts,
   until every row has ``n_dof`` tokens or emitted EOS.

Each pass is one :class:`ActionRound`, run by the shared loop (:func:`~diffspec.multimodal.rounds.run_rounds`).
``r = 0`` is exact greedy decoding (every token is the target's argmax given its prefix). A full
accept costs 1 pass instead of ``n_dof``; the worst case is ``n_dof`` passes, as plain decoding.

Example:
    >>> ids = vla.generate(input_ids=prompt, max_new_tokens=7, custom_generate=relaxed_action_generate,  # doctest: +SKIP
    ...                    action_map=amap, drafts=draft_ids, tolerance=3)
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import DynamicCache

from .. import kernels
from ..stats import SpecStats
from .action_map import ActionTokenMap
from .rounds import process, run_rounds
from .slots import SlotState


def tolerance_ok(drafts: torch.Tensor, target: torch.Tensor, action_map: ActionTokenMap, tolerance: int) -> torch.Tensor:
    """Bool (B, L): draft ``d`` passes against target argmax ``t`` (rule A3: ``|bin(t) - bin(d)| <= r``).

    A draft that is not an action token passes only if equal to ``t``; a non-action ``t`` rejects
    every action draft. With ``tolerance = 0`` this is ``d == t`` (exact greedy, rule A1). The decode
    loop runs the same rule fused with the argmax: :func:`diffspec.kernels.bin_tolerance`.

    Example:
        >>> amap = ActionTokenMap(vocab_size=20, n_bins=10, n_dof=3)
        >>> tolerance_ok(torch.tensor([[12, 15, 3]]), torch.tensor([[13, 4, 3]]), amap, 1).tolist()
        [[True, False, True]]
    """
    both = action_map.is_action(drafts) & action_map.is_action(target)
    near = (action_map.tokens_to_bins(drafts) - action_map.tokens_to_bins(target)).abs() <= tolerance
    return torch.where(both, near, drafts == target)


def _extend(model_kwargs: dict[str, Any], k: int) -> dict[str, Any]:
    """The prompt's prepared kwargs grown by ``k`` text slots (mask, positions on every M-RoPE row)."""
    kw = dict(model_kwargs)
    mask = kw["attention_mask"]
    kw["attention_mask"] = torch.cat([mask, mask.new_ones(mask.shape[0], k)], dim=1)
    pos = kw.get("position_ids")
    if pos is not None:
        kw["position_ids"] = torch.cat([pos, pos[..., -1:] + torch.arange(1, k + 1, device=pos.device)], dim=-1)
    mm = kw.get("mm_token_type_ids")
    if mm is not None:
        kw["mm_token_type_ids"] = torch.cat([mm, mm.new_zeros(mm.shape[0], k)], dim=1)
    return kw


class ActionRound:
    """One pass of the ``relaxed-action`` decode over every row (the module docstring's steps 1-3) and its state.

    Args:
        model, input_ids, logits_processor, model_kwargs: prepared by ``generate`` (with an attention mask).
        action_map, drafts, tolerance: as :func:`relaxed_action_generate`.
        eos: ``(E,)`` EOS ids or None.
    """

    def __init__(self, model: Any, input_ids: torch.Tensor, logits_processor: Any, model_kwargs: dict[str, Any],
                 action_map: ActionTokenMap, drafts: torch.Tensor, tolerance: int, eos: torch.Tensor | None) -> None:
        self.model, self.input_ids, self.model_kwargs = model, input_ids, model_kwargs
        self.logits_processor = logits_processor
        self.action_map, self.tolerance, self.eos = action_map, tolerance, eos
        dev, n = input_ids.device, action_map.n_dof
        self.batch, self.n = input_ids.shape[0], n
        self.cur = drafts.to(dev).long().clone()  # each row's tokens: decided ones, then the drafts left
        self.slots: SlotState | None = None
        self.decided = torch.zeros(self.batch, dtype=torch.long, device=dev)  # tokens decided per row
        self.finished = torch.zeros(self.batch, dtype=torch.bool, device=dev)
        self.first_real = torch.zeros(self.batch, dtype=torch.long, device=dev)  # a row's first fed slot (holes before)
        self.start, self.fed, self.done = 0, n - 1, False  # first DoF scored this pass, slots it feeds
        self.pos_all = torch.arange(n, device=dev)
        self.counts = torch.zeros(3, dtype=torch.long, device=dev)  # proposed, accepted, relaxed (synced at the end)

    def forward(self) -> torch.Tensor:
        """The pass's target call: first the prefill over ``prompt + drafts[:n - 1]`` (``n`` logits: DoF 0 .. n - 1),
        then the emitted token plus the remaining drafts. Returns the logits of DoF ``start .. n - 1``."""
        n = self.n
        if self.slots is None:
            kw = _extend(self.model_kwargs, n - 1)
            inputs = self.model.prepare_inputs_for_generation(torch.cat([self.input_ids, self.cur[:, :-1]], 1),
                                                              is_first_iteration=True, **kw)
            inputs["logits_to_keep"] = n
            out = self.model(**inputs)
            self.slots = SlotState.after_prefill(out.past_key_values, kw["attention_mask"], kw.get("position_ids"))
            return out.logits
        s = self.start - 1
        valid = (self.pos_all[s:n - 1] >= self.first_real[:, None]).long()
        return self.slots.forward(self.model, self.cur[:, s:n - 1], valid, logits_to_keep=n - 1 - s)

    def __call__(self) -> None:
        n, start, decided, finished = self.n, self.start, self.decided, self.finished
        logits = self.forward()
        # target argmax for DoF start .. n-1 (processors see the prefix the target saw)
        seqs = torch.cat([self.input_ids, self.cur], 1)
        lengths = torch.full((self.batch,), self.input_ids.shape[1], dtype=torch.long, device=seqs.device)
        scores = torch.stack([process(self.logits_processor, seqs, lengths + start + j, logits[:, j].float())
                              for j in range(n - start)], 1)
        pos, d, amap = self.pos_all[start:], self.cur[:, start:], self.action_map
        t, _, m = kernels.bin_tolerance(scores, d, first_id=amap.first_id, n_bins=amap.n_bins, reverse=amap.reverse,
                                        tolerance=self.tolerance,
                                        always=(pos < decided[:, None]).expand_as(d))  # the rule of tolerance_ok
        run = torch.where(finished, decided, m + start)  # first rejected DoF (n: all accepted)
        fix = (run < n) & ~finished
        t_fix = t.gather(1, (run - start).clamp(0, n - start - 1)[:, None])[:, 0]
        self.cur[:, start:] = torch.where(fix[:, None] & (pos == run[:, None]), t, d)
        judged = (pos >= decided[:, None]) & ~finished[:, None]
        acc = judged & (pos < run[:, None])
        self.counts += torch.stack([judged.sum(), acc.sum(), (acc & (d != t)).sum()])
        # EOS and bookkeeping, then roll the cache back to the accepted slots
        if self.eos is not None:
            finished = finished | (fix & torch.isin(t_fix, self.eos))
        self.slots.rollback(self.fed, (run.clamp(max=n - 1) - self.first_real).clamp(min=0))  # type: ignore[union-attr]
        self.decided = torch.where(self.finished, decided, (run + 1).clamp(max=n))
        self.finished = finished | (self.decided >= n)
        s = int(torch.where(self.finished, n, self.decided - 1).min())  # the pass's decision sync
        self.done = s >= n - 1
        self.first_real = torch.where(self.finished, n, self.decided - 1)
        self.start, self.fed = s + 1, n - 1 - s


def relaxed_action_generate(model: Any, input_ids: torch.Tensor, logits_processor: Any, stopping_criteria: Any,
                            generation_config: Any, action_map: ActionTokenMap | None = None,
                            drafts: torch.Tensor | None = None, tolerance: int = 0,
                            spec_stats: SpecStats | None = None, **model_kwargs: Any) -> torch.Tensor:
    """Decode one action step (``action_map.n_dof`` tokens per row) with drafts verified in the prefill.

    Args:
        model: the VLA target (called by ``generate``; do not pass it).
        input_ids, logits_processor, stopping_criteria, generation_config, model_kwargs: prepared
            by ``generate``.
        action_map: the target's action tokens.
        drafts: (B, n_dof) drafted action ids.
        tolerance: ``r`` in bins (0: exact greedy).
        spec_stats: counters to fill: ``target_calls`` (passes), ``target_evals`` (rows x passes),
            ``accepted``/``proposed``, ``extra["relaxed_tokens"]`` (accepted drafts that differ
            from the target's argmax given the same prefix).

    Returns:
        (B, T0 + n_dof) ids: the prompt then each row's action tokens (padded after an EOS).
    """
    if action_map is None or drafts is None:
        raise ValueError("relaxed_action_generate needs action_map=<ActionTokenMap> and drafts=<(B, n_dof) ids>")
    n = action_map.n_dof
    if tuple(drafts.shape) != (input_ids.shape[0], n):
        raise ValueError(f"drafts has shape {tuple(drafts.shape)}; expected (batch={input_ids.shape[0]}, n_dof={n})")
    cache = model_kwargs.get("past_key_values")
    if cache is not None and not isinstance(cache, DynamicCache):
        raise ValueError(f"past_key_values={type(cache).__name__} is not supported: use the default DynamicCache")
    stats = spec_stats if spec_stats is not None else SpecStats(method="relaxed-action")
    pad = generation_config._pad_token_tensor
    pad_id = 0 if pad is None else int(pad.reshape(-1)[0])
    eos = generation_config._eos_token_tensor
    eos = None if eos is None else eos.reshape(-1).to(input_ids.device)
    if model_kwargs.get("attention_mask") is None:
        model_kwargs["attention_mask"] = torch.ones_like(input_ids)
    one_round = ActionRound(model, input_ids, logits_processor, model_kwargs, action_map, drafts, tolerance, eos)
    run_rounds(one_round, stats)
    proposed, accepted, relaxed = one_round.counts.tolist()
    stats.proposed += proposed
    stats.accepted += accepted
    stats.extra["relaxed_tokens"] = stats.extra.get("relaxed_tokens", 0) + relaxed
    unused = one_round.finished[:, None] & (one_round.pos_all >= one_round.decided[:, None])
    return torch.cat([input_ids, one_round.cur.masked_fill(unused, pad_id)], 1)
