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
