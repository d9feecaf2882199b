"""`exact-diffusion` on a judged text-to-image FluxPipeline folder (the form `tiny-flux` runs in)."""

import json

import pytest

from diffspec.bench import run_bench
from diffspec.bench.dit_cache_workloads import judged_prompts
from diffspec.bench.exact_text import TextWorkload
from diffspec.bench.report import headline, markdown_table
from diffspec.testing.tiny_pipelines import save_tiny_pipeline

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py

SETTINGS = {"call_defaults": {"height": 32, "width": 32, "max_sequence_length": 16}, "steps": 6,
            "judge": "prompted-scenes"}


@pytest.fixture(scope="module")
def flux_folder(tmp_path_factory):
    """A random tiny FluxPipeline folder with tiny-flux's diffspec_model.json (6 steps)."""
    folder = save_tiny_pipeline("tiny-flux-random", tmp_path_factory.mktemp("exact-text") / "flux")
    (folder / "diffspec_model.json").write_text(json.dumps(SETTINGS))
    return folder


def test_a_judged_flux_folder_runs_every_arm_it_supports(flux_folder, tmp_path, monkeypatch):
    asked = []
    prompts_for = TextWorkload.prompts_for
    monkeypatch.setattr(TextWorkload, "prompts_for", lambda self, seeds: asked.extend(prompts_for(self, seeds))
                        or prompts_for(self, seeds))
    out = tmp_path / "exact-text.json"
    doc = run_bench("exact-diffusion", out=out, model=str(flux_folder), quality_samples=4, repeats=1, warmup=0,
                    overrides={"lookahead": 2}, show_progress=False)
    assert json.loads(out.read_text())["runs"] == doc["runs"]
    runs = {r["method"]: r for r in doc["runs"]}
    assert list(runs) == ["baseline", "coupling", "coupling-forecast", "fewer-steps"]
    skipped = {s["method"]: s["reason"] for s in doc["skipped"]}
    assert set(skipped) == {"autospec", "picard", "ddim", "dpm-solver++"} and "ASD" in skipped["autospec"]
    assert "DiTPipeline" in skipped["picard"]
    held_out = judged_prompts(1000)  # the suite's prompt set (not a prefix of judged_prompts(10))
    w = doc["workload"]
    assert w["steps"] == 6 and w["scheduler"] == "FlowMatchEulerDiscreteScheduler" and w["pipeline"] == "FluxPipeline"
    assert w["scheduler_config"]["stochastic_sampling"] is True and w["call_kwargs"] == SETTINGS["call_defaults"]
    assert w["judge"] == "prompted-scenes" and w["prompts"] == held_out[:10] and w["guidance_scale"] is None
    assert runs["baseline"]["target_calls"] == 6 and runs["baseline"]["config"]["sampler"].startswith("FlowMatch")
    coupling = runs["coupling"]
    assert coupling["target_calls"] <= 6 and coupling["config"]["lookahead"] == 2
    assert "acceptance_rate" in coupling and coupling["acceptance_by_depth"] is not None
    assert coupling["target_evals"] >= coupling["target_calls"]
    for name, run in runs.items():
        q = run["quality"]
        assert {"fid", "accuracy", "psnr", "ssim", "lpips", "exact", "target_evals"} <= set(q), name
        assert q["fid"] > 0 and 0 <= q["accuracy"] <= 1, name
        assert ("two_sample" in q) == (name != "baseline") and q["exact"] == (name != "fewer-steps"), name
    assert coupling["quality"]["two_sample"]["n"] == [4, 4]
    assert asked and set(asked) <= set(held_out) and asked[0] == held_out[0]  # seed 0 takes prompt 0
    assert "6 steps" in headline(doc) and "| `coupling` |" in markdown_table(doc)


def test_other_pipelines_are_refused_naming_what_is_supported(flux_folder, tmp_path):
    unjudged = save_tiny_pipeline("tiny-flux-random", tmp_path / "unjudged")
    with pytest.raises(ValueError, match="FluxPipeline folder whose diffspec_model.json names the judge "
                                         "'prompted-scenes'.*is a FluxPipeline with judge None"):
        run_bench("exact-diffusion", model=str(unjudged), quality_samples=2, repeats=1)
    other = save_tiny_pipeline("tiny-chroma", tmp_path / "chroma")
    (other / "diffspec_model.json").write_text(json.dumps(SETTINGS))
    with pytest.raises(ValueError, match="class-conditional DiTPipeline.*is a ChromaPipeline$"):
        run_bench("exact-diffusion", model=str(other), quality_samples=2, repeats=1)


def test_compiled_flux_arms_pad_single_rows(flux_folder):
    """Under --compile every arm calls the same compiled transformer: one row per drafted state (no CFG rows)."""
    doc = run_bench("exact-diffusion", model=str(flux_folder), quality_samples=2, repeats=1, warmup=1,
                    methods=["coupling"], overrides={"lookahead": 2, "max_lookahead": 2}, compile="default",
                    compile_backend="eager", show_progress=False)
    assert doc["compile"]["row_buckets"] == [1, 2]
    runs = {r["method"]: r for r in doc["runs"]}
    assert runs["baseline"]["rows"] == {"buckets": [1], "padding_fraction": 0.0}
    assert all(r["compiled_graphs"]["after_warmup"] == 0 for r in runs.values())
    assert runs["coupling"]["quality"]["two_sample"]["n"] == [2, 2]
