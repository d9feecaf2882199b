"""The long-video cost benchmark: JSON contract, forced acceptance 1, exact outputs (tiny sizes)."""

from __future__ import annotations

import json

from diffspec.bench.mm_long_video import run_mm_long_video


def test_long_video_cost_bench_json(tmp_path):
    out = tmp_path / "mm.json"
    doc = run_mm_long_video(frames=4, side=56, hidden=64, layers=2, new_tokens=8, k=3, repeats=1, warmup=0, out=out)
    assert json.loads(out.read_text())["runs"][0] == doc["runs"][0]
    assert doc["machine"]["device_type"] == "cpu" and doc["model"]["weights"] == "random"
    assert doc["workload"]["visual_tokens"] == 2 * 4 * 4 // 4
    runs = {r["method"]: r for r in doc["runs"]}
    assert runs["baseline"]["speedup_vs_baseline"] == 1.0 and len(runs) == 5
    assert doc["workload"]["target_prefill_s"]["n"] == 1 and "after_prefill_speedup" in runs["self-draft (sparse KV)"]
    for name, r in runs.items():
        assert r["quality"]["exact"] is True and r["latency_s"]["n"] == 1
        if name != "baseline":
            assert r["acceptance_rate"] == 1.0 and r["draft_ms_per_step"] > 0
            assert r["target_calls"] == 1 + 2  # prefill + ceil(7 tokens / (3 + 1)) rounds
