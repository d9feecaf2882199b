"""Batch generation to a folder: PNGs plus ``manifest.jsonl`` (what ``diffspec generate`` runs).

Each item has its own seed (``seed + index``) and generator, so an image does not depend on the
batch size or on which other items share its batch.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..progress import progress


@dataclass(frozen=True)
class Item:
    """One image to make: its index, the prompt line it came from, and its seed."""

    index: int
    prompt: str
    seed: int


def read_prompts(path: str | Path) -> list[str]:
    """Non-empty, non-comment (``#``) lines of a prompt file.

    Raises:
        ValueError: the file does not exist or holds no prompt.
    """
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"prompt file {str(path)!r} does not exist")
    lines = [line.strip() for line in path.read_text(encoding="utf-8").splitlines()]
    prompts = [line for line in lines if line and not line.startswith("#")]
    if not prompts:
        raise ValueError(f"prompt file {str(path)!r} holds no prompt (one per line, '#' starts a comment)")
    return prompts


def is_class_conditional(pipe: Any) -> bool:
    """DiT-style pipelines take class labels instead of text prompts."""
    return hasattr(pipe, "get_label_ids")


def class_ids(pipe: Any, prompts: list[str]) -> list[int]:
    """Class names (or integer ids) → label ids of a class-conditional pipeline.

    Raises:
        ValueError: a name the pipeline does not know, or an id out of range (lists the classes).
    """
    labels = getattr(pipe, "labels", None) or {}
    ids = []
    for prompt in prompts:
        if prompt.isdigit() and (not labels or int(prompt) in labels.values()):
            ids.append(int(prompt))
        elif prompt in labels:
            ids.append(labels[prompt])
        else:
            names = ", ".join(sorted(labels, key=labels.get)) if len(labels) <= 40 else f"{len(labels)} classes"
            raise ValueError(f"unknown class {prompt!r} for this model; its classes: {names}")
    return ids


def _save_png_atomic(image: Any, path: Path) -> None:
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".png", dir=path.parent)
    os.close(fd)
    try:
        image.save(tmp, format="PNG")
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def generate_to_folder(pipe: Any, prompts: list[str], out: str | Path, *, seed: int = 0, batch_size: int = 4,
                       steps: int = 50, guidance_scale: float | None = None, device: str | torch.device = "cpu",
                       record: dict[str, Any] | None = None) -> Path:
    """Generate one image per prompt into ``out`` and write ``out/manifest.jsonl``.

    ``pipe`` is a diffusers pipeline or a :class:`~diffspec.SpeculativePipeline` (its per-batch
    ``spec_stats`` go into the manifest). ``record`` is merged into every manifest line
    (model, method, config).

    Example:
        >>> generate_to_folder(spec, ["circle", "star"], "out/", steps=20)  # doctest: +SKIP
        PosixPath('out/manifest.jsonl')
    """
    if batch_size < 1:
        raise ValueError(f"batch_size={batch_size} is out of range; must be >= 1")
    if steps < 1:
        raise ValueError(f"steps={steps} is out of range; must be >= 1")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    labels = class_ids(pipe, prompts) if is_class_conditional(pipe) else None
    items = [Item(i, p, seed + i) for i, p in enumerate(prompts)]
    manifest = out / "manifest.jsonl"
    gen_device = torch.device(device).type
    with manifest.open("w", encoding="utf-8") as fh:
        batches = [items[i : i + batch_size] for i in range(0, len(items), batch_size)]
        for batch in progress(batches, desc="generate", unit="batch"):
            kwargs: dict[str, Any] = {"num_inference_steps": steps,
                                      "generator": [torch.Generator(gen_device).manual_seed(it.seed) for it in batch]}
            if guidance_scale is not None:
                kwargs["guidance_scale"] = guidance_scale
            if labels is not None:
                kwargs["class_labels"] = [labels[it.index] for it in batch]
            else:
                kwargs["prompt"] = [it.prompt for it in batch]
            result = pipe(**kwargs)
            stats = getattr(result, "spec_stats", None)
            for it, image in zip(batch, result.images):
                name = f"{it.index:05d}.png"
                _save_png_atomic(image, out / name)
                line = {"file": name, "index": it.index, "prompt": it.prompt, "seed": it.seed, "steps": steps,
                        "guidance_scale": guidance_scale, **(record or {}),
                        "batch_stats": stats.to_dict() if stats is not None else None}
                if labels is not None:
                    line["class_label"] = labels[it.index]
                fh.write(json.dumps(line) + "\n")
            fh.flush()
    return manifest
