"""The shipped scene judge: prompt adherence and a reference FID for text-to-image samples of prompted scenes.

A small CNN reads each cell of a 2x2 scene (:func:`~diffspec.data.render_prompted_scenes`) and
names what it holds: nothing or one of the six scene shapes, and its colour. Comparing that with
what the prompt asks (:func:`~diffspec.data.parse_prompt`) gives the prompt accuracy of a sample
(every cell right: count, positions, shapes and colours) and the accuracy of each attribute; the
judge's features (four cells side by side) give a reference FID against real prompted scenes.

Example:
    >>> from diffspec.data import render_prompted_scenes
    >>> images, prompts = render_prompted_scenes(64, seed=123)
    >>> prompt_scores(images, prompts)["prompt_accuracy"] > 0.95  # doctest: +SKIP
    True
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

import numpy as np
import torch
from torch import nn

from ..metrics import feature_stats, frechet_distance

JUDGE_DIR = Path(__file__).resolve().parent.parent / "weights" / "scene-judge"


class SceneJudge(nn.Module):
    """A CNN on the four 16x16 cells of a 32x32 scene in [-1, 1].

    ``forward`` gives per-cell shape logits (n, 4, 1 + shapes; class 0 is an empty cell) and colour
    logits (n, 4, colours); ``features`` the (n, 4 * feature_dim) features of the four cells.
    """

    def __init__(self, shapes: int = 6, colours: int = 6, width: int = 32, feature_dim: int = 32) -> None:
        super().__init__()
        self.config = {"shapes": shapes, "colours": colours, "width": width, "feature_dim": feature_dim}

        def conv(cin: int, cout: int) -> list[nn.Module]:
            return [nn.Conv2d(cin, cout, 3, padding=1), nn.BatchNorm2d(cout), nn.ReLU()]

        self.body = nn.Sequential(*conv(3, width), *conv(width, width), nn.MaxPool2d(2),
                                  *conv(width, 2 * width), *conv(2 * width, 2 * width))
        self.head = nn.Linear(2 * width, feature_dim)
        self.shape_out = nn.Linear(feature_dim, 1 + shapes)
        self.colour_out = nn.Linear(feature_dim, colours)

    def cell_features(self, images: torch.Tensor) -> torch.Tensor:
        """Features of each cell in reading order, (n, 4, feature_dim)."""
        n, c, h, w = images.shape
        if (h, w) != (32, 32):
            raise ValueError(f"the scene judge reads 32x32 images, got {h}x{w}")
        cells = images.reshape(n, c, 2, 16, 2, 16).permute(0, 2, 4, 1, 3, 5).reshape(n * 4, c, 16, 16)
        return torch.relu(self.head(self.body(cells).mean(dim=(2, 3)))).reshape(n, 4, -1)

    def features(self, images: torch.Tensor) -> torch.Tensor:
        return self.cell_features(images).flatten(1)

    def forward(self, images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        f = self.cell_features(images)
        return self.shape_out(f), self.colour_out(f)


@lru_cache(maxsize=1)
def load_scene_judge() -> SceneJudge:
    """The shipped judge (eval mode, float32; its weights are stored in float16)."""
    from safetensors.torch import load_file

    model = SceneJudge(**json.loads((JUDGE_DIR / "config.json").read_text()))
    model.load_state_dict(load_file(str(JUDGE_DIR / "model.safetensors")))
    return model.eval()


@torch.no_grad()
def judge_cells(images: torch.Tensor, batch_size: int = 512) -> tuple[torch.Tensor, torch.Tensor]:
    """What the judge sees in each cell: shape (n, 4) with -1 for an empty cell, and colour (n, 4)."""
    model = load_scene_judge()
    images = images.detach().float().cpu()
    shapes, colours = [], []
    for i in range(0, len(images), batch_size):
        s, c = model(images[i:i + batch_size])
        shapes.append(s.argmax(-1) - 1)
        colours.append(c.argmax(-1))
    return torch.cat(shapes), torch.cat(colours)


def prompt_correct(images: torch.Tensor, prompts: list[str]) -> dict[str, torch.Tensor]:
    """Per-image adherence, each (n,) bool: ``prompt`` (every cell right), ``count``, ``positions`` (the
    asked cells hold something, the others nothing), ``shapes`` and ``colours`` (of every asked object)."""
    from ..data import parse_prompt

    if len(images) != len(prompts):
        raise ValueError(f"prompt_correct: {len(images)} images but {len(prompts)} prompts")
    present, shape, colour = (torch.stack(t) for t in zip(*(parse_prompt(p) for p in prompts)))
    seen_shape, seen_colour = judge_cells(images)
    seen = seen_shape >= 0
    shapes_ok = ((seen_shape == shape) | ~present).all(1)
    colours_ok = ((seen_colour == colour) | ~present).all(1)
    positions = (seen == present).all(1)
    return {"prompt": positions & shapes_ok & colours_ok, "count": seen.sum(1) == present.sum(1),
            "positions": positions, "shapes": shapes_ok, "colours": colours_ok}


def prompt_scores(images: torch.Tensor, prompts: list[str]) -> dict[str, float]:
    """Shares of images that follow their prompt: ``prompt_accuracy`` (everything right) and one share per
    attribute (``count_accuracy``, ``position_accuracy``, ``shape_accuracy``, ``colour_accuracy``)."""
    ok = prompt_correct(images, prompts)
    names = {"prompt": "prompt_accuracy", "count": "count_accuracy", "positions": "position_accuracy",
             "shapes": "shape_accuracy", "colours": "colour_accuracy"}
    return {names[k]: round(float(v.float().mean()), 4) for k, v in ok.items()}


@lru_cache(maxsize=1)
def _reference_stats() -> tuple[np.ndarray, np.ndarray]:
    from safetensors.torch import load_file

    stats = load_file(str(JUDGE_DIR / "fid_stats.safetensors"))
    return stats["mu"].double().numpy(), stats["sigma"].double().numpy()


@torch.no_grad()
def scene_features(images: torch.Tensor, batch_size: int = 512) -> torch.Tensor:
    """Judge features of [-1, 1] scenes, (n, 4 * feature_dim) float64."""
    model = load_scene_judge()
    images = images.detach().float().cpu()
    return torch.cat([model.features(images[i:i + batch_size]) for i in range(0, len(images), batch_size)]).double()


def scene_fid(images: torch.Tensor) -> float:
    """FID of [-1, 1] scenes against the shipped statistics of real prompted scenes (judge features)."""
    if len(images) < 2:
        raise ValueError(f"scene_fid needs at least 2 images, got {len(images)}")
    ref_mu, ref_sigma = _reference_stats()
    mu, sigma = feature_stats(scene_features(images))
    return frechet_distance(mu, sigma, ref_mu, ref_sigma)
