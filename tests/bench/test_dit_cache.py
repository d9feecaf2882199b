import json

import pytest

from diffspec.bench import SUITES, run_bench
from diffspec.bench.dit_cache import DEFAULT_METHODS, full_steps_of
from diffspec.config import ForecastConfig

RUN_KEYS = {"method", "peer", "config", "latency_s", "target_calls", "target_evals", "peak_mem_gb",
            "speedup_vs_baseline", "quality"}


@pytest.mark.parametrize("model", ["tiny-flux", "tiny-dit-random"])
def test_loop_suite_writes_the_design_json_with_every_arm(tmp_path, model):
    out = tmp_path / "r.json"
    doc = run_bench("dit-cache", out=out, model=model, steps=12, repeats=2, warmup=1, show_progress=False)
    assert json.loads(out.read_text()) == doc
    assert {"suite", "created", "machine", "model", "workload", "runs"} <= set(doc)
    assert doc["workload"]["steps"] == 12 and doc["model"]["mode"] == "loop"
    runs = {r["method"]: r for r in doc["runs"]}
    assert list(runs) == ["baseline", *DEFAULT_METHODS]
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
    for peer in ("diffusers-taylorseer", "diffusers-magcache"):
        assert runs[peer]["target_evals"] < base["target_evals"], peer


def test_shipped_pipeline_suite_reports_fid_and_accuracy():
    doc = run_bench("dit-cache", model="tiny-dit", methods=["taylor", "fewer-steps"], steps=10, batch=2,
                    repeats=1, warmup=0, quality_samples=20, show_progress=False)
    assert doc["model"]["mode"] == "pipeline" and doc["workload"]["resolution"] == [32, 32]
    for r in doc["runs"]:
        q = r["quality"]
        assert q["fid"] is not None and 0 <= q["accuracy"] <= 1 and q["ssim"] is not None
    assert doc["runs"][0]["target_calls"] == 10


def test_overrides_target_one_method_or_every_method_with_the_field():
    from diffspec.bench.dit_cache import method_configs

    configs = method_configs({"order": 2, "speca.k_max": 4, "taylor.interval": 3})
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
        run_bench("dit-cache", model="tiny-flux", methods=["warp"], steps=4, show_progress=False)
    with pytest.raises(ValueError, match="repeats=0"):
        run_bench("dit-cache", model="tiny-flux", repeats=0)
