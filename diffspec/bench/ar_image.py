"""The ``ar-image`` suite: speculative Jacobi decoding against plain AR decoding with a KV cache.

Workload: a class-conditional AR image target (the shipped ``tiny-ar`` or an AR model folder),
classifier-free guidance, the same sampling settings in every arm. Arms: ``baseline`` (plain AR
decoding, one target call per token), ``sjd`` (window 16, its default), ``sjd-L64`` (SJD at the
MC-SJD window: the equal-window comparison), ``mc-sjd`` (maximal coupling, window 64),
``mc-sjd-gumbel``, ``mc-sjd-uniform`` (first drafts uniform random tokens instead of the default
left-token repeat), ``sjd-pac`` (mc-sjd + a 4 x 3 tree of alternatives at the window start, exact,
window 64), ``mc-sjd-ra`` / ``mc-sjd-ra-w8f6`` (mc-sjd + residual alternatives, exact: 4 siblings for each of
the first 8 drafts, each followed by 3 chain copies / 8 siblings followed by 6), and the relaxed ``gsd-G25`` / ``gsd-G50`` (grouped acceptance in the mc-sjd loop; ``-cb05`` /
``-cb15``: distance filter on the VQ codebook at the nearest 5% / 15% of code pairs, ``-emb05`` /
``-emb10``: on the input embeddings at 5% / 10%; ``-dp0.3`` / ``-dp0.4``: probability-gap filter 0.3 / 0.4; ``-tv0.2``:
``max_tv=0.2``, the acceptance clamped to within 0.2 of the exact test's; ``-run0`` / ``-run1``: ``min_run=0`` / ``1``,
a group-only acceptance kept only before a run of that many exact acceptances; ``gsd-cb-k24`` / ``-k32`` / ``-k40``:
``clusters=24`` / ``32`` / ``40``, lumped rejection sampling over a fixed k-means partition of the VQ codebook;
``gsd-cb-kK-mintv`` (K = 8, 16, 24, 26, 28, 32, 48): ``clusters=K`` with ``cluster_rule="min-tv"``, the same acceptance
emitting the law closest to the target's; ``gsd-cb-kK-mintv-ra-d8`` / ``-ra-d16`` (K = 8, 16, 26): the same with residual
alternatives (the loop of ``mc-sjd-ra``: 4 siblings for each of the first 8 / 16 drafts, each followed by 3 chain
copies); ``gsd-emb-kK-mintv`` (K = 16, 26, 32): the same with the partition fitted on the target's input
embeddings)
and ``lantern`` / ``lantern++-chain`` / ``lantern++`` (the target's shipped drafter; ``lantern++`` drafts
its default static tree, ``lantern++-chain`` a chain of 4; all with LANTERN's official "certain"
acceptance, ``-residual`` with the ``q``-ratio rule, ``-d0.3`` with a wider budget), each ``"exact": false`` with its
same-seed difference from the baseline and its per-token TV budget. Reported per arm: target calls per image and step compression (tokens per
call) at the timed batch and over the quality set, wall-clock (interleaved, warmed up), and
quality: reference FID and class accuracy of the decoded images, and for exact arms a
token-histogram homogeneity test against the baseline (per position, Bonferroni). The model
block carries the target's per-token entropy at the sampling settings, so acceptance figures
can be read against how peaked the model is. Every speculative arm is also run on the baseline's
first quality seeds (``same_seed``): the fraction of tokens differing from plain decoding and the
PSNR of the decoded images. Plain and Jacobi decoding use the random stream differently, so the
exact arms give the floor of that figure; ``gsd`` arms also report it against ``mc-sjd`` (same
random stream until the group test first accepts what the exact test rejects), and
``relaxed_tv``, the mean per-token TV budget their test spent (over the timed images, and in
``quality`` over the quality batch).

Example:
    >>> doc = run_ar_image("tiny-ar", quality_samples=200, repeats=1)  # doctest: +SKIP
"""

from __future__ import annotations

from typing import Any

import torch

from ..api import SpeculativePipeline
from ..progress import progress
from .timing import Arm, latency_summary, machine_info, time_arms

ARMS: dict[str, dict[str, Any]] = {
    "sjd": {"method": "sjd"},
    "sjd-L64": {"method": "sjd", "window": 64},
    "mc-sjd": {"method": "mc-sjd", "coupling": "maximal"},
    "mc-sjd-gumbel": {"method": "mc-sjd", "coupling": "gumbel"},
    "mc-sjd-uniform": {"method": "mc-sjd", "init": "uniform"},
    "sjd-pac": {"method": "sjd-pac"},
    "mc-sjd-ra": {"method": "mc-sjd-ra"},
    "mc-sjd-ra-w8f6": {"method": "mc-sjd-ra", "width": 8, "follow": 6},
    "gsd-G25": {"method": "gsd", "group_size": 25},
    "gsd-G50": {"method": "gsd", "group_size": 50},
    "gsd-G50-cb05": {"method": "gsd", "group_size": 50, "embed_source": "codebook", "embed_quantile": 0.05},
    "gsd-G50-cb15": {"method": "gsd", "group_size": 50, "embed_source": "codebook", "embed_quantile": 0.15},
    "gsd-G50-emb05": {"method": "gsd", "group_size": 50, "embed_quantile": 0.05},
    "gsd-G100-emb10": {"method": "gsd", "group_size": 100, "embed_quantile": 0.1},
    "gsd-G100-emb05-dp0.3": {"method": "gsd", "group_size": 100, "embed_quantile": 0.05, "delta_p": 0.3},
    "gsd-G100-emb03-dp0.5": {"method": "gsd", "group_size": 100, "embed_quantile": 0.03, "delta_p": 0.5},
    "gsd-G100-emb03-dp0.5-run0": {"method": "gsd", "group_size": 100, "embed_quantile": 0.03, "delta_p": 0.5,
                                  "min_run": 0},
    "gsd-G100-emb03-dp0.5-run1": {"method": "gsd", "group_size": 100, "embed_quantile": 0.03, "delta_p": 0.5,
                                  "min_run": 1},
    "gsd-cb-k32": {"method": "gsd", "clusters": 32, "embed_source": "codebook", "cluster_rule": "lumped"},
    "gsd-cb-k24": {"method": "gsd", "clusters": 24, "embed_source": "codebook", "cluster_rule": "lumped"},
    "gsd-cb-k40": {"method": "gsd", "clusters": 40, "embed_source": "codebook", "cluster_rule": "lumped"},
    **{f"gsd-cb-k{k}-mintv": {"method": "gsd", "clusters": k, "embed_source": "codebook", "cluster_rule": "min-tv"}
       for k in (8, 16, 24, 26, 28, 32, 48)},
    **{f"gsd-cb-k{k}-mintv-ra{tail}": {"method": "gsd", "clusters": k, "embed_source": "codebook",
                                       "cluster_rule": "min-tv", "width": 4, "depth": depth}
       for k in (8, 16, 26) for tail, depth in (("-d8", 8), ("-d16", 16))},
    **{f"gsd-emb-k{k}-mintv": {"method": "gsd", "clusters": k, "embed_source": "embeddings", "cluster_rule": "min-tv"}
       for k in (16, 26, 32)},
    "gsd-G50-emb05-dp0.4": {"method": "gsd", "group_size": 50, "embed_quantile": 0.05, "delta_p": 0.4},
    "gsd-G100-emb10-dp1-tv0.2": {"method": "gsd", "group_size": 100, "embed_quantile": 0.1, "delta_p": 1.0,
                                 "max_tv": 0.2},
    "gsd-G100-dp1-tv0.15": {"method": "gsd", "group_size": 100, "embed_quantile": 1.0, "delta_p": 1.0, "max_tv": 0.15},
    "lantern": {"method": "lantern"},
    "lantern++-chain": {"method": "lantern++", "tree": ()},
    "lantern++": {"method": "lantern++"},
    "lantern-residual": {"method": "lantern", "acceptance": "residual"},
    "lantern++-residual": {"method": "lantern++", "acceptance": "residual"},
    "lantern-d0.3": {"method": "lantern", "delta": 0.3},
    "lantern++-d0.3": {"method": "lantern++", "delta": 0.3, "lam": 4.0},
    "lantern++-d0.05": {"method": "lantern++", "delta": 0.05},
    "lantern++-d0.1-t8": {"method": "lantern++", "delta": 0.1, "tree": (8, 2, 2, 1, 1, 1)},
}
QUALITY_CHUNK = 250
SAME_SEED_SAMPLES = 200


def same_seed_difference(tokens: torch.Tensor, reference: torch.Tensor, images: torch.Tensor,
                         reference_images: torch.Tensor) -> dict[str, float]:
    """Fraction of differing tokens and mean PSNR (dB, images in ``[-1, 1]``) of two same-seed runs.

    Example:
        >>> t = torch.zeros(2, 4, dtype=torch.long)
        >>> same_seed_difference(t, t, torch.zeros(2, 3, 2, 2), torch.zeros(2, 3, 2, 2))["token_disagreement"]
        0.0
    """
    from ..metrics import psnr

    return {"token_disagreement": round(float((tokens != reference).double().mean()), 4),
            "psnr": psnr(images, reference_images, data_range=2.0)}


def token_homogeneity(a: torch.Tensor, b: torch.Tensor, vocab: int, min_count: float = 5.0) -> dict[str, Any]:
    """Per-position chi-square homogeneity of two token samples ``(n, N)``, Bonferroni over positions.

    Cells with fewer than ``min_count`` tokens in both samples together are pooled. Returns the
    smallest per-position p-value, the corrected p-value and ``passed`` (at 0.01).
    """
    ca = torch.zeros(a.shape[1], vocab, dtype=torch.float64).scatter_add_(1, a.T.cpu(), torch.ones(a.T.shape).double())
    cb = torch.zeros(b.shape[1], vocab, dtype=torch.float64).scatter_add_(1, b.T.cpu(), torch.ones(b.T.shape).double())
    pvals = []
    for row_a, row_b in zip(ca, cb):  # one position at a time: N small tables
        big = (row_a + row_b) >= min_count
        table = torch.stack([torch.cat([row_a[big], row_a[~big].sum()[None]]),
                             torch.cat([row_b[big], row_b[~big].sum()[None]])])
        table = table[:, table.sum(0) > 0]
        if table.shape[1] < 2:
            pvals.append(1.0)
            continue
        expected = table.sum(1, keepdim=True) * table.sum(0, keepdim=True) / table.sum()
        stat = ((table - expected) ** 2 / expected).sum()
        dof = torch.tensor(float(table.shape[1] - 1), dtype=torch.float64)
        pvals.append(float(torch.special.gammaincc(dof / 2, stat / 2)))
    smallest = min(pvals)
    corrected = min(1.0, smallest * len(pvals))
    return {"min_p": smallest, "bonferroni_p": corrected, "positions": len(pvals), "passed": corrected > 0.01}


def _entropy(target: Any, tokens: torch.Tensor, labels: torch.Tensor, guidance: float,
             sampling: dict[str, Any]) -> dict[str, float]:
    """Per-token entropy of the target's sampling law along sampled sequences (one teacher-forced call)."""
    from ..speculation.sampling import warp

    session = target.start(class_labels=labels, guidance_scale=guidance)
    logits = torch.cat([session.first_logits[:, None], session.step(tokens[:, :-1], torch.zeros_like(labels))], 1)
    from ..ar_image.token_stats import entropy_summary

    summary = entropy_summary(warp(logits, **sampling).log())  # -inf where a warper removed a token
    return {k: v if isinstance(v, int) else round(v, 4) for k, v in summary.items()}


def _config_fields(method: str) -> set[str]:
    """Field names of a registered method's config (which ``--set`` overrides apply to it)."""
    import dataclasses

    from ..api import methods as registry

    cls = next(m.config_class for m in registry("ar_image") if m.name == method)
    return {f.name for f in dataclasses.fields(cls)}


def run_ar_image(model: str = "tiny-ar", *, methods: list[str] | None = None, device: str | None = None,
                 dtype: str | None = None, batch: int | None = None, repeats: int = 3, warmup: int = 1,
                 quality_samples: int = 1000, guidance_scale: float | None = None, overrides: dict[str, Any] | None = None,
                 show_progress: bool = True, **_: Any) -> dict[str, Any]:
    """Run the suite and return the JSON document (the benchmark JSON, docs/benchmarks/index.md).

    ``guidance_scale=None`` uses the target's default (3 for ``tiny-ar``). ``overrides`` (``--set``) apply to every speculative arm (e.g. ``window=32``, ``top_k=100``,
    ``temperature=0.9``); sampling settings also apply to the baseline, so every arm samples the
    same law.
    """
    from ..ar_image.config import MCSJDConfig
    from ..models import SHIPPED_MODELS, class_accuracy, load_ar_target, reference_fid

    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    names = list(methods or ARMS)
    unknown = [m for m in names if m not in ARMS]
    if unknown:
        raise ValueError(f"ar-image: unknown method(s) {', '.join(unknown)}; choose from {', '.join(ARMS)}")
    if quality_samples < 2:
        raise ValueError(f"quality_samples={quality_samples} is out of range; must be >= 2")
    target = load_ar_target(model, device=dev, dtype=getattr(torch, dtype) if dtype else None)
    classifier = getattr(target, "reference_classifier", "shapes")  # FID / accuracy features for its data
    n, vocab, batch = target.num_tokens, target.codebook_size, batch or 1
    if guidance_scale is None:
        guidance_scale = target.default_guidance_scale
    overrides = dict(overrides or {})
    offset = overrides.pop("seed_offset", 0)  # --set seed_offset=N: another independent set of quality seeds
    if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0 or offset % 10 != 0:
        raise ValueError(f"seed_offset={offset!r} must be a non-negative multiple of 10 (class labels are seed % 10)")
    sampling = MCSJDConfig().replace(**{k: v for k, v in overrides.items() if k in ("temperature", "top_k", "top_p")})
    specs = {}
    for name in names:
        arm = {k: v for k, v in ARMS[name].items() if k != "method"}
        fields = _config_fields(ARMS[name]["method"])
        arm_overrides = {k: v for k, v in overrides.items() if k in fields}  # e.g. window= only for Jacobi arms
        specs[name] = SpeculativePipeline.from_pipe(target, method=ARMS[name]["method"], **{**arm, **arm_overrides})
    baseline = SpeculativePipeline.from_pipe(target, method="sjd", **{k: overrides[k] for k in overrides
                                                                      if k in ("temperature", "top_k", "top_p")})
    for spec in (baseline, *specs.values()):
        spec.set_progress_bar_config(disable=True)

    def call(spec: Any, seeds: list[int], plain: bool) -> torch.Tensor:
        run = spec.plain if plain else spec
        gens = [torch.Generator(dev).manual_seed(s) for s in seeds]
        return run(class_labels=[s % 10 for s in seeds], guidance_scale=guidance_scale, generator=gens,
                   output_type="tokens").tokens

    arms = [Arm("baseline", lambda seeds: call(baseline, seeds, True), config={"decoding": "plain AR, KV cache",
                                                                               **sampling.sampling})]
    arms += [Arm(m, lambda seeds, s=s: call(s, seeds, False), config=s.config.to_dict()) for m, s in specs.items()]
    stats_of = {"baseline": baseline, **specs}
    timed = list(range(batch))
    calls_of: dict[str, dict[str, Any]] = {}
    with torch.inference_mode():
        for arm in arms:  # untimed pass at the timed batch: calls and compression
            arm.run(timed)
            s = stats_of[arm.name].stats
            calls_of[arm.name] = {"target_calls": s.target_calls, "target_evals": s.target_evals,
                                  "step_compression": round(n / s.target_calls, 3),
                                  "tokens_per_call": s.extra.get("tokens_per_call"),
                                  "acceptance_rate": round(s.acceptance_rate, 4),
                                  **({"draft_calls": s.draft_calls} if s.draft_calls else {}),
                                  **({"tv_budget_mean": round(s.extra["tv_budget_mean"], 5)}
                                     if "tv_budget_mean" in s.extra else {})}
            if "relaxed_tv" in s.extra:
                calls_of[arm.name]["relaxed_tv"] = round(s.extra["relaxed_tv"], 4)
        time_arms(arms, timed, device=dev, repeats=repeats, warmup=warmup, show_progress=show_progress)
        tokens, quality_calls = {}, {}
        for i, arm in enumerate(arms):  # independent seeds per arm (the homogeneity test needs independence)
            seeds = list(range(offset + 10_000 * (i + 1), offset + 10_000 * (i + 1) + quality_samples))
            chunks, calls, per_image, tv = [], 0, 0.0, None
            for c in progress(range(0, quality_samples, QUALITY_CHUNK), desc=f"quality {arm.name}",
                              disable=not show_progress):
                chunks.append(arm.run(seeds[c: c + QUALITY_CHUNK]))
                extra = stats_of[arm.name].stats.extra
                calls += stats_of[arm.name].stats.target_calls
                per_image += extra.get("tokens_per_call", 1.0) * len(chunks[-1])
                if "relaxed_tv" in extra:  # a relaxed rule: its TV budget over the whole quality batch
                    tv = (tv or 0.0) + extra["relaxed_tv"] * len(chunks[-1])
            tokens[arm.name] = torch.cat(chunks).cpu()
            quality_calls[arm.name] = {"target_calls_per_chunk": round(calls / len(chunks), 2),
                                       "step_compression_per_chunk": round(n * len(chunks) / calls, 3),
                                       "step_compression_per_image": round(per_image / quality_samples, 3)}
            if tv is not None:
                quality_calls[arm.name]["relaxed_tv"] = round(tv / quality_samples, 4)
        base = tokens["baseline"]
        same_n = min(quality_samples, SAME_SEED_SAMPLES)
        same_seeds = list(range(offset + 10_000, offset + 10_000 + same_n))  # the baseline's first quality seeds
        same = {arm.name: arm.run(same_seeds).cpu() for arm in arms[1:]}
        same["baseline"] = base[:same_n]
        same_images = {k: target.decode_tokens(v.to(dev)).float().cpu() for k, v in same.items()}
        labels = torch.tensor([s % 10 for s in range(offset + 10_000, offset + 10_000 + min(quality_samples, 256))],
                              device=dev)
        entropy = _entropy(target, base[: len(labels)].to(dev), labels, guidance_scale, sampling.sampling)
        base_median = latency_summary(arms[0].times)["median"]
        runs = []
        for i, arm in enumerate(arms):
            images = target.decode_tokens(tokens[arm.name].to(dev)).float().cpu()
            arm_labels = torch.tensor([s % 10 for s in range(offset + 10_000 * (i + 1),
                                                              offset + 10_000 * (i + 1) + quality_samples)])
            quality: dict[str, Any] = {"fid": round(reference_fid(images, classifier), 3),
                                       "accuracy": round(class_accuracy(images, arm_labels, classifier), 4),
                                       "psnr": None, "ssim": None, "lpips": None,
                                       "exact": bool(getattr(stats_of[arm.name].config, "exact", True)),
                                       **quality_calls[arm.name]}
            if arm.name != "baseline":
                quality["token_two_sample"] = token_homogeneity(base, tokens[arm.name], vocab)
                quality["same_seed"] = {"samples": same_n, "vs_baseline": same_seed_difference(
                    same[arm.name], same["baseline"], same_images[arm.name], same_images["baseline"])}
                if not quality["exact"] and "mc-sjd" in same:
                    quality["same_seed"]["vs_mc_sjd"] = same_seed_difference(
                        same[arm.name], same["mc-sjd"], same_images[arm.name], same_images["mc-sjd"])
            latency = latency_summary(arm.times)
            runs.append({"method": arm.name, "peer": False, "config": arm.config, "latency_s": latency,
                         **calls_of[arm.name], "peak_mem_gb": arm.peak_mem_gb,
                         "speedup_vs_baseline": round(base_median / latency["median"], 3), "quality": quality})
    return {
        "suite": "ar-image",
        "machine": machine_info(dev),
        "model": {"name": model, "params": sum(p.numel() for p in target.model.parameters()),
                  "dtype": dtype or "float32", "weights": "trained" if model in SHIPPED_MODELS else "given",
                  "codebook_size": vocab, "grid": list(target.grid), "token_entropy": entropy,
                  "reference_classifier": classifier},
        "workload": {"tokens": n, "batch": batch, "seeds": timed, "guidance_scale": guidance_scale,
                     "sampling": sampling.sampling, "quality_samples": quality_samples, "seed_offset": offset,
                     "repeats": repeats, "warmup": warmup, "quality_chunk": QUALITY_CHUNK},
        "runs": runs,
        "peers_not_run": {
            "official SJD (tyshiwo1/Accelerating-T2I-AR-with-SJD) and MC-SJD / SCD (junhyukso/SCD)": "they need "
            "their own transformers pin (4.47) in the process; run them side by side on tiny-ar with "
            "scripts/ar_image_official_peers.py (checkouts given by path; see docs/benchmarks/ar-image.md)",
            "official LANTERN / LANTERN++ (jadohu/LANTERN)": "scripts for LlamaGen/Anole hub checkpoints with "
            "their trained drafters on CUDA; no hub and no GPU here",
        },
        "notes": [
            "target_calls: sequential target calls for the timed batch (the prefill counts as one); "
            "step_compression = tokens generated / target calls; a CFG call evaluates 2 rows (target_evals).",
            "quality.token_two_sample: per-position chi-square homogeneity of the arm's tokens against the "
            "baseline's on independent seeds, Bonferroni over positions; exact arms must pass, relaxed "
            "arms (exact: false, gsd) may fail: that is their quality loss.",
            "quality.same_seed: the arm and plain decoding (and, for gsd, mc-sjd) on the same seeds: fraction of "
            "differing tokens and PSNR of the images; exact arms give the floor (different use of the random "
            "stream). relaxed_tv: mean per-token TV budget spent by a relaxed acceptance test (top level: the "
            "timed images; quality.relaxed_tv: the quality batch, chunk means weighted by images).",
            "model.token_entropy: the sampling law (after CFG and warpers) along baseline samples.",
            "quality.step_compression_per_image: tokens / target calls of each image (the calls until its own "
            "row finished), averaged over the quality set; step_compression_per_chunk: the chunk waits for its slowest row.",
            "tv_budget_mean (lantern, lantern++): neighbour mass moved per verified draft (lantern++ trees: per "
            "tested candidate).",
        ],
    }
