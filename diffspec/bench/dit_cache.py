"""The ``dit-cache`` suite: feature forecasting vs diffusers' caches on DiT-family transformers.

Two workloads (:mod:`.dit_cache_workloads`):

* **pipeline** (``--model tiny-dit`` or a local ``DiTPipeline`` folder): the full diffusers
  pipeline (DDIM, classifier-free guidance, VAE decode) on trained weights, so quality is real:
  PSNR/SSIM vs the same-seed baseline images, reference FID and class accuracy.
* **loop** (``--model dit-xl-2-256 | pixart-1024 | sd3-1024 | flux-1024 | wan-1.3b-512-17f``, or the ``tiny-*``
  configs): a random-weight transformer of that architecture in a plain Euler loop, for speed at
  real size (GPU); quality is the PSNR of the final latents vs the baseline's.

Arms: ``baseline``, our methods (``taylor``, ``speca``), and peers marked ``"peer": true``: diffusers'
``TaylorSeerCacheConfig()`` (defaults, and ``-tuned`` at ``taylor``'s interval, order and warmup),
``FirstBlockCacheConfig()``, ``MagCacheConfig`` (calibrated in process, as its docs prescribe),
cache-dit's DBCache with and without its TaylorSeer calibrator (when cache-dit is installed; see
:mod:`diffspec.bench.cache_dit_peer`), and a plain run with fewer steps (as many as ``taylor`` runs
in full). A peer that cannot run on the model (cache-dit missing, or a transformer it is not wired
up for) is left out and listed under ``"skipped"`` in the JSON.

``compile`` (``--compile``, see :mod:`.compiled`) compiles the transformer once, before any arm is
built, so every arm (baseline, ours, peers) runs on it; compilation happens in the untimed
warmup, graphs compiled after it are counted per run, counting and quality passes run eagerly.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from ..config import ForecastConfig, MethodConfig, SpecaConfig
from ..forecast.gate import Schedule
from ..testing.random_transformers import SPECS
from .cache_dit_peer import CACHE_DIT_PEERS, CacheDitCache
from .compiled import check_compile_mode, compile_transformer, eager
from .dit_cache_workloads import PipelineWorkload, loop_base, make_workload
from .peers import (
    PEER_CACHES,
    DiffusersCache,
    calibrate_magcache,
    config_dict,
    peer_cache_config,
    taylorseer_full_steps,
)
from .runner import run_arms
from .timing import Arm, machine_info
from .workload import Workload

OUR_METHODS = ("taylor", "speca")
METHOD_CONFIGS: dict[str, type[MethodConfig]] = {"taylor": ForecastConfig, "speca": SpecaConfig}
PEERS = (*PEER_CACHES, *CACHE_DIT_PEERS, "fewer-steps")
DEFAULT_METHODS = (*OUR_METHODS, *PEERS)
CONTROLNET_REFERENCE = "taylor-controlnet-every-step"
"""On a ControlNet workload: ``taylor`` with the ControlNet run in full at every step (not forecast), the reference
for what forecasting the ControlNet's outputs saves; a default arm there, refused elsewhere."""
TINY_LOOP_MODELS = tuple(name for name in SPECS if name.startswith("tiny-"))


def full_steps_of(config: ForecastConfig, steps: int) -> int:
    """How many steps ``taylor`` runs in full at ``steps`` (the fewer-steps peer gets as many)."""
    return sum(Schedule.of(config).for_steps(steps).without_rejections(steps))


def cache_arm(workload: Workload, name: str, magcache_ratios: list[float] | None,
              forecast: ForecastConfig | None = None) -> Arm:
    """An arm for one of diffusers' cache hooks (``forecast``: ``taylor``'s config, for the tuned TaylorSeer)."""
    config = peer_cache_config(name, workload.steps, magcache_ratios, workload.transformer, forecast)
    arm = diffusers_arm(workload, name, config)
    if name == "diffusers-taylorseer-tuned":
        f = forecast or ForecastConfig()
        arm.config["matches"] = (f"taylor interval/order/warmup at {f.to_dict()}: "
                                 f"{taylorseer_full_steps(config, workload.steps)} full steps vs taylor's "
                                 f"{full_steps_of(f, workload.steps)}")
    return arm


def diffusers_arm(workload: Workload, name: str, config: Any) -> Arm:
    """An arm running one diffusers cache ``config`` (a ``*CacheConfig``) on the workload."""
    cache = DiffusersCache(workload.transformer, config)

    def run(seeds: list[int]) -> torch.Tensor:
        cache.start_generation()
        try:
            return workload.generate(seeds)
        finally:
            cache.end_generation()

    return Arm(name, run, enable=cache.attach, disable=cache.detach, peer=True, config=config_dict(config))


def cache_dit_arm(workload: Workload, name: str, overrides: dict[str, Any] | None = None) -> Arm:
    """An arm for cache-dit's DBCache (``name`` in :data:`CACHE_DIT_PEERS`), attached once to check it fits.

    Raises:
        ImportError: cache-dit is not installed.
        ValueError: cache-dit cannot cache this model (the message names it and what is supported).
    """
    pipe = getattr(workload, "pipe", None)
    cache = CacheDitCache(workload.transformer, name, workload.steps, pipe=pipe, model=workload.name,
                          overrides=overrides)
    try:
        cache.attach()
    except (AssertionError, TypeError, ValueError, AttributeError) as e:
        raise ValueError(f"cache-dit cannot cache {workload.name} ({type(workload.transformer).__name__}): "
                         f"{type(e).__name__}: {e}") from e
    cache.detach()

    def run(seeds: list[int]) -> torch.Tensor:
        cache.start_generation()
        out = workload.generate(seeds)
        cache.end_generation()
        return out

    arm = Arm(name, run, enable=cache.attach, disable=cache.detach, peer=True, config=cache.describe())
    arm.stats_obj = cache.stats  # type: ignore[attr-defined]
    arm.cache = cache  # type: ignore[attr-defined]
    return arm


def build_arms(workload: Workload, methods: list[str], overrides: dict[str, Any],
               skipped: list[dict[str, str]] | None = None) -> list[Arm]:
    """The baseline first, then each requested method or peer.

    A cache-dit peer that cannot run here (not installed, or a model it cannot cache) is left out
    and appended to ``skipped`` as ``{"method", "reason"}``; without a ``skipped`` list it raises.
    """
    has_controlnet = getattr(workload, "controlnet", None) is not None
    known = (*DEFAULT_METHODS, CONTROLNET_REFERENCE) if has_controlnet else DEFAULT_METHODS
    unknown = [m for m in methods if m not in known]
    if unknown:
        raise ValueError(f"dit-cache: unknown method(s) {', '.join(unknown)} for {workload.name}; choose from "
                         f"{', '.join(known)}")
    configs = method_configs(overrides)
    forecast = configs["taylor"]
    arms = [Arm("baseline", lambda seeds: workload.generate(seeds), config={"num_inference_steps": workload.steps})]
    for method in methods:
        if method in OUR_METHODS:
            arms.append(workload.method_arm(method, configs[method]))
        elif method == CONTROLNET_REFERENCE:
            arms.append(workload.method_arm(method, configs["taylor"], forecast_controlnet=False))  # type: ignore[call-arg]
        elif method == "fewer-steps":
            k = full_steps_of(forecast, workload.steps)
            arms.append(Arm("fewer-steps", lambda seeds, k=k: workload.generate(seeds, steps=k), peer=True,
                            config={"num_inference_steps": k, "matches": f"taylor full steps at {forecast.to_dict()}"}))
        elif method in CACHE_DIT_PEERS:
            try:
                arms.append(cache_dit_arm(workload, method))
            except (ImportError, ValueError) as e:
                if skipped is None:
                    raise
                skipped.append({"method": method, "reason": str(e)})
        else:
            ratios = None
            if method == "diffusers-magcache":
                with torch.inference_mode():
                    ratios = calibrate_magcache(workload.transformer, workload.steps,
                                                lambda: workload.generate(workload.seeds))
            arms.append(cache_arm(workload, method, ratios, forecast))
    return arms


def method_configs(overrides: dict[str, Any],
                   classes: dict[str, type[MethodConfig]] | None = None) -> dict[str, MethodConfig]:
    """Each of our methods' config with ``overrides``: ``"speca.tau0"`` targets one method, a plain
    ``"order"`` every method that has the field.

    Raises:
        ValueError: a key that no method's config has.
    """
    classes = classes or METHOD_CONFIGS
    per_method: dict[str, dict[str, Any]] = {m: {} for m in classes}
    for key, value in overrides.items():
        method, _, name = key.rpartition(".")
        targets = [method] if method else [m for m, c in classes.items() if name in c.__dataclass_fields__]
        if method and method not in classes or not targets:
            raise ValueError(f"--set {key}: no method config has this field; use METHOD.FIELD with METHOD in "
                             f"{', '.join(classes)} and a field of its config")
        for m in targets:
            per_method[m][name] = value
    return {m: classes[m]().replace(**per_method[m]) for m in classes}


def _speca_thresholds(workload: Workload) -> dict[str, float]:
    """``speca``'s thresholds as resolved for this workload (calibration file, else the fallback)."""
    config = workload.method_arm("speca", SpecaConfig()).config
    return {k: config[k] for k in ("tau0", "beta", "tau_min")}


def _speca_record(workload: Workload) -> dict[str, Any] | None:
    """The calibration record ``speca-replay`` replays (its ``full_rate``: per step, how often the calibrated
    gate ran in full; its searched ``schedules``), if there is one for this number of steps, with its ``source``.

    A pipeline workload reads its model folder's. A random-weight architecture has none of its own, and its gate's
    decisions would not be representative anyway: it replays what calibration chose on the trained ``tiny-dit``.
    """
    from ..forecast.calibrate import CALIBRATION_FILE, load_calibration
    from ..models import resolve_model_path

    pipe = getattr(workload, "pipe", None)
    folder = getattr(pipe, "name_or_path", None) if pipe is not None else None
    own = folder is not None
    folder = folder if own else resolve_model_path("tiny-dit")
    record = load_calibration(folder)
    if record is None or record.get("steps") != workload.steps:
        return None
    source = f"{Path(folder).name}/{CALIBRATION_FILE}"
    return {**record, "source": source if own else f"{source}: the trained tiny-dit's calibration, replayed on "
                                                    "this random-weight architecture"}


def default_steps(model: str) -> int:
    """50 for DiT-style models, 28 for flow-matching ones (SD3, Flux), as their pipelines use; a model folder's
    ``diffspec_model.json`` may name its own (``"steps"``: 28 for ``tiny-flux``)."""
    base = loop_base(model)
    if base is None:
        from ..models import resolve_model_path
        from ..models.dit import MODEL_FILE

        try:
            settings = resolve_model_path(model) / MODEL_FILE
        except ValueError:
            return 50
        return int(json.loads(settings.read_text()).get("steps", 50)) if settings.is_file() else 50
    return 28 if SPECS[base].family in ("sd3", "flux") else 50


def run_dit_cache(model: str = "tiny-dit", *, methods: list[str] | None = None, device: str | None = None,
                  dtype: str | None = None, steps: int | None = None, batch: int | None = None, repeats: int = 3,
                  warmup: int = 1, quality_samples: int = 500, guidance_scale: float = 4.0,
                  overrides: dict[str, Any] | None = None, allow_cpu: bool = False,
                  show_progress: bool = True, budget_evals: list[float] | None = None,
                  compile: str | None = None, compile_backend: str = "inductor", prompts: list[str] | None = None,
                  call_kwargs: dict[str, Any] | None = None) -> dict[str, Any]:
    """Run the ``dit-cache`` suite and return the JSON document (the benchmark JSON, docs/benchmarks/index.md).

    ``budget_evals``: the equal-budget mode (:mod:`diffspec.bench.equal_evals`): every arm's knobs are
    searched on calibration seeds for each budget of full evaluations, then all are measured side by side.
    ``compile``: one of :data:`~diffspec.bench.compiled.COMPILE_MODES`, applied to the transformer
    every arm runs (not with ``budget_evals``). ``prompts`` / ``call_kwargs`` (``height``, ``width``,
    ``num_frames``): a text-conditioned pipeline folder's prompts and sizes.

    Example:
        >>> doc = run_dit_cache("tiny-dit", methods=["taylor"], repeats=1, quality_samples=20)  # doctest: +SKIP
        >>> doc["runs"][1]["speedup_vs_baseline"]  # doctest: +SKIP
    """
    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    base = loop_base(model)
    if base is not None and (prompts or call_kwargs):
        raise ValueError(f"prompts and sizes apply to text-conditioned pipeline folders; {model} is a loop workload "
                         "(an architecture name with its own latent size)")
    if base is not None and base not in TINY_LOOP_MODELS and dev.type != "cuda" and not allow_cpu:
        raise ValueError(f"--model {model} is a real-size architecture meant for a GPU (device is {dev}); "
                         "pass --device cuda, or --allow-cpu to time it on the CPU anyway")
    dtype_name = dtype or ("bfloat16" if dev.type == "cuda" and base is not None else "float32")
    if dtype_name not in ("float32", "float16", "bfloat16"):
        raise ValueError(f"dtype={dtype_name!r}; choose float32, float16 or bfloat16")
    for field, value, low in (("repeats", repeats, 1), ("warmup", warmup, 0), ("quality_samples", quality_samples, 2)):
        if value < low:
            raise ValueError(f"{field}={value} is out of range; must be >= {low}")
    compile_mode = check_compile_mode(compile)
    if compile_mode != "none" and budget_evals:
        raise ValueError(f"compile={compile_mode!r} with budget_evals is not supported; use compile='none' "
                         "for the equal-evals mode")
    steps = steps or default_steps(model)
    batch = batch or (1 if base is not None else 10)
    workload = make_workload(model, device=dev, dtype=getattr(torch, dtype_name), steps=steps, batch=batch,
                             guidance_scale=guidance_scale, prompts=prompts, call_kwargs=call_kwargs)
    if compile_mode != "none":  # before any arm exists: every arm runs the same compiled transformer
        workload.transformer = compile_transformer(workload.transformer, compile_mode, model, compile_backend)
        if isinstance(workload, PipelineWorkload):
            workload.pipe.transformer = workload.transformer
    skipped: list[dict[str, str]] = []
    equal: dict[str, Any] | None = None
    if budget_evals:
        from .equal_evals import run_equal_evals

        equal = run_equal_evals(workload, methods=methods, budgets=list(budget_evals), device=dev, repeats=repeats,
                                warmup=warmup, quality_samples=quality_samples, show_progress=show_progress,
                                resolve_speca=lambda: _speca_thresholds(workload),
                                resolve_record=lambda: _speca_record(workload))
        runs, equal, skipped = equal["runs"], equal["equal_evals"], equal["skipped"]
    else:
        default = (*OUR_METHODS, CONTROLNET_REFERENCE, *PEERS) if getattr(workload, "controlnet", None) is not None \
            else DEFAULT_METHODS
        arms = build_arms(workload, list(methods or default), dict(overrides or {}), skipped)
        compiled = compile_mode != "none"
        runs = run_arms(workload, arms, device=dev, repeats=repeats, warmup=warmup, quality_samples=quality_samples,
                        quality_chunk=max(batch, 50), show_progress=show_progress,
                        untimed=eager if compiled else None, count_compiles=compiled)
        for run in runs:
            run["compile"] = compile_mode
    params = sum(p.numel() for p in workload.transformer.parameters())
    describe = workload.describe()
    describe.update(repeats=repeats, warmup=warmup,
                    quality_samples=quality_samples if workload.mode == "pipeline" else len(workload.seeds))
    doc = {
        "suite": "dit-cache",
        "machine": machine_info(dev),
        "model": {"name": model, "mode": workload.mode, "transformer": type(workload.transformer).__name__,
                  "params": params, "dtype": dtype_name, "weights": "trained" if workload.mode == "pipeline"
                  else "random (speed does not depend on weight values)"},
        "workload": describe,
        "compile": {"mode": compile_mode,
                    **({"backend": compile_backend, "dynamic": False} if compile_mode != "none" else {})},
        "runs": runs,
        "notes": [
            "target_calls: transformer calls in which every block ran in full; target_evals: block work "
            "(nn.Linear weight sizes x calls) in full-call equivalents, so attention-only caching counts partly.",
            "quality compares each arm with the baseline on the same seeds; fid/accuracy use the shipped shape "
            "classifier against the training distribution (pipeline workload only).",
            "arms are interleaved per round (rotating order) after untimed warmup; the per-arm counting and "
            "quality passes are untimed.",
        ],
    }
    if compile_mode != "none":
        doc["notes"].append("compile: every arm runs the transformer compiled as compile.mode (compiled before the "
                            "arms are built, in the untimed warmup); compiled_graphs per run counts graphs dynamo "
                            "compiled in its warmup and after it (recompiles while timed); counting and quality "
                            "passes run eagerly (torch.compiler.set_stance('force_eager')); compiled_vs_eager_max_abs: "
                            "largest difference between the arm's last timed (compiled) output and its eager one, "
                            "same seeds.")
    if equal is not None:
        doc["equal_evals"] = equal
        doc["notes"].append("equal_evals: each arm runs at the setting its search kept for budget_evals (see "
                            "equal_evals.rule); over_budget marks an arm whose counted evals exceed the budget.")
    if dev.type == "cpu":
        doc["wall_clock_caveat"] = ("CPU timings: latency depends on the machine's load at the time, which this "
                                    "suite does not check (shared CPUs are noisy); compare arms within this file only.")
    if skipped:
        doc["skipped"] = skipped
        doc["notes"].append("skipped: requested arms that could not run here, with the reason.")
    return doc
