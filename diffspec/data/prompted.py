"""Prompted scenes: the text-to-image data of ``tiny-flux``, and the parser that scores its samples.

One or two large shapes (:data:`~diffspec.data.scenes.SCENE_SHAPES`, palette
:data:`~diffspec.data.scenes.COLOURS`) in the cells of a 2x2 grid, drawn as
:func:`~diffspec.data.scenes.render_scenes` draws them. The prompt names each object's colour,
shape and cell in reading order, so the count, colours, shapes and positions are all asked for:
``"a red star at the top left , a blue ring at the bottom right ."``. :func:`parse_prompt` turns a
prompt back into the per-cell attributes a judge compares an image with.

Example:
    >>> images, prompts = render_prompted_scenes(2, seed=0)
    >>> images.shape
    torch.Size([2, 3, 32, 32])
    >>> present, shape, colour = parse_prompt("a red star at the top left .")
    >>> present.tolist(), SCENE_SHAPES[int(shape[0])], list(COLOURS)[int(colour[0])]
    ([True, False, False, False], 'star', 'red')
"""

from __future__ import annotations

import torch

from .scenes import CELLS, COLOURS, SCENE_SHAPES, SIZES, draw_cells

PROMPT_WORDS: tuple[str, ...] = ("a", "at", "the", ",", ".", *COLOURS, *SCENE_SHAPES, "top", "bottom", "left", "right")
"""Every word a prompt can use (``tiny-flux``'s tokenizer vocabulary)."""

MAX_OBJECTS = 2
"""Objects per prompted scene: 1 or 2."""


def prompt_of(present: torch.Tensor, shape: torch.Tensor, colour: torch.Tensor) -> list[str]:
    """Prompts from per-cell attributes, each (n, 4): presence (bool), shape and colour indices.

    Example:
        >>> prompt_of(torch.tensor([[False, True, False, False]]), torch.tensor([[0, 3, 0, 0]]),
        ...           torch.tensor([[0, 2, 0, 0]]))
        ['a blue ring at the top right .']
    """
    colours = list(COLOURS)
    out = []
    for row_p, row_s, row_c in zip(present.tolist(), shape.tolist(), colour.tolist()):
        parts = [f"a {colours[c]} {SCENE_SHAPES[s]} at the {CELLS[i]}"
                 for i, (p, s, c) in enumerate(zip(row_p, row_s, row_c)) if p]
        out.append(" , ".join(parts) + " .")
    return out


def parse_prompt(prompt: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The per-cell attributes a prompt asks for: presence (4,) bool, shape and colour indices (4,) int64
    (0 where no object is asked).

    Raises:
        ValueError: the prompt is not of the form :func:`prompt_of` writes (the message names the part).
    """
    present = torch.zeros(4, dtype=torch.bool)
    shape = torch.zeros(4, dtype=torch.int64)
    colour = torch.zeros(4, dtype=torch.int64)
    body = prompt.strip().removesuffix(".").strip()
    for part in body.split(","):
        words = part.split()
        if (len(words) != 7 or words[0] != "a" or words[3] != "at" or words[4] != "the" or words[1] not in COLOURS
                or words[2] not in SCENE_SHAPES or " ".join(words[5:7]) not in CELLS):
            raise ValueError(f"prompt part {part.strip()!r} is not 'a <colour> <shape> at the <cell>' with colour in "
                             f"{list(COLOURS)}, shape in {list(SCENE_SHAPES)}, cell in {list(CELLS)}")
        cell = CELLS.index(" ".join(words[5:7]))
        if present[cell]:
            raise ValueError(f"prompt {prompt!r} asks for two objects at the {CELLS[cell]}")
        present[cell] = True
        shape[cell] = SCENE_SHAPES.index(words[2])
        colour[cell] = list(COLOURS).index(words[1])
    return present, shape, colour


def render_prompted_scenes(n: int, *, seed: int, size: int = 32, noise: float = 0.05) -> tuple[torch.Tensor, list[str]]:
    """Render ``n`` prompted scenes (1 or 2 large shapes in a 2x2 grid), vectorised over the batch.

    Args:
        n: number of scenes (>= 1).
        seed: the seed (same seed, same scenes and prompts).
        size: image side in pixels (even, >= 8).
        noise: Gaussian pixel noise (std) on the image.

    Returns:
        ``(images, prompts)``: float32 (n, 3, size, size) in [-1, 1] and ``n`` prompt strings.
    """
    if n < 1:
        raise ValueError(f"n={n} must be >= 1")
    if size < 8 or size % 2:
        raise ValueError(f"size={size} must be an even number >= 8")
    g = torch.Generator().manual_seed(seed)
    count = 1 + torch.randint(0, MAX_OBJECTS, (n,), generator=g)
    present = torch.rand(n, 4, generator=g).argsort(1).argsort(1) < count[:, None]
    shape = torch.randint(0, len(SCENE_SHAPES), (n, 4), generator=g)
    colour = torch.randint(0, len(COLOURS), (n, 4), generator=g)
    large = torch.full((n, 4), list(SIZES).index("large"))
    images = draw_cells(present, shape, colour, large, g, size=size, noise=noise)
    return images, prompt_of(present, shape, colour)
