"""Loading diffusers pipeline folders quietly, and saving ``DiTPipeline`` folders with their class names."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any


def write_id2label(folder: str | Path, labels: Sequence[str]) -> None:
    """Record class names in ``model_index.json`` (as hub DiT folders do); ``DiTPipeline`` reads them back.

    Example:
        >>> write_id2label("my-dit", ["circle", "square"])  # doctest: +SKIP
        >>> DiffusionPipeline.from_pretrained("my-dit").labels  # doctest: +SKIP
        {'circle': 0, 'square': 1}
    """
    index = Path(folder) / "model_index.json"
    if not index.is_file():
        raise ValueError(f"{folder} is not a diffusers pipeline folder (no model_index.json)")
    data = json.loads(index.read_text())
    data["id2label"] = {str(i): name for i, name in enumerate(labels)}
    index.write_text(json.dumps(data, indent=2) + "\n")


def save_dit_pipeline(pipe: Any, folder: str | Path, labels: Sequence[str] | None = None) -> Path:
    """``pipe.save_pretrained(folder)`` plus its class names (default: the pipeline's own ``labels``)."""
    pipe.save_pretrained(folder)
    if labels is None:
        by_id = {i: name for name, i in getattr(pipe, "labels", {}).items()}
        labels = [by_id[i] for i in sorted(by_id)]
    if labels:
        write_id2label(folder, labels)
    return Path(folder)


@contextlib.contextmanager
def quiet_diffusers() -> Iterator[None]:
    """Hide diffusers' and transformers' loading bars and notes (e.g. the ``id2label`` type note of
    hub DiT folders, the weight-loading bar of text encoders)."""
    from diffusers.utils import logging as dlog
    from transformers.utils import logging as tlog

    level, t_level, t_bar = dlog.get_verbosity(), tlog.get_verbosity(), tlog.is_progress_bar_enabled()
    dlog.set_verbosity_error()
    dlog.disable_progress_bar()
    tlog.set_verbosity_error()
    tlog.disable_progress_bar()
    try:
        yield
    finally:
        dlog.set_verbosity(level)
        dlog.enable_progress_bar()
        tlog.set_verbosity(t_level)
        if t_bar:
            tlog.enable_progress_bar()


def _dtype_kwarg() -> str:
    """``dtype`` on diffusers that deprecate ``torch_dtype`` (0.42+), ``torch_dtype`` before."""
    from diffusers.utils import deprecation_utils

    return "dtype" if hasattr(deprecation_utils, "_resolve_dtype") else "torch_dtype"


TILED_ONLY_VAES = ("AutoencoderKLAllegro",)
"""VAE classes whose ``decode`` raises ``NotImplementedError`` unless tiling is on (diffusers 0.42; the
Allegro model card calls ``vae.enable_tiling()``). :func:`load_pipeline` turns it on: the switch is not
saved with the folder."""


def load_pipeline(name_or_path: str | Path, *, dtype: Any = None, device: Any = None) -> Any:
    """A shipped model name (``"tiny-dit"``) or a local diffusers folder → the loaded pipeline, with
    tiling on for a VAE that decodes only in tiles (:data:`TILED_ONLY_VAES`).

    Raises:
        ValueError: unknown name, missing folder, or a folder without ``model_index.json``.

    Example:
        >>> pipe = load_pipeline("tiny-dit")  # doctest: +SKIP
    """
    from diffusers import DiffusionPipeline

    from . import resolve_model_path
    from .folders import model_family

    folder = resolve_model_path(name_or_path)
    if not (folder / "model_index.json").is_file():
        family = model_family(folder)
        hint = (f": it holds an {'AR image' if family == 'ar_image' else 'transformers'} model, which "
                f"SpeculativePipeline.from_pretrained({str(name_or_path)!r}, method=...) loads" if family else "")
        raise ValueError(f"{folder} is not a diffusers pipeline folder (no model_index.json){hint}")
    kwargs = {_dtype_kwarg(): dtype} if dtype is not None else {}
    with quiet_diffusers():
        pipe = DiffusionPipeline.from_pretrained(str(folder), **int8_components(folder, dtype), **kwargs)
    vae = getattr(pipe, "vae", None)
    if type(vae).__name__ in TILED_ONLY_VAES:
        vae.enable_tiling()
    defaults = call_defaults(pipe)
    if "height" in defaults and hasattr(pipe, "default_sample_size") and hasattr(pipe, "vae_scale_factor"):
        pipe.default_sample_size = defaults["height"] // pipe.vae_scale_factor  # FLUX-style pipelines: size default
    return pipe.to(device) if device is not None else pipe


def int8_components(folder: Path, dtype: Any = None) -> dict[str, Any]:
    """The components of a pipeline folder stored in int8 (``<component>/model.int8.safetensors``,
    :mod:`~diffspec.models.int8_weights`), built from their configs with the dequantized weights; ``{}`` for a plain
    diffusers folder. ``load_pipeline(...).save_pretrained(path)`` writes a plain one."""
    import importlib

    import torch

    from .int8_weights import FILENAME, load_int8

    components = {}
    for name, spec in json.loads((folder / "model_index.json").read_text()).items():
        if isinstance(spec, list) and len(spec) == 2 and (folder / name / FILENAME).is_file():
            model_cls = getattr(importlib.import_module(spec[0]), spec[1])
            components[name] = load_int8(model_cls, folder / name, dtype=dtype or torch.float32)
    return components


MODEL_FILE = "diffspec_model.json"
"""A model folder's diffspec settings: ``call_defaults``, the pipeline arguments the model was trained for
(``height``, ``width``, ``max_sequence_length``; applied by ``diffspec generate`` and the benchmarks where the
caller gives none), and ``judge``, what scores its samples (``"prompted-scenes"``:
:mod:`~diffspec.models.scene_judge`)."""


def model_settings(pipe: Any) -> dict[str, Any]:
    """The :data:`MODEL_FILE` of the folder ``pipe`` was loaded from (``{}`` when it has none)."""
    name = getattr(pipe, "name_or_path", None) or getattr(getattr(pipe, "config", None), "_name_or_path", None)
    path = Path(str(name)) / MODEL_FILE if name else None
    if path is None or not path.is_file():
        return {}
    return json.loads(path.read_text())


def call_defaults(pipe: Any) -> dict[str, Any]:
    """The pipeline arguments the model was trained for, e.g. ``{"height": 32, "width": 32,
    "max_sequence_length": 24}`` for ``tiny-flux`` (``{}`` for most folders).

    Example:
        >>> call_defaults(load_pipeline("tiny-flux"))  # doctest: +SKIP
        {'height': 32, 'width': 32, 'max_sequence_length': 24}
    """
    return dict(model_settings(pipe).get("call_defaults", {}))
