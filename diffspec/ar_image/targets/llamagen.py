"""LlamaGen's autoregressive image transformer (class- and text-conditional), own implementation.

The module layout and parameter names follow the official ``autoregressive/models/gpt.py`` of
https://github.com/FoundationVision/LlamaGen so its checkpoints load key for key
(``tok_embeddings``, ``cls_embedding.embedding_table`` / ``cls_embedding.cap_proj.fc1``,
``layers.N.attention.wqkv``/``wo``, ``layers.N.feed_forward.w1/w2/w3``, ``attention_norm``,
``ffn_norm``, ``norm``, ``output``). Architecture: Llama blocks (RMSNorm, SwiGLU, no biases), a 2D
rotary embedding (first half of each head's rotation pairs turns with the token's grid row, the
second half with its column) and condition tokens first. As in the official code the condition
positions get an all-zero rotary table, so their queries and keys are zero vectors (not an identity
rotation); reproducing that is what makes official weights give official logits.

Sequence layout: ``cls_token_num`` condition tokens, then image tokens; the output at sequence
position ``cls_token_num - 1 + j`` predicts image token ``j``.

Example:
    >>> cfg = LlamaGenConfig(dim=64, n_layer=2, n_head=4, vocab_size=32, num_classes=10, block_size=16)
    >>> model = LlamaGenTransformer(cfg).eval()
    >>> tokens = torch.randint(0, 32, (2, 16))
    >>> model(tokens, torch.tensor([3, 7])).shape  # row j predicts image token j
    torch.Size([2, 16, 32])
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from diffspec.ar_image.targets.llamagen_config import (
    CAPTION_NULL_TOKENS,
    LLAMAGEN_PRESETS,
    LlamaGenConfig,
    apply_rope,
    rope_table_2d,
)

__all__ = ["LLAMAGEN_PRESETS", "LlamaGenConfig", "LlamaGenTransformer", "apply_rope", "rope_table_2d"]


class RMSNorm(nn.Module):
    """Root-mean-square norm computed in fp32 (key: ``weight``)."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).type_as(x) * self.weight


class FeedForward(nn.Module):
    """SwiGLU: ``w2(silu(w1 x) * w3 x)``."""

    def __init__(self, config: LlamaGenConfig) -> None:
        super().__init__()
        hidden = config.ffn_hidden
        self.w1 = nn.Linear(config.dim, hidden, bias=False)
        self.w3 = nn.Linear(config.dim, hidden, bias=False)
        self.w2 = nn.Linear(hidden, config.dim, bias=False)
        self.ffn_dropout = nn.Dropout(config.ffn_dropout_p)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.ffn_dropout(self.w2(F.silu(self.w1(x)) * self.w3(x)))


class Attention(nn.Module):
    """Multi-head (optionally grouped) attention with a fused ``wqkv`` projection.

    With ``cache=(k_cache, v_cache)`` (each ``(B, n_kv_head, S, head_dim)``) the new keys/values
    are scattered into the cache at ``write_slots`` ``(B, T)`` and the queries attend to the whole
    cache under ``mask``; without it, to the current sequence (causal unless ``mask`` is given).
    """

    def __init__(self, config: LlamaGenConfig) -> None:
        super().__init__()
        self.n_head, self.n_kv_head, self.head_dim = config.n_head, config.kv_heads, config.head_dim
        self.wqkv = nn.Linear(config.dim, (self.n_head + 2 * self.n_kv_head) * self.head_dim, bias=False)
        self.wo = nn.Linear(config.dim, config.dim, bias=False)
        self.attn_dropout_p = config.attn_dropout_p
        self.resid_dropout = nn.Dropout(config.resid_dropout_p)

    def forward(
        self,
        x: torch.Tensor,
        rope: torch.Tensor,
        mask: torch.Tensor | None = None,
        cache: tuple[torch.Tensor, torch.Tensor] | None = None,
        write_slots: torch.Tensor | None = None,
    ) -> torch.Tensor:
        bsz, seq, _ = x.shape
        kv = self.n_kv_head * self.head_dim
        q, k, v = self.wqkv(x).split([self.n_head * self.head_dim, kv, kv], dim=-1)
        q = apply_rope(q.view(bsz, seq, self.n_head, self.head_dim), rope).transpose(1, 2)
        k = apply_rope(k.view(bsz, seq, self.n_kv_head, self.head_dim), rope).transpose(1, 2)
        v = v.view(bsz, seq, self.n_kv_head, self.head_dim).transpose(1, 2)
        if cache is not None:
            k_cache, v_cache = cache
            index = write_slots[:, None, :, None].expand(-1, self.n_kv_head, -1, self.head_dim)
            k_cache.scatter_(2, index, k.to(k_cache.dtype))
            v_cache.scatter_(2, index, v.to(v_cache.dtype))
            k, v = k_cache, v_cache
        out = F.scaled_dot_product_attention(
            q,
            k,
            v,
            attn_mask=mask,
            is_causal=mask is None and cache is None,
            dropout_p=self.attn_dropout_p if self.training else 0.0,
            enable_gqa=self.n_kv_head != self.n_head,
        )
        return self.resid_dropout(self.wo(out.transpose(1, 2).reshape(bsz, seq, -1)))


class _DropPath(nn.Module):
    """Stochastic depth on the residual branch (training only)."""

    def __init__(self, p: float) -> None:
        super().__init__()
        self.p = p

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.p == 0.0:
            return x
        keep = x.new_empty(x.shape[0], *([1] * (x.dim() - 1))).bernoulli_(1 - self.p)
        return x * keep / (1 - self.p)


class TransformerBlock(nn.Module):
    """Pre-norm Llama block: ``h = x + attn(norm(x)); out = h + ffn(norm(h))``."""

    def __init__(self, config: LlamaGenConfig, drop_path: float) -> None:
        super().__init__()
        self.attention = Attention(config)
        self.feed_forward = FeedForward(config)
        self.attention_norm = RMSNorm(config.dim, config.norm_eps)
        self.ffn_norm = RMSNorm(config.dim, config.norm_eps)
        self.drop_path = _DropPath(drop_path)

    def forward(self, x: torch.Tensor, rope: torch.Tensor, **attn: Any) -> torch.Tensor:
        h = x + self.drop_path(self.attention(self.attention_norm(x), rope, **attn))
        return h + self.drop_path(self.feed_forward(self.ffn_norm(h)))


class LabelEmbedder(nn.Module):
    """Class-label embedding with a null label ``num_classes`` (key ``embedding_table``)."""

    def __init__(self, config: LlamaGenConfig) -> None:
        super().__init__()
        self.num_classes = config.num_classes
        self.dropout_prob = config.class_dropout_prob
        self.embedding_table = nn.Embedding(config.num_classes + int(self.dropout_prob > 0), config.dim)

    def null_condition(self, batch: int, device: torch.device) -> torch.Tensor:
        """The unconditional input for CFG: ``(batch,)`` null labels."""
        return torch.full((batch,), self.num_classes, dtype=torch.long, device=device)

    def forward(self, labels: torch.Tensor, drop: torch.Tensor | None = None) -> torch.Tensor:
        if drop is not None:
            labels = torch.where(drop, self.num_classes, labels)
        return self.embedding_table(labels)[:, None]


class CaptionMLP(nn.Module):
    """``fc2(gelu_tanh(fc1 x))`` without biases."""

    def __init__(self, in_features: int, hidden: int, out_features: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(in_features, hidden, bias=False)
        self.act = nn.GELU(approximate="tanh")
        self.fc2 = nn.Linear(hidden, out_features, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


class CaptionEmbedder(nn.Module):
    """Caption projection (``cap_proj``) and the learned null caption buffer ``uncond_embedding``."""

    def __init__(self, config: LlamaGenConfig) -> None:
        super().__init__()
        self.cap_proj = CaptionMLP(config.caption_dim, config.dim, config.dim)
        null = torch.randn(CAPTION_NULL_TOKENS, config.caption_dim) / config.caption_dim**0.5
        self.register_buffer("uncond_embedding", null)

    def null_condition(self, batch: int, device: torch.device) -> torch.Tensor:
        """The unconditional input for CFG: ``(batch, 120, caption_dim)`` null captions."""
        return self.uncond_embedding.to(device)[None].expand(batch, -1, -1)

    def forward(self, caption: torch.Tensor, drop: torch.Tensor | None = None) -> torch.Tensor:
        if drop is not None:
            null = self.uncond_embedding[: caption.shape[1]].to(caption.dtype)
            caption = torch.where(drop[:, None, None], null, caption)
        return self.cap_proj(caption)


class LlamaGenTransformer(nn.Module):
    """The LlamaGen GPT: condition token(s), then image tokens, next-token logits over the codebook.

    Args:
        config: a :class:`LlamaGenConfig` (presets via ``LlamaGenConfig.from_preset``).

    Example:
        >>> cfg = LlamaGenConfig(dim=64, n_layer=1, n_head=4, vocab_size=16, num_classes=4, block_size=4)
        >>> m = LlamaGenTransformer(cfg).eval()
        >>> m(torch.zeros(1, 4, dtype=torch.long), torch.tensor([2])).shape
        torch.Size([1, 4, 16])
    """

    def __init__(self, config: LlamaGenConfig) -> None:
        super().__init__()
        self.config = config
        self.cls_token_num = config.cls_token_num
        self.cls_embedding: LabelEmbedder | CaptionEmbedder = (
            LabelEmbedder(config) if config.model_type == "c2i" else CaptionEmbedder(config)
        )
        self.tok_embeddings = nn.Embedding(config.vocab_size, config.dim)
        self.tok_dropout = nn.Dropout(config.token_dropout_p)
        rates = [config.drop_path_rate * i / max(config.n_layer - 1, 1) for i in range(config.n_layer)]
        self.layers = nn.ModuleList(TransformerBlock(config, r) for r in rates)
        self.norm = RMSNorm(config.dim, config.norm_eps)
        self.output = nn.Linear(config.dim, config.vocab_size, bias=False)
        # fp32 rotary table, deliberately not a buffer: ``.to(bfloat16)`` must not round it.
        self.freqs_cis = rope_table_2d(config)
        self._init_weights()

    def _init_weights(self) -> None:
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, std=self.config.initializer_range)
        nn.init.zeros_(self.output.weight)

    def embed_condition(self, cond: torch.Tensor, drop: torch.Tensor | None = None) -> torch.Tensor:
        """``(B, cls_token_num, dim)`` condition embeddings (labels ``(B,)`` or captions ``(B, T, C)``)."""
        return self.cls_embedding(cond, drop)[:, : self.cls_token_num]

    def null_condition(self, batch: int, device: torch.device | None = None) -> torch.Tensor:
        """Unconditional condition input for CFG (null labels or the learned null caption)."""
        return self.cls_embedding.null_condition(batch, device or self.tok_embeddings.weight.device)

    def rope(self, device: torch.device) -> torch.Tensor:
        """The fp32 rotary table on ``device`` (moved once, then cached)."""
        if self.freqs_cis.device != device:
            self.freqs_cis = self.freqs_cis.to(device)
        return self.freqs_cis

    def run_layers(
        self,
        h: torch.Tensor,
        rope: torch.Tensor,
        mask: torch.Tensor | None = None,
        caches: list[tuple[torch.Tensor, torch.Tensor]] | None = None,
        write_slots: torch.Tensor | None = None,
        return_hidden: bool = False,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Blocks, final norm and output head: fp32 logits ``(B, S, vocab)``.

        ``caches`` holds one ``(k, v)`` pair per layer (see :class:`Attention`); the new keys and
        values are written at ``write_slots`` before attending. ``return_hidden=True`` also
        returns the last block's output (before the final norm: the EAGLE drafter's feature).
        """
        for i, layer in enumerate(self.layers):
            cache = caches[i] if caches is not None else None
            h = layer(h, rope, mask=mask, cache=cache, write_slots=write_slots)
        logits = self.output(self.norm(h)).float()
        return (logits, h) if return_hidden else logits

    def forward(
        self,
        idx: torch.Tensor,
        cond_idx: torch.Tensor,
        cond_mask: torch.Tensor | None = None,
        drop_condition: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Teacher forcing: ``(B, N)`` image tokens → ``(B, N, vocab)`` fp32 logits, row j predicts token j.

        Token ``N - 1`` is only a target (the model sees the condition and tokens ``< j``).

        Args:
            idx: image tokens ``(B, N)``, ``1 <= N <= block_size``.
            cond_idx: class ids ``(B,)`` (c2i) or caption embeddings ``(B, T, caption_dim)`` (t2i).
            cond_mask: t2i only, ``(B, cls_token_num)`` bool, False for padded caption slots.
            drop_condition: ``(B,)`` bool, rows that get the null condition. ``None`` in training
                mode draws it with ``class_dropout_prob`` (as the official code); in eval: none.
        """
        bsz, n = idx.shape
        if not 1 <= n <= self.config.block_size:
            raise ValueError(f"idx has {n} tokens; expected 1..block_size={self.config.block_size}")
        if drop_condition is None and self.training and self.config.class_dropout_prob > 0:
            drop_condition = torch.rand(bsz, device=idx.device) < self.config.class_dropout_prob
        cond = self.embed_condition(cond_idx, drop_condition)
        h = torch.cat([cond, self.tok_embeddings(idx[:, :-1]).to(cond.dtype)], dim=1)
        h = self.tok_dropout(h)
        seq = h.shape[1]
        mask = None
        if cond_mask is not None:
            key_ok = torch.ones(bsz, seq, dtype=torch.bool, device=h.device)
            key_ok[:, : self.cls_token_num] = cond_mask.to(h.device, torch.bool)
            pos = torch.arange(seq, device=h.device)
            mask = ((pos[None, :] <= pos[:, None]) & key_ok[:, None, :]) | torch.eye(
                seq, dtype=torch.bool, device=h.device
            )
            mask = mask[:, None]
        logits = self.run_layers(h, self.rope(h.device)[:seq], mask=mask)
        return logits[:, self.cls_token_num - 1 :]

    def save_pretrained(self, save_directory: str | Path) -> None:
        """Write ``config.json`` and ``model.safetensors`` (official key names)."""
        from diffspec.ar_image.targets.llamagen_load import save_folder

        save_folder(self, self.config.to_dict(), save_directory)

    @classmethod
    def from_pretrained(
        cls, directory: str | Path, *, device: str | torch.device = "cpu", dtype: torch.dtype | None = None
    ) -> LlamaGenTransformer:
        """Load a :meth:`save_pretrained` folder (strict: every key must match); returns ``eval()`` mode."""
        from diffspec.ar_image.targets.llamagen_load import load_folder

        return load_folder(cls, LlamaGenConfig, directory, device=device, dtype=dtype)
