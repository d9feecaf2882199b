"""The ``exact-diffusion`` suite: exact speculative samplers against the plain stochastic sampler.

Workload: a class-conditional ``DiTPipeline`` (the shipped ``tiny-dit`` or a local folder) sampled
with DDPM at ``steps`` steps (one or several step counts, each a group with its own baseline) and
classifier-free guidance. Arms: ``baseline`` (the plain sampler: one transformer call per step),
``coupling``, ``autospec``, ``coupling-forecast`` (experimental: coupling with the forecast draft),
and the peers ``fewer-steps`` (the plain sampler given as many steps as ``coupling`` made
sequential calls), ``picard`` (ParaDiGMS-style, approximate) and the deterministic solvers
``ddim-K`` / ``dpm-solver++-K`` at a few step counts ``K`` (see :mod:`.exact_peers`). Reported per arm: sequential
transformer calls and rows evaluated per sample (at the timed batch and over the quality set),
acceptance per draft depth, wall-clock (interleaved, warmed up), and quality: a two-sample test
of the final latents against the baseline's (energy distance and per-coordinate KS; exact arms
must pass), reference FID and class accuracy of the decoded images. A judged text-to-image ``FluxPipeline``
(``tiny-flux``) runs the same arms on prompts instead of class labels (:mod:`.exact_text`).

``compile`` (``--compile``, see :mod:`.compiled`) compiles the transformer once for every arm
(baseline and peers alike); calls are padded to a few fixed row counts, each compiled (and on CUDA
graph-captured) in the untimed warmup. Counting and quality passes run eagerly.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

import torch

from ..api import SpeculativePipeline
from ..config import AutospecConfig, CouplingConfig
from ..progress import progress
from ..stats import SpecStats
from .compiled import PaddedRows, check_compile_mode, compile_transformer, eager, recompile_limit, row_buckets
from .dit_cache import method_configs
from .exact_peers import SOLVERS, picard_runner, solver_runner
from .exact_text import TextWorkload
from .timing import Arm, latency_summary, machine_info, time_arms
from .twosample import same_law

EXACT_METHODS = ("coupling", "autospec", "coupling-forecast")
PEERS = ("fewer-steps", "picard", *SOLVERS)
EXPERIMENTAL = ("coupling-forecast",)
QUALITY_CHUNK = 250


def _pipeline(model: str, device: torch.device, dtype: torch.dtype) -> tuple[Any, TextWorkload | None]:
    """The pipeline with its sampler swapped in (DiT: DDPM), and the text workload for a judged text pipeline."""
    from diffusers import DDPMScheduler

    from ..models import load_pipeline

    pipe = random_dit_pipeline(model, device, dtype) if _is_dit_spec(model) else load_pipeline(model, dtype=dtype,
                                                                                               device=device)
    pipe.set_progress_bar_config(disable=True)
    if not hasattr(pipe, "get_label_ids"):
        return pipe, TextWorkload(pipe, model)  # ValueError unless a judged FluxPipeline
    pipe.scheduler = DDPMScheduler.from_config(pipe.scheduler.config)
    return pipe, None


def _is_dit_spec(model: str) -> bool:
    from ..testing.random_transformers import SPECS

    return model in SPECS and SPECS[model].family == "dit"


def random_dit_pipeline(model: str, device: torch.device, dtype: torch.dtype) -> Any:
    """A ``DiTPipeline`` around a random-weight DiT of the named architecture (``dit-xl-2-256``): the
    real-size speed workload (1000 classes, DDPM). Its VAE is a small random one with DiT's 8x
    scale, used only to decode the quality set: quality figures on random weights mean nothing."""
    from diffusers import AutoencoderKL, DDPMScheduler, DiTPipeline

    from ..testing.random_transformers import build_transformer

    transformer = build_transformer(model, dtype=dtype, device=device)
    torch.manual_seed(0)
    vae = AutoencoderKL(in_channels=3, out_channels=3, down_block_types=("DownEncoderBlock2D",) * 4,
                        up_block_types=("UpDecoderBlock2D",) * 4, block_out_channels=(16,) * 4, layers_per_block=1,
                        latent_channels=4, norm_num_groups=8).to(device=device, dtype=dtype).eval()
    scheduler = DDPMScheduler(num_train_timesteps=1000, beta_schedule="linear", clip_sample=False)
    pipe = DiTPipeline(transformer=transformer, vae=vae, scheduler=scheduler,
                       id2label={i: f"class{i}" for i in range(transformer.config.num_embeds_ada_norm)})
    return pipe


def _step_list(steps: int | str | list[int] | None) -> list[int]:
    if steps is None:
        return [100]
    values = [int(v) for v in steps.split(",") if v.strip()] if isinstance(steps, str) else (
        [steps] if isinstance(steps, int) else list(steps))
    if not values or any(v < 2 for v in values):
        raise ValueError(f"steps={steps!r} is out of range: each step count must be >= 2")
    return values


def run_exact_diffusion(model: str = "tiny-dit", *, methods: list[str] | None = None, device: str | None = None,
                        dtype: str | None = None, steps: int | str | list[int] | None = None, batch: int | None = None,
                        repeats: int = 3, warmup: int = 1, quality_samples: int = 1000, guidance_scale: float = 4.0,
                        overrides: dict[str, Any] | None = None, show_progress: bool = True,
                        quality_steps: list[int] | None = None, quality_methods: list[str] | None = None,
                        solver_steps: tuple[int, ...] = (10, 20, 25, 50),
                        picard_window: int = 8, picard_tol: float = 0.1, compile: str | None = None,
                        compile_backend: str = "inductor", **_: Any) -> dict[str, Any]:
    """Run the suite at one or several step counts and return the JSON document (the benchmark JSON, docs/benchmarks/index.md).

    ``steps`` may be a list (or ``"50,100,250"``): each step count is a group of arms with its own
    baseline. Quality (two-sample tests, FID, accuracy) is measured for the groups in
    ``quality_steps`` (default: all); the ODE-solver peers, which do not depend on the baseline's
    step count, run once, in the first quality group. ``quality_methods`` limits the quality
    measurement to these arms (``ddim`` / ``dpm-solver++`` name all their step counts; the baseline
    is always measured). ``compile``: one of :data:`~diffspec.bench.compiled.COMPILE_MODES`, applied to
    the transformer that every arm calls. ``model`` may be a judged ``FluxPipeline`` folder
    (:class:`~diffspec.bench.exact_text.TextWorkload`; default steps: the folder's ``steps``).

    Example:
        >>> doc = run_exact_diffusion("tiny-dit", steps=[20, 50], quality_samples=50, repeats=1)  # doctest: +SKIP
    """
    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    step_counts, batch = _step_list(steps) if steps is not None else None, batch or 1
    methods = list(methods or (*EXACT_METHODS, *PEERS))
    unknown = [m for m in methods if m not in (*EXACT_METHODS, *PEERS)]
    if unknown:
        raise ValueError(f"exact-diffusion: unknown method(s) {', '.join(unknown)}; choose from "
                         f"{', '.join((*EXACT_METHODS, *PEERS))}")
    if quality_samples < 2:
        raise ValueError(f"quality_samples={quality_samples} is out of range; must be >= 2")
    compile_mode = check_compile_mode(compile)
    pipe, text = _pipeline(model, dev, getattr(torch, dtype or "float32"))
    step_counts = step_counts or [text.steps if text is not None else 100]
    quality_steps = [quality_steps] if isinstance(quality_steps, int) else quality_steps
    quality_at = [s for s in step_counts if quality_steps is None or s in quality_steps]
    skipped = text.skipped(methods) if text is not None else []
    methods = [m for m in methods if m not in {x["method"] for x in skipped}]
    configs = method_configs(dict(overrides or {}), {"coupling": CouplingConfig, "autospec": AutospecConfig})
    configs["coupling-forecast"] = configs["coupling"].replace(draft="forecast")
    padded = None
    if compile_mode != "none":  # one compiled transformer for every arm, calls padded to fixed row counts
        lookahead = max([configs[m].max_lookahead if configs[m].adaptive else configs[m].lookahead
                         for m in EXACT_METHODS if m in methods] + [1])
        longest = max(lookahead, picard_window if "picard" in methods else 1)
        cfg = 2 if guidance_scale > 1 and text is None else 1  # rows per drafted state: 2 under DiT's CFG
        padded = PaddedRows(compile_transformer(pipe.transformer, compile_mode, model, compile_backend),
                            [cfg * u for u in row_buckets(batch * longest, fixed=(batch,))])
        pipe.transformer = padded
    specs = _specs(pipe, configs, methods, skipped)
    plain = SpeculativePipeline.from_pipe(pipe, method="coupling")
    num_classes = len(pipe.labels) if getattr(pipe, "labels", None) else 1000
    setup = _Setup(pipe, dev, specs, plain, num_classes, guidance_scale, batch, repeats, warmup, quality_samples,
                   show_progress, methods, picard_window, picard_tol, quality_methods, compile_mode, padded, text)
    runs: list[dict[str, Any]] = []
    limit = recompile_limit(len(padded.buckets) + 4) if padded is not None else contextlib.nullcontext()
    with torch.inference_mode(), limit:
        for n in step_counts:
            solvers = solver_steps if quality_at and n == quality_at[0] else ()
            runs += _group(setup, n, quality=n in quality_at, solver_steps=solvers)
    single = len(step_counts) == 1
    return {
        "suite": "exact-diffusion",
        "machine": {**machine_info(dev), "load": "loaded shared 2-core CPU (other jobs running)"
                    if dev.type == "cpu" else None},
        "model": {"name": model, "transformer": type(pipe.transformer).__name__,
                  "params": sum(p.numel() for p in pipe.transformer.parameters()), "dtype": dtype or "float32",
                  "weights": "random (speed only: acceptance and quality are not a trained model's)"
                  if _is_dit_spec(model) else "trained"},
        "workload": {"steps": step_counts[0] if single else step_counts, "quality_steps": quality_at,
                     "quality_methods": quality_methods,
                     "batch": batch, "seeds": list(range(batch)), "guidance_scale": guidance_scale,
                     "scheduler": "DDPMScheduler", "quality_samples": quality_samples, "repeats": repeats,
                     "warmup": warmup, "quality_chunk": QUALITY_CHUNK, "solver_steps": list(solver_steps),
                     "picard": {"window": picard_window, "tol": picard_tol},
                     **(text.describe(guidance_scale) if text is not None else {})},
        "compile": _compile_block(compile_mode, padded, compile_backend),
        "runs": runs,
        "notes": _notes(padded is not None, text, bool(skipped)),
        **({"skipped": skipped} if skipped else {}),
    }


def _notes(compiled: bool, text: TextWorkload | None, skipped: bool) -> list[str]:
    """The JSON's ``notes``: how to read its fields."""
    return [
        "target_calls: sequential transformer calls for the timed batch; target_evals: transformer rows per "
        "sample (CFG rows counted once); quality.target_calls_per_chunk: the same for chunks of 250 samples "
        "(a chunk waits for its slowest trajectory). Each run's 'steps' is its group's baseline step count.",
        "two_sample compares the arm's final latents with its group's baseline on independent seeds; an exact "
        "arm must pass (energy-distance permutation test and Bonferroni per-coordinate KS, each at alpha).",
        "fewer-steps is the plain sampler with as many steps as coupling made sequential calls.",
        "coupling-forecast (experimental) is coupling with draft='forecast': x0 extrapolated (Newton, order "
        "forecast_order) through the target's predictions at committed states; exact by the same coupling.",
        "picard: ParaDiGMS-style sliding-window Picard iteration of the same DDPM chain with pre-drawn noise "
        "(window, tol on the noise-scaled squared change); approximate, its two-sample test is reported as is.",
        "ddim (eta 0) and dpm-solver++ (2M) are deterministic ODE solvers at their own step counts "
        "(config.num_inference_steps): compare by reference FID and accuracy with the baseline of their group.",
        "Wall-clock on CPU is measured on a loaded shared machine: read it as indicative only.",
        *([] if not compiled else [
            "compile: every arm calls the same compiled transformer (compile.mode); calls are padded to the "
            "next of compile.row_buckets by repeating the last row and the padding is cut from the output "
            "(never counted in target_evals); every bucket is compiled in the untimed warmup. Per run, "
            "compiled_graphs counts graphs compiled in its warmup runs and after them (should be 0; most graphs "
            "are compiled before, in the untimed counting pass and the prewarm of every bucket), rows the "
            "buckets it called and its padding overhead. Counting and quality passes run eagerly (torch.compiler.set_stance('force_eager')); "
            "compiled outputs match eager within float tolerance (tests/bench/test_bench_compile.py)."]),
        *(text.notes() if text is not None else []),
        *(["skipped: requested arms that could not run on this pipeline, with the reason."] if skipped else []),
    ]


def _specs(pipe: Any, configs: dict[str, Any], methods: list[str], skipped: list[dict[str, str]]) -> dict[str, Any]:
    """The exact arms the pipeline/scheduler pair accepts; the refused ones go to ``skipped`` with the reason."""
    specs = {}
    for m in (m for m in EXACT_METHODS if m in methods):
        try:
            specs[m] = SpeculativePipeline.from_pipe(pipe, method=configs[m])
        except ValueError as e:  # e.g. autospec (ASD) on a flow-matching scheduler
            skipped.append({"method": m, "reason": str(e)})
    return specs


@dataclass
class _Setup:
    pipe: Any
    dev: torch.device
    specs: dict[str, Any]
    plain: Any
    num_classes: int
    guidance_scale: float
    batch: int
    repeats: int
    warmup: int
    quality_samples: int
    show_progress: bool
    methods: list[str]
    picard_window: int
    picard_tol: float
    quality_methods: list[str] | None
    compile_mode: str = "none"
    padded: PaddedRows | None = None
    text: TextWorkload | None = None


def _group(s: _Setup, steps: int, *, quality: bool, solver_steps: tuple[int, ...]) -> list[dict[str, Any]]:
    """The arms at one baseline step count: untimed counting pass, interleaved timing, quality."""

    def call(spec: Any, seeds: list[int], n_steps: int, plain_run: bool) -> torch.Tensor:
        run = spec.plain if plain_run else spec
        if s.text is not None:
            return s.text.generate(run, seeds, n_steps, s.guidance_scale)
        g = torch.Generator(s.dev).manual_seed(seeds[0])  # on the run's device: no host copy per draw
        return run(class_labels=[x % s.num_classes for x in seeds], num_inference_steps=n_steps, generator=g,
                   guidance_scale=s.guidance_scale, output_type="latent").images.float().cpu()

    timed_seeds, sampler = list(range(s.batch)), "DDPM" if s.text is None else s.text.sampler
    stats_of: dict[str, SpecStats] = {"baseline": s.plain.stats}
    arms = [Arm("baseline", lambda seeds: call(s.plain, seeds, steps, True),
                config={"num_inference_steps": steps, "sampler": sampler})]
    for m, spec in s.specs.items():
        arms.append(Arm(m, lambda seeds, spec=spec: call(spec, seeds, steps, False), config=spec.config.to_dict()))
        stats_of[m] = spec.stats
    if "picard" in s.methods:
        stats_of["picard"] = SpecStats(method="picard")
        arms.append(Arm("picard", picard_runner(s.pipe, steps, window=s.picard_window, tol=s.picard_tol,
                                                guidance_scale=s.guidance_scale, num_classes=s.num_classes,
                                                stats=stats_of["picard"]), peer=True,
                        config={"num_inference_steps": steps, "sampler": "DDPM", "window": s.picard_window,
                                "tol": s.picard_tol}))
    calls_of: dict[str, dict[str, Any]] = {}
    for arm in arms:  # untimed pass at the timed batch: sequential calls, rows, acceptance
        if s.padded is not None:
            arm.run = _watch_rows(arm, s.padded)
        arm.run(timed_seeds)
        calls_of[arm.name] = _calls(stats_of[arm.name])
    if "fewer-steps" in s.methods:
        k = calls_of.get("coupling", {"target_calls": steps // 2})["target_calls"]
        arms.append(Arm("fewer-steps", lambda seeds, k=k: call(s.plain, seeds, k, True), peer=True,
                        config={"num_inference_steps": k, "sampler": sampler, "matches": "coupling's sequential calls"}))
        calls_of["fewer-steps"] = {"target_calls": k, "target_evals": float(k)}
    for solver in (x for x in SOLVERS if x in s.methods):
        for k in solver_steps:
            name = f"{solver}-{k}"
            arms.append(Arm(name, solver_runner(s.pipe, solver, k, guidance_scale=s.guidance_scale,
                                                num_classes=s.num_classes), peer=True,
                            config={"num_inference_steps": k, "sampler": solver, "deterministic": True}))
            calls_of[name] = {"target_calls": k, "target_evals": float(k)}
    if s.padded is not None:
        for arm in arms:  # the arms added after the counting pass (fewer-steps, solvers)
            if not hasattr(arm.run, "rows"):
                arm.run = _watch_rows(arm, s.padded)
        s.padded.prewarm()  # every row bucket compiled (and CUDA-graph captured) before timing
    time_arms(arms, timed_seeds, device=s.dev, repeats=s.repeats, warmup=s.warmup, show_progress=s.show_progress,
              count_compiles=s.padded is not None)
    samples: dict[str, torch.Tensor] = {}
    quality_calls: dict[str, dict[str, Any]] = {}
    untimed = eager(s.padded) if s.padded is not None else contextlib.nullcontext()
    with untimed:
        _quality_pass(s, arms if quality else [], steps, stats_of, calls_of, samples, quality_calls)
    return _runs(arms, samples, calls_of, quality_calls, s, steps)


def _quality_pass(s: _Setup, arms: list[Arm], steps: int, stats_of: dict[str, SpecStats],
                  calls_of: dict[str, dict[str, Any]], samples: dict[str, torch.Tensor],
                  quality_calls: dict[str, dict[str, Any]]) -> None:
    """Each arm's quality set (independent seeds per arm: the two-sample tests need independence)."""
    n = s.quality_samples
    for i, arm in enumerate(arms):  # independent seeds per arm: the tests need independence
        if s.quality_methods is not None and arm.name != "baseline" and arm.name not in s.quality_methods \
                and arm.config.get("sampler") not in s.quality_methods:
            continue
        seeds = list(range(10_000 * (i + 1), 10_000 * (i + 1) + n))
        chunks = []
        calls = evals = 0.0
        for c in progress(range(0, n, QUALITY_CHUNK), desc=f"quality {arm.name} @{steps}", disable=not s.show_progress):
            chunks.append(arm.run(seeds[c : c + QUALITY_CHUNK]))
            st = stats_of.get(arm.name, s.plain.stats)
            if arm.name in stats_of or arm.name == "fewer-steps":  # fewer-steps runs spec.plain
                calls, evals = calls + st.target_calls, evals + st.target_evals * len(chunks[-1])
            else:  # a deterministic solver: one call a step, whatever the batch
                calls, evals = calls + calls_of[arm.name]["target_calls"], evals + calls_of[arm.name]["target_evals"] * len(chunks[-1])
        samples[arm.name] = torch.cat(chunks)
        quality_calls[arm.name] = {"target_calls_per_chunk": round(calls / len(chunks), 2),
                                   "target_evals": round(evals / n, 3)}


def _watch_rows(arm: Arm, padded: PaddedRows) -> Any:
    """``arm.run`` recording, in ``arm.stats["rows"]``, the row buckets it called and its padding overhead."""
    run = arm.run
    record = arm.stats.setdefault("rows", {"buckets": [], "real": 0, "padding": 0})

    def watched(seeds: list[int]) -> torch.Tensor:
        seen, real, pad = padded.seen, padded.real_rows, padded.padded_rows
        padded.seen = set()
        try:
            return run(seeds)
        finally:
            record["buckets"] = sorted(set(record["buckets"]) | padded.seen)
            record["real"] += padded.real_rows - real
            record["padding"] += padded.padded_rows - pad
            padded.seen = seen | padded.seen

    watched.rows = record  # type: ignore[attr-defined]
    return watched


def _compile_block(mode: str, padded: PaddedRows | None, backend: str) -> dict[str, Any]:
    """The top-level ``compile`` entry of the JSON."""
    if padded is None:
        return {"mode": mode}
    return {"mode": mode, "backend": backend, "dynamic": False, "row_buckets": padded.buckets, "compiled_shapes": sorted(padded.seen),
            "padding": "calls padded to the next row bucket by repeating the last row; padding cut from outputs"}


def _calls(stats: SpecStats) -> dict[str, Any]:
    return {"target_calls": stats.target_calls, "target_evals": round(stats.target_evals, 3),
            "acceptance_rate": round(stats.acceptance_rate, 4),
            "acceptance_by_depth": stats.extra.get("acceptance_by_depth")}


def _runs(arms: list[Arm], samples: dict[str, torch.Tensor], calls_of: dict[str, dict[str, Any]],
          quality_calls: dict[str, dict[str, Any]], s: _Setup, steps: int) -> list[dict[str, Any]]:
    from ..models import class_accuracy, reference_fid

    pipe, num_classes, n, compile_mode = s.pipe, s.num_classes, s.quality_samples, s.compile_mode
    base_median = latency_summary(arms[0].times)["median"]
    reference = samples.get("baseline")
    runs = []
    for i, arm in enumerate(arms):
        latency = latency_summary(arm.times)
        quality: dict[str, Any] = {"fid": None, "accuracy": None, "psnr": None, "ssim": None, "lpips": None}
        if arm.name in samples:
            latents, seeds = samples[arm.name], list(range(10_000 * (i + 1), 10_000 * (i + 1) + n))
            if s.text is not None:  # the scene judge's FID and prompt accuracy
                quality.update(**s.text.scores(latents, seeds), **quality_calls[arm.name])
            else:
                images = pipe.vae.decode(latents.to(pipe.vae.device, pipe.vae.dtype) / pipe.vae.config.scaling_factor).sample
                images = images.float().clamp(-1, 1).cpu()
                labels = torch.tensor([x % num_classes for x in seeds])
                quality.update(fid=round(reference_fid(images), 3), accuracy=round(class_accuracy(images, labels), 4),
                               **quality_calls[arm.name])
            if arm.name != "baseline":
                quality["two_sample"] = same_law(reference, latents)
        quality["exact"] = arm.name in ("baseline", *EXACT_METHODS)
        runs.append({"method": arm.name, "steps": steps, "peer": arm.peer,
                     "experimental": arm.name in EXPERIMENTAL, "config": arm.config, "latency_s": latency,
                     **calls_of[arm.name], "peak_mem_gb": arm.peak_mem_gb,
                     "speedup_vs_baseline": round(base_median / latency["median"], 3),
                     "calls_speedup_vs_baseline": round(calls_of["baseline"]["target_calls"]
                                                        / calls_of[arm.name]["target_calls"], 3),
                     "compile": compile_mode, **_compile_stats(arm), "quality": quality})
    return runs


def _compile_stats(arm: Arm) -> dict[str, Any]:
    """A run's compile figures: graphs compiled in warmup / after it, row buckets and padding overhead."""
    out: dict[str, Any] = {}
    if "compiled_graphs" in arm.stats:
        out["compiled_graphs"] = arm.stats["compiled_graphs"]
    rows = arm.stats.get("rows")
    if rows is not None:
        out["rows"] = {"buckets": rows["buckets"], "padding_fraction": round(rows["padding"] / max(rows["real"], 1), 4)}
    return out
