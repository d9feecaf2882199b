"""LlamaGen's VQ image tokenizer (VQ-16 / VQ-8), own implementation with the official key layout.

Mirrors ``tokenizer/tokenizer_image/vq_model.py`` of https://github.com/FoundationVision/LlamaGen:
a conv encoder/decoder (GroupNorm-32, swish, ResNet blocks, single-head self-attention at the
lowest resolution), ``quant_conv``/``post_quant_conv`` and an l2-normalised codebook
(``quantize.embedding``, 16384 x 8). Keys: ``encoder.conv_blocks.I.res.J.conv1``,
``decoder.mid.1.q``, ``quantize.codebook_used`` ... so official checkpoints load strictly.

Example:
    >>> cfg = VQConfig(codebook_size=32, ch=32, encoder_ch_mult=(1, 2), decoder_ch_mult=(1, 2), z_channels=32)
    >>> vq = VQModel(cfg).eval()
    >>> vq.decode_code(torch.zeros(2, 16, dtype=torch.long), (4, 4)).shape  # 2x downsampling
    torch.Size([2, 3, 8, 8])
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

# Official presets: name -> ch_mult (encoder = decoder); downsampling = 2 ** (len - 1).
VQ_PRESETS: dict[str, tuple[int, ...]] = {"VQ-16": (1, 1, 2, 2, 4), "VQ-8": (1, 2, 2, 4)}


@dataclasses.dataclass(frozen=True)
class VQConfig:
    """LlamaGen VQ hyper-parameters (official ``ModelArgs`` names plus the encoder/decoder defaults).

    Attributes:
        codebook_size, codebook_embed_dim: codebook shape (16384 x 8 officially).
        codebook_l2_norm: codes and encoder outputs are l2-normalised before matching.
        codebook_show_usage: keeps the official ``quantize.codebook_used`` buffer (65536 entries).
        encoder_ch_mult, decoder_ch_mult: channel multipliers per resolution; same length.
        z_channels: latent channels. dropout_p: ResNet dropout. ch: base channels (GroupNorm 32
            needs every ``ch * mult`` divisible by 32). num_res_blocks: blocks per resolution.
    """

    codebook_size: int = 16384
    codebook_embed_dim: int = 8
    codebook_l2_norm: bool = True
    codebook_show_usage: bool = True
    commit_loss_beta: float = 0.25
    entropy_loss_ratio: float = 0.0
    encoder_ch_mult: tuple[int, ...] = (1, 1, 2, 2, 4)
    decoder_ch_mult: tuple[int, ...] = (1, 1, 2, 2, 4)
    z_channels: int = 256
    dropout_p: float = 0.0
    ch: int = 128
    num_res_blocks: int = 2

    def __post_init__(self) -> None:
        object.__setattr__(self, "encoder_ch_mult", tuple(self.encoder_ch_mult))
        object.__setattr__(self, "decoder_ch_mult", tuple(self.decoder_ch_mult))
        for name in ("codebook_size", "codebook_embed_dim", "z_channels", "ch", "num_res_blocks"):
            if getattr(self, name) <= 0:
                raise ValueError(f"VQConfig.{name} must be > 0, got {getattr(self, name)!r}")
        if len(self.encoder_ch_mult) != len(self.decoder_ch_mult) or not self.decoder_ch_mult:
            raise ValueError(
                f"VQConfig.encoder_ch_mult {self.encoder_ch_mult} and decoder_ch_mult "
                f"{self.decoder_ch_mult} must be non-empty and of equal length"
            )
        widths = [self.ch * m for m in (1, *self.encoder_ch_mult, *self.decoder_ch_mult)]
        if any(w % 32 for w in widths + [self.z_channels]):
            raise ValueError(f"VQConfig.ch={self.ch} x ch_mult must be multiples of 32 (GroupNorm groups)")

    @property
    def downsample(self) -> int:
        """Pixels per token side."""
        return 2 ** (len(self.decoder_ch_mult) - 1)

    @classmethod
    def from_preset(cls, name: str, **overrides: Any) -> VQConfig:
        """``"VQ-16"`` or ``"VQ-8"`` with overrides (e.g. ``codebook_size``)."""
        if name not in VQ_PRESETS:
            raise ValueError(f"unknown LlamaGen VQ preset {name!r}; known: {sorted(VQ_PRESETS)}")
        mult = VQ_PRESETS[name]
        return cls(**{"encoder_ch_mult": mult, "decoder_ch_mult": mult, **overrides})


def _norm(channels: int) -> nn.GroupNorm:
    return nn.GroupNorm(32, channels, eps=1e-6, affine=True)


class ResnetBlock(nn.Module):
    """``x + conv2(drop(swish(norm2(conv1(swish(norm1 x))))))``; 1x1 ``nin_shortcut`` on width change."""

    def __init__(self, cin: int, cout: int, dropout: float) -> None:
        super().__init__()
        self.norm1, self.conv1 = _norm(cin), nn.Conv2d(cin, cout, 3, padding=1)
        self.norm2, self.conv2 = _norm(cout), nn.Conv2d(cout, cout, 3, padding=1)
        self.dropout = nn.Dropout(dropout)
        if cin != cout:
            self.nin_shortcut = nn.Conv2d(cin, cout, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.conv1(F.silu(self.norm1(x)))
        h = self.conv2(self.dropout(F.silu(self.norm2(h))))
        return (self.nin_shortcut(x) if hasattr(self, "nin_shortcut") else x) + h


class AttnBlock(nn.Module):
    """Single-head spatial self-attention with 1x1 ``q``/``k``/``v``/``proj_out`` convs."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.norm = _norm(channels)
        self.q, self.k, self.v, self.proj_out = (nn.Conv2d(channels, channels, 1) for _ in range(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, c, hgt, wid = x.shape
        h = self.norm(x)
        q, k, v = (conv(h).flatten(2).transpose(1, 2)[:, None] for conv in (self.q, self.k, self.v))
        out = F.scaled_dot_product_attention(q, k, v)[:, 0].transpose(1, 2).reshape(b, c, hgt, wid)
        return x + self.proj_out(out)


class _Resample(nn.Module):
    """Stride-2 conv after (0, 1, 0, 1) padding (down) or nearest 2x then conv (up)."""

    def __init__(self, channels: int, up: bool) -> None:
        super().__init__()
        self.up = up
        self.conv = nn.Conv2d(channels, channels, 3, stride=1 if up else 2, padding=1 if up else 0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.interpolate(x, scale_factor=2.0, mode="nearest") if self.up else F.pad(x, (0, 1, 0, 1))
        return self.conv(x)


def _level(cin: int, cout: int, blocks: int, attn: bool, dropout: float) -> tuple[nn.Module, int]:
    level = nn.Module()
    level.res = nn.ModuleList(ResnetBlock(cin if i == 0 else cout, cout, dropout) for i in range(blocks))
    level.attn = nn.ModuleList(AttnBlock(cout) for _ in range(blocks if attn else 0))
    return level, cout


def _run_level(level: nn.Module, h: torch.Tensor) -> torch.Tensor:
    for i, res in enumerate(level.res):
        h = res(h)
        if len(level.attn):
            h = level.attn[i](h)
    return h


class Encoder(nn.Module):
    """Images ``(B, 3, H, W)`` → latents ``(B, z_channels, H/d, W/d)``."""

    def __init__(self, cfg: VQConfig) -> None:
        super().__init__()
        mult, n = cfg.encoder_ch_mult, len(cfg.encoder_ch_mult)
        self.conv_in = nn.Conv2d(3, cfg.ch, 3, padding=1)
        self.conv_blocks = nn.ModuleList()
        width = cfg.ch
        for i in range(n):
            level, width = _level(width, cfg.ch * mult[i], cfg.num_res_blocks, i == n - 1, cfg.dropout_p)
            if i != n - 1:
                level.downsample = _Resample(width, up=False)
            self.conv_blocks.append(level)
        self.mid = nn.ModuleList(
            [
                ResnetBlock(width, width, cfg.dropout_p),
                AttnBlock(width),
                ResnetBlock(width, width, cfg.dropout_p),
            ]
        )
        self.norm_out = _norm(width)
        self.conv_out = nn.Conv2d(width, cfg.z_channels, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.conv_in(x)
        for level in self.conv_blocks:
            h = _run_level(level, h)
            if hasattr(level, "downsample"):
                h = level.downsample(h)
        for block in self.mid:
            h = block(h)
        return self.conv_out(F.silu(self.norm_out(h)))


class Decoder(nn.Module):
    """Latents ``(B, z_channels, h, w)`` → images ``(B, 3, h*d, w*d)``."""

    def __init__(self, cfg: VQConfig) -> None:
        super().__init__()
        mult, n = cfg.decoder_ch_mult, len(cfg.decoder_ch_mult)
        width = cfg.ch * mult[-1]
        self.conv_in = nn.Conv2d(cfg.z_channels, width, 3, padding=1)
        self.mid = nn.ModuleList(
            [
                ResnetBlock(width, width, cfg.dropout_p),
                AttnBlock(width),
                ResnetBlock(width, width, cfg.dropout_p),
            ]
        )
        self.conv_blocks = nn.ModuleList()
        for i in reversed(range(n)):
            level, width = _level(width, cfg.ch * mult[i], cfg.num_res_blocks + 1, i == n - 1, cfg.dropout_p)
            if i != 0:
                level.upsample = _Resample(width, up=True)
            self.conv_blocks.append(level)
        self.norm_out = _norm(width)
        self.conv_out = nn.Conv2d(width, 3, 3, padding=1)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        h = self.conv_in(z)
        for block in self.mid:
            h = block(h)
        for level in self.conv_blocks:
            h = _run_level(level, h)
            if hasattr(level, "upsample"):
                h = level.upsample(h)
        return self.conv_out(F.silu(self.norm_out(h)))


class VectorQuantizer(nn.Module):
    """Nearest-code lookup over ``embedding`` (l2-normalised when configured)."""

    def __init__(self, cfg: VQConfig) -> None:
        super().__init__()
        self.l2_norm = cfg.codebook_l2_norm
        self.embedding = nn.Embedding(cfg.codebook_size, cfg.codebook_embed_dim)
        nn.init.uniform_(self.embedding.weight, -1.0 / cfg.codebook_size, 1.0 / cfg.codebook_size)
        if cfg.codebook_show_usage:
            self.register_buffer("codebook_used", torch.zeros(65536))

    @property
    def codebook(self) -> torch.Tensor:
        """``(codebook_size, embed_dim)`` codes as used for lookup (normalised if ``l2_norm``)."""
        weight = self.embedding.weight
        return F.normalize(weight, dim=-1) if self.l2_norm else weight

    def indices(self, z: torch.Tensor) -> torch.Tensor:
        """``(B, C, h, w)`` latents → ``(B, h*w)`` nearest-code ids (row-major)."""
        flat = z.flatten(2).transpose(1, 2)
        if self.l2_norm:
            flat = F.normalize(flat, dim=-1)
        book = self.codebook
        dist = flat.pow(2).sum(-1, keepdim=True) + book.pow(2).sum(-1) - 2 * flat @ book.T
        return dist.argmin(-1)

    def lookup(self, tokens: torch.Tensor, grid: tuple[int, int]) -> torch.Tensor:
        """``(B, rows*cols)`` ids → ``(B, C, rows, cols)`` code vectors."""
        rows, cols = grid
        return self.codebook[tokens].reshape(tokens.shape[0], rows, cols, -1).permute(0, 3, 1, 2)


class VQModel(nn.Module):
    """LlamaGen VQ tokenizer: :meth:`encode_tokens` images → ids, :meth:`decode_code` ids → images.

    Example:
        >>> vq = VQModel(VQConfig(codebook_size=16, ch=32, encoder_ch_mult=(1,), decoder_ch_mult=(1,), z_channels=32))
        >>> vq.encode_tokens(torch.zeros(1, 3, 4, 4)).shape
        torch.Size([1, 16])
    """

    def __init__(self, config: VQConfig) -> None:
        super().__init__()
        self.config = config
        self.encoder = Encoder(config)
        self.decoder = Decoder(config)
        self.quantize = VectorQuantizer(config)
        self.quant_conv = nn.Conv2d(config.z_channels, config.codebook_embed_dim, 1)
        self.post_quant_conv = nn.Conv2d(config.codebook_embed_dim, config.z_channels, 1)

    @property
    def codebook(self) -> torch.Tensor:
        """The lookup codebook (LANTERN neighbourhoods use it)."""
        return self.quantize.codebook

    def encode_tokens(self, images: torch.Tensor) -> torch.Tensor:
        """``(B, 3, H, W)`` in ``[-1, 1]`` → ``(B, (H/d)*(W/d))`` token ids."""
        return self.quantize.indices(self.quant_conv(self.encoder(images)))

    def decode_code(self, tokens: torch.Tensor, grid: tuple[int, int]) -> torch.Tensor:
        """``(B, rows*cols)`` ids → ``(B, 3, rows*d, cols*d)`` images (about ``[-1, 1]``)."""
        quant = self.quantize.lookup(tokens, grid).to(self.post_quant_conv.weight.dtype)
        return self.decoder(self.post_quant_conv(quant))

    def save_pretrained(self, save_directory: str | Path) -> None:
        """Write ``config.json`` and ``model.safetensors`` (official key names)."""
        from diffspec.ar_image.targets.llamagen_load import save_folder

        save_folder(self, dataclasses.asdict(self.config), save_directory)

    @classmethod
    def from_pretrained(
        cls, directory: str | Path, *, device: str | torch.device = "cpu", dtype: torch.dtype | None = None
    ) -> VQModel:
        """Load a :meth:`save_pretrained` folder (strict); returns ``eval()`` mode."""
        from diffspec.ar_image.targets.llamagen_load import load_folder

        return load_folder(cls, VQConfig, directory, device=device, dtype=dtype)
