import pytest

from diffspec.bench import run_bench
from diffspec.bench.report import headline, markdown_table


def test_exact_diffusion_suite_writes_every_arm(tmp_path):
    out = tmp_path / "exact.json"
    doc = run_bench("exact-diffusion", out=out, model="tiny-dit", steps=8, quality_samples=6, repeats=1, warmup=0,
                    overrides={"lookahead": 2}, show_progress=False, solver_steps=(4,))
    assert out.exists() and doc["suite"] == "exact-diffusion"
    runs = {r["method"]: r for r in doc["runs"]}
    assert list(runs) == ["baseline", "coupling", "autospec", "coupling-forecast", "picard", "fewer-steps",
                          "ddim-4", "dpm-solver++-4"]
    assert runs["baseline"]["target_calls"] == 8 and runs["fewer-steps"]["peer"]
    assert runs["coupling"]["config"]["lookahead"] == 2 and runs["autospec"]["config"]["lookahead"] == 2
    assert runs["coupling-forecast"]["config"]["draft"] == "forecast" and runs["coupling-forecast"]["experimental"]
    for name in ("coupling", "autospec", "coupling-forecast"):
        assert runs[name]["quality"]["exact"] and "two_sample" in runs[name]["quality"]
        assert runs[name]["target_calls"] <= 9 and runs[name]["latency_s"]["n"] == 1  # ASD: +1 root call at worst
    for name in ("picard", "ddim-4", "dpm-solver++-4"):
        assert runs[name]["peer"] and not runs[name]["quality"]["exact"] and "two_sample" in runs[name]["quality"]
    assert runs["ddim-4"]["target_calls"] == 4 and runs["ddim-4"]["config"]["sampler"] == "ddim"
    assert runs["ddim-4"]["quality"]["target_evals"] == 4.0 == runs["ddim-4"]["quality"]["target_calls_per_chunk"]
    assert runs["picard"]["target_evals"] >= runs["picard"]["target_calls"]
    assert "| `coupling` | 8 |" in markdown_table(doc) and "| `ddim-4` (peer) | 4 |" in markdown_table(doc)


def test_a_steps_sweep_groups_arms_and_measures_quality_where_asked():
    doc = run_bench("exact-diffusion", model="tiny-dit", steps="6,10", quality_steps=[10], quality_samples=4,
                    repeats=1, warmup=0, methods=["coupling", "ddim"], solver_steps=(3,), show_progress=False,
                    quality_methods=["ddim"])
    got = [(r["method"], r["steps"], r["quality"]["fid"] is not None) for r in doc["runs"]]
    assert got == [("baseline", 6, False), ("coupling", 6, False),
                   ("baseline", 10, True), ("coupling", 10, False), ("ddim-3", 10, True)]
    assert doc["workload"]["steps"] == [6, 10] and doc["workload"]["quality_steps"] == [10]
    assert [r["target_calls"] for r in doc["runs"] if r["method"] == "baseline"] == [6, 10]
    assert "6,10 steps" in headline(doc) and "loaded shared" in doc["machine"]["load"]


def test_bad_arguments():
    with pytest.raises(ValueError, match="unknown method"):
        run_bench("exact-diffusion", methods=["taylor"], steps=4, quality_samples=4)
    with pytest.raises(ValueError, match="no method config has this field"):
        run_bench("exact-diffusion", overrides={"interval": 3}, steps=4, quality_samples=4)
    with pytest.raises(ValueError, match="each step count must be >= 2"):
        run_bench("exact-diffusion", steps="50,1", quality_samples=4)


def test_a_dit_architecture_name_runs_on_random_weights():
    """``--model dit-xl-2-256`` (here its tiny sibling): a random-weight DiTPipeline, marked as such."""
    doc = run_bench("exact-diffusion", model="tiny-dit-random", steps=4, quality_samples=2, repeats=1, warmup=0,
                    methods=["coupling"], show_progress=False)
    assert doc["model"]["weights"].startswith("random") and doc["model"]["transformer"] == "DiTTransformer2DModel"
    assert [r["method"] for r in doc["runs"]] == ["baseline", "coupling"] and doc["compile"] == {"mode": "none"}
