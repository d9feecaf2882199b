"""How a batch of items becomes one call of a diffusers pipeline, and its output a list of arrays.

Works from the pipeline's ``__call__`` signature, so any text-to-image, text-to-video or
class-conditional pipeline (DiT), and those taking an input ``image`` or a ControlNet ``control_image``, is driven the
same way: items that set a field the pipeline does
not take (``num_frames`` for an image pipeline, ``class_label`` for a text one) are refused before
the run starts, naming the line.

Example:
    >>> adapter = PipelineAdapter(pipe)  # doctest: +SKIP
    >>> out = pipe(**adapter.kwargs(batch))  # doctest: +SKIP
    >>> arrays = adapter.outputs(out)  # (H, W, 3) images or (F, H, W, 3) videos in [0, 1]  # doctest: +SKIP
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from .items import GenItem, ItemError, shorten

_CALL_FIELDS = {"negative_prompt": "negative_prompt", "height": "height", "width": "width",
                "num_frames": "num_frames", "guidance_scale": "guidance_scale", "image": "image",
                "control_image": "control_image"}
"""Item field → pipeline ``__call__`` argument (when the item sets it)."""

NEGATIVE_PROMPT_REQUIRED = ("EasyAnimatePipeline",)
"""Pipelines whose ``negative_prompt`` defaults to ``None`` but which iterate over it under classifier-free
guidance (diffusers 0.42): items without one are given ``""``, what the others put in its place."""


def is_class_conditional(pipe: Any) -> bool:
    """DiT-style pipelines take class labels instead of text prompts."""
    return hasattr(pipe, "get_label_ids")


def class_id(pipe: Any, label: str | int) -> int:
    """A class name or integer id (or its decimal string) → the label id of a class-conditional pipeline.

    Raises:
        ValueError: a name the pipeline does not know, or an id out of range (lists the classes).
    """
    labels = getattr(pipe, "labels", None) or {}
    text = str(label)
    if text.isdigit() and (not labels or int(text) in labels.values()):
        return int(text)
    if text in labels:
        return labels[text]
    names = ", ".join(sorted(labels, key=labels.get)) if len(labels) <= 40 else f"{len(labels)} classes"
    raise ValueError(f"unknown class {shorten(label)} for this model; its classes: {names}")


def _label(item: GenItem) -> str | int:
    """An item's class: its ``class_label``, else its prompt (a class name in prompt files)."""
    return item.class_label if item.class_label is not None else item.prompt or ""


def _load_image(path: str) -> Any:
    """An input image file as an RGB PIL image (EXIF orientation applied, as diffusers' ``load_image``)."""
    from diffusers.utils import load_image

    return load_image(path)


class PipelineAdapter:
    """Builds call kwargs for a batch of compatible items and splits the output per item."""

    def __init__(self, pipe: Any) -> None:
        from ..models.dit import call_defaults

        self.pipe = pipe
        self.params = set(inspect.signature(pipe.__call__).parameters)
        self.defaults = {k: v for k, v in call_defaults(pipe).items() if k in self.params}  # the model's own
        self.class_conditional = is_class_conditional(pipe)
        self.video = "num_frames" in self.params

    @property
    def kind(self) -> str:
        """``"video"`` or ``"image"``."""
        return "video" if self.video else "image"

    def check(self, item: GenItem) -> None:
        """Refuse fields this pipeline cannot take.

        Raises:
            ItemError: naming the item's line and the field.
        """
        name = type(self.pipe).__name__
        if self.class_conditional:
            try:
                class_id(self.pipe, _label(item))
            except ValueError as exc:
                raise ItemError(f"{item.where}: {exc}") from None
        elif item.class_label is not None:
            raise ItemError(f"{item.where}: field 'class_label' needs a class-conditional model; {name} takes 'prompt'")
        for field, arg in _CALL_FIELDS.items():
            if getattr(item, field) is not None and arg not in self.params:
                raise ItemError(f"{item.where}: field {field!r} is not an argument of {name}")
        if item.fps is not None and not self.video:
            raise ItemError(f"{item.where}: field 'fps' applies to video pipelines; {name} makes images")

    @staticmethod
    def batch_key(item: GenItem) -> tuple[Any, ...]:
        """Items with equal keys can share one pipeline call."""
        return (item.steps, item.negative_prompt is None, item.height, item.width, item.num_frames,
                item.guidance_scale, item.image, item.control_image)  # one input image per call

    def kwargs(self, items: Sequence[GenItem]) -> dict[str, Any]:
        """Call arguments for ``items`` (which share :meth:`batch_key`); one CPU generator per item."""
        first = items[0]
        kw: dict[str, Any] = {"num_inference_steps": first.steps, "output_type": "np",
                              "generator": [torch.Generator("cpu").manual_seed(it.seed) for it in items]}
        if self.class_conditional:
            kw["class_labels"] = [class_id(self.pipe, _label(it)) for it in items]
        else:
            kw["prompt"] = [it.prompt for it in items]
            if first.negative_prompt is not None:
                kw["negative_prompt"] = [it.negative_prompt for it in items]
            elif type(self.pipe).__name__ in NEGATIVE_PROMPT_REQUIRED:
                kw["negative_prompt"] = [""] * len(items)
        for field in ("height", "width", "num_frames", "guidance_scale"):
            if getattr(first, field) is not None:
                kw[field] = getattr(first, field)
        for arg, path in first.input_images().items():  # shared by the batch (batch_key)
            kw[arg] = _load_image(path)
        for arg, value in self.defaults.items():  # what the model was trained for, where the item is silent
            kw.setdefault(arg, value)
        return kw

    def outputs(self, result: Any) -> list[np.ndarray]:
        """Per-item arrays in [0, 1]: (H, W, C) images or (F, H, W, C) videos."""
        data = getattr(result, "frames", None) if self.video else None
        if data is None:
            data = getattr(result, "images", None)
        if data is None and isinstance(result, tuple):
            data = result[0]
        if data is None:
            raise RuntimeError(f"{type(result).__name__} has neither `frames` nor `images`")
        if isinstance(data, torch.Tensor):
            data = data.detach().float().cpu().numpy()
        if isinstance(data, np.ndarray):
            return list(data)
        # lists of PIL images (or of frame lists): uint8 arrays, which to_uint8 passes through
        return [np.stack([np.asarray(f) for f in x]) if isinstance(x, (list, tuple)) else np.asarray(x) for x in data]
