"""Captioned multi-shape scenes: the data of the tiny VLM reference pair (``tiny-vlm``).

A scene is a 2x2 grid of cells; 2 or 3 cells hold a shape (the classes of
:data:`~diffspec.data.shapes.SHAPE_CLASSES` listed in :data:`SCENE_SHAPES`) in a palette colour
and one of two sizes, on a dark noisy background. The caption is a function of the drawn
attributes only, so it is deterministic from the image: the objects in reading order (top left,
top right, bottom left, bottom right), e.g. ``"a large red circle at the top left , a small
blue star at the bottom right ."`` (18 words for two objects, 27 for three).

Example:
    >>> images, captions = render_scenes(4, seed=0)
    >>> images.shape, float(images.min()) >= -1.0
    (torch.Size([4, 3, 32, 32]), True)
    >>> captions[0].split()[:2]
    ['a', 'large']
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .shapes import _masks

SCENE_SHAPES: tuple[str, ...] = ("circle", "square", "triangle", "ring", "cross", "star")
"""Shape words of the scenes (the first six classes of ``SHAPE_CLASSES``, same masks)."""

COLOURS: dict[str, tuple[float, float, float]] = {
    "red": (0.9, -0.8, -0.8), "green": (-0.8, 0.8, -0.8), "blue": (-0.7, -0.6, 0.95),
    "yellow": (0.9, 0.9, -0.8), "white": (0.9, 0.9, 0.9), "purple": (0.6, -0.7, 0.8),
}
"""Palette of the shapes, RGB in [-1, 1]."""

SIZES: dict[str, float] = {"small": 0.42, "large": 0.85}
"""Shape scale as a fraction of the half cell."""

CELLS: tuple[str, ...] = ("top left", "top right", "bottom left", "bottom right")
"""Cell names in reading order."""

CAPTION_WORDS: tuple[str, ...] = (
    "a", "at", "the", ",", ".", *SIZES, *COLOURS, *SCENE_SHAPES, "top", "bottom", "left", "right",
)
"""Every word a caption can use (the tokenizer's caption vocabulary)."""


def caption_of(present: torch.Tensor, shape: torch.Tensor, colour: torch.Tensor, size: torch.Tensor) -> list[str]:
    """Captions from per-cell attributes, each (n, 4): presence (bool) and class/colour/size indices.

    Example:
        >>> caption_of(torch.tensor([[True, False, False, True]]), torch.tensor([[0, 0, 0, 5]]),
        ...            torch.tensor([[0, 0, 0, 2]]), torch.tensor([[1, 0, 0, 0]]))
        ['a large red circle at the top left , a small blue star at the bottom right .']
    """
    colours, sizes = list(COLOURS), list(SIZES)
    out = []
    for row_p, row_s, row_c, row_z in zip(present.tolist(), shape.tolist(), colour.tolist(), size.tolist()):
        parts = [f"a {sizes[z]} {colours[c]} {SCENE_SHAPES[s]} at the {CELLS[i]}"
                 for i, (p, s, c, z) in enumerate(zip(row_p, row_s, row_c, row_z)) if p]
        out.append(" , ".join(parts) + " .")
    return out


def render_scenes(n: int, *, seed: int, size: int = 32, noise: float = 0.05) -> tuple[torch.Tensor, list[str]]:
    """Render ``n`` captioned scenes (2-3 shapes in a 2x2 grid), vectorised over the batch.

    Args:
        n: number of scenes.
        seed: the seed (same seed, same scenes and captions).
        size: image side in pixels (even).
        noise: Gaussian pixel noise (std) on the image.

    Returns:
        ``(images, captions)``: float32 (n, 3, size, size) in [-1, 1] and ``n`` caption strings.
    """
    _check_sizes(n, size)
    g = torch.Generator().manual_seed(seed)
    count = 2 + (torch.rand(n, generator=g) < 0.5).long()  # 2 or 3 objects
    rank = torch.rand(n, 4, generator=g).argsort(1).argsort(1)
    present = rank < count[:, None]
    shape = torch.randint(0, len(SCENE_SHAPES), (n, 4), generator=g)
    colour = torch.randint(0, len(COLOURS), (n, 4), generator=g)
    scale_idx = torch.randint(0, len(SIZES), (n, 4), generator=g)
    images = draw_cells(present, shape, colour, scale_idx, g, size=size, noise=noise)
    return images, caption_of(present, shape, colour, scale_idx)


def _check_sizes(n: int, size: int) -> None:
    if n < 1:
        raise ValueError(f"n={n} must be >= 1")
    if size < 8 or size % 2:
        raise ValueError(f"size={size} must be an even number >= 8")


def draw_cells(present: torch.Tensor, shape: torch.Tensor, colour: torch.Tensor, scale_idx: torch.Tensor,
               g: torch.Generator, *, size: int = 32, noise: float = 0.05) -> torch.Tensor:
    """Draw scenes from per-cell attributes, each (n, 4) as in :func:`caption_of`; the centre jitter,
    background and pixel noise come from ``g``. Returns float32 (n, 3, size, size) in [-1, 1]."""
    n = present.shape[0]
    jitter = (torch.rand(n, 4, 2, generator=g) - 0.5) * 0.16  # cell-frame centre jitter
    hi = 2 * size
    half = hi // 2  # each cell is drawn in its own window (shapes stay inside their cell)
    lin = (torch.arange(half, dtype=torch.float32) + 0.5) / half * 2 - 1
    gy, gx = torch.meshgrid(lin, lin, indexing="ij")  # cell frame, [-1, 1]
    scale = torch.tensor(list(SIZES.values()))[scale_idx]  # (n, 4) in half-cell units
    px = (gx - 2 * jitter[..., 0, None, None]) / scale[..., None, None]  # (n, 4, h, w)
    py = (gy - 2 * jitter[..., 1, None, None]) / scale[..., None, None]
    masks = _masks(px, py)  # (C, n, 4, h, w)
    mask = masks[: len(SCENE_SHAPES)].gather(0, shape[None, ..., None, None].expand(1, n, 4, half, half))[0]
    mask = (mask & present[..., None, None]).float()[:, :, None]  # (n, 4, 1, h, w)
    rgb = torch.tensor(list(COLOURS.values()))[colour][..., None, None]  # (n, 4, 3, 1, 1)
    bg = -0.85 + 0.2 * torch.rand(n, 1, 3, 1, 1, generator=g)
    cells = bg * (1 - mask) + mask * rgb  # (n, 4, 3, h, w)
    top = torch.cat([cells[:, 0], cells[:, 1]], dim=3)
    bottom = torch.cat([cells[:, 2], cells[:, 3]], dim=3)
    img = torch.cat([top, bottom], dim=2)
    img = F.avg_pool2d(img, 2) + noise * torch.randn(n, 3, size, size, generator=g)
    return img.clamp(-1, 1)
