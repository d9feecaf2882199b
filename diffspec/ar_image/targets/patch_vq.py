"""A patch k-means VQ tokenizer: the image tokenizer of the shipped ``tiny-ar`` reference model.

Images are cut into non-overlapping ``patch_size x patch_size`` RGB patches; each patch is
replaced by its nearest codebook vector (squared L2). Encoding is a nearest-neighbour search,
decoding pastes the code vectors back. The codebook is fitted by deterministic k-means in
torch (:func:`kmeans`), and doubles as the latent space LANTERN-style methods take
neighbourhoods in (``codebook`` is ``(K, 3 * patch_size**2)``).

Example:
    >>> import torch
    >>> from diffspec.data import render_shapes
    >>> images, _ = render_shapes(64, seed=0)
    >>> vq = PatchVQ.fit(images, PatchVQConfig(codebook_size=16, kmeans_iters=3), seed=0)
    >>> tokens = vq.encode(images[:2])
    >>> tokens.shape, vq.decode_code(tokens).shape
    (torch.Size([2, 64]), torch.Size([2, 3, 32, 32]))
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import nn

CONFIG_NAME = "config.json"
WEIGHTS_NAME = "codebook.safetensors"


@dataclass(frozen=True)
class PatchVQConfig:
    """Shape of a :class:`PatchVQ`.

    Attributes:
        image_size: square image side in pixels (a multiple of ``patch_size``).
        patch_size: side of one patch = one token.
        codebook_size: number of codes K (>= 2).
        channels: image channels.
        kmeans_iters: Lloyd iterations used by :meth:`PatchVQ.fit`.
    """

    image_size: int = 32
    patch_size: int = 4
    codebook_size: int = 512
    channels: int = 3
    kmeans_iters: int = 25

    def __post_init__(self) -> None:
        for name, low in (("image_size", 1), ("patch_size", 1), ("codebook_size", 2), ("channels", 1),
                          ("kmeans_iters", 1)):
            value = getattr(self, name)
            if not isinstance(value, int) or value < low:
                raise ValueError(f"PatchVQConfig.{name}={value!r} must be an int >= {low}")
        if self.image_size % self.patch_size:
            raise ValueError(
                f"PatchVQConfig.image_size={self.image_size} must be a multiple of patch_size={self.patch_size}"
            )

    @property
    def grid(self) -> tuple[int, int]:
        """``(rows, cols)`` of the token grid."""
        side = self.image_size // self.patch_size
        return side, side

    @property
    def code_dim(self) -> int:
        """Length of one code vector (``channels * patch_size**2``)."""
        return self.channels * self.patch_size**2


def nearest_code(x: torch.Tensor, codebook: torch.Tensor, chunk: int = 8192) -> torch.Tensor:
    """Index of the nearest row of ``codebook`` (K, d) for every row of ``x`` (M, d) (squared L2).

    Ties go to the lowest index. Works in chunks of ``chunk`` rows to bound memory.

    Example:
        >>> nearest_code(torch.tensor([[0.9], [0.1]]), torch.tensor([[0.0], [1.0]])).tolist()
        [1, 0]
    """
    c2 = codebook.pow(2).sum(1)
    out = [((c2 - 2 * xs @ codebook.T).argmin(1)) for xs in x.split(chunk)]
    return torch.cat(out) if out else torch.zeros(0, dtype=torch.long, device=x.device)


def kmeans(x: torch.Tensor, k: int, iters: int, generator: torch.Generator) -> torch.Tensor:
    """Lloyd's k-means on ``x`` (M, d) → ``(k, d)`` centroids; deterministic for a seeded generator.

    Initialised from ``k`` distinct random rows; a cluster that empties is re-seeded with the
    points currently worst served (largest distance to their centroid).

    Example:
        >>> x = torch.cat([torch.zeros(5, 2), torch.ones(5, 2)])
        >>> c = kmeans(x, 2, 3, torch.Generator().manual_seed(0))
        >>> sorted(c.sum(1).tolist())
        [0.0, 2.0]
    """
    if k > len(x):
        raise ValueError(f"kmeans: k={k} must be <= the number of points ({len(x)})")
    centroids = x[torch.randperm(len(x), generator=generator)[:k]].clone()
    for _ in range(iters):
        assign = nearest_code(x, centroids)
        sums = torch.zeros_like(centroids).index_add_(0, assign, x)
        counts = torch.bincount(assign, minlength=k)
        empty = counts == 0
        centroids = torch.where(empty[:, None], centroids, sums / counts.clamp(min=1)[:, None].to(x.dtype))
        n_empty = int(empty.sum())
        if n_empty:  # re-seed with the worst-served points
            err = (x - centroids[assign]).pow(2).sum(1)
            centroids[empty] = x[err.topk(n_empty).indices]
    return centroids


class PatchVQ(nn.Module):
    """Patch k-means VQ: ``encode`` images to ``(B, N)`` tokens, ``decode_code`` tokens to images.

    Attributes:
        config: the :class:`PatchVQConfig`.
        codebook: ``(codebook_size, code_dim)`` code vectors in pixel units ([-1, 1] images).
    """

    codebook: torch.Tensor

    def __init__(self, config: PatchVQConfig, codebook: torch.Tensor | None = None) -> None:
        super().__init__()
        self.config = config
        shape = (config.codebook_size, config.code_dim)
        if codebook is None:
            codebook = torch.zeros(shape)
        if tuple(codebook.shape) != shape:
            raise ValueError(f"codebook shape {tuple(codebook.shape)} does not match the config {shape}")
        self.register_buffer("codebook", codebook.float().contiguous())

    @property
    def grid(self) -> tuple[int, int]:
        """``(rows, cols)`` of the token grid."""
        return self.config.grid

    def patchify(self, images: torch.Tensor) -> torch.Tensor:
        """``(B, C, H, W)`` → ``(B, N, code_dim)`` patches in raster order (row-major)."""
        cfg = self.config
        if images.shape[1:] != (cfg.channels, cfg.image_size, cfg.image_size):
            raise ValueError(
                f"images must be (B, {cfg.channels}, {cfg.image_size}, {cfg.image_size}), got {tuple(images.shape)}"
            )
        b, p, (rows, cols) = images.shape[0], cfg.patch_size, cfg.grid
        x = images.reshape(b, cfg.channels, rows, p, cols, p).permute(0, 2, 4, 1, 3, 5)
        return x.reshape(b, rows * cols, cfg.code_dim)

    def encode(self, images: torch.Tensor) -> torch.Tensor:
        """``(B, C, H, W)`` images in [-1, 1] → ``(B, N)`` int64 tokens (nearest code per patch)."""
        patches = self.patchify(images.to(self.codebook))
        return nearest_code(patches.reshape(-1, self.config.code_dim), self.codebook).view(patches.shape[:2])

    def decode_code(self, tokens: torch.Tensor, grid: tuple[int, int] | None = None) -> torch.Tensor:
        """``(B, N)`` tokens → ``(B, C, H, W)`` images in [-1, 1] (code vectors pasted back).

        Args:
            tokens: token ids in ``[0, codebook_size)``.
            grid: ``(rows, cols)``; defaults to the config's grid. Any grid with
                ``rows * cols == N`` works (the tokenizer is patch-local).
        """
        rows, cols = self.grid if grid is None else grid
        b, n = tokens.shape
        if rows * cols != n:
            raise ValueError(f"grid {(rows, cols)} does not hold N={n} tokens")
        if n and (int(tokens.min()) < 0 or int(tokens.max()) >= self.config.codebook_size):
            raise ValueError(f"tokens must lie in [0, {self.config.codebook_size})")
        c, p = self.config.channels, self.config.patch_size
        x = self.codebook[tokens].view(b, rows, cols, c, p, p).permute(0, 3, 1, 4, 2, 5)
        return x.reshape(b, c, rows * p, cols * p).clamp(-1, 1)

    @classmethod
    def fit(cls, images: torch.Tensor, config: PatchVQConfig, seed: int = 0,
            max_patches: int | None = None) -> PatchVQ:
        """Fit the codebook by k-means on the patches of ``images`` (deterministic for a seed).

        Args:
            images: ``(B, C, H, W)`` training images in [-1, 1].
            config: shape and iteration count.
            seed: seeds the patch subsample and the k-means initialisation.
            max_patches: optional random subsample of patches to fit on.
        """
        vq = cls(config)
        g = torch.Generator().manual_seed(seed)
        patches = vq.patchify(images.float()).reshape(-1, config.code_dim)
        if max_patches is not None and max_patches < len(patches):
            patches = patches[torch.randperm(len(patches), generator=g)[:max_patches]]
        vq.codebook.copy_(kmeans(patches, config.codebook_size, config.kmeans_iters, g))
        return vq

    def save_pretrained(self, directory: str | Path) -> None:
        """Write ``config.json`` and ``codebook.safetensors`` into ``directory``."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        (directory / CONFIG_NAME).write_text(json.dumps({"class": "PatchVQ", **asdict(self.config)}, indent=2) + "\n")
        save_file({"codebook": self.codebook.detach().cpu().contiguous()}, str(directory / WEIGHTS_NAME))

    @classmethod
    def from_pretrained(cls, directory: str | Path) -> PatchVQ:
        """Load a folder written by :meth:`save_pretrained`."""
        directory = Path(directory)
        fields = json.loads((directory / CONFIG_NAME).read_text())
        fields.pop("class", None)
        return cls(PatchVQConfig(**fields), load_file(str(directory / WEIGHTS_NAME))["codebook"])


__all__ = ["PatchVQ", "PatchVQConfig", "kmeans", "nearest_code"]
