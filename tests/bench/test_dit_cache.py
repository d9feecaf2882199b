import json
import math

import pytest
import torch
from torch import nn

from diffspec.bench import SUITES, run_bench
from diffspec.bench.cache_dit_peer import BLOCK_LAYOUTS, CACHE_DIT_PEERS, block_layout
from diffspec.bench.dit_cache import DEFAULT_METHODS, build_arms, full_steps_of, make_workload
from diffspec.bench.peers import peer_cache_config, taylorseer_full_steps
from diffspec.config import ForecastConfig


def _cache_dit_installed() -> bool:
    try:
        import cache_dit  # noqa: F401
    except ImportError:
        return False
    return True


RUN_KEYS = {"method", "peer", "config", "latency_s", "target_calls", "target_evals", "peak_mem_gb",
            "speedup_vs_baseline", "quality"}


@pytest.mark.parametrize("model", ["tiny-flux-random", "tiny-dit-random"])
def test_loop_suite_writes_the_benchmark_json_with_every_arm(tmp_path, model):
    out = tmp_path / "r.json"
    doc = run_bench("dit-cache", out=out, model=model, steps=12, repeats=2, warmup=1, show_progress=False)
    assert json.loads(out.read_text()) == doc
    assert {"suite", "created", "machine", "model", "workload", "runs"} <= set(doc)
    assert doc["workload"]["steps"] == 12 and doc["model"]["mode"] == "loop"
    runs = {r["method"]: r for r in doc["runs"]}
    skipped = {s["method"] for s in doc.get("skipped", [])}
    assert skipped == (set() if _cache_dit_installed() else set(CACHE_DIT_PEERS))
    assert list(runs) == ["baseline", *(m for m in DEFAULT_METHODS if m not in skipped)]
    for r in runs.values():
        assert RUN_KEYS <= set(r) and r["latency_s"]["n"] == 2
        assert r["peer"] == (r["method"] not in ("baseline", "taylor", "speca"))
    base = runs["baseline"]
    assert base["quality"]["exact"] and base["quality"]["psnr"] == 100.0 and base["speedup_vs_baseline"] == 1.0
    assert base["target_calls"] == 12
    k = full_steps_of(ForecastConfig(), 12)
    assert runs["taylor"]["target_calls"] == runs["taylor"]["stats"]["full_steps"] == k
    assert runs["taylor"]["transformer_calls"] == 12
    assert runs["fewer-steps"]["target_calls"] == runs["fewer-steps"]["transformer_calls"] == k
    assert not runs["taylor"]["quality"]["exact"] and runs["taylor"]["quality"]["psnr"] < 100
    assert runs["diffusers-magcache"]["config"]["mag_ratios"]  # calibrated in process
    speca = runs["speca"]
    assert speca["stats"]["extra"]["checks"] > 0 and speca["config"]["tau0"] is not None  # fallback thresholds
    assert 0 < speca["target_evals"] < base["target_evals"]
    # schedule-driven peers really skip work (FirstBlockCache's gate rarely opens on random weights)
    for peer in ("diffusers-taylorseer", "diffusers-taylorseer-tuned", "diffusers-magcache"):
        assert runs[peer]["target_evals"] < base["target_evals"], peer
    for peer in set(CACHE_DIT_PEERS) - skipped:  # DBCache's gate stays shut on these random weights
        assert runs[peer]["stats"]["executed_steps"] == 12 and runs[peer]["peer"], peer


def test_shipped_pipeline_suite_reports_fid_and_accuracy():
    doc = run_bench("dit-cache", model="tiny-dit", methods=["taylor", "fewer-steps"], steps=10, batch=2,
                    repeats=1, warmup=0, quality_samples=20, show_progress=False)
    assert doc["model"]["mode"] == "pipeline" and doc["workload"]["resolution"] == [32, 32]
    for r in doc["runs"]:
        q = r["quality"]
        assert q["fid"] is not None and 0 <= q["accuracy"] <= 1 and q["ssim"] is not None
        assert q["accuracy_delta_se"] >= 0 and 0 <= q["class_agreement"] <= 1
    base = next(r for r in doc["runs"] if r["method"] == "baseline")["quality"]
    assert base["accuracy_delta"] == 0 and base["class_agreement"] == 1  # paired with itself
    assert doc["runs"][0]["target_calls"] == 10


def test_overrides_target_one_method_or_every_method_with_the_field():
    from diffspec.bench.dit_cache import method_configs

    configs = method_configs({"order": 2, "speca.k_max": 4, "speca.k_min": 2, "taylor.interval": 3})
    assert configs["taylor"].order == configs["speca"].order == 2
    assert configs["speca"].k_max == 4 and configs["taylor"].interval == 3
    with pytest.raises(ValueError, match="--set bogus"):
        method_configs({"bogus": 1})
    with pytest.raises(ValueError, match="no field"):
        method_configs({"taylor.k_max": 4})


def test_bad_arguments_are_value_errors():
    assert "dit-cache" in SUITES
    with pytest.raises(ValueError, match="unknown benchmark suite"):
        run_bench("nope")
    with pytest.raises(ValueError, match="meant for a GPU"):
        run_bench("dit-cache", model="flux-1024", device="cpu")
    with pytest.raises(ValueError, match="unknown method"):
        run_bench("dit-cache", model="tiny-flux-random", methods=["warp"], steps=4, show_progress=False)
    with pytest.raises(ValueError, match="repeats=0"):
        run_bench("dit-cache", model="tiny-flux-random", repeats=0)


# The peers beside diffusers' defaults: cache-dit's DBCache (alone and with its TaylorSeer calibrator)
# and diffusers' TaylorSeer at taylor's schedule.

NEW_PEERS = [*CACHE_DIT_PEERS, "diffusers-taylorseer-tuned"]


def _check_new_peers(doc, steps):
    runs = {r["method"]: r for r in doc["runs"]}
    assert list(runs) == ["baseline", *NEW_PEERS]
    base = runs["baseline"]
    assert base["target_calls"] == steps
    for name in NEW_PEERS:
        r = runs[name]
        assert r["peer"] is True, name
        assert 0 < r["target_calls"] < base["target_calls"], name
        assert r["target_evals"] < base["target_evals"], name
        assert math.isfinite(r["quality"]["psnr"]) and r["quality"]["psnr"] < 100, name
    for name in CACHE_DIT_PEERS:
        stats = runs[name]["stats"]  # cache-dit's own count (cache_dit.summary) agrees with ours
        assert stats["executed_steps"] == steps and stats["cached_steps"] == steps - runs[name]["target_calls"]
    tuned = runs["diffusers-taylorseer-tuned"]["config"]
    assert (tuned["cache_interval"], tuned["max_order"], tuned["disable_cache_before_step"]) == (5, 1, 3)
    assert runs["cache-dit-dbcache-taylorseer"]["config"]["calibrator_config"]["taylorseer_order"] == 1
    assert runs["cache-dit-dbcache"]["config"]["calibrator_config"] is None
    return runs


def test_new_peers_skip_work_on_a_tiny_loop_model():
    pytest.importorskip("cache_dit")
    doc = run_bench("dit-cache", model="tiny-pixart", methods=NEW_PEERS, steps=12, repeats=1, warmup=0,
                    show_progress=False)
    runs = _check_new_peers(doc, 12)
    config = runs["cache-dit-dbcache"]["config"]
    assert config["cache_config"]["residual_diff_threshold"] == 0.08  # cache-dit's default gate
    assert config["cache_config"]["Fn_compute_blocks"] == 1 and "Fn_compute_blocks" in config["changed_from_defaults"]
    assert config["adapter"]["forward_pattern"] == "Pattern_3" and "transformer-only" in config["adapter"]["mode"]


def test_new_peers_skip_work_on_the_tiny_dit_pipeline():
    pytest.importorskip("cache_dit")
    doc = run_bench("dit-cache", model="tiny-dit", methods=NEW_PEERS, steps=20, batch=2, repeats=1, warmup=0,
                    quality_samples=2, show_progress=False)
    runs = _check_new_peers(doc, 20)
    assert runs["cache-dit-dbcache"]["config"]["adapter"]["mode"].startswith("pipeline")


@pytest.mark.parametrize("model", ["tiny-pixart", "tiny-dit-random", "tiny-flux-random", "tiny-dit"])
def test_cache_dit_detach_restores_the_uncached_model_bit_for_bit(model):
    pytest.importorskip("cache_dit")
    w = make_workload(model, device=torch.device("cpu"), dtype=torch.float32, steps=10, batch=1, guidance_scale=4.0)
    t = w.transformer
    pipe_cls = type(getattr(w, "pipe", None))
    call_before = vars(pipe_cls).get("__call__")
    attrs, keys = set(vars(t)), list(t.state_dict())
    with torch.inference_mode():
        before = w.generate(w.seeds)
        for arm in build_arms(w, list(CACHE_DIT_PEERS), {})[1:]:
            arm.enable()
            try:
                first, second = arm.run(w.seeds), arm.run(w.seeds)
            finally:
                arm.disable()
            assert torch.isfinite(first).all()
            assert torch.equal(first, second)  # fresh caches per generation: a rerun repeats exactly
            assert torch.equal(w.generate(w.seeds), before), arm.name
            # no patched forward or _norm1_emb left, block lists back in their registration order
            assert set(vars(t)) == attrs and list(t.state_dict()) == keys
            assert vars(pipe_cls).get("__call__") is call_before


def test_a_model_cache_dit_cannot_cache_is_skipped_with_the_reason():
    pytest.importorskip("cache_dit")

    class Bare:
        name, steps, transformer = "my-unet", 10, nn.Linear(2, 2)

    with pytest.raises(ValueError, match="my-unet.*Linear.*supported transformers: DiTTransformer2DModel"):
        block_layout(Bare.transformer, Bare.name)
    skipped = []
    arms = build_arms(Bare(), ["cache-dit-dbcache"], {}, skipped)
    assert [a.name for a in arms] == ["baseline"]
    assert skipped[0]["method"] == "cache-dit-dbcache" and "my-unet" in skipped[0]["reason"]
    with pytest.raises(ValueError, match="my-unet"):
        build_arms(Bare(), ["cache-dit-dbcache"], {})


def test_every_image_family_the_bench_builds_has_a_cache_dit_layout():
    from diffspec.testing.random_transformers import SPECS

    names = {"dit": "DiTTransformer2DModel", "pixart": "PixArtTransformer2DModel", "sd3": "SD3Transformer2DModel",
             "flux": "FluxTransformer2DModel", "sana": "SanaTransformer2DModel"}
    assert {s.family for s in SPECS.values()} >= set(names)
    assert set(names.values()) <= set(BLOCK_LAYOUTS)


def test_tuned_taylorseer_follows_taylors_schedule():
    config = peer_cache_config("diffusers-taylorseer-tuned", 50)
    assert (config.cache_interval, config.max_order, config.disable_cache_before_step) == (5, 1, 3)
    assert taylorseer_full_steps(config, 50) == full_steps_of(ForecastConfig(), 50) == 13
    custom = ForecastConfig(interval=3, order=2, warmup=4)
    config = peer_cache_config("diffusers-taylorseer-tuned", 50, forecast=custom)
    assert (config.cache_interval, config.max_order, config.disable_cache_before_step) == (3, 2, 4)
    default = peer_cache_config("diffusers-taylorseer", 50)
    assert taylorseer_full_steps(default, 50) == 13  # diffusers' defaults already run this schedule


@pytest.mark.parametrize("model", ["tiny-flux-random", "tiny-flux2", "tiny-qwenimage", "tiny-wan", "tiny-dit-random"])
def test_loop_workload_integrates_the_whole_sigma_range(model, monkeypatch):
    """The loop's Euler steps add up to one unit of sigma whatever the family's timestep units (sigma, 1000 * sigma
    or DDPM's 0..999): a constant prediction v moves the latents by -v."""
    workload = make_workload(model, device=torch.device("cpu"), dtype=torch.float32, steps=8, batch=1,
                             guidance_scale=1.0)
    monkeypatch.setattr(workload, "call", lambda transformer, x, t: torch.ones_like(x))
    moved = workload.generate([0]) - workload.latents.float()
    assert torch.allclose(moved, torch.full_like(moved, -1.0), atol=2e-3), moved.flatten()[:3]


@pytest.mark.parametrize("model,audio", [("tiny-stableaudio", True), ("tiny-acestep", True), ("tiny-wan", False)])
def test_loop_workload_reports_no_pixel_resolution_for_audio(model, audio):
    """1-D audio latents (B, C, T) have no image size: the workload reports their shape, no resolution."""
    workload = make_workload(model, device=torch.device("cpu"), dtype=torch.float32, steps=2, batch=1,
                             guidance_scale=1.0)
    described = workload.describe()
    assert described["latent_shape"] == list(workload.latents.shape)
    assert (described["resolution"] is None) == audio and (described["latent_hw"] is None) == audio


def test_controlnet_workload_counts_controlnet_calls_per_arm(tmp_path):
    """tiny-flux-controlnet: a FLUX ControlNet runs before the transformer at every step. ``taylor`` forecasts its
    outputs on its draft steps (as many ControlNet calls as full steps), ``speca`` before its unchecked drafts, the
    reference arm and the peers run it every step; the arm is only known on a ControlNet workload."""
    methods = ["taylor", "speca", "taylor-controlnet-every-step", "diffusers-taylorseer", "fewer-steps"]
    doc = run_bench("dit-cache", out=tmp_path / "r.json", model="tiny-flux-controlnet", steps=12, repeats=1,
                    warmup=0, methods=methods, show_progress=False)
    runs = {r["method"]: r for r in doc["runs"]}
    k = full_steps_of(ForecastConfig(), 12)
    assert doc["workload"]["controlnet"]["double_blocks"] == 1 and runs["baseline"]["controlnet_calls"] == 12
    assert runs["taylor"]["controlnet_calls"] == runs["taylor"]["target_calls"] == k
    assert runs["taylor"]["config"]["controlnet"] == "forecast"
    reference = runs["taylor-controlnet-every-step"]
    assert reference["controlnet_calls"] == 12 and reference["config"]["controlnet"] == "every step"
    assert reference["target_calls"] == k and not reference["peer"]
    assert runs["diffusers-taylorseer"]["controlnet_calls"] == 12 and runs["fewer-steps"]["controlnet_calls"] == k
    # the gated speca: the ControlNet runs on full and checked steps, and is forecast before its unchecked drafts
    speca = runs["speca"]
    assert speca["stats"]["extra"]["controlnet_forecast"] == 12 - speca["controlnet_calls"] > 0
    assert 40 < runs["taylor"]["quality"]["psnr"] < 100 and 40 < reference["quality"]["psnr"] < 100
    with pytest.raises(ValueError, match="unknown method"):
        run_bench("dit-cache", model="tiny-flux-random", steps=4, repeats=1, methods=["taylor-controlnet-every-step"],
                  show_progress=False)


def test_a_text_pipeline_folder_is_a_pipeline_workload(tmp_path):
    """A text-conditioned pipeline folder (tiny random-weight FLUX) runs in the pipeline mode: prompts cycle by seed,
    quality is agreement with the full run (no classifier: no FID or accuracy)."""
    from diffspec.testing.tiny_pipelines import save_tiny_pipeline

    folder = save_tiny_pipeline("tiny-flux-random", tmp_path / "flux")
    doc = run_bench("dit-cache", model=str(folder), steps=4, batch=1, repeats=1, warmup=0, quality_samples=2,
                    methods=["taylor", "fewer-steps"], overrides={"warmup": 1, "interval": 2},
                    call_kwargs={"height": 16, "width": 24}, show_progress=False)
    runs = {r["method"]: r for r in doc["runs"]}
    assert doc["model"]["mode"] == "pipeline" and doc["workload"]["pipeline"] == "FluxPipeline"
    assert doc["workload"]["prompts"][0].startswith("a red fox") and doc["workload"]["resolution"] == [16, 24]
    taylor = runs["taylor"]
    assert taylor["target_calls"] < 4 and 20 < taylor["quality"]["psnr"] < 100 and taylor["quality"]["fid"] is None


def test_text_workload_flags_are_refused_where_they_do_not_apply(capsys):
    from diffspec.cli import main

    assert main(["bench", "dit-cache", "--model", "tiny-flux-random", "--height", "16"]) == 2
    assert "text-conditioned pipeline folders" in capsys.readouterr().err
    assert main(["bench", "ar-image", "--height", "16"]) == 2
    assert "apply to the dit-cache suite" in capsys.readouterr().err


def test_a_judged_model_folder_is_benchmarked_on_its_prompts_at_its_call_defaults(tmp_path):
    """A folder whose diffspec_model.json names the scene judge: held-out prompted-scene prompts, the folder's call
    defaults (32x32 here) and steps, and the judge's prompt accuracy, FID and paired accuracy change per arm."""
    from diffspec.bench.dit_cache import default_steps
    from diffspec.data import parse_prompt
    from diffspec.testing.tiny_pipelines import save_tiny_pipeline

    folder = save_tiny_pipeline("tiny-flux-random", tmp_path / "flux")
    settings = {"call_defaults": {"height": 32, "width": 32, "max_sequence_length": 16}, "steps": 5,
                "judge": "prompted-scenes"}
    (folder / "diffspec_model.json").write_text(json.dumps(settings))
    assert default_steps(str(folder)) == 5
    doc = run_bench("dit-cache", model=str(folder), batch=2, repeats=1, warmup=0, quality_samples=4,
                    methods=["taylor"], overrides={"warmup": 1, "interval": 2}, show_progress=False)
    assert doc["workload"]["steps"] == 5 and doc["workload"]["resolution"] == [32, 32]
    assert all(parse_prompt(p) for p in doc["workload"]["prompts"]) and "1000" in doc["workload"]["prompt_source"]
    quality = {r["method"]: r["quality"] for r in doc["runs"]}
    assert quality["baseline"]["accuracy_delta"] == 0.0 and quality["baseline"]["fid"] > 0
    assert 0.0 <= quality["taylor"]["accuracy"] <= 1.0 and "accuracy_delta_se" in quality["taylor"]
