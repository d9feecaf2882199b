"""``diffspec calibrate``: :func:`~diffspec.forecast.calibrate.calibrate_speca` on a model's ``dit-cache`` workload.

The model is a shipped name or a local diffusers pipeline folder (the record is saved next to it, where
``speca`` finds it), or a random-weight architecture of :mod:`diffspec.testing.random_transformers` (``out``
required). The calibration seeds (5000 onwards) are never used by the benchmarks.

Example:
    >>> record, path = calibrate_model("tiny-dit", target_psnr=30, schedules=[12])  # doctest: +SKIP
    >>> record["reached"], path.name  # doctest: +SKIP
    (True, 'diffspec_speca.json')
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from ..config import AutoConfig, SpecaConfig, check_choice, check_float, check_int
from ..forecast.blocks import find_block_lists
from ..forecast.calibrate import Generate, calibrate_speca, save_calibration
from ..forecast.modules import check_module_support
from ..forecast.schedule_search import GRANULARITIES, search_schedules
from ..metrics import psnr
from ..models import resolve_model_path
from ..stats import SpecStats
from ..testing.random_transformers import SPECS
from .dit_cache import default_steps
from .dit_cache_workloads import make_workload
from .workload import Workload


def calibrate_model(model: str = "tiny-dit", *, target_psnr: float = 30.0, steps: int | None = None, samples: int = 8,
                    device: str | None = None, dtype: str | None = None, guidance_scale: float = 4.0,
                    out: str | Path | None = None, overrides: dict[str, Any] | None = None,
                    schedules: Sequence[int] = (), schedule_granularities: Sequence[str] = ("block",),
                    prompts: Sequence[str] | None = None, call_kwargs: dict[str, Any] | None = None,
                    show_progress: bool = True) -> tuple[dict[str, Any], Path]:
    """Calibrate ``speca`` on a model and save the record (what ``diffspec calibrate`` runs).

    Args:
        model: a shipped name or local diffusers pipeline folder with a transformer (saved next to it by default):
            class-conditional (``DiTPipeline``) or text-conditioned (FLUX, SD3, PixArt, Wan...); or a
            ``diffspec.testing.random_transformers`` architecture name (random weights; ``out`` required).
        target_psnr: see :func:`~diffspec.forecast.calibrate.calibrate_speca`.
        steps: inference steps (default: the model's usual, 50 or 28).
        samples: calibration samples (seeds 5000 onwards, never used by the benchmarks).
        out: folder to write :data:`~diffspec.forecast.calibrate.CALIBRATION_FILE` into (made if missing).
        overrides: other ``speca`` settings (``k_max``, ``order``...).
        schedules: also search a fixed placement of this many full steps, per size and per
            ``schedule_granularities`` entry (:func:`~diffspec.forecast.schedule_search.search_schedules`);
            saved under ``"schedules"``, read back by :func:`~diffspec.forecast.calibrate.calibrated_replay`.
        prompts: a text-conditioned pipeline's calibration prompts, one per sample in turn (default: eight varied
            ones, :data:`~diffspec.bench.dit_cache_workloads.DEFAULT_PROMPTS`).
        call_kwargs: more pipeline arguments for a text-conditioned pipeline (``height``, ``width``,
            ``num_frames``): calibrate at the size you generate at.

    Example:
        >>> record, path = calibrate_model("tiny-dit", target_psnr=30, schedules=[12])  # doctest: +SKIP
        >>> spec = SpeculativePipeline.from_pipe(pipe, method=calibrated_replay(record, 12))  # doctest: +SKIP
    """
    check_float("target_psnr", target_psnr, 0.0, 100.0, lo_open=True)
    if model in SPECS and out is None:
        raise ValueError(f"--model {model} is a random-weight architecture with no folder; pass --out FOLDER")
    folder = Path(out) if out is not None else resolve_model_path(model)
    if out is not None and not folder.exists():
        folder.mkdir(parents=True)  # before the search, so a path that cannot be made fails now
    if not folder.is_dir():
        raise ValueError(f"calibration output folder {folder} is not a folder")
    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    dtype_name = dtype or ("bfloat16" if dev.type == "cuda" and model in SPECS else "float32")
    steps = steps or default_steps(model)
    for n_full in schedules:  # checked before the threshold search, not after it
        check_int("schedules", n_full, 3, steps)
    for granularity in schedule_granularities:
        check_choice("schedule_granularities", granularity, GRANULARITIES)
    workload = make_workload(model, device=dev, dtype=getattr(torch, dtype_name), steps=steps, batch=samples,
                             guidance_scale=guidance_scale, prompts=list(prompts) if prompts else None,
                             call_kwargs=call_kwargs)
    if schedules and "module" in schedule_granularities:  # checked now, not after the threshold search
        try:
            check_module_support([b for _, blocks in find_block_lists(workload.transformer) for b in blocks])
        except ValueError as e:
            raise ValueError(f"schedule_granularities='module': {e}") from None
    seeds = list(range(5000, 5000 + samples))
    data_range = 1.0 if workload.mode == "pipeline" else None
    generate = speca_generator(workload, seeds)

    with torch.inference_mode():
        record = calibrate_speca(generate, target_psnr=target_psnr, base=SpecaConfig().replace(**(overrides or {})),
                                 data_range=data_range, show_progress=show_progress)
        if schedules:
            def score_for(granularity: str) -> Callable[[tuple[int, ...]], float]:
                def score(schedule: tuple[int, ...]) -> float:
                    images, _ = generate(SpecaConfig(replay_steps=schedule, granularity=granularity, order=2))
                    return psnr(images, generate(None)[0], data_range)
                return score

            record["schedules"] = search_schedules(score_for, schedules, steps, schedule_granularities,
                                                   record.get("full_rate"), show_progress=show_progress)
    record.update(model=str(model), steps=steps, samples=samples, seeds=[seeds[0], seeds[-1]], dtype=dtype_name,
                  guidance_scale=guidance_scale if workload.mode == "pipeline" else None)
    if workload.mode == "pipeline" and not workload.class_conditional:  # type: ignore[attr-defined]
        record.update(prompts=workload.prompts, call_kwargs=workload.call_kwargs)  # type: ignore[attr-defined]
    return record, save_calibration(record, folder)


def speca_generator(workload: Workload, seeds: list[int]) -> Generate:
    """The ``generate(config)`` that :func:`~diffspec.forecast.calibrate.calibrate_speca` searches with: the
    workload's ``speca`` arm at ``config`` on ``seeds``, or (``config=None``) its full-compute output, computed once.

    Example:
        >>> generate = speca_generator(workload, [5000, 5001])  # doctest: +SKIP
        >>> images, stats = generate(SpecaConfig(tau0=0.1, beta=1.0, tau_min=0.0))  # doctest: +SKIP
    """
    reference: list[torch.Tensor] = []

    def generate(config: SpecaConfig | None) -> tuple[torch.Tensor, SpecStats | None]:
        if config is None:
            if not reference:
                reference.append(workload.generate(seeds))
            return reference[0], None
        arm = workload.method_arm("speca", config)
        arm.enable()
        try:
            images = arm.run(seeds)
        finally:
            arm.disable()
        spec = getattr(arm, "spec", None)
        return images, spec.stats if spec is not None else arm.stats_obj  # type: ignore[attr-defined]

    return generate


def calibrate_auto(model: str = "tiny-dit", *, quality: str | float = "balanced", steps: int = 50,
                   samples: int | None = None,
                   guidance_scale: float | None = None, prompts: Sequence[str] | None = None,
                   call_kwargs: dict[str, Any] | None = None, scheduler: type | None = None, device: str | None = None,
                   dtype: str = "float32") -> dict[str, Any]:
    """``method="auto"``'s choice for a model at these settings, measured now or read from its cache (what
    ``diffspec calibrate --method auto`` runs; a later ``method="auto"`` call at the same settings reuses it).

    Args:
        model: a shipped name or local diffusers pipeline folder, or an AR image model (``tiny-ar``: calibrated on
            its classes in turn; ``steps``, ``prompts``, ``call_kwargs`` and ``scheduler`` do not apply).
        samples: calibration samples (default: ``AutoConfig``'s for the model's family, :data:`~diffspec.config.
            AUTO_SAMPLES`), each with the next prompt or class in turn.
        prompts: a text-conditioned pipeline's calibration prompts (default: eight varied ones, or the judged
            prompts of a shipped text-to-image model); a class-conditional pipeline is calibrated on its classes.
        call_kwargs: more call arguments (``height``, ``width``, ``num_frames``): calibrate at the size you generate.
        scheduler: a diffusers scheduler class to swap in (e.g. ``DDPMScheduler``, which the exact methods need).

    Example:
        >>> choice = calibrate_auto("tiny-dit", quality="fast", steps=20)  # doctest: +SKIP
        >>> choice["method"], choice["psnr"], choice["speedup"]  # doctest: +SKIP
    """
    from ..api import SpeculativePipeline
    from ..models import load_pipeline, model_family, resolve_model_path
    from ..models.dit import call_defaults, model_settings
    from .dit_cache_workloads import DEFAULT_PROMPTS, judged_prompts

    if model_family(resolve_model_path(model)) == "ar_image":
        return _calibrate_auto_ar(model, quality, samples, guidance_scale, device)
    pipe = load_pipeline(model, dtype=getattr(torch, dtype),
                         device=device or ("cuda" if torch.cuda.is_available() else "cpu"))
    pipe.set_progress_bar_config(disable=True)
    if scheduler is not None:
        pipe.scheduler = scheduler.from_config(pipe.scheduler.config)
    call: dict[str, Any] = {"num_inference_steps": steps, **call_defaults(pipe), **(call_kwargs or {})}
    if guidance_scale is not None:
        call["guidance_scale"] = guidance_scale
    count = AutoConfig(samples=samples).sample_count("diffusion")
    if "class_labels" in inspect.signature(pipe.__call__).parameters:
        classes = len(getattr(pipe, "labels", None) or {}) or 1000
        call["class_labels"] = [i % classes for i in range(count)]
    else:
        judged = model_settings(pipe).get("judge")
        call["prompt"] = list(prompts or (judged_prompts(count) if judged else DEFAULT_PROMPTS))
    spec = SpeculativePipeline.from_pipe(pipe, method="auto", quality=quality, samples=samples)
    try:
        return spec.calibrate(**call)
    finally:
        spec.disable()


def _calibrate_auto_ar(model: str, quality: str | float, samples: int | None, guidance_scale: float | None,
                       device: str | None) -> dict[str, Any]:
    """``calibrate_auto`` on an AR image model: its classes in turn, the target's default guidance."""
    from ..api import SpeculativePipeline
    from ..models import load_ar_target

    target = load_ar_target(model, device=device or ("cuda" if torch.cuda.is_available() else "cpu"))
    spec = SpeculativePipeline.from_pipe(target, method="auto", quality=quality, samples=samples)
    classes = int(target.model.config.num_classes)
    count = AutoConfig(samples=samples).sample_count("ar_image")
    return spec.calibrate(class_labels=[i % classes for i in range(count)], guidance_scale=guidance_scale)
