"""Ragged rows over one dense KV cache: masked slots and explicit gap-free positions.

Rows of a batch accept different numbers of drafts. Instead of re-padding, every row keeps its
rejected cache slots (attention mask 0) and each row has its own next position, so the tokens
it feeds later get the positions plain decoding would have given them (M-RoPE included: a
position tensor (R, B, L) advances every row ``R`` alike, as transformers' generation does for
decoded tokens). The cache tail rejected by *every* row is cropped (5.x ``crop(-n)``), so batch 1
reduces to the usual assisted-generation rollback.

Example:
    >>> import torch
    >>> s = SlotState(cache=None, mask=torch.ones(2, 3, dtype=torch.long), next_pos=torch.tensor([3, 2]))
    >>> s.positions(2).tolist()
    [[3, 4], [2, 3]]
"""

from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass, field
from typing import Any

import torch


def drop_tail(cache: Any, n: int) -> None:
    """Remove the last ``n`` slots of a transformers cache (no-op for ``n <= 0``; 5.x semantics).

    ``crop(0)`` empties a 4.x cache, so it is never called with 0.
    """
    if n > 0:
        cache.crop(-n)


@functools.lru_cache(maxsize=64)
def _forward_params(forward: Any) -> frozenset[str]:
    return frozenset(inspect.signature(forward).parameters)


def forward_params(model: Any) -> frozenset[str]:
    """The parameter names of ``model.forward`` (cached per forward function: read once per model class)."""
    forward = model.forward
    return _forward_params(getattr(forward, "__func__", forward))


def takes_logits_to_keep(model: Any) -> bool:
    """Whether ``model.forward`` names ``logits_to_keep`` (Whisper and MusicGen compute every position)."""
    return "logits_to_keep" in forward_params(model)


@dataclass
class SlotState:
    """One model's cache with its slot mask (B, S) and next positions ((B,) or (R, B)).

    ``seq2seq`` feeds an encoder-decoder's decoder (``decoder_input_ids``, ``decoder_attention_mask``,
    ``decoder_position_ids``; its :class:`~transformers.EncoderDecoderCache` crops the self-attention
    part and keeps the cross-attention part); ``static`` holds kwargs passed on every call (the
    encoder outputs). ``dense``: every slot is known to be real (the mask is all ones), so the model
    gets ``attention_mask=None`` (no per-call mask check or build, e.g. at batch 1); it is kept
    while the fed slots are real and every row keeps the same slots.
    """

    cache: Any
    mask: torch.Tensor
    next_pos: torch.Tensor
    seq2seq: bool = False
    static: dict[str, Any] = field(default_factory=dict)
    dense: bool = False

    @classmethod
    def after_prefill(cls, cache: Any, mask: torch.Tensor, position_ids: torch.Tensor | None) -> SlotState:
        """State after a prefill of ``mask.shape[1]`` slots, from the prompt's position ids (or the mask)."""
        if position_ids is None:
            next_pos = mask.long().sum(-1)
        else:  # plain decoding continues from the last position; a masked last slot (text-only
            # drafter) continues from the largest real one
            last_real = position_ids.masked_fill(mask == 0, -1).amax(-1) + 1
            next_pos = torch.where(mask[:, -1] > 0, position_ids[..., -1] + 1, last_real)
        return cls(cache, mask.long(), next_pos.long(), dense=bool(mask.all()))

    def positions(self, length: int, valid: torch.Tensor | None = None) -> torch.Tensor:
        """Positions of the next ``length`` fed slots; ``valid`` (B, length) marks the real ones
        (a masked slot takes the position of the next real slot and does not advance it)."""
        if valid is None:
            offs = torch.arange(length, device=self.mask.device).expand(self.mask.shape[0], length)
        else:
            offs = valid.long().cumsum(1) - valid.long()
        return self.next_pos[..., None] + offs

    def forward(self, model: Any, ids: torch.Tensor, valid: torch.Tensor | None = None,
                logits_to_keep: int = 0) -> torch.Tensor:
        """Feed ``ids`` (B, L) after the cached slots; return logits of the last ``logits_to_keep``
        (0: all). ``valid`` (B, L) masks slots that must stay invisible (holes)."""
        L = ids.shape[1]
        self.dense = self.dense and valid is None
        pos = self.positions(L, valid)
        valid = torch.ones_like(ids, dtype=torch.long) if valid is None else valid.long()
        self.mask = torch.cat([self.mask, valid], dim=1)
        prefix = "decoder_" if self.seq2seq else ""
        mask = None if self.dense else self.mask
        kwargs = {f"{prefix}input_ids": ids, f"{prefix}attention_mask": mask, f"{prefix}position_ids": pos,
                  "past_key_values": self.cache, "use_cache": True, **self.static}
        keep = takes_logits_to_keep(model)
        if keep:
            kwargs["logits_to_keep"] = logits_to_keep
        out = model(**kwargs)
        self.cache = out.past_key_values
        self.next_pos = self.next_pos + valid.sum(1)
        return out.logits if keep or not logits_to_keep else out.logits[:, -logits_to_keep:]

    def rollback(self, fed: int, keep: torch.Tensor) -> None:
        """Of the last ``fed`` slots, row ``b`` keeps its first ``keep[b]`` *real* ones.

        The slots after the longest kept prefix are cropped from the cache; the other rows'
        rejected slots are masked and their next positions moved back.
        """
        new_mask = self.mask[:, -fed:]
        real_rank = new_mask.cumsum(1)  # 1-based rank among real slots
        kept = (new_mask > 0) & (real_rank <= keep[:, None])
        last_kept = torch.where(kept, torch.arange(1, fed + 1, device=kept.device), 0).amax()
        # the one sync: the longest kept prefix and whether every row keeps exactly that prefix
        last_kept, uniform = torch.stack([last_kept, (kept.sum(1) == last_kept).all().long()]).tolist()
        self.dense = self.dense and bool(uniform)
        drop = fed - int(last_kept)
        self.next_pos = self.next_pos - (new_mask.sum(1) - kept.sum(1))
        self.mask = torch.cat([self.mask[:, :-fed], kept.long()], dim=1)
        if drop > 0:
            drop_tail(self.cache, drop)
            self.mask = self.mask[:, :-drop]
