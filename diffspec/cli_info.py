"""``diffspec info``: versions, devices, shipped models (their parts and class names) and methods.

Package versions are read from their metadata and model details from the folders' JSON files, so the
command imports torch (for the devices) and the method registry, but not diffusers or transformers.

Example:
    >>> print(table([["tiny-dit", "DiTPipeline"], ["tiny-ar-noisy", "LlamaGen"]]))
    tiny-dit       DiTPipeline
    tiny-ar-noisy  LlamaGen
"""

from __future__ import annotations

import platform
from collections.abc import Sequence
from importlib.metadata import PackageNotFoundError, version
from typing import Any


def _version(package: str) -> str | None:
    try:
        return version(package)
    except PackageNotFoundError:
        return None


def _classes(names: list[str] | None, components: dict[str, str] | None = None) -> str:
    if not names:
        return "text prompts" if "text_encoder" in (components or {}) else "-"
    if all(n.isdigit() for n in names):
        return f"ids {names[0]}-{names[-1]}"
    return ", ".join(names)


def info() -> dict[str, Any]:
    """Versions, devices, shipped models and methods (what ``diffspec info --json`` prints)."""
    import torch

    from . import __version__
    from .api import methods
    from .models import REFERENCE_CLASSIFIERS, SHIPPED_MODELS
    from .models.folders import describe_model

    devices = ["cpu"] + [f"cuda:{i} ({torch.cuda.get_device_name(i)})" for i in range(torch.cuda.device_count())]
    models = {name: {"path": str(path), "present": path.is_dir(), **describe_model(path)}
              for name, path in SHIPPED_MODELS.items()}
    return {
        "diffspec": __version__, "python": platform.python_version(), "torch": torch.__version__,
        "diffusers": _version("diffusers"), "transformers": _version("transformers"), "cuda": torch.version.cuda,
        "devices": devices, "models": models,
        "reference_classifiers": {name: str(path) for name, path in REFERENCE_CLASSIFIERS.items()},
        "methods": [{"name": m.name, "family": m.family, "kind": "exact" if m.exact else "relaxed",
                     "status": m.status} for m in methods()],
    }


def table(rows: Sequence[Sequence[str]], indent: str = "") -> str:
    """Rows of cells as text, each column padded to its widest cell (two spaces apart; no trailing spaces)."""
    widths = [max(len(r[i]) for r in rows if i < len(r)) for i in range(max(len(r) for r in rows))]
    return "\n".join(indent + "  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows)


def format_info(data: dict[str, Any]) -> str:
    """The text ``diffspec info`` prints: aligned columns (paths and model parts only in ``--json``)."""
    keys = ("diffspec", "python", "torch", "diffusers", "transformers", "cuda")
    head = table([[k, str(data[k])] for k in keys] + [["devices", ", ".join(data["devices"])]])
    models = table([["name", "family", "model", "classes"]]
                   + [[name, m["family"] or "-", m["model"] or "-", _classes(m["classes"], m["components"])] if m["present"]
                      else [name, "missing", "-", "-"]
                      for name, m in data["models"].items()], indent="  ")
    classifiers = table([[name, path] for name, path in data["reference_classifiers"].items()], indent="  ")
    methods = table([["name", "family", "kind", "status"]]
                    + [[m["name"], m["family"], m["kind"], m["status"]] for m in data["methods"]], indent="  ")
    return (f"{head}\nmodels (their parts and paths: --json):\n{models}\n"
            f"reference classifiers (FID, class accuracy):\n{classifiers}\nmethods:\n{methods}")
