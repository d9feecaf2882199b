"""Seeded procedural data shared by every reference model."""

from .prompted import parse_prompt, render_prompted_scenes
from .scenes import render_scenes
from .shapes import SHAPE_CLASSES, make_grid_png, render_shapes, to_uint8

__all__ = ["SHAPE_CLASSES", "make_grid_png", "parse_prompt", "render_prompted_scenes", "render_scenes", "render_shapes",
           "to_uint8"]
