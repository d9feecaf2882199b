"""Batch items: reading a prompt file (plain text or JSONL), validating it, and keying each item.

A JSONL item file (``*.jsonl``, ``*.ndjson``, ``*.json``) holds one JSON object per line (blank
lines and ``#`` lines are skipped)::

    {"id": "fox", "prompt": "a red fox in the snow", "seed": 7, "steps": 30, "height": 480, "width": 832,
     "num_frames": 33, "method": "speca", "config": {"k_max": 6}}
    {"class_label": "circle", "method": "none"}
    {"prompt": "a fox, canny edges", "control_image": "edges/fox.png"}

Every field but ``prompt`` (or ``class_label``) is optional; missing ones take the command-line
defaults (``--steps``, ``--method``, ``--set``, ...). A plain text file holds one prompt (or class
name) per line. Item ``i`` (0-based, counting every generated output) without a ``seed`` uses
``base_seed + i``: seeds belong to items, never to processes.

Example:
    >>> from diffspec.batch.items import parse_item
    >>> item = parse_item({"prompt": "a fox", "seed": 3}, index=0, line=1, defaults=ItemDefaults())
    >>> item.prompt, item.seed, item.method
    ('a fox', 3, 'taylor')
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

FIELDS: dict[str, str] = {
    "id": "a string or integer naming the item (default: its position)",
    "prompt": "the text prompt (class name for class-conditional models)",
    "class_label": "class name or integer id (class-conditional models)",
    "negative_prompt": "text to steer away from",
    "seed": "integer seed of this item's generator",
    "steps": "inference steps (>= 1)",
    "height": "image/video height in pixels (1 to 8192)",
    "width": "image/video width in pixels (1 to 8192)",
    "num_frames": "video frames (>= 1; alias: frames)",
    "fps": "video frames per second in the written file (>= 1)",
    "guidance_scale": "classifier-free guidance scale (a finite number)",
    "image": "input image file, the pipeline's `image` (image-to-video, image-to-image, edit pipelines); a relative "
             "path starts at the prompt file's folder",
    "control_image": "ControlNet conditioning image file, the pipeline's `control_image` (same path rule)",
    "method": "acceleration method, or 'none'",
    "config": "method config overrides, e.g. {\"interval\": 4}",
}
"""The fields a JSONL item may carry."""

MAX_SIDE = 8192
"""The largest ``height``/``width`` accepted (pixels): more than any diffusers model is trained for, and past it a
pipeline fails item after item on its allocation."""
SHORT = 80
"""Characters of a value that error messages repeat (:func:`shorten`)."""

_ALIASES = {"frames": "num_frames"}
JSONL_SUFFIXES = (".jsonl", ".ndjson", ".json")
"""Prompt files read as one JSON object per line; any other file holds one prompt per line."""


class ItemError(ValueError):
    """A bad item file or item: the message names the line and the field."""


@dataclass(frozen=True)
class ItemDefaults:
    """Command-line defaults for the fields an item leaves out."""

    steps: int = 50
    seed: int = 0
    method: str = "taylor"
    overrides: dict[str, Any] = field(default_factory=dict)
    negative_prompt: str | None = None
    height: int | None = None
    width: int | None = None
    num_frames: int | None = None
    fps: int | None = None
    guidance_scale: float | None = None


@dataclass(frozen=True)
class GenItem:
    """One output to generate.

    ``index`` is the item's position among all outputs (manifest order), ``line`` the 1-based
    line of the input it came from (0 for ``--class-labels``). ``overrides`` are the method config
    overrides (command line, then the item's ``config``).
    """

    index: int
    line: int
    id: str
    prompt: str | None
    seed: int
    steps: int
    method: str
    overrides: dict[str, Any] = field(default_factory=dict)
    class_label: str | int | None = None
    negative_prompt: str | None = None
    height: int | None = None
    width: int | None = None
    num_frames: int | None = None
    fps: int | None = None
    guidance_scale: float | None = None
    image: str | None = None  # resolved path of the pipeline's `image`
    control_image: str | None = None  # resolved path of the pipeline's `control_image`

    @property
    def where(self) -> str:
        """``"line 3"`` (or ``"item 'x'"`` when the item has no line), for messages."""
        return f"line {self.line}" if self.line else f"item {shorten(self.id)}"

    def fields(self) -> dict[str, Any]:
        """The fields that decide the output (what the item key hashes, with the model)."""
        out = {"id": self.id, "prompt": self.prompt, "class_label": self.class_label, "seed": self.seed,
               "steps": self.steps, "method": self.method, "overrides": self.overrides,
               "negative_prompt": self.negative_prompt, "height": self.height, "width": self.width,
               "num_frames": self.num_frames, "fps": self.fps, "guidance_scale": self.guidance_scale,
               **{name: image_identity(path) for name, path in self.input_images().items()}}
        return {k: v for k, v in out.items() if v is not None and v != {}}

    def input_images(self) -> dict[str, str]:
        """The pipeline arguments this item gives an image file for: argument -> path."""
        return {k: v for k, v in (("image", self.image), ("control_image", self.control_image)) if v is not None}


def image_identity(path: str | Path) -> dict[str, str]:
    """An input image in an item's key: its file name and a hash of its bytes (not its folder, so a moved prompt
    folder keys the same, as :func:`model_identity` does for models; a changed image keys anew)."""
    return {"file": Path(path).name, "sha256": _file_digest(str(Path(path).resolve()))}


@functools.lru_cache(maxsize=256)
def _file_digest(path: str) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()[:16]


# ---------------------------------------------------------------------------------------------- validation
def shorten(value: Any, limit: int = SHORT) -> str:
    """``repr(value)``, cut to its first ``limit`` characters + ``"..."`` when longer (for one-line messages).

    Example:
        >>> shorten("x" * 100, 8)
        "'xxxxxxx..."
    """
    return cut(repr(value), limit)


def cut(text: str, limit: int = SHORT) -> str:
    """``text``, cut to its first ``limit`` characters + ``"..."`` when longer."""
    return text if len(text) <= limit else text[:limit] + "..."


def _int(where: str, name: str, value: Any, lo: int | None = 1, hi: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ItemError(f"{where}: field {name!r} must be an integer, got {shorten(value)}")
    if hi is not None and not lo <= value <= hi:  # type: ignore[operator]
        raise ItemError(f"{where}: field {name!r}={shorten(value)} is out of range; must be {lo} to {hi}")
    if lo is not None and value < lo:
        raise ItemError(f"{where}: field {name!r}={shorten(value)} is out of range; must be >= {lo}")
    return value


def _str(where: str, name: str, value: Any) -> str:
    if not isinstance(value, str):
        raise ItemError(f"{where}: field {name!r} must be a string, got {shorten(value)}")
    return value


def _finite(where: str, name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ItemError(f"{where}: field {name!r} must be a number, got {shorten(value)}")
    if not math.isfinite(value):  # JSON's NaN / Infinity, or 1e999
        raise ItemError(f"{where}: field {name!r} must be a finite number, got {value}")
    return float(value)


def _image_path(where: str, name: str, value: Any, base: Path | None) -> str:
    path = Path(_str(where, name, value)).expanduser()
    if not path.is_absolute():
        path = (base or Path.cwd()) / path
    if not path.is_file():
        raise ItemError(f"{where}: field {name!r}={shorten(value)} is not a file ({cut(str(path))}; a relative "
                        f"path starts at {'the prompt file' if base else 'the working'} folder)")
    return str(path)


def parse_item(obj: Any, *, index: int, line: int, defaults: ItemDefaults, base: Path | None = None) -> GenItem:
    """Validate one decoded JSONL object into a :class:`GenItem` (types and ranges, not config values).

    ``base``: the folder relative image paths start at (the prompt file's; default the working folder).

    Raises:
        ItemError: not an object, an unknown field, a wrong type, neither/both of prompt and class_label, or an
            image field naming no file.
    """
    where = f"line {line}"
    if not isinstance(obj, dict):
        raise ItemError(f"{where}: expected a JSON object ({{\"prompt\": ...}}), got {type(obj).__name__}")
    obj = {_ALIASES.get(k, k): v for k, v in obj.items()}
    unknown = sorted(set(obj) - set(FIELDS))
    if unknown:
        raise ItemError(f"{where}: unknown field {shorten(unknown[0])}; item fields are: {', '.join(FIELDS)}")
    if ("prompt" in obj) == ("class_label" in obj):
        raise ItemError(f"{where}: give exactly one of the fields 'prompt' and 'class_label'")
    prompt = _str(where, "prompt", obj["prompt"]) if "prompt" in obj else None
    label = obj.get("class_label")
    if label is not None and (isinstance(label, bool) or not isinstance(label, (str, int))):
        raise ItemError(f"{where}: field 'class_label' must be a class name or an integer id, got {shorten(label)}")
    item_id = obj.get("id", index)
    if isinstance(item_id, bool) or not isinstance(item_id, (str, int)) or item_id == "":
        raise ItemError(f"{where}: field 'id' must be a non-empty string or an integer, got {shorten(item_id)}")
    method = _str(where, "method", obj["method"]) if "method" in obj else defaults.method
    config = obj.get("config", {})
    if not isinstance(config, dict):
        raise ItemError(f"{where}: field 'config' must be an object of method settings, got {shorten(config)}")
    guidance = obj.get("guidance_scale", defaults.guidance_scale)

    def opt_int(name: str, hi: int | None = None) -> int | None:
        value = obj.get(name, getattr(defaults, name))
        return None if value is None else _int(where, name, value, 1, hi)

    negative = obj.get("negative_prompt", defaults.negative_prompt)
    return GenItem(
        index=index, line=line, id=str(item_id), prompt=prompt, class_label=label,
        seed=_int(where, "seed", obj.get("seed", defaults.seed + index), lo=None),
        steps=_int(where, "steps", obj.get("steps", defaults.steps)), method=method,
        overrides={**defaults.overrides, **config},
        negative_prompt=None if negative is None else _str(where, "negative_prompt", negative),
        height=opt_int("height", MAX_SIDE), width=opt_int("width", MAX_SIDE), num_frames=opt_int("num_frames"),
        fps=opt_int("fps"), guidance_scale=None if guidance is None else _finite(where, "guidance_scale", guidance),
        **{name: _image_path(where, name, obj[name], base) for name in ("image", "control_image") if name in obj},
    )


def source_lines(path: str | Path, what: str = "prompt file") -> list[tuple[int, str]]:
    """The ``(line number, text)`` of a UTF-8 file's lines that are neither blank nor ``#`` comments, stripped.

    Raises:
        ItemError: a missing file or a folder, a line that is not UTF-8, or no line left (``what`` names the file).
    """
    path = Path(path)
    if path.is_dir():
        raise ItemError(f"{what} {str(path)!r} is a folder, not a file")
    if not path.is_file():
        raise ItemError(f"{what} {str(path)!r} does not exist")
    data = path.read_bytes()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line, column = data.count(b"\n", 0, exc.start) + 1, exc.start - data.rfind(b"\n", 0, exc.start)
        raise ItemError(f"{what} {str(path)!r} line {line}: not UTF-8 text (byte 0x{data[exc.start]:02x} at column "
                        f"{column}); save it as UTF-8") from None
    out = [(n, line.strip()) for n, line in enumerate(text.splitlines(), 1)]
    out = [(n, line) for n, line in out if line and not line.startswith("#")]
    if not out:
        raise ItemError(f"{what} {str(path)!r} holds no item (one per line, '#' starts a comment)")
    return out


def read_items(path: str | Path, defaults: ItemDefaults | None = None, *, copies: int = 1) -> list[GenItem]:
    """Read a JSONL (``*.jsonl``, ``*.ndjson``, ``*.json``) or plain-text prompt file into items.

    ``copies`` > 1 repeats each entry (ids get ``-0``, ``-1``... and seeds move on by one per copy).

    Raises:
        ItemError: a missing or empty file (or a folder), a line that is not UTF-8 or not valid JSON, a bad
            field, a repeated id.

    Example:
        >>> items = read_items("examples/items.jsonl")  # doctest: +SKIP
    """
    defaults = defaults or ItemDefaults()
    path = Path(path)
    entries: list[tuple[int, dict[str, Any]]] = []
    for number, text in source_lines(path):
        if path.suffix.lower() in JSONL_SUFFIXES:
            try:
                obj = json.loads(text)
            except json.JSONDecodeError as exc:
                raise ItemError(f"{path.name} line {number}: not valid JSON ({exc.msg} at column {exc.colno})"
                                ) from None
            except ValueError as exc:  # an integer of more than 4300 digits
                raise ItemError(f"{path.name} line {number}: not valid JSON ({cut(str(exc))})") from None
        else:
            obj = {"prompt": text}
        entries.append((number, obj))
    return expand(entries, defaults, copies=copies, base=path.parent)


def items_from_prompts(prompts: list[str], defaults: ItemDefaults | None = None, *, copies: int = 1) -> list[GenItem]:
    """Items from a list of prompts or class names (``--class-labels``)."""
    return expand([(0, {"prompt": p}) for p in prompts], defaults or ItemDefaults(), copies=copies)


def expand(entries: list[tuple[int, Any]], defaults: ItemDefaults, *, copies: int = 1,
           base: Path | None = None) -> list[GenItem]:
    """Parse ``(line, object)`` entries, ``copies`` outputs each; ids must be unique. ``base``: see :func:`parse_item`."""
    items: list[GenItem] = []
    seen: dict[str, int] = {}
    for line, obj in entries:
        first = parse_item(obj, index=len(items), line=line, defaults=defaults, base=base)
        has_seed = isinstance(obj, dict) and "seed" in obj
        for k in range(copies):
            item = first
            if copies > 1:
                seed = first.seed + k if has_seed else defaults.seed + len(items)
                item = replace(first, index=len(items), id=f"{first.id}-{k}", seed=seed)
            if item.id in seen:
                raise ItemError(f"{item.where}: id {shorten(item.id)} repeats the item of line {seen[item.id]}")
            seen[item.id] = line
            items.append(item)
    return items


# ---------------------------------------------------------------------------------------------- keys
def model_identity(folder: str | Path, name: str | None = None) -> dict[str, str]:
    """Name and fingerprint of a diffusers folder: a hash of its small JSON files (configs, index,
    tokenizer, calibration), so the same model copied elsewhere keys the same.

    Example:
        >>> model_identity("diffspec/weights/tiny-dit")["name"]  # doctest: +SKIP
        'tiny-dit'
    """
    folder = Path(folder)
    digest = hashlib.sha256()
    for path in sorted(list(folder.glob("*.json")) + list(folder.glob("*/*.json"))):
        if path.stat().st_size <= 64 * 2**20:
            digest.update(path.relative_to(folder).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return {"name": name or folder.name, "fingerprint": digest.hexdigest()[:16]}


def item_key(item: GenItem, model: dict[str, str], *, dtype: str, version: str, config: dict[str, Any] | None,
             fmt: str) -> str:
    """The item's key: a hash of the model, the item's fields, the resolved method config, dtype,
    output format and diffspec version (20 hex digits). Outputs live at ``out/<key[:2]>/<key>.<fmt>``.
    """
    payload = {"model": model, "item": item.fields(), "config": config, "dtype": dtype, "format": fmt,
               "diffspec": version}
    text = json.dumps(payload, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:20]
