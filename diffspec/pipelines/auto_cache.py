"""Where ``method="auto"`` keeps its measurements: one JSON file per model and call settings.

The folder is ``$DIFFSPEC_CACHE`` when set, else ``auto/`` in the user's cache folder (platformdirs: e.g.
``~/.cache/diffspec`` on Linux, ``~/Library/Caches/diffspec`` on macOS). A file is named by a hash of the
model's fingerprint (:func:`model_fingerprint`: pipeline and transformer classes, the transformer's config and a
few of its weights) and the settings that change the result (:func:`call_settings`: resolution, frames, steps,
guidance, scheduler class and config) and the measurement :data:`FORMAT`. Each measured candidate is written as
soon as it is measured, under a file lock, so an interrupted calibration resumes where it stopped and a second run
measures nothing; a measurement on fewer samples than a later calibration asks for is measured again.

Example:
    >>> cache = AutoCache.for_call(pipe, {"num_inference_steps": 20})  # doctest: +SKIP
    >>> cache.measured()  # {candidate key: measurement}  # doctest: +SKIP
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

import torch
from filelock import FileLock

CACHE_ENV = "DIFFSPEC_CACHE"
"""Environment variable overriding the cache folder."""

FORMAT = 3
"""The measurement format: part of every file name, so measurements of an older format are measured again."""

SETTINGS = ("height", "width", "num_frames", "num_inference_steps", "guidance_scale", "eta")
"""Call arguments a measurement depends on (besides the scheduler)."""


def cache_dir() -> Path:
    """The folder of ``method="auto"``'s measurements: ``$DIFFSPEC_CACHE``, else the user's cache folder.

    Example:
        >>> os.environ[CACHE_ENV] = "/tmp/diffspec-cache"
        >>> str(cache_dir())
        '/tmp/diffspec-cache'
        >>> del os.environ[CACHE_ENV]
    """
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV]).expanduser()
    import platformdirs

    return Path(platformdirs.user_cache_dir("diffspec")) / "auto"


def digest(value: Any) -> str:
    """A SHA-256 hex digest of ``value`` as sorted JSON (other objects by ``str``)."""
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()


def weights_digest(module: Any) -> str:
    """A hash of a module's first, middle and last weight tensors (their first 4096 values); of nothing if
    ``module`` is not a ``torch.nn.Module``.

    Example:
        >>> weights_digest(torch.nn.Linear(2, 2)) != weights_digest(torch.nn.Linear(2, 2))
        True
    """
    weights = hashlib.sha256()
    if isinstance(module, torch.nn.Module):
        tensors = list(module.state_dict().items())
        for name, tensor in [tensors[i] for i in sorted({0, len(tensors) // 2, len(tensors) - 1})] if tensors else []:
            weights.update(name.encode())
            weights.update(tensor.detach().flatten()[:4096].float().cpu().numpy().tobytes())
    return weights.hexdigest()


def model_fingerprint(pipe: Any) -> dict[str, Any]:
    """What identifies the model cheaply: pipeline and transformer classes, the transformer's config and
    :func:`weights_digest` of the transformer."""
    transformer = getattr(pipe, "transformer", None)
    config = getattr(transformer, "config", {})
    return {"pipeline": type(pipe).__name__, "transformer": type(transformer).__name__,
            "config": digest(dict(config)), "weights": weights_digest(transformer)}


def call_settings(pipe: Any, call: dict[str, Any]) -> dict[str, Any]:
    """The settings of a call (``call``: its arguments by name, defaults applied) a measurement depends on."""
    scheduler = pipe.scheduler
    return {**{k: call.get(k) for k in SETTINGS if k in call}, "scheduler": type(scheduler).__name__,
            "scheduler_config": digest(dict(scheduler.config))}


class AutoCache:
    """The measurements of one model at one set of call settings, in one JSON file.

    The file holds ``model``, ``settings``, ``measured`` (candidate key -> measurement) and ``notes`` (other
    values worth keeping, such as ``speca``'s probe range).
    """

    def __init__(self, path: Path, model: dict[str, Any], settings: dict[str, Any]) -> None:
        self.path = path
        self.model = model
        self.settings = settings

    @classmethod
    def for_call(cls, pipe: Any, call: dict[str, Any]) -> AutoCache:
        """The cache file of ``pipe`` at the settings of ``call`` (its arguments by name)."""
        return cls.for_settings(model_fingerprint(pipe), call_settings(pipe, call))

    @classmethod
    def for_settings(cls, model: dict[str, Any], settings: dict[str, Any]) -> AutoCache:
        """The cache file of a model fingerprint at ``settings`` (any JSON-able values that change the result)."""
        return cls(cache_dir() / f"{digest([model, settings, FORMAT])[:32]}.json", model, settings)

    def read(self) -> dict[str, Any]:
        """The file's content (an empty record when it does not exist or was cut short)."""
        try:
            data = json.loads(self.path.read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            data = {}
        return {"model": self.model, "settings": self.settings, "measured": {}, "notes": {}, **data}

    def measured(self) -> dict[str, dict[str, Any]]:
        """Candidate key -> measurement, as stored."""
        return self.read()["measured"]

    def note(self, name: str) -> Any:
        """A value stored with :meth:`put_note` (None if absent)."""
        return self.read()["notes"].get(name)

    def put(self, key: str, measurement: dict[str, Any]) -> None:
        """Store one measurement (read, update and replace the file under its lock)."""
        self._update("measured", key, measurement)

    def put_note(self, name: str, value: Any) -> None:
        """Store another value worth keeping across runs."""
        self._update("notes", name, value)

    def _update(self, section: str, key: str, value: Any) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with FileLock(str(self.path) + ".lock"):
            data = self.read()
            data[section][key] = value
            tmp = self.path.with_suffix(f".tmp{os.getpid()}")
            tmp.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
            tmp.replace(self.path)
