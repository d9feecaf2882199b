"""Tiny random-weight diffusers pipelines by name, built from configs, offline (tests, demos, CLI smoke runs).

The builders are in :mod:`.video_pipelines` (text to video) and :mod:`.image_pipelines` (text to image).

Every component is built from a config with seeded random weights: the transformer, the VAE, the
text encoder (a transformers config) and a word-level tokenizer made with the ``tokenizers``
library from a fixed word list. Nothing is downloaded. Saved with ``save_pretrained``, a folder
loads back with ``DiffusionPipeline.from_pretrained`` and drives ``diffspec generate`` like a
real checkpoint.

Example:
    >>> from diffspec.testing.tiny_pipelines import save_tiny_pipeline
    >>> folder = save_tiny_pipeline("tiny-wan", "/tmp/tiny-wan")  # doctest: +SKIP
    >>> # diffspec generate --model /tmp/tiny-wan --prompt-file prompts.txt --height 32 --width 32 \\
    >>> #     --num-frames 5 --steps 8 --out out/
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..models.dit import quiet_diffusers
from .image_pipelines import (
    build_tiny_auraflow,
    build_tiny_chroma,
    build_tiny_cogview3plus,
    build_tiny_flux,
    build_tiny_hidream,
    build_tiny_lumina2,
)
from .video_pipelines import (
    build_tiny_allegro,
    build_tiny_cogvideox,
    build_tiny_easyanimate,
    build_tiny_hunyuanvideo,
    build_tiny_ltx,
    build_tiny_mochi,
    build_tiny_skyreelsv2,
    build_tiny_wan,
    build_tiny_wan22,
    build_tiny_wan22_i2v,
)

TINY_PIPELINES: dict[str, Callable[[int], Any]] = {
    "tiny-flux-random": build_tiny_flux,
    "tiny-wan": build_tiny_wan,
    "tiny-wan22": build_tiny_wan22,
    "tiny-wan22-i2v": build_tiny_wan22_i2v,
    "tiny-cogvideox": build_tiny_cogvideox,
    "tiny-ltx": build_tiny_ltx,
    "tiny-hunyuanvideo": build_tiny_hunyuanvideo,
    "tiny-skyreelsv2": build_tiny_skyreelsv2,
    "tiny-chroma": build_tiny_chroma,
    "tiny-lumina2": build_tiny_lumina2,
    "tiny-auraflow": build_tiny_auraflow,
    "tiny-cogview3plus": build_tiny_cogview3plus,
    "tiny-hidream": build_tiny_hidream,
    "tiny-mochi": build_tiny_mochi,
    "tiny-allegro": build_tiny_allegro,
    "tiny-easyanimate": build_tiny_easyanimate,
}
"""Builders of the tiny pipelines by name."""


def build_tiny_pipeline(name: str, seed: int = 0) -> Any:
    """The named tiny pipeline (see :data:`TINY_PIPELINES`), progress bars off.

    Raises:
        ValueError: an unknown name (lists the known ones).
    """
    if name not in TINY_PIPELINES:
        raise ValueError(f"unknown tiny pipeline {name!r}; choose one of {', '.join(TINY_PIPELINES)}")
    pipe = TINY_PIPELINES[name](seed)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def save_tiny_pipeline(name: str, folder: str | Path, seed: int = 0) -> Path:
    """Build the named tiny pipeline and ``save_pretrained`` it into ``folder``; returns the folder."""
    with quiet_diffusers():
        build_tiny_pipeline(name, seed).save_pretrained(str(folder))
    return Path(folder)
