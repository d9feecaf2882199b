"""render_scenes: seeded, captions 15-40 words that describe what is drawn (colour and place per object)."""

from __future__ import annotations

import pytest
import torch

from diffspec.data import render_scenes
from diffspec.data.scenes import CAPTION_WORDS, CELLS, COLOURS


def test_seeded_and_caption_lengths():
    a, ca = render_scenes(64, seed=3)
    b, cb = render_scenes(64, seed=3)
    assert torch.equal(a, b) and ca == cb
    assert render_scenes(4, seed=4)[1] != ca[:4]
    lengths = {len(c.split()) for c in ca}
    assert lengths == {18, 27}  # two or three objects, both occur
    assert set(" ".join(ca).split()) <= set(CAPTION_WORDS)
    assert a.shape == (64, 3, 32, 32) and a.min() >= -1 and a.max() <= 1


def test_caption_names_each_cells_colour():
    """The brightest-colour pixels of each named cell match the named palette colour."""
    images, captions = render_scenes(32, seed=7, noise=0.0)
    palette = torch.tensor(list(COLOURS.values()))
    for img, caption in zip(images, captions):
        named = {}
        for part in caption.rstrip(" .").split(" , "):
            words = part.split()
            named[" ".join(words[-2:])] = words[2]
        for i, cell in enumerate(CELLS):
            r, c = divmod(i, 2)
            patch = img[:, 16 * r: 16 * r + 16, 16 * c: 16 * c + 16].reshape(3, -1)
            fg = patch[:, (patch - patch[:, :1]).abs().sum(0) > 0.5]  # pixels unlike the background
            if cell not in named:
                assert fg.shape[1] == 0, (caption, cell)
                continue
            nearest = (fg.T[:, None] - palette[None]).abs().sum(-1).argmin(1).mode().values
            assert list(COLOURS)[int(nearest)] == named[cell], (caption, cell)


def test_bad_arguments():
    with pytest.raises(ValueError, match="n=0"):
        render_scenes(0, seed=0)
    with pytest.raises(ValueError, match="size=7"):
        render_scenes(1, seed=0, size=7)
