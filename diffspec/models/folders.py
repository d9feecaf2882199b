"""What a model folder holds, read from its JSON files alone (no weights are opened, nothing heavy is imported).

Example:
    >>> from diffspec.models.folders import describe_model, model_family
    >>> from diffspec.models import resolve_model_path
    >>> model_family(resolve_model_path("tiny-ar"))
    'ar_image'
    >>> describe_model(resolve_model_path("tiny-dit"))["classes"][:3]
    ['circle', 'square', 'triangle']
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def _json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def is_ar_model_folder(folder: Path) -> bool:
    """Whether ``folder`` holds an AR image model (``gpt/`` + ``tokenizer/``), as ``load_ar_target`` reads."""
    return (folder / "gpt" / "config.json").is_file() and (folder / "tokenizer" / "config.json").is_file()


def model_family(folder: str | Path) -> str | None:
    """The method family (``"diffusion"``, ``"ar_image"``, ``"multimodal"``) of the model ``folder`` holds, as
    ``SpeculativePipeline.from_pretrained`` loads it: a diffusers pipeline (``model_index.json``), an AR image model
    (``gpt/`` + ``tokenizer/``) or a transformers model (``config.json``); None for anything else."""
    folder = Path(folder)
    if is_ar_model_folder(folder):
        return "ar_image"
    if (folder / "model_index.json").is_file():
        return "diffusion"
    if (folder / "config.json").is_file():
        return "multimodal"
    return None


def _architecture(config: dict[str, Any]) -> str | None:
    archs = config.get("architectures") or []
    return str(archs[0]) if archs else config.get("_class_name")


def describe_model(folder: str | Path) -> dict[str, Any]:
    """``{"family", "model", "classes", "components"}`` of a model folder, from its JSON files.

    ``model`` is the main class (a diffusers pipeline's, ``LlamaGen (c2i) + PatchVQ``, a transformers
    architecture, or the ``target/`` one of a folder of several models); ``components`` names each part's class;
    ``classes`` lists what the model is conditioned on: a diffusers pipeline's ``id2label`` names, an AR image
    model's class ids (``["0", ..., "9"]``, from its GPT's ``num_classes``: it takes ids), else None.
    """
    folder = Path(folder)
    family, classes, components = model_family(folder), None, {}
    if family == "diffusion":
        index = _json(folder / "model_index.json")
        components["pipeline"] = index.get("_class_name")
        components.update({k: v[1] for k, v in index.items() if isinstance(v, list) and len(v) == 2 and v[1]})
        labels = index.get("id2label") or {}
        classes = [labels[k] for k in sorted(labels, key=int)] if labels else None
    elif family == "ar_image":
        gpt = _json(folder / "gpt" / "config.json")
        components["gpt"] = f"LlamaGen ({gpt.get('model_type', '?')})"
        components["tokenizer"] = _json(folder / "tokenizer" / "config.json").get("class")
        if (folder / "drafter" / "config.json").is_file():
            components["drafter"] = "EagleDrafter"
        if gpt.get("num_classes"):
            classes = [str(i) for i in range(int(gpt["num_classes"]))]
    elif family == "multimodal":
        components["model"] = _architecture(_json(folder / "config.json"))
    elif folder.is_dir():  # a folder of several transformers models (tiny-vlm: target/, drafter/, text-drafter/)
        for sub in sorted(p for p in folder.iterdir() if (p / "config.json").is_file()):
            components[sub.name] = _architecture(_json(sub / "config.json"))
        family = "multimodal" if components else None
    components = {k: v for k, v in components.items() if v}
    main = components.get("pipeline") or components.get("model") or components.get("target")
    if family == "ar_image":
        main = f"{components['gpt']} + {components.get('tokenizer', '?')}"
    return {"family": family, "model": main, "classes": classes, "components": components}
