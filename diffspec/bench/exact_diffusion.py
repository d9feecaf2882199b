"""The ``exact-diffusion`` suite: exact speculative samplers against the plain stochastic sampler.

Workload: a class-conditional ``DiTPipeline`` (the shipped ``tiny-dit`` or a local folder) sampled
with DDPM at ``steps`` steps and classifier-free guidance. Arms: ``baseline`` (the plain sampler:
one transformer call per step), ``coupling``, ``autospec``, and the peer ``fewer-steps`` (the plain
sampler given as many steps as ``coupling`` made sequential calls). Reported per arm: sequential
transformer calls and rows evaluated per sample (at the timed batch and over the quality set),
acceptance per draft depth, wall-clock (interleaved, warmed up), and quality: a two-sample test
of the final latents against the baseline's (energy distance and per-coordinate KS; exact arms
must pass), reference FID and class accuracy of the decoded images.
"""

from __future__ import annotations

from typing import Any

import torch

from ..api import SpeculativePipeline
from ..config import AutospecConfig, CouplingConfig
from ..progress import progress
from .dit_cache import method_configs
from .timing import Arm, latency_summary, machine_info, time_arms
from .twosample import same_law

EXACT_METHODS = ("coupling", "autospec")
PEERS = ("fewer-steps",)


def _pipeline(model: str, device: torch.device, dtype: torch.dtype) -> Any:
    from diffusers import DDPMScheduler

    from ..models import load_pipeline

    pipe = load_pipeline(model, dtype=dtype, device=device)
    if not hasattr(pipe, "get_label_ids"):
        raise ValueError(f"exact-diffusion needs a class-conditional DiTPipeline; {model!r} is {type(pipe).__name__}")
    pipe.scheduler = DDPMScheduler.from_config(pipe.scheduler.config)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def run_exact_diffusion(model: str = "tiny-dit", *, methods: list[str] | None = None, device: str | None = None,
                        dtype: str | None = None, steps: int | None = None, batch: int | None = None, repeats: int = 3,
                        warmup: int = 1, quality_samples: int = 1000, guidance_scale: float = 4.0,
                        overrides: dict[str, Any] | None = None, show_progress: bool = True,
                        **_: Any) -> dict[str, Any]:
    """Run the suite and return the JSON document (DESIGN.md section 5).

    Example:
        >>> doc = run_exact_diffusion("tiny-dit", steps=20, quality_samples=50, repeats=1)  # doctest: +SKIP
    """
    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    steps, batch = steps or 100, batch or 1
    methods = list(methods or (*EXACT_METHODS, *PEERS))
    unknown = [m for m in methods if m not in (*EXACT_METHODS, *PEERS)]
    if unknown:
        raise ValueError(f"exact-diffusion: unknown method(s) {', '.join(unknown)}; choose from "
                         f"{', '.join((*EXACT_METHODS, *PEERS))}")
    if quality_samples < 2:
        raise ValueError(f"quality_samples={quality_samples} is out of range; must be >= 2")
    pipe = _pipeline(model, dev, getattr(torch, dtype or "float32"))
    configs = method_configs(dict(overrides or {}), {"coupling": CouplingConfig, "autospec": AutospecConfig})
    specs = {m: SpeculativePipeline.from_pipe(pipe, method=configs[m]) for m in EXACT_METHODS if m in methods}
    plain = SpeculativePipeline.from_pipe(pipe, method="coupling")
    num_classes = len(pipe.labels) if getattr(pipe, "labels", None) else 1000

    def call(spec: Any, seeds: list[int], n_steps: int, plain_run: bool) -> torch.Tensor:
        run = spec.plain if plain_run else spec
        g = torch.Generator().manual_seed(seeds[0])
        return run(class_labels=[s % num_classes for s in seeds], num_inference_steps=n_steps, generator=g,
                   guidance_scale=guidance_scale, output_type="latent").images.float().cpu()

    timed_seeds = list(range(batch))
    calls_of: dict[str, dict[str, Any]] = {}
    arms = [Arm("baseline", lambda seeds: call(plain, seeds, steps, True), config={"num_inference_steps": steps,
                                                                                   "sampler": "DDPM"})]
    for m, spec in specs.items():
        arms.append(Arm(m, lambda seeds, spec=spec: call(spec, seeds, steps, False), config=spec.config.to_dict()))
    with torch.inference_mode():
        for arm in arms:  # untimed pass at the timed batch: sequential calls, rows, acceptance
            arm.run(timed_seeds)
            stats = (specs.get(arm.name) or plain).stats
            calls_of[arm.name] = {"target_calls": stats.target_calls, "target_evals": round(stats.target_evals, 3),
                                  "acceptance_rate": round(stats.acceptance_rate, 4),
                                  "acceptance_by_depth": stats.extra.get("acceptance_by_depth")}
        if "fewer-steps" in methods:
            k = calls_of.get("coupling", {"target_calls": steps // 2})["target_calls"]
            arms.append(Arm("fewer-steps", lambda seeds, k=k: call(plain, seeds, k, True), peer=True,
                            config={"num_inference_steps": k, "sampler": "DDPM", "matches": "coupling's sequential calls"}))
            calls_of["fewer-steps"] = {"target_calls": k, "target_evals": float(k)}
        time_arms(arms, timed_seeds, device=dev, repeats=repeats, warmup=warmup, show_progress=show_progress)
        samples, quality_calls = {}, {}
        for i, arm in enumerate(arms):  # independent seeds per arm: the two-sample test needs independence
            seeds = list(range(10_000 * (i + 1), 10_000 * (i + 1) + quality_samples))
            chunks = []
            calls = evals = 0.0
            for s in progress(range(0, quality_samples, 250), desc=f"quality {arm.name}", disable=not show_progress):
                chunks.append(arm.run(seeds[s : s + 250]))
                stats = (specs.get(arm.name) or plain).stats
                calls, evals = calls + stats.target_calls, evals + stats.target_evals * len(chunks[-1])
            samples[arm.name] = torch.cat(chunks)
            quality_calls[arm.name] = {"target_calls_per_chunk": round(calls / len(chunks), 2),
                                       "target_evals": round(evals / quality_samples, 3)}
        runs = _runs(arms, samples, calls_of, quality_calls, pipe, num_classes, quality_samples)
    return {
        "suite": "exact-diffusion",
        "machine": machine_info(dev),
        "model": {"name": model, "transformer": type(pipe.transformer).__name__,
                  "params": sum(p.numel() for p in pipe.transformer.parameters()), "dtype": dtype or "float32",
                  "weights": "trained"},
        "workload": {"steps": steps, "batch": batch, "seeds": timed_seeds, "guidance_scale": guidance_scale,
                     "scheduler": "DDPMScheduler", "quality_samples": quality_samples, "repeats": repeats,
                     "warmup": warmup, "quality_chunk": 250},
        "runs": runs,
        "notes": [
            "target_calls: sequential transformer calls for the timed batch; target_evals: transformer rows per "
            "sample (CFG rows counted once); quality.target_calls_per_chunk: the same for chunks of 250 samples "
            "(a chunk waits for its slowest trajectory).",
            "two_sample compares the arm's final latents with the baseline's on independent seeds; an exact arm "
            "must pass (energy-distance permutation test and Bonferroni per-coordinate KS, each at alpha).",
            "fewer-steps is the plain sampler with as many steps as coupling made sequential calls.",
        ],
    }


def _runs(arms: list[Arm], samples: dict[str, torch.Tensor], calls_of: dict[str, dict[str, Any]],
          quality_calls: dict[str, dict[str, Any]], pipe: Any, num_classes: int, n: int) -> list[dict[str, Any]]:
    from ..models import class_accuracy, reference_fid

    base_median = latency_summary(arms[0].times)["median"]
    reference = samples["baseline"]
    runs = []
    for i, arm in enumerate(arms):
        latents = samples[arm.name]
        images = pipe.vae.decode(latents.to(pipe.vae.dtype) / pipe.vae.config.scaling_factor).sample.float().clamp(-1, 1)
        labels = torch.tensor([s % num_classes for s in range(10_000 * (i + 1), 10_000 * (i + 1) + n)])
        latency = latency_summary(arm.times)
        quality = {"fid": round(reference_fid(images), 3), "accuracy": round(class_accuracy(images, labels), 4),
                   "psnr": None, "ssim": None, "lpips": None, **quality_calls[arm.name]}
        if arm.name != "baseline":
            quality["two_sample"] = same_law(reference, latents)
        quality["exact"] = arm.name in ("baseline", *EXACT_METHODS)
        runs.append({"method": arm.name, "peer": arm.peer, "config": arm.config, "latency_s": latency,
                     **calls_of[arm.name], "peak_mem_gb": arm.peak_mem_gb,
                     "speedup_vs_baseline": round(base_median / latency["median"], 3),
                     "calls_speedup_vs_baseline": round(calls_of["baseline"]["target_calls"]
                                                        / calls_of[arm.name]["target_calls"], 3),
                     "quality": quality})
    return runs
