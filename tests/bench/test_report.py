"""The docs' benchmark tables are what ``python -m diffspec.bench.report`` makes from the committed JSON."""

import json
from pathlib import Path

from diffspec.bench.report import main, noisy_arms, render_page, weights

ROOT = Path(__file__).resolve().parents[2]


def _tiny_doc() -> dict:
    run = {"peer": False, "target_calls": 50, "target_evals": 50.0, "speedup_vs_baseline": 1.0,
           "quality": {"psnr": None, "ssim": None, "fid": None, "accuracy": None}}
    return {"suite": "dit-cache", "machine": {"device": "CPU (x86_64, 1 threads)"},
            "model": {"name": "tiny", "dtype": "float32", "weights": "trained"},
            "workload": {"steps": 50, "batch": 1},
            "runs": [{**run, "method": "baseline", "latency_s": {"median": 1.0, "min": 0.95, "max": 1.05, "n": 3}},
                     {**run, "method": "taylor", "target_calls": 13, "target_evals": 13.0,
                      "speedup_vs_baseline": 3.0, "latency_s": {"median": 0.33, "min": 0.3, "max": 0.5, "n": 3}}]}


def test_committed_docs_tables_match_the_committed_json():
    assert main(["--check", "--docs", str(ROOT / "docs"), "--results", str(ROOT / "benchmarks/results")]) == 0


def test_docs_pages_hold_generated_tables():
    pages = "".join(p.read_text() for p in (ROOT / "docs").rglob("*.md"))
    assert pages.count("<!-- report:") >= 5


def test_a_block_gets_source_machine_weights_table_and_noisy_arms(tmp_path):
    (tmp_path / "tiny.json").write_text(json.dumps(_tiny_doc()))
    page = "intro\n<!-- report:tiny -->\nstale\n<!-- /report:tiny -->\nafter\n"
    out = render_page(page, tmp_path)
    assert out.startswith("intro\n<!-- report:tiny -->\nSource: `benchmarks/results/tiny.json`")
    assert "CPU (x86_64, 1 threads)" in out and "weights: trained" in out
    assert "| `taylor` | 0.330 | 3.00x | 13/13 | 13.0 |" in out
    assert "`taylor` (61%)" in out and "`baseline`" not in out.split("Noisy")[1]
    assert out.endswith("<!-- /report:tiny -->\nafter\n")
    assert render_page(out, tmp_path) == out


def test_check_exits_1_on_a_stale_page_and_writing_fixes_it(tmp_path, capsys):
    (tmp_path / "tiny.json").write_text(json.dumps(_tiny_doc()))
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "page.md").write_text("<!-- report:tiny -->\nold table\n<!-- /report:tiny -->\n")
    args = ["--docs", str(docs), "--results", str(tmp_path)]
    assert main([*args, "--check"]) == 1
    assert "page.md: out of date" in capsys.readouterr().out
    assert main(args) == 0
    assert main([*args, "--check"]) == 0


def test_noisy_arms_and_weights_read_the_json_as_recorded():
    assert noisy_arms(_tiny_doc()) == [("taylor", 0.606)]
    assert weights(_tiny_doc()) == "trained"
    assert weights({"model": {"weights": "random (speed does not depend on weight values)"}}) == "random"
    assert weights({"model": {}}) == "not recorded"


def _ar_doc(offset: int, arm_fid: float, base_fid: float) -> dict:
    def run(method, compression, fid, accuracy):
        return {"method": method, "quality": {"step_compression_per_image": compression, "fid": fid,
                                              "accuracy": accuracy, "exact": method == "mc-sjd",
                                              "token_two_sample": {"passed": True, "bonferroni_p": 1.0}}}
    return {"suite": "ar-image", "machine": {"device": "CPU"}, "model": {"name": "tiny-ar", "weights": "trained"},
            "workload": {"quality_samples": 100, "seed_offset": offset},
            "runs": [run("baseline", 1.0, base_fid, 0.5), run("gsd", 7.0 + offset / 1e6, arm_fid, 0.49)]}


def test_a_seed_set_block_reads_every_ratio_inside_its_own_file(tmp_path):
    (tmp_path / "ar-seeds100k.json").write_text(json.dumps(_ar_doc(100_000, 110.0, 100.0)))
    (tmp_path / "ar-seeds20k.json").write_text(json.dumps(_ar_doc(20_000, 90.0, 100.0)))
    page = "<!-- report:ar-seeds* -->\n<!-- /report:ar-seeds* -->\n"
    out = render_page(page, tmp_path)
    assert "Sources: `benchmarks/results/ar-seeds*.json` (2 files); tiny-ar (trained) on CPU." in out
    # sets in numeric order; the rises are +10% and -10% against each file's own baseline, mean 0 ± 10
    assert "| `gsd` (relaxed) | 20k / 100k | 100 | 7.02 / 7.10 | 7.06 ± 0.06x | 90.00 (100.00) / 110.00 (100.00) | " \
           "+0.0 ± 10.0 | -1.0 | 2/2 pass | - |" in out
    assert render_page(out, tmp_path) == out


def test_json_outside_the_bench_contract_gets_its_own_table():
    from diffspec.bench.report import markdown_table, shape

    compiled = {"like_with_like": {"baseline": {
        "eager_latency_s": 2.0, "compiled_latency_s": 1.0, "speedup_vs_baseline_eager": 1.0,
        "speedup_vs_baseline_compiled": 1.0, "target_calls_compiled": 100, "compiled_graphs_after_warmup": 0}}}
    assert shape(compiled) == "exact-diffusion-compile"
    assert "| `baseline` | 2.00 | 1.00 | 1.00 | 1.00 | 100 | 0 |" in markdown_table(compiled)
    assert shape({"script": "scripts/speca_schedule_holdout.py", "rows": []}) == "speca-schedule-holdout"
    assert weights({"model": "tiny-dit"}) == "trained (shipped)"
