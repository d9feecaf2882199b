"""Shipped tiny reference models and their loaders.

Example:
    >>> from diffspec.models import resolve_model_path
    >>> resolve_model_path("tiny-dit").name
    'tiny-dit'
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .classifier import (
    REFERENCE_CLASSIFIERS,
    ShapeClassifier,
    class_accuracy,
    classifier_features,
    load_reference_classifier,
    paired_accuracy,
    reference_fid,
)
from .dit import load_pipeline, quiet_diffusers, save_dit_pipeline, write_id2label
from .folders import describe_model, is_ar_model_folder, model_family
from .tiny_vlm import load_tiny_vlm

WEIGHTS = Path(__file__).resolve().parent.parent / "weights"

SHIPPED_MODELS: dict[str, Path] = {
    "tiny-dit": WEIGHTS / "tiny-dit",  # class-conditional DiTPipeline on diffspec.data shapes, 32x32
    "tiny-flux": WEIGHTS / "tiny-flux",  # text-to-image FluxPipeline on prompted scenes, 32x32 (int8 transformer)
    "tiny-ar": WEIGHTS / "tiny-ar",  # class-conditional LlamaGen GPT + patch k-means VQ on shapes, 8x8 tokens
    "tiny-ar-tex": WEIGHTS / "tiny-ar-tex",  # the same on textured backgrounds: less peaked (classifier shapes-tex)
    "tiny-ar-noisy": WEIGHTS / "tiny-ar-noisy",  # textured + strong pixel noise: flat laws like published models'
    "tiny-vlm": WEIGHTS / "tiny-vlm",  # LLaVA captioner of render_scenes + VLM and text drafters (load_tiny_vlm)
    "tiny-vla": WEIGHTS / "tiny-vla",  # Llama policy with OpenVLA-style action tokens on a reach task (load_tiny_vla)
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


GPT_STORAGE = ("float32", "float16", "int8")
"""How :func:`save_gpt` can store a ``LlamaGenTransformer`` (the shipped GPTs are int8)."""


def load_gpt(folder: str | Path, *, device: Any = None, dtype: Any = None) -> Any:
    """A ``LlamaGenTransformer`` folder written by :func:`save_gpt` (``config.json`` with ``model.safetensors``
    or with the per-row int8 ``model.int8.safetensors``, dequantized), in eval mode, float32 unless ``dtype``
    says otherwise.

    Example:
        >>> load_gpt(resolve_model_path("tiny-ar") / "gpt").config.vocab_size
        1024
    """
    from ..ar_image.targets.llamagen import LlamaGenTransformer
    from ..ar_image.targets.llamagen_config import LlamaGenConfig, config_from_dict
    from ..ar_image.targets.llamagen_load import build_and_load
    from .int8_weights import FILENAME, load_int8_state

    folder = Path(folder)
    if not (folder / FILENAME).is_file():
        return LlamaGenTransformer.from_pretrained(folder, device=device or "cpu", dtype=dtype)
    config = config_from_dict(LlamaGenConfig, json.loads((folder / "config.json").read_text()))
    return build_and_load(LlamaGenTransformer, config, load_int8_state(folder), str(folder), device or "cpu", dtype)


def save_gpt(model: Any, folder: str | Path, storage: str = "int8") -> Path:
    """Write a ``LlamaGenTransformer`` as :func:`load_gpt` reads it: ``config.json`` and either
    ``model.safetensors`` (``storage="float32"`` or ``"float16"``) or ``model.int8.safetensors``
    (``"int8"``, per-row, :mod:`~diffspec.models.int8_weights`); the folder's other weight file is
    removed. Returns the weight file written.

    Raises:
        ValueError: ``storage`` is not one of :data:`GPT_STORAGE`.

    Example:
        >>> save_gpt(load_gpt("diffspec/weights/tiny-ar/gpt"), "my-gpt").name  # doctest: +SKIP
        'model.int8.safetensors'
    """
    import copy

    import torch

    from .int8_weights import FILENAME, save_int8_state

    if storage not in GPT_STORAGE:
        raise ValueError(f"storage={storage!r} is not supported; choose one of {', '.join(GPT_STORAGE)}")
    folder = Path(folder)
    copy.deepcopy(model).to(torch.float16 if storage == "float16" else torch.float32).save_pretrained(folder)
    (folder / FILENAME).unlink(missing_ok=True)
    if storage != "int8":
        return folder / "model.safetensors"
    (folder / "model.safetensors").unlink()
    return save_int8_state(model.state_dict(), folder)


def load_ar_target(name_or_path: str | Path, *, device: Any = None, dtype: Any = None) -> Any:
    """A shipped AR image model (``"tiny-ar"``) or a folder with ``gpt/`` + ``tokenizer/`` → a ``LlamaGenTarget``.

    ``gpt/`` is a :func:`save_gpt` folder, ``tokenizer/`` a
    ``PatchVQ.save_pretrained`` folder (its decoder and LANTERN codebook); an optional
    ``generation_config.json`` gives the target's ``default_guidance_scale`` and
    ``reference_classifier`` (the ``REFERENCE_CLASSIFIERS`` name that scores its samples, set on the
    target; ``"shapes"`` when absent). Weights stored in float16 or int8 load as float32 unless ``dtype`` says
    otherwise.

    Raises:
        ValueError: unknown name, a folder without ``gpt/config.json`` and ``tokenizer/config.json``,
            or an unknown ``reference_classifier``.

    Example:
        >>> target = load_ar_target("tiny-ar")
        >>> target.codebook_size, target.grid
        (1024, (8, 8))
    """
    from ..ar_image.targets.llamagen_session import LlamaGenTarget
    from ..ar_image.targets.patch_vq import PatchVQ

    folder = resolve_model_path(name_or_path)
    if not is_ar_model_folder(folder):
        raise ValueError(f"{folder} is not an AR image model folder (needs gpt/config.json and tokenizer/config.json)")
    model = load_gpt(folder / "gpt", device=device, dtype=dtype)
    generation_file = folder / "generation_config.json"
    generation = json.loads(generation_file.read_text()) if generation_file.is_file() else {}
    classifier = generation.get("reference_classifier", "shapes")
    if classifier not in REFERENCE_CLASSIFIERS:
        raise ValueError(f"{generation_file}: reference_classifier={classifier!r} is not one of "
                         f"{', '.join(REFERENCE_CLASSIFIERS)}")
    target = LlamaGenTarget(model, PatchVQ.from_pretrained(folder / "tokenizer").to(device or "cpu"),
                            default_guidance_scale=generation.get("default_guidance_scale", 1.0))
    target.name_or_path = folder  # where method extras live (LANTERN's drafter/)
    target.reference_classifier = classifier  # which shipped classifier scores its samples (FID, accuracy)
    return target


__all__ = [
    "REFERENCE_CLASSIFIERS",
    "GPT_STORAGE",
    "SHIPPED_MODELS",
    "ShapeClassifier",
    "class_accuracy",
    "classifier_features",
    "describe_model",
    "is_ar_model_folder",
    "load_ar_target",
    "load_gpt",
    "load_pipeline",
    "load_tiny_vlm",
    "model_family",
    "paired_accuracy",
    "quiet_diffusers",
    "load_reference_classifier",
    "reference_fid",
    "resolve_model_path",
    "save_dit_pipeline",
    "save_gpt",
    "write_id2label",
]
