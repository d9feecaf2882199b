"""Seeded procedural data shared by every reference model."""

from .scenes import render_scenes
from .shapes import SHAPE_CLASSES, make_grid_png, render_shapes, to_uint8

__all__ = ["SHAPE_CLASSES", "make_grid_png", "render_scenes", "render_shapes", "to_uint8"]
