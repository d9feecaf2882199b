"""Seeded procedural data shared by every reference model."""

from .shapes import SHAPE_CLASSES, make_grid_png, render_shapes, to_uint8

__all__ = ["SHAPE_CLASSES", "make_grid_png", "render_shapes", "to_uint8"]
