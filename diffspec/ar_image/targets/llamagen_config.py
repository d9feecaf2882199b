"""Configuration of LlamaGen GPTs (official ``ModelArgs`` field names and presets) and its 2D RoPE.

Example:
    >>> cfg = LlamaGenConfig.from_preset("GPT-B", block_size=256)
    >>> cfg.dim, cfg.n_layer, cfg.grid, cfg.ffn_hidden
    (768, 12, (16, 16), 2048)
    >>> rope_table_2d(cfg).shape  # (cls_token_num + 256, head_dim // 2, (cos, sin))
    torch.Size([257, 32, 2])
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import torch

# Official presets (``GPT_models`` in gpt.py): name -> (n_layer, n_head, dim).
LLAMAGEN_PRESETS: dict[str, dict[str, int]] = {
    "GPT-B": {"n_layer": 12, "n_head": 12, "dim": 768},
    "GPT-L": {"n_layer": 24, "n_head": 16, "dim": 1024},
    "GPT-XL": {"n_layer": 36, "n_head": 20, "dim": 1280},
    "GPT-XXL": {"n_layer": 48, "n_head": 24, "dim": 1536},
    "GPT-XXXL": {"n_layer": 48, "n_head": 40, "dim": 2560},
    "GPT-1B": {"n_layer": 22, "n_head": 32, "dim": 2048},
    "GPT-3B": {"n_layer": 24, "n_head": 32, "dim": 3200},
    "GPT-7B": {"n_layer": 32, "n_head": 32, "dim": 4096},
}

# Tokens of the learned null caption in the official CaptionEmbedder (independent of cls_token_num).
CAPTION_NULL_TOKENS = 120


def _positive(name: str, value: float) -> None:
    if not value > 0:
        raise ValueError(f"LlamaGenConfig.{name} must be > 0, got {value!r}")


@dataclasses.dataclass(frozen=True)
class LlamaGenConfig:
    """Hyper-parameters of a LlamaGen GPT (field names of the official ``ModelArgs``).

    Attributes:
        dim: model width. n_layer: blocks. n_head: query heads; ``dim / n_head`` must be a multiple
            of 4 (2D RoPE). n_kv_head: key/value heads (``None`` = ``n_head``).
        multiple_of, ffn_dim_multiplier: SwiGLU hidden size = ``2/3 * 4 * dim`` (times the
            multiplier) rounded up to a multiple of ``multiple_of``.
        rope_base: rotary base. norm_eps: RMSNorm epsilon. initializer_range: init std.
        token_dropout_p, attn_dropout_p, resid_dropout_p, ffn_dropout_p, drop_path_rate: training
            regularisation (inactive in ``eval()``).
        num_classes: class labels (c2i); the null label for CFG is ``num_classes``.
        caption_dim: caption embedding width (t2i, flan-t5-xl: 2048).
        class_dropout_prob: condition dropout during training (CFG); > 0 adds the null label row.
        model_type: ``"c2i"`` (class-conditional) or ``"t2i"`` (text-conditional).
        vocab_size: image codebook size. cls_token_num: condition tokens (1 for c2i, 120 for t2i).
        block_size: image tokens per image (``rows * cols``).
        max_batch_size, max_seq_len: kept for official-config compatibility (unused here).
        grid_rows, grid_cols: image-token grid; ``None`` = square ``sqrt(block_size)`` (official).

    Example:
        >>> LlamaGenConfig.from_preset("GPT-B", block_size=256).n_layer
        12
    """

    dim: int = 4096
    n_layer: int = 32
    n_head: int = 32
    n_kv_head: int | None = None
    multiple_of: int = 256
    ffn_dim_multiplier: float | None = None
    rope_base: float = 10000.0
    norm_eps: float = 1e-5
    initializer_range: float = 0.02
    token_dropout_p: float = 0.1
    attn_dropout_p: float = 0.0
    resid_dropout_p: float = 0.1
    ffn_dropout_p: float = 0.1
    drop_path_rate: float = 0.0
    num_classes: int = 1000
    caption_dim: int = 2048
    class_dropout_prob: float = 0.1
    model_type: str = "c2i"
    vocab_size: int = 16384
    cls_token_num: int = 1
    block_size: int = 256
    max_batch_size: int = 32
    max_seq_len: int = 2048
    grid_rows: int | None = None
    grid_cols: int | None = None

    def __post_init__(self) -> None:
        for name in (
            "dim",
            "n_layer",
            "n_head",
            "multiple_of",
            "rope_base",
            "norm_eps",
            "vocab_size",
            "cls_token_num",
            "block_size",
            "num_classes",
            "caption_dim",
        ):
            _positive(name, getattr(self, name))
        if self.dim % self.n_head or (self.dim // self.n_head) % 4:
            raise ValueError(
                f"LlamaGenConfig.dim={self.dim} must be n_head ({self.n_head}) x a head size that "
                "is a multiple of 4 (2D rotary embedding)"
            )
        if self.n_kv_head is not None and (self.n_kv_head <= 0 or self.n_head % self.n_kv_head):
            raise ValueError(
                f"LlamaGenConfig.n_kv_head={self.n_kv_head} must be a positive divisor of "
                f"n_head={self.n_head}"
            )
        if self.model_type not in ("c2i", "t2i"):
            raise ValueError(f"LlamaGenConfig.model_type must be 'c2i' or 't2i', got {self.model_type!r}")
        for name in (
            "token_dropout_p",
            "attn_dropout_p",
            "resid_dropout_p",
            "ffn_dropout_p",
            "drop_path_rate",
            "class_dropout_prob",
        ):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ValueError(f"LlamaGenConfig.{name} must be in [0, 1), got {getattr(self, name)!r}")
        if self.model_type == "t2i" and self.cls_token_num > CAPTION_NULL_TOKENS:
            raise ValueError(
                f"LlamaGenConfig.cls_token_num={self.cls_token_num} must be <= {CAPTION_NULL_TOKENS} for t2i"
            )
        if (self.grid_rows is None) != (self.grid_cols is None):
            raise ValueError("LlamaGenConfig.grid_rows and grid_cols must be given together (or neither)")
        rows, cols = self.grid
        if rows * cols != self.block_size:
            raise ValueError(
                f"LlamaGenConfig.block_size={self.block_size} must equal grid_rows x grid_cols "
                f"({rows} x {cols}); without a grid it must be a perfect square"
            )

    @property
    def grid(self) -> tuple[int, int]:
        """``(rows, cols)`` of the image-token grid."""
        if self.grid_rows is not None and self.grid_cols is not None:
            return int(self.grid_rows), int(self.grid_cols)
        side = math.isqrt(self.block_size)
        return side, side

    @property
    def head_dim(self) -> int:
        """Width of one attention head."""
        return self.dim // self.n_head

    @property
    def kv_heads(self) -> int:
        """Key/value heads (``n_kv_head`` or ``n_head``)."""
        return self.n_kv_head if self.n_kv_head is not None else self.n_head

    @property
    def ffn_hidden(self) -> int:
        """SwiGLU hidden width, computed as the official FeedForward does."""
        hidden = int(2 * (4 * self.dim) / 3)
        if self.ffn_dim_multiplier is not None:
            hidden = int(self.ffn_dim_multiplier * hidden)
        return -(-hidden // self.multiple_of) * self.multiple_of

    @classmethod
    def from_preset(cls, name: str, **overrides: Any) -> LlamaGenConfig:
        """An official preset (``"GPT-B"``, ``"GPT-L"``, ``"GPT-XL"``, ...) with overrides.

        Raises:
            ValueError: unknown preset name (the known ones are listed).
        """
        if name not in LLAMAGEN_PRESETS:
            raise ValueError(f"unknown LlamaGen preset {name!r}; known: {sorted(LLAMAGEN_PRESETS)}")
        return cls(**{**LLAMAGEN_PRESETS[name], **overrides})

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready field dict."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> LlamaGenConfig:
        """Inverse of :meth:`to_dict`; unknown keys raise ``ValueError``."""
        return config_from_dict(cls, data)


def config_from_dict(cls: type, data: dict[str, Any]) -> Any:
    """Build the config dataclass ``cls`` from a JSON dict, naming unknown fields in a ``ValueError``."""
    known = {f.name for f in dataclasses.fields(cls)}
    extra = sorted(set(data) - known)
    if extra:
        raise ValueError(f"unknown {cls.__name__} fields {extra}; known: {sorted(known)}")
    return cls(**data)


def rope_table_2d(config: LlamaGenConfig) -> torch.Tensor:
    """``(cls_token_num + rows*cols, head_dim // 2, 2)`` (cos, sin) per position and rotation pair.

    Condition positions get zeros (official behaviour); image token ``r * cols + c`` turns its
    first ``head_dim // 4`` pairs by ``r * f_k`` and the rest by ``c * f_k``.
    """
    half = config.head_dim // 2
    cpu = torch.device("cpu")  # explicit: the model may be built under ``torch.device("meta")``
    exponent = torch.arange(0, half, 2, device=cpu)[: half // 2].float() / half
    freqs = 1.0 / (config.rope_base**exponent)
    rows, cols = config.grid
    row_ang = torch.outer(torch.arange(rows, dtype=torch.float32, device=cpu), freqs)  # (rows, half/2)
    col_ang = torch.outer(torch.arange(cols, dtype=torch.float32, device=cpu), freqs)  # (cols, half/2)
    ang = torch.cat(
        [row_ang[:, None, :].expand(rows, cols, -1), col_ang[None, :, :].expand(rows, cols, -1)], dim=-1
    ).flatten(0, 1)
    table = torch.stack([torch.cos(ang), torch.sin(ang)], dim=-1)
    return torch.cat([torch.zeros(config.cls_token_num, half, 2, device=cpu), table])


def apply_rope(x: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """Rotate interleaved pairs of ``x`` ``(B, S, H, D)`` by ``table`` ``(S, D/2, 2)`` or ``(B, S, D/2, 2)``."""
    pairs = x.float().reshape(*x.shape[:-1], -1, 2)
    if table.dim() == 3:
        table = table[None]
    cos, sin = table[:, :, None, :, 0], table[:, :, None, :, 1]
    a, b = pairs[..., 0], pairs[..., 1]
    out = torch.stack([a * cos - b * sin, b * cos + a * sin], dim=-1)
    return out.flatten(-2).type_as(x)
