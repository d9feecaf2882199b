"""Shipped tiny reference models and their loaders.

Example:
    >>> from diffspec.models import resolve_model_path
    >>> resolve_model_path("tiny-dit").name
    'tiny-dit'
"""

from __future__ import annotations

from pathlib import Path

from .classifier import (
    ShapeClassifier,
    class_accuracy,
    classifier_features,
    frechet_distance,
    load_reference_classifier,
    reference_fid,
)
from .dit import load_pipeline, quiet_diffusers, save_dit_pipeline, write_id2label

WEIGHTS = Path(__file__).resolve().parent.parent / "weights"

SHIPPED_MODELS: dict[str, Path] = {
    "tiny-dit": WEIGHTS / "tiny-dit",  # class-conditional DiTPipeline on diffspec.data shapes, 32x32
}


def resolve_model_path(name_or_path: str | Path) -> Path:
    """A shipped model name (``"tiny-dit"``) or an existing local folder → its folder.

    Raises:
        ValueError: neither a shipped name nor an existing folder.
    """
    key = str(name_or_path)
    if key in SHIPPED_MODELS:
        return SHIPPED_MODELS[key]
    path = Path(key).expanduser()
    if path.is_dir():
        return path
    raise ValueError(
        f"model {key!r} is neither a shipped model ({', '.join(SHIPPED_MODELS)}) nor an existing local folder"
    )


__all__ = [
    "SHIPPED_MODELS",
    "ShapeClassifier",
    "class_accuracy",
    "classifier_features",
    "frechet_distance",
    "load_pipeline",
    "quiet_diffusers",
    "load_reference_classifier",
    "reference_fid",
    "resolve_model_path",
    "save_dit_pipeline",
    "write_id2label",
]
