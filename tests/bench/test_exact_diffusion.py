import pytest

from diffspec.bench import run_bench
from diffspec.bench.report import markdown_table


def test_exact_diffusion_suite_writes_every_arm(tmp_path):
    out = tmp_path / "exact.json"
    doc = run_bench("exact-diffusion", out=out, model="tiny-dit", steps=8, quality_samples=6, repeats=1, warmup=0,
                    overrides={"lookahead": 2}, show_progress=False)
    assert out.exists() and doc["suite"] == "exact-diffusion"
    runs = {r["method"]: r for r in doc["runs"]}
    assert list(runs) == ["baseline", "coupling", "autospec", "fewer-steps"]
    assert runs["baseline"]["target_calls"] == 8 and runs["fewer-steps"]["peer"]
    assert runs["coupling"]["config"]["lookahead"] == 2 and runs["autospec"]["config"]["lookahead"] == 2
    for name in ("coupling", "autospec"):
        assert runs[name]["quality"]["exact"] and "two_sample" in runs[name]["quality"]
        assert runs[name]["target_calls"] <= 9 and runs[name]["latency_s"]["n"] == 1  # ASD: +1 root call at worst
    assert "| `coupling` |" in markdown_table(doc)


def test_bad_arguments():
    with pytest.raises(ValueError, match="unknown method"):
        run_bench("exact-diffusion", methods=["taylor"], steps=4, quality_samples=4)
    with pytest.raises(ValueError, match="no method config has this field"):
        run_bench("exact-diffusion", overrides={"interval": 3}, steps=4, quality_samples=4)
