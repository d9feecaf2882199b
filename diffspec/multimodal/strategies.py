"""Draft strategies of ``compressed-draft`` and ``self-draft`` for the shared loop.

A strategy gives :func:`~diffspec.multimodal.loop.speculative_generate` two things: a context
around the target's prefill (``probe``: attention scores of the visual tokens, or nothing) and the
drafter's state after it (``prepare``: an object with ``forward``/``rollback``, optionally
``round_start``).

``self-draft`` cache (STD style, no second model): the draft pass reads the *target's* cache
through a per-round view, a fresh ``DynamicCache`` holding, for each layer the draft pass runs,
the target's prompt KV at the kept slots (all text + top-K visual, gathered once at prefill) and
the target's KV of every token decoded since; the draft tokens' KV go into that view only and the
view is dropped after the round (nothing to roll back; the target's cache is never written by a
draft). Skipped layers are identity modules during the draft pass (their cache entries are
aliases of a run layer's, never read). Per round the view costs one copy of its KV (what a
``DynamicCache`` update costs per decoded token anyway).

Example:
    >>> from diffspec.multimodal.self_config import SelfDraftConfig
    >>> strategy_for(SelfDraftConfig(visual_top_k=16)).__class__.__name__
    'SelfDraft'
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any

import torch
from transformers import DynamicCache

from ..config import MethodConfig
from .compressed_config import CompressedDraftConfig
from .drafter import MULTIMODAL_TOKEN_ATTRS, multimodal_token_ids, prepare_drafter
from .prune import compact_index, decoder_of
from .self_config import SelfDraftConfig
from .slots import SlotState
from .visual import AttentionProbe, keep_count, select_visual, visual_mask

VIDEO_TOKEN_ATTRS = tuple(a for a in MULTIMODAL_TOKEN_ATTRS if a.startswith("video"))
"""Config attributes naming video placeholder ids (``compressed-draft``'s ``video_keep`` applies to them)."""


def _mask(input_ids: torch.Tensor, model_kwargs: dict[str, Any]) -> torch.Tensor:
    mask = model_kwargs.get("attention_mask")
    return torch.ones_like(input_ids) if mask is None else mask


class CompressedDraft:
    """``compressed-draft``: the drafter's decoder keeps a fraction of the visual prompt tokens."""

    def __init__(self, config: CompressedDraftConfig) -> None:
        self.config = config

    def probe(self, model: Any, input_ids: torch.Tensor, model_kwargs: dict[str, Any]) -> AbstractContextManager:
        if not self.config.needs_scores:
            return nullcontext()
        return AttentionProbe(model, _mask(input_ids, model_kwargs), rows=self.config.score_rows)

    def keep(self, model: Any, input_ids: torch.Tensor, model_kwargs: dict[str, Any],
             scores: torch.Tensor | None) -> torch.Tensor:
        """(B, T) bool: real text slots plus the selected image and video slots."""
        cfg = self.config
        mask = _mask(input_ids, model_kwargs)
        visual = visual_mask(model, input_ids, mask, model_kwargs)
        video_ids = torch.tensor(multimodal_token_ids(model.config, VIDEO_TOKEN_ATTRS), device=input_ids.device)
        video = visual & torch.isin(input_ids, video_ids)
        mm = model_kwargs.get("mm_token_type_ids")
        if mm is not None:
            video |= visual & (mm == 2)
        image = visual & ~video
        kept = select_visual(image, keep_count(image, cfg.image_keep), scores, cfg.image_selection)
        kept |= select_visual(video, keep_count(video, cfg.video_keep), scores, cfg.video_selection)
        return mask.bool() & (~visual | kept)

    def prepare(self, drafter: Any, model: Any, input_ids: torch.Tensor, model_kwargs: dict[str, Any],
                target: SlotState, drafter_inputs: dict[str, Any] | None, probe: Any) -> SlotState:
        scores = probe.scores if isinstance(probe, AttentionProbe) else None
        keep = self.keep(model, input_ids, model_kwargs, scores)
        return prepare_drafter(drafter, model, input_ids, model_kwargs, text_only=False,
                               drafter_inputs=drafter_inputs, keep=keep)


class _Skip(torch.nn.Module):
    """A skipped decoder layer: returns its input hidden states."""

    def forward(self, hidden_states: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        return hidden_states


@contextmanager
def skip_layers(model: Any, run: tuple[int, ...] | None) -> Iterator[None]:
    """Run ``model`` with only the decoder layers ``run`` (``None``: all), restoring them after."""
    if run is None:
        yield
        return
    layers = decoder_of(model).layers
    saved = {i: layers[i] for i in range(len(layers)) if i not in run}
    skip = _Skip()
    try:
        for i in saved:
            layers[i] = skip
        yield
    finally:
        for i, layer in saved.items():
            layers[i] = layer


class SelfDraftState:
    """The target drafting for itself on a per-round view of its own cache (module doc)."""

    prefill_calls = 0  # no drafter prefill: the target's prefill cache is the drafter's

    def __init__(self, target: SlotState, index: torch.Tensor | None, valid: torch.Tensor | None,
                 prompt_len: int, run: tuple[int, ...] | None, n_layers: int) -> None:
        self.target, self.prompt_len, self.run, self.n_layers = target, prompt_len, run, n_layers
        used = range(n_layers) if run is None else run
        T0 = prompt_len
        cache = target.cache
        if index is None:
            self.prompt_kv = {i: (cache.layers[i].keys[:, :, :T0], cache.layers[i].values[:, :, :T0]) for i in used}
            self.prompt_mask = target.mask[:, :T0]
        else:
            def gather(x: torch.Tensor) -> torch.Tensor:
                return x[:, :, :T0].gather(2, index[:, None, :, None].expand(-1, x.shape[1], -1, x.shape[-1]))

            self.prompt_kv = {i: (gather(cache.layers[i].keys), gather(cache.layers[i].values)) for i in used}
            self.prompt_mask = target.mask[:, :T0].gather(1, index) * valid.long()
        self.view: SlotState | None = None

    def _view_cache(self) -> DynamicCache:
        T0 = self.prompt_len
        tgt = self.target.cache
        view = DynamicCache()
        for i, (k, v) in self.prompt_kv.items():
            view.update(torch.cat([k, tgt.layers[i].keys[:, :, T0:]], 2),
                        torch.cat([v, tgt.layers[i].values[:, :, T0:]], 2), i)
        first = next(iter(self.prompt_kv))
        while len(view.layers) < self.n_layers:
            view.layers.append(view.layers[first])
        for i in range(self.n_layers):  # skipped layers alias a run layer's entry (never read)
            if i not in self.prompt_kv:
                view.layers[i] = view.layers[first]
        return view

    def round_start(self, model: Any, hole_tok: torch.Tensor, hole_valid: torch.Tensor,
                    last: torch.Tensor) -> torch.Tensor:
        """Open this round's view and feed ``last`` (the previous round's drafts are in the target's cache)."""
        mask = torch.cat([self.prompt_mask, self.target.mask[:, self.prompt_len:]], 1)
        self.view = SlotState(self._view_cache(), mask, self.target.next_pos.clone())
        return self.forward(model, last[:, None], logits_to_keep=1)

    def forward(self, model: Any, ids: torch.Tensor, valid: torch.Tensor | None = None,
                logits_to_keep: int = 0) -> torch.Tensor:
        with skip_layers(model, self.run):
            return self.view.forward(model, ids, valid, logits_to_keep)  # type: ignore[union-attr]

    def rollback(self, fed: int, keep: torch.Tensor) -> None:
        self.view = None  # the view (and the drafts' KV) is dropped; the next round opens a new one


class SelfDraft:
    """``self-draft``: sparse top-K visual KV and/or layer skip over the target's own cache."""

    def __init__(self, config: SelfDraftConfig) -> None:
        self.config = config

    def probe(self, model: Any, input_ids: torch.Tensor, model_kwargs: dict[str, Any]) -> AbstractContextManager:
        if not self.config.sparse_visual:
            return nullcontext()
        return AttentionProbe(model, _mask(input_ids, model_kwargs), rows=self.config.score_rows)

    def prepare(self, drafter: Any, model: Any, input_ids: torch.Tensor, model_kwargs: dict[str, Any],
                target: SlotState, drafter_inputs: dict[str, Any] | None, probe: Any) -> SelfDraftState:
        cfg = self.config
        n_layers = len(decoder_of(model).layers)
        if cfg.draft_layers is not None and max(cfg.draft_layers) >= n_layers:
            raise ValueError(f"draft_layers={cfg.draft_layers!r} is out of range: the target has {n_layers} decoder "
                             f"layers, allowed indices [0, {n_layers - 1}]")
        index = valid = None
        if cfg.sparse_visual:
            mask = _mask(input_ids, model_kwargs)
            visual = visual_mask(model, input_ids, mask, model_kwargs)
            kept = select_visual(visual, keep_count(visual, cfg.visual_ratio, cfg.visual_top_k), probe.scores,
                                 "attention")
            index, valid = compact_index(mask.bool() & (~visual | kept))
        return SelfDraftState(target, index, valid, input_ids.shape[1], cfg.draft_layers, n_layers)


def strategy_for(config: MethodConfig) -> CompressedDraft | SelfDraft | None:
    """The loop strategy of a multimodal config (``None``: plain ``draft``/``text-draft``)."""
    if isinstance(config, SelfDraftConfig):
        return SelfDraft(config)
    if isinstance(config, CompressedDraftConfig):
        return CompressedDraft(config)
    return None
