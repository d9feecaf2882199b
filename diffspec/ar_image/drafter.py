"""EAGLE-style feature drafter for LlamaGen targets (LANTERN's draft model).

The head is one Llama decoder block of the target's width over ``fc([embed(token) ; feature])``:
pair ``j`` is image token ``t_j`` with the target's final hidden state ``F_j`` (the feature whose
logits predict ``t_j``), and the block's output at ``j`` regresses ``F_{j+1}``. Logits come from the
target's own final norm and output head, so the drafter owns only ``fc`` and the block; with CFG it
runs on the conditional and unconditional rows and its logits are mixed like the target's.

Example:
    >>> from diffspec.ar_image.targets.llamagen import LlamaGenConfig, LlamaGenTransformer
    >>> cfg = LlamaGenConfig(dim=32, n_layer=1, n_head=2, vocab_size=8, num_classes=3, block_size=4)
    >>> model = LlamaGenTransformer(cfg).eval()
    >>> head = FeatureDrafter(EagleDrafter(cfg).eval(), model)
    >>> head.features(torch.zeros(2, 4, dtype=torch.long), torch.zeros(2, 4, 32)).shape
    torch.Size([2, 4, 32])
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

from .targets.llamagen import LlamaGenConfig, LlamaGenTransformer, TransformerBlock


class EagleDrafter(nn.Module):
    """The trainable part of the drafter: ``fc`` (``2 dim -> dim``) and one decoder block.

    Args:
        config: the target's :class:`LlamaGenConfig` (width, heads, norm eps, grid for the rope).
    """

    def __init__(self, config: LlamaGenConfig) -> None:
        super().__init__()
        self.config = config
        self.fc = nn.Linear(2 * config.dim, config.dim)
        self.layer = TransformerBlock(config, 0.0)

    def forward(self, embeds: torch.Tensor, feats: torch.Tensor, rope: torch.Tensor, **attn: Any) -> torch.Tensor:
        """``(R, S, dim)`` token embeddings and features → ``(R, S, dim)`` next features.

        Causal over the given pairs, or, with ``cache``/``write_slots``/``mask`` (see LlamaGen's
        ``Attention``), over a static per-row KV cache.
        """
        return self.layer(self.fc(torch.cat([embeds, feats.to(embeds.dtype)], -1)), rope, **attn)

    def save_pretrained(self, directory: str | Path) -> None:
        """Write ``config.json`` (the target's config) and ``model.safetensors``."""
        from .targets.llamagen_load import save_folder

        save_folder(self, self.config.to_dict(), directory)

    @classmethod
    def from_pretrained(cls, directory: str | Path, *, device: str | torch.device = "cpu",
                        dtype: torch.dtype | None = None) -> EagleDrafter:
        """Load a :meth:`save_pretrained` folder strictly, in ``eval()`` mode.

        Example:
            >>> drafter = EagleDrafter.from_pretrained("diffspec/weights/tiny-ar/drafter")  # doctest: +SKIP
        """
        from .targets.llamagen_load import load_folder

        return load_folder(cls, LlamaGenConfig, directory, device=device, dtype=dtype)


class FeatureDrafter:
    """An :class:`EagleDrafter` bound to its target GPT (embeddings, rope, final norm, output head).

    Args:
        drafter: the trained head.
        model: the target's :class:`LlamaGenTransformer` (same width).

    Raises:
        ValueError: the widths differ.
    """

    def __init__(self, drafter: EagleDrafter, model: LlamaGenTransformer) -> None:
        if drafter.config.dim != model.config.dim:
            raise ValueError(f"drafter dim={drafter.config.dim} does not match the target's dim={model.config.dim}")
        self.drafter, self.model = drafter, model

    def features(self, tokens: torch.Tensor, feats: torch.Tensor, positions: torch.Tensor | None = None,
                 cache: list[tuple[torch.Tensor, torch.Tensor]] | None = None) -> torch.Tensor:
        """Pairs ``(tokens[:, i], feats[:, i])`` → predicted next features ``(R, T, dim)``.

        Without ``cache`` the pairs are image positions ``0..T-1`` (causal, training). With a
        :meth:`new_cache`, pair ``i`` of row ``r`` is image position ``positions[r, i]``: its
        key/value is written there and it attends to cached positions ``<=`` its own.
        """
        rows, length = tokens.shape
        cfg = self.model.config
        if positions is None:
            positions = torch.arange(length, device=tokens.device).expand(rows, -1)
        last = cfg.cls_token_num + cfg.block_size - 1
        rope = self.model.rope(tokens.device)[(cfg.cls_token_num + positions).clamp(max=last)]
        embeds = self.model.tok_embeddings(tokens)
        if cache is None:
            return self.drafter(embeds, feats, rope)
        keys = torch.arange(cache[0][0].shape[2], device=tokens.device)
        mask = (keys[None, None, :] <= positions[..., None])[:, None]
        return self.drafter(embeds, feats, rope, mask=mask, cache=cache[0], write_slots=positions)

    def features_at(self, tokens: torch.Tensor, feats: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor,
                    mask: torch.Tensor, cache: list[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
        """Pairs at image ``positions`` ``(R, T)`` written to cache ``slots`` ``(R, T)``, attending under
        ``mask`` ``(R, T, cache slots)`` bool: tree drafting (siblings share a position, not a slot)."""
        cfg = self.model.config
        last = cfg.cls_token_num + cfg.block_size - 1
        rope = self.model.rope(tokens.device)[(cfg.cls_token_num + positions).clamp(max=last)]
        return self.drafter(self.model.tok_embeddings(tokens), feats, rope, mask=mask[:, None], cache=cache[0],
                            write_slots=slots)

    def new_cache(self, rows: int, slots: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """An empty static KV cache of the drafter's block for ``rows`` rows and ``slots`` image positions."""
        cfg, param = self.drafter.config, self.drafter.fc.weight
        shape = (rows, cfg.kv_heads, slots, cfg.head_dim)
        return [(torch.zeros(shape, dtype=param.dtype, device=param.device),
                 torch.zeros(shape, dtype=param.dtype, device=param.device))]

    def logits(self, feats: torch.Tensor) -> torch.Tensor:
        """fp32 logits of features through the target's final norm and output head."""
        return self.model.output(self.model.norm(feats)).float()
