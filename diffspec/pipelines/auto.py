"""``method="auto"``: the fastest diffusion method that meets a quality target, tuned on the user's own calls.

The first call (or :meth:`AutoPipeline.calibrate`) measures the candidates of
:mod:`~diffspec.pipelines.auto_search` on the call's first prompts or class labels (``AutoConfig.samples`` of them,
seeds 5000 on) at the call's settings, keeps the fastest that meets ``quality`` and generates with it. The
measurements are cached on disk (:mod:`~diffspec.pipelines.auto_cache`), so a later call at the same settings, in
this process or another, measures nothing; an interrupted calibration resumes from what it measured. The choice is
``spec.config``, and ``spec.stats.extra["auto"]`` holds its measured PSNR and expected speedup.

Example:
    >>> spec = SpeculativePipeline.from_pipe(pipe, method="auto", quality="balanced")  # doctest: +SKIP
    >>> images = spec(class_labels=[0, 1, 2, 3], num_inference_steps=50).images  # doctest: +SKIP
    >>> spec.config, spec.stats.extra["auto"]["psnr"], spec.stats.extra["auto"]["speedup"]  # doctest: +SKIP
"""

from __future__ import annotations

import warnings
from typing import Any

from ..api import SpeculativePipeline, methods, resolve_config, target_family
from ..config import AutoConfig, MethodConfig
from ..stats import SpecStats
from .auto_cache import AutoCache, call_settings
from .auto_cost import clock_pick
from .auto_search import VERIFY_TOP, Tuner, best_reachable, ranked, worst_psnr
from .prepare import bind_call

NOT_TUNED = ("generator", "latents", "output_type", "return_dict", "callback", "callback_steps",
             "callback_on_step_end", "num_images_per_prompt", "prompt", "class_labels", "negative_prompt")
"""Call arguments the calibration samples set themselves (or leave to the pipeline)."""


def calibration_samples(call: dict[str, Any], passed: dict[str, Any], count: int) -> list[dict[str, Any]]:
    """``count`` call-argument dicts, one prompt (or class label) each, taken in turn from the call's.

    Raises:
        ValueError: the call has neither ``prompt`` nor ``class_labels``.

    Example:
        >>> call = {"class_labels": [3, 5], "num_inference_steps": 8}
        >>> [s["class_labels"] for s in calibration_samples(call, call, 3)]
        [[3], [5], [3]]
    """
    base = {k: v for k, v in passed.items() if k not in NOT_TUNED}
    base["num_inference_steps"] = call["num_inference_steps"]
    name = "class_labels" if call.get("class_labels") is not None else "prompt"
    given = call.get(name)
    if given is None:
        raise ValueError("method='auto' tunes on the call's own prompts: pass prompt= (or class_labels= to a "
                         "class-conditional pipeline), not only embeddings")
    values = list(given) if isinstance(given, (list, tuple)) else given.reshape(-1).tolist() \
        if hasattr(given, "reshape") else [given]
    negative = call.get("negative_prompt")
    samples = []
    for i in range(count):
        sample = {**base, name: [values[i % len(values)]]}
        if negative is not None:
            sample["negative_prompt"] = [negative[i % len(negative)] if isinstance(negative, list) else negative]
        samples.append(sample)
    return samples


def describe_choice(result: dict[str, Any]) -> str:
    """A measurement or choice in words (its method, main knobs, quality and speedup).

    Example:
        >>> describe_choice({"method": "taylor", "config": {"order": 1, "full_steps": 12}, "exact": False,
        ...                  "psnr": 36.2, "speedup": 4.17})
        'taylor (order=1, full_steps=12): 36.2 dB, 4.17x fewer sequential transformer calls'
        >>> describe_choice({"method": "none", "config": None, "exact": True, "speedup": 1.0})
        'none: the pipeline unchanged (no method that meets the target runs faster here)'
    """
    if result["method"] == "none":
        return "none: the pipeline unchanged (no method that meets the target runs faster here)"
    knobs = ", ".join(f"{k}={v}" for k, v in (result["config"] or {}).items()
                      if k in ("order", "full_steps", "warmup", "tau0", "beta", "lookahead", "window",
                               "num_draft_tokens"))
    worst, bound = result.get("psnr_min"), result.get("psnr_bound")
    quality = "exact" if result["exact"] else f"{result['psnr']} dB" + (
        f" (worst sample {worst} dB, 95% of new items above {bound} dB)" if bound is not None else "")
    if "predicted_s" in result:  # AR image and multimodal: predicted from the device's cost curves
        return (f"{result['method']} ({knobs}): {quality}, {result['speedup']}x predicted and "
                f"{result['measured_speedup']}x measured wall-clock against the plain loop")
    clock = f", {result['measured_speedup']}x measured wall-clock" if result.get("measured_speedup") else ""
    return f"{result['method']} ({knobs}): {quality}, {result['speedup']}x fewer sequential transformer calls{clock}"


def tune(pipe: Any, config: AutoConfig, call: dict[str, Any], passed: dict[str, Any],
         show_progress: bool = True) -> dict[str, Any]:
    """Measure the candidates for one call (``call``: its arguments with defaults, ``passed``: those given) and
    return the choice: ``method`` (``"none"``: the pipeline unchanged), ``config``, ``quality``, ``floor``,
    ``psnr`` (None: exact), ``speedup``, ``exact``, ``cache`` (the file) and ``measured`` (candidates known).

    Raises:
        ValueError: no method supports the pipeline; or no candidate meets the floor (the message gives the best
            reachable quality and its speedup).
    """
    count = config.sample_count("diffusion")
    cache = AutoCache.for_call(pipe, call)
    tuner = Tuner(pipe, calibration_samples(call, passed, count), cache, config.floor, show_progress)
    results = tuner.search()
    name, floor = type(pipe).__name__, config.floor
    if not results and floor is not None:
        reasons = "; ".join(f"{m}: {why}" for m, why in tuner.refused.items())
        raise ValueError(f"method='auto' found no method for {name} ({reasons}). It supports the diffusion family: "
                         "diffusers pipelines with a transformer (DiT, PixArt, SD3, Flux, Wan...) for "
                         f"{', '.join(m.name for m in methods('diffusion', available_only=True))}; AR image and "
                         "multimodal targets take a named method")
    passing = ranked(results, floor)
    best = _verified(tuner, passing[:VERIFY_TOP]) if passing else None
    if best is None and floor is not None and not passing:
        top = best_reachable(results)
        raise ValueError(f"quality={config.quality!r} ({floor} dB) is out of reach on {name} at these settings: the "
                         f"best reachable is {describe_choice(top)}; pass quality <= {worst_psnr(top)}, or 'exact' with a "
                         "stochastic scheduler (DDPMScheduler) for the exact methods")  # type: ignore[index]
    if best is None:
        why = "; ".join(f"{m}: {w}" for m, w in tuner.refused.items()) or "the exact methods make no fewer calls"
        why = f"{len(passing)} made fewer calls, none ran faster on this device" if passing else why
        warnings.warn(f"quality={config.quality!r} on {name} with {type(pipe.scheduler).__name__}: no method that "
                      f"meets it speeds it up ({why}); running the pipeline unchanged", stacklevel=3)
        best = {"method": "none", "config": None, "exact": True, "psnr": None, "speedup": 1.0}
    return {"method": best["method"], "config": best["config"], "quality": config.quality, "floor": floor,
            "psnr": best["psnr"], "psnr_min": best.get("psnr_min"),
            "psnr_bound": best.get("psnr_bound"), "speedup": best["speedup"], "exact": best["exact"],
            "measured_speedup": best.get("measured_speedup"), "verified": best.get("verified", []),
            "cache": str(cache.path),
            "measured": len(cache.measured())}


def _verified(tuner: Tuner, top: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The one of ``top`` (passing candidates, fewest calls first) the clock picks (:func:`~diffspec.pipelines.
    auto_cost.clock_pick`), None if it does not beat the plain pipeline there; with ``measured_speedup`` and
    ``verified`` (every timed candidate)."""
    measured = [tuner.verify(r) for r in top]
    verified = [{"config": r["config"], "speedup": r["speedup"], "measured_speedup": m} for r, m in zip(top, measured)]
    i = clock_pick(measured)
    return {**top[i], "measured_speedup": measured[i], "verified": verified} if measured[i] > 1.0 else None


class AutoPipeline(SpeculativePipeline):
    """A pipeline that picks its method on its first call at each setting (see the module docs).

    ``spec.config`` is the chosen method's config once chosen (``AutoConfig`` before), ``spec.choice`` the whole
    choice (:func:`tune`) and ``spec.stats.extra["auto"]`` its measured quality and expected speedup. AR image and
    multimodal targets get their own subclasses (:mod:`~diffspec.pipelines.auto_ar`,
    :mod:`~diffspec.pipelines.auto_mm`), which override :meth:`settings`, :meth:`tune_call` and :meth:`build`.
    """

    family = "diffusion"
    reported: tuple[str, ...] = ("quality", "psnr", "psnr_min", "psnr_bound", "speedup", "measured_speedup",
                                 "exact", "cache")
    """Keys of the choice copied into ``spec.stats.extra["auto"]``."""

    def __init__(self, pipe: Any, config: AutoConfig) -> None:
        super().__init__(pipe, config)
        self.auto_config = config
        self.choice: dict[str, Any] | None = None
        self.inner: SpeculativePipeline | None = None
        """The chosen method's wrapper (None: not chosen yet, or the pipeline runs unchanged)."""
        self._settings: dict[str, Any] | None = None
        self.enable()

    @classmethod
    def wrap(cls, target: Any, config: MethodConfig, draft: Any = None) -> AutoPipeline:
        """The auto pipeline of ``target``'s family (``draft``: a multimodal drafter model, to consider ``draft``)."""
        if not isinstance(config, AutoConfig):
            raise ValueError(f"{type(config).__name__} is not an AutoConfig")
        family = target_family(target)
        if draft is not None and family != "multimodal":
            raise ValueError("method='auto' takes draft= (a drafter model) for multimodal targets only")
        if family == "ar_image":
            from .auto_ar import ARAutoPipeline

            return ARAutoPipeline(target, config)
        if family == "multimodal":
            from .auto_mm import MultimodalAutoPipeline

            return MultimodalAutoPipeline(target, config, draft)
        return cls(target, config)

    def settings(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
        """The settings of a call that the choice depends on (a new value tunes again)."""
        return call_settings(self.pipe, bind_call(self.pipe, args, kwargs))

    def tune_call(self, args: tuple[Any, ...], kwargs: dict[str, Any], show_progress: bool) -> dict[str, Any]:
        """Measure (or read from the cache) and return the choice for a call."""
        return tune(self.pipe, self.auto_config, bind_call(self.pipe, args, kwargs),
                    bind_call(self.pipe, args, kwargs, defaults=False), show_progress=show_progress)

    def build(self, config: MethodConfig) -> SpeculativePipeline:
        """The chosen method's wrapper."""
        return SpeculativePipeline.from_pipe(self.pipe, method=config)

    def run_unchanged(self, *args: Any, **kwargs: Any) -> Any:
        """A call when no method speeds the target up."""
        return self.pipe(*args, **kwargs)

    def show_progress(self) -> bool:
        """Whether calibration shows a progress bar (the pipeline's own bar setting)."""
        return not getattr(self.pipe, "_progress_bar_config", {}).get("disable", False)

    def calibrate(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        """Choose the method for a call's settings and prompts without generating (what a first call does);
        returns the choice (:func:`tune`).

        Example:
            >>> spec.calibrate(prompt=my_prompts, num_inference_steps=28, height=1024, width=1024)  # doctest: +SKIP
        """
        settings = self.settings(args, kwargs)
        if self.choice is not None and settings == self._settings:
            return self.choice
        if self.inner is not None:
            self.inner.disable()
            self.inner = None
        self.choice = self.tune_call(args, kwargs, self.show_progress())
        self._settings = settings
        self.config = self.auto_config
        if self.choice["method"] != "none":
            overrides = {k: v for k, v in self.choice["config"].items() if k != "method"}
            self.inner = self.build(resolve_config(self.choice["method"], overrides)[1])
            self.config = self.inner.config
        return self.choice

    def _run(self, *args: Any, **kwargs: Any) -> Any:
        choice = self.calibrate(*args, **kwargs)
        if self.inner is None:
            self.stats = SpecStats(method="none")
            out = self.run_unchanged(*args, **kwargs)
        else:
            out = self.inner(*args, **kwargs)
            self.stats = self.inner.stats
        self.stats.extra["auto"] = {k: choice[k] for k in self.reported if k in choice}
        return out

    def enable(self) -> None:
        if self.inner is not None:
            self.inner.enable()
        super().enable()

    def disable(self) -> None:
        if self.inner is not None:
            self.inner.disable()
        super().disable()
