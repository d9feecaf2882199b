"""Restricting a transformer call to some batch rows, and merging a sub-batch result back.

Used where rows decide on their own: only the rows that must be full are recomputed, and the
verifier runs on the checked rows only. Arguments are recognised by name, conventions the diffusers
transformers share; what holds for one class only is in its :class:`~.profiles.ModelProfile`.
"""

from __future__ import annotations

from typing import Any

import torch

UNBATCHED_ARGS = frozenset({"img_ids", "txt_ids", "image_rotary_emb", "rotary_emb", "freqs_cis",
                            "visual_rope_pos", "text_rope_pos",  # Kandinsky 5: 1-D position ranges
                            "attention_kwargs", "joint_attention_kwargs", "return_dict",
                            "control_hidden_states_scale",
                            # FramePack: 1-D frame indices of the latents and of each history
                            "indices_latents", "indices_latents_clean", "indices_latents_history_2x",
                            "indices_latents_history_4x",
                            "rotary_embedding",  # Stable Audio: a (cos, sin) pair of (S, D) tables
                            "sta_mask"})  # Kandinsky 6 SR: NABLA's (blocks, blocks) sliding-tile prior
"""Arguments usually without a batch dimension: only their tensors of 3+ dims whose first dim is
the batch are sliced (LTX's rotary embedding is ``(B, S, D)``; Flux's is a 2-D table; a position
range, or Wan VACE's ``control_hidden_states_scale`` (one entry per VACE layer), as long as the batch
is not sliced; FramePack's frame indices)."""

PER_ROW_LIST_ARGS = frozenset({"img_shapes",
                               "shape_list"})  # JoyImage Edit Plus: each row's (t, h, w) per component
"""Python lists / tuples with one entry per batch row (Qwen-Image's ``img_shapes``, from which the
edit model builds its per-row ``modulate_index``): sliced like a batch when their length is the batch.
Other lists are left whole: a config tuple can have the batch's length by chance."""

STACKED_ARGS = frozenset({"temb"})
"""Tensors stacking ``m`` copies of the batch along dim 0, copy ``j`` at rows ``j * batch ..``:
Qwen-Image with ``zero_cond_t`` (the edit models) passes its blocks ``temb`` for the real timestep's
rows, then the zero timestep's. When their first dim is ``m * batch`` (``m > 1``), each copy is sliced."""

BATCH_DIM1_ARGS = frozenset({"encoder_hidden_states_llama3"})
"""Tensors with the batch at dim 1: HiDream's stack of Llama-3 hidden layers, ``(layers, B, L, D)``. Sliced
along dim 1 when it is the batch."""
TRAILING_SHARED_ARGS = frozenset({"modulation"})
"""Tensors of ``batch + 1`` rows whose last row is shared by every batch row: Qwen-Image 2.1 (``causal_condition``)
passes its blocks one modulation row per sample, then the ``t = 0`` row of the text and condition tokens. When their
first dim is ``batch + 1``, the rows are sliced and the last row kept."""


def take_rows(value: Any, index: torch.Tensor, batch: int, name: str | None = None, per_row_lists: bool = False,
              unbatched: frozenset[str] = frozenset()) -> Any:
    """``value`` (argument ``name``) restricted to the rows ``index`` wherever it has a batch dimension.

    ``per_row_lists``: the model takes its latents as a list with one entry per row (Z-Image), and so
    every list of ``batch`` entries (caption features...) is indexed as a list of rows. ``unbatched``: names
    never sliced (the ``unbatched_args`` of the model's :class:`~.profiles.ModelProfile`).
    """
    if name is not None and name in unbatched:
        return value
    if per_row_lists and isinstance(value, list) and len(value) == batch:
        return [value[i] for i in index.tolist()]
    if isinstance(value, torch.Tensor):
        if name in STACKED_ARGS and value.dim() >= 1 and value.shape[0] > batch and value.shape[0] % batch == 0:
            index = index.to(value.device, non_blocking=True)
            stacked = torch.cat([index + j * batch for j in range(value.shape[0] // batch)])
            return value.index_select(0, stacked)
        if name in BATCH_DIM1_ARGS:
            batched = value.dim() >= 2 and value.shape[1] == batch
            return value.index_select(1, index.to(value.device, non_blocking=True)) if batched else value
        if name in TRAILING_SHARED_ARGS and value.dim() >= 1 and value.shape[0] == batch + 1:
            index = index.to(value.device, non_blocking=True)
            return value.index_select(0, torch.cat([index, index.new_tensor([batch])]))
        batched = value.dim() >= (3 if name in UNBATCHED_ARGS else 1) and value.shape[0] == batch
        return value.index_select(0, index.to(value.device, non_blocking=True)) if batched else value
    if name in PER_ROW_LIST_ARGS and isinstance(value, (list, tuple)) and len(value) == batch:
        return type(value)(value[i] for i in index.tolist())
    if isinstance(value, dict):
        return {k: take_rows(v, index, batch, k, per_row_lists, unbatched) for k, v in value.items()}
    if isinstance(value, (list, tuple)) and value and all(isinstance(v, torch.Tensor) for v in value):
        return type(value)(take_rows(v, index, batch, name) for v in value)
    return value


def take_call_rows(args: tuple, kwargs: dict, names: list[str], index: torch.Tensor,
                   batch: int, per_row_lists: bool = False,
                   unbatched: frozenset[str] = frozenset()) -> tuple[tuple, dict]:
    """A call's positional (named by ``names``) and keyword arguments restricted to the rows ``index``."""
    sub_args = tuple(take_rows(a, index, batch, names[i] if i < len(names) else None, per_row_lists, unbatched)
                     for i, a in enumerate(args))
    return sub_args, {k: take_rows(v, index, batch, k, per_row_lists, unbatched) for k, v in kwargs.items()}


def merge_rows(index: torch.Tensor, part: Any, whole: Any, per_row_lists: bool = False) -> Any:
    """``whole`` with the rows ``index`` replaced by ``part``'s (tensors, tuples, diffusers outputs).

    ``part`` holds just the rows ``index``, in order, or every row of ``whole`` (a whole-batch recompute,
    a ``batch_coupled`` model's), from which the rows ``index`` are taken.

    ``per_row_lists``: lists hold one entry per row (Z-Image returns a list of per-image tensors).
    """
    if per_row_lists and isinstance(part, list) and isinstance(whole, list):
        merged = list(whole)
        for j, i in enumerate(index.tolist()):
            merged[i] = part[j]
        return merged
    if isinstance(part, torch.Tensor):
        if not isinstance(whole, torch.Tensor) or whole.dim() == 0 or part.shape[1:] != whole.shape[1:]:
            return whole
        index = index.to(whole.device, non_blocking=True)
        if part.shape[0] != index.numel():  # every row: keep ``index``'s
            part = part.index_select(0, index)
        return whole.index_copy(0, index, part.to(whole.dtype))
    if isinstance(part, tuple):
        return tuple(merge_rows(index, a, b, per_row_lists) for a, b in zip(part, whole))
    if hasattr(part, "keys"):  # diffusers BaseOutput
        return type(part)(**{k: merge_rows(index, part[k], whole[k], per_row_lists) for k in part.keys()})
    return whole


