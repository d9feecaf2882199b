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
from .loop import process
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
    B, T0 = input_ids.shape
    dev = input_ids.device
    if tuple(drafts.shape) != (B, n):
        raise ValueError(f"drafts has shape {tuple(drafts.shape)}; expected (batch={B}, n_dof={n})")
    cache = model_kwargs.get("past_key_values")
    if cache is not None and not isinstance(cache, DynamicCache):
        raise ValueError(f"past_key_values={type(cache).__name__} is not supported: use the default DynamicCache")
    stats = spec_stats if spec_stats is not None else SpecStats(method="relaxed-action")
    pad = generation_config._pad_token_tensor
    pad_id = 0 if pad is None else int(pad.reshape(-1)[0])
    eos = generation_config._eos_token_tensor
    eos = None if eos is None else eos.reshape(-1).to(dev)
    if model_kwargs.get("attention_mask") is None:
        model_kwargs["attention_mask"] = torch.ones_like(input_ids)

    # 1. prefill = verification of the first n - 1 drafts (n logits: DoF 0 .. n-1)
    cur = drafts.to(dev).long().clone()
    kw = _extend(model_kwargs, n - 1)
    inputs = model.prepare_inputs_for_generation(torch.cat([input_ids, cur[:, :-1]], 1), is_first_iteration=True, **kw)
    inputs["logits_to_keep"] = n
    out = model(**inputs)
    state = SlotState.after_prefill(out.past_key_values, kw["attention_mask"], kw.get("position_ids"))
    logits, start, fed, first_real = out.logits, 0, n - 1, torch.zeros(B, dtype=torch.long, device=dev)
    done = torch.zeros(B, dtype=torch.long, device=dev)  # tokens decided per row
    finished = torch.zeros(B, dtype=torch.bool, device=dev)
    pos_all = torch.arange(n, device=dev)
    counts = torch.zeros(3, dtype=torch.long, device=dev)  # proposed, accepted, relaxed (synced once at the end)
    while True:
        stats.target_calls += 1
        stats.target_evals += B
        # 2. target argmax for DoF start .. n-1 (processors see the prefix the target saw)
        seqs = torch.cat([input_ids, cur], 1)
        lengths = torch.full((B,), T0, dtype=torch.long, device=dev)
        scores = torch.stack([process(logits_processor, seqs, lengths + start + j, logits[:, j].float())
                              for j in range(n - start)], 1)
        pos = pos_all[start:]
        d = cur[:, start:]
        t, _, m = kernels.bin_tolerance(scores, d, first_id=action_map.first_id, n_bins=action_map.n_bins,
                                        reverse=action_map.reverse, tolerance=tolerance,
                                        always=(pos < done[:, None]).expand_as(d))  # the rule of tolerance_ok
        run = m + start  # first rejected DoF (n: all accepted)
        run = torch.where(finished, done, run)
        fix = (run < n) & ~finished
        idx = (run - start).clamp(0, n - start - 1)
        t_fix = t.gather(1, idx[:, None])[:, 0]
        cur[:, start:] = torch.where(fix[:, None] & (pos == run[:, None]), t, d)
        judged = (pos >= done[:, None]) & ~finished[:, None]
        acc = judged & (pos < run[:, None])
        counts += torch.stack([judged.sum(), acc.sum(), (acc & (d != t)).sum()])
        # 3. EOS and bookkeeping, then roll the cache back to the accepted slots
        new_done = torch.where(finished, done, (run + 1).clamp(max=n))
        if eos is not None:
            finished = finished | (fix & torch.isin(t_fix, eos))
        state.rollback(fed, (run.clamp(max=n - 1) - first_real).clamp(min=0))  # fed slots before ``run`` stay
        done = new_done
        finished = finished | (done >= n)
        s = int(torch.where(finished, n, done - 1).min())  # the round's decision sync (rollback has the other)
        if s >= n - 1:
            break
        # 4. next pass: the emitted token plus the remaining drafts (holes before a row's first real slot)
        first_real = torch.where(finished, n, done - 1)
        valid = (pos_all[s:n - 1] >= first_real[:, None]).long()
        logits = state.forward(model, cur[:, s:n - 1], valid, logits_to_keep=n - 1 - s)
        start, fed = s + 1, n - 1 - s
    proposed, accepted, relaxed = counts.tolist()
    stats.proposed += proposed
    stats.accepted += accepted
    stats.extra["relaxed_tokens"] = stats.extra.get("relaxed_tokens", 0) + relaxed
    tokens = cur.masked_fill(finished[:, None] & (pos_all >= done[:, None]), pad_id)
    return torch.cat([input_ids, tokens], 1)
