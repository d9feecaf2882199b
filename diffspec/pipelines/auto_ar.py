"""``method="auto"`` on AR image targets: the Jacobi method and window that run fastest on the user's device.

Candidates (:func:`ar_candidates`), each run on the call's class labels or prompts in turn (``AutoConfig.samples``
images, by default 64, one at a time, seeds 5000 on) at the call's guidance and sampling settings:

- exact, for every preset: ``mc-sjd`` at windows 4, 8, 16, 32 and 64; its tree variants ``sjd-pac`` (2 siblings,
  2 levels) and ``mc-sjd-ra`` (2 siblings on the first 4 drafts, 1 chain copy each) at windows 8 and 16: small trees,
  since every node is a token each call feeds;
- relaxed, for ``"balanced"`` and ``"fast"`` (or a PSNR floor below 40 dB): ``gsd`` at windows 8, 16 and 32 with
  ``max_tv`` capped (:data:`GSD_TV_CAPS`: 0.05 and 0.1), so every token's law stays within that total variation of
  the target's by construction. A PSNR floor has no meaning for AR sampling (a relaxed sampler and the plain loop
  use the random stream differently), so the cap takes its place; ``"high"`` and ``"exact"`` keep exact methods.

The window is chosen on the device's own cost (:mod:`~diffspec.pipelines.auto_wall`): on a CPU a call that feeds 65
tokens costs several plain calls, so a short window wins; on a GPU the same call costs about one.

Example:
    >>> spec = SpeculativePipeline.from_pretrained("tiny-ar", method="auto", quality="exact")  # doctest: +SKIP
    >>> out = spec(class_labels=[1, 7], generator=torch.Generator().manual_seed(0))  # doctest: +SKIP
    >>> spec.config, spec.stats.extra["auto"]["speedup"], spec.stats.extra["auto"]["measured_speedup"]  # doctest: +SKIP
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch

from ..ar_image.config import GSDConfig, MCSJDConfig, MCSJDRAConfig, SJDPACConfig, tokens_fed_per_call
from ..config import AutoConfig, MethodConfig
from .auto import AutoPipeline
from .auto_cache import AutoCache, digest, weights_digest
from .auto_cost import CostCurve, ar_call_cost
from .auto_search import CALIBRATION_SEED
from .auto_wall import WallTuner

MCSJD_WINDOWS = (4, 8, 16, 32, 64)
TREE_WINDOWS = (8, 16)
GSD_WINDOWS = (8, 16, 32)
GSD_TV_CAPS = {"balanced": 0.05, "fast": 0.1}
"""``max_tv`` of the ``gsd`` candidates per preset (``"high"``, ``"exact"``: no relaxed candidate)."""
SAMPLING = ("temperature", "top_k", "top_p")
REPORTED = ("quality", "speedup", "measured_speedup", "predicted_s", "plain_s", "exact", "calibration_s", "cache")


def relaxed_cap(config: AutoConfig) -> float | None:
    """The ``max_tv`` of ``gsd`` candidates for ``config.quality`` (None: exact methods only): the presets' caps,
    a PSNR floor at or above 40 dB none, at or above 32 dB ``"balanced"``'s, below it ``"fast"``'s.

    Example:
        >>> relaxed_cap(AutoConfig(quality="fast")), relaxed_cap(AutoConfig(quality=35)), relaxed_cap(AutoConfig(quality="high"))
        (0.1, 0.05, None)
    """
    floor = config.floor
    if floor is None or floor >= 40.0:
        return None
    return GSD_TV_CAPS["balanced"] if floor >= 32.0 else GSD_TV_CAPS["fast"]


def ar_candidates(num_tokens: int, cap: float | None) -> list[MethodConfig]:
    """The candidates on ``num_tokens``-token images (windows clipped to the image, duplicates dropped).

    Example:
        >>> [c.window for c in ar_candidates(16, None) if c.method == "mc-sjd"]
        [4, 8, 15]
    """
    def window(w: int) -> int:
        return max(1, min(w, num_tokens - 1))

    configs: list[MethodConfig] = [MCSJDConfig(window=window(w)) for w in MCSJD_WINDOWS]
    configs += [SJDPACConfig(window=window(w), width=2, depth=2) for w in TREE_WINDOWS]
    configs += [MCSJDRAConfig(window=window(w), width=2, depth=4, follow=1) for w in TREE_WINDOWS]
    if cap is not None:
        configs += [GSDConfig(window=window(w), max_tv=cap) for w in GSD_WINDOWS]
    return list(dict.fromkeys(configs))


def ar_fingerprint(target: Any) -> dict[str, Any]:
    """What identifies an AR image target cheaply: its class, its model's config and :func:`weights_digest`."""
    model = getattr(target, "model", None)
    config = getattr(model, "config", None)
    config = config.to_dict() if hasattr(config, "to_dict") else dict(config or {})
    return {"target": type(target).__name__, "config": digest(config), "weights": weights_digest(model),
            "grid": list(getattr(target, "grid", ()))}


class ARTuner(WallTuner):
    """:class:`~diffspec.pipelines.auto_wall.WallTuner` over an AR image target's calibration images.

    Args:
        target: the :class:`~diffspec.ar_image.target.ARImageTarget`.
        items: one condition per image (``{"class_labels": [3]}`` or ``{"prompt": ["a cat"]}``).
        cache: the measurements' file.
        guidance_scale, sampling: the call's (None: the target's default guidance).
    """

    def __init__(self, target: Any, items: list[dict[str, Any]], cache: AutoCache, guidance_scale: float | None,
                 sampling: dict[str, Any], show_progress: bool = True) -> None:
        super().__init__(cache, show_progress)
        self.target, self.items, self.guidance_scale, self.sampling = target, items, guidance_scale, sampling

    def verify_rounds(self) -> tuple[int, int]:
        """From 32 images on, one timed run each and no warm-up: the candidates and the plain loop have just run
        over the same images, and one run over many images averages out what repeats over a few would."""
        return (1, 0) if len(self.items) >= 32 else super().verify_rounds()

    def measure_cost(self, configs: list[MethodConfig]) -> dict[str, CostCurve]:
        n = self.target.num_tokens
        feeds = sorted({tokens_fed_per_call(c, n) for c in configs})  # type: ignore[arg-type]
        sizes = sorted({1, feeds[0], feeds[len(feeds) // 2], feeds[-1], min(17, n)})
        return {"target": ar_call_cost(self.target, sizes, self.items[0], self.guidance_scale)}

    def _generate(self, spec: Any, plain: bool = False) -> list[int]:
        calls = []
        for i, condition in enumerate(self.items):
            run = spec.plain if plain else spec
            run(**condition, guidance_scale=self.guidance_scale, output_type="tokens", **self.sampling,
                generator=torch.Generator(self.target.device).manual_seed(CALIBRATION_SEED + i))
            calls.append(spec.stats.target_calls)
        return calls

    def _spec(self, config: MethodConfig | None) -> Any:
        from ..api import SpeculativePipeline

        spec = SpeculativePipeline.from_pipe(self.target, method=config or MCSJDConfig())
        spec.set_progress_bar_config(disable=True)
        return spec

    def run(self, config: MethodConfig | None) -> dict[str, Any]:
        spec = self._spec(config)
        start = time.perf_counter()
        calls = self._generate(spec, plain=config is None)
        wall = (time.perf_counter() - start) / len(calls)
        fed = 1 if config is None else tokens_fed_per_call(config, self.target.num_tokens)  # type: ignore[arg-type]
        return {"calls_per_item": round(sum(calls) / len(calls), 3), "tokens_fed": fed, "wall_s": round(wall, 6),
                "relaxed_tv": spec.stats.extra.get("relaxed_tv"), "samples": len(calls)}

    def explained(self, counts: dict[str, Any], cost: dict[str, CostCurve]) -> float:
        return counts["calls_per_item"] * cost["target"](counts["tokens_fed"])

    def runners(self, config: MethodConfig) -> tuple[Callable[[], Any], Callable[[], Any]]:
        spec = self._spec(config)
        return (lambda: self._generate(spec, plain=True)), (lambda: self._generate(spec))


class ARAutoPipeline(AutoPipeline):
    """``method="auto"`` on an AR image target (see the module docs); called like the target.

    ``spec.stats.extra["auto"]``: ``speedup`` (predicted from the measured cost and acceptance),
    ``measured_speedup`` (one timed run of the choice against the plain loop on the calibration images),
    ``predicted_s`` / ``plain_s`` (seconds per image), ``calibration_s`` and ``cache``.
    """

    family = "ar_image"
    reported = REPORTED

    def __init__(self, pipe: Any, config: AutoConfig) -> None:
        super().__init__(pipe, config)
        self._progress_bar_config: dict[str, Any] = {}

    def set_progress_bar_config(self, **kwargs: Any) -> None:
        """tqdm options of the calls' bars and of the calibration's (``disable=True`` silences both)."""
        self._progress_bar_config = dict(kwargs)
        if self.inner is not None:
            self.inner.set_progress_bar_config(**kwargs)

    def show_progress(self) -> bool:
        return not self._progress_bar_config.get("disable", False)

    @staticmethod
    def _call(class_labels: Any = None, prompt: Any = None, guidance_scale: float | None = None,
              **kwargs: Any) -> dict[str, Any]:
        return {"class_labels": class_labels, "prompt": prompt, "guidance_scale": guidance_scale, **kwargs}

    def settings(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
        call = self._call(*args, **kwargs)
        device = self.pipe.device
        return {"family": "ar_image", "guidance_scale": call["guidance_scale"], "num_tokens": self.pipe.num_tokens,
                **{k: call.get(k) for k in SAMPLING}, "device": device.type,
                "threads": torch.get_num_threads() if device.type == "cpu" else None}

    def tune_call(self, args: tuple[Any, ...], kwargs: dict[str, Any], show_progress: bool) -> dict[str, Any]:
        call = self._call(*args, **kwargs)
        name = "class_labels" if call["class_labels"] is not None else "prompt"
        given = call[name]
        if given is None:
            raise ValueError("method='auto' tunes on the call's own conditions: pass class_labels= or prompt=")
        values = given.reshape(-1).tolist() if hasattr(given, "reshape") else \
            list(given) if isinstance(given, (list, tuple)) else [given]
        items = [{name: [values[i % len(values)]]} for i in range(self.auto_config.sample_count("ar_image"))]
        cache = AutoCache.for_settings(ar_fingerprint(self.pipe), self.settings(args, kwargs))
        sampling = {k: call[k] for k in SAMPLING if call.get(k) is not None}
        tuner = ARTuner(self.pipe, items, cache, call["guidance_scale"], sampling, show_progress)
        choice = tuner.choose(ar_candidates(self.pipe.num_tokens, relaxed_cap(self.auto_config)))
        return {**choice, "quality": self.auto_config.quality, "floor": self.auto_config.floor}

    def build(self, config: MethodConfig) -> Any:
        inner = super().build(config)
        inner.set_progress_bar_config(**self._progress_bar_config)
        return inner
