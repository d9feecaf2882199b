"""Prefill pruning: the decoder of a drafter sees only some prompt slots, at their original positions.

:class:`PrunePrefill` is a forward pre-hook on a model's decoder (``get_decoder()``: the language
model of a VLM) that gathers the prefill's ``inputs_embeds`` (visual features already merged),
attention mask and position ids (1-D, or the M-RoPE rows) at the kept slots. The cache then holds
only those slots; later calls pass their own positions, so decoding continues where plain
decoding would.

Example:
    >>> import torch
    >>> compact_index(torch.tensor([[True, False, True], [False, False, True]]))[0].tolist()
    [[0, 2], [2, 0]]
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Any

import torch


def compact_index(keep: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Rectangular gather index of the kept slots, in order: ``(index, valid)``, both (B, n) with
    ``n`` the largest kept count (shorter rows padded with masked slots)."""
    order = torch.argsort((~keep).long(), dim=1, stable=True)
    n = int(keep.sum(1).max())  # one host sync, at prefill
    index = order[:, :n]
    return index, keep.gather(1, index)


def decoder_of(model: Any) -> torch.nn.Module:
    """The decoder stack of a transformers LM/VLM (the module holding ``layers``)."""
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else None
    if not isinstance(getattr(decoder, "layers", None), torch.nn.ModuleList):
        raise ValueError(f"{type(model).__name__}: no decoder layer list found (get_decoder().layers); pruned "
                         "prefills, layer skip and attention scores need a decoder-only transformers LM/VLM")
    return decoder


def _gather_slots(x: torch.Tensor, index: torch.Tensor, dim: int) -> torch.Tensor:
    shape = [1] * x.ndim
    shape[dim] = index.shape[1]
    shape[dim - 1] = index.shape[0]
    idx = index.reshape(shape).expand(*x.shape[:dim], index.shape[1], *x.shape[dim + 1:])
    return x.gather(dim, idx)


class PrunePrefill(AbstractContextManager):
    """Keep the prompt slots ``index`` (B, n) of the next decoder call of width ``index.shape``'s
    source length; ``valid`` (B, n) masks padding. :attr:`positions` holds the kept position ids.

    Example:
        >>> with PrunePrefill(decoder_of(drafter), index, valid, width=T) as prune:  # doctest: +SKIP
        ...     drafter(**prefill_inputs)
    """

    def __init__(self, decoder: torch.nn.Module, index: torch.Tensor, valid: torch.Tensor, width: int) -> None:
        self.decoder, self.index, self.valid, self.width = decoder, index, valid.long(), width
        self.positions: torch.Tensor | None = None
        self._handle: Any = None

    def __enter__(self) -> PrunePrefill:
        self._handle = self.decoder.register_forward_pre_hook(self._hook, with_kwargs=True)
        return self

    def __exit__(self, *exc: Any) -> None:
        self._handle.remove()

    def _hook(self, module: Any, args: tuple, kwargs: dict[str, Any]) -> tuple[tuple, dict[str, Any]]:
        if args:
            raise ValueError("PrunePrefill expects the decoder to be called with keyword arguments")
        emb, ids = kwargs.get("inputs_embeds"), kwargs.get("input_ids")
        src = emb if emb is not None else ids
        B, T = src.shape[:2]
        if T != self.width:
            raise ValueError(f"pruned prefill: the drafter's prompt has {T} slots but the target's has "
                             f"{self.width}; compressed drafting needs a drafter of the target's family "
                             "(same processor, same number of visual tokens)")
        if emb is not None:
            kwargs["inputs_embeds"] = _gather_slots(emb, self.index, 1)
        else:
            kwargs["input_ids"] = ids.gather(1, self.index)
        mask = kwargs.get("attention_mask")
        if mask is not None and not (isinstance(mask, torch.Tensor) and mask.ndim == 2):
            raise ValueError("pruned prefill needs a 2-D attention mask at the decoder")
        mask = torch.ones(B, T, dtype=torch.long, device=src.device) if mask is None else mask
        kwargs["attention_mask"] = mask.gather(1, self.index) * self.valid
        pos = kwargs.get("position_ids")
        if pos is None:
            pos = torch.arange(T, device=src.device).expand(B, T)
        self.positions = pos.gather(1, self.index) if pos.ndim == 2 else _gather_slots(pos, self.index, pos.ndim - 1)
        kwargs["position_ids"] = self.positions
        return args, kwargs
