"""The multimodal-cost suite: JSON fields on the tiny size, refusals and bad values, projection arithmetic."""

from __future__ import annotations

import json

import pytest
import torch

from diffspec.bench import run_bench
from diffspec.bench.mm_cost import run_multimodal_cost
from diffspec.bench.mm_cost_project import acceptance_sources, expected_accepted, project
from diffspec.cli import main

SMALL = {"contexts": "40", "batches": "1,2", "ks": "1,3", "new_tokens": "8,16"}
DRAFTERS = {"self-draft (sparse KV)", "self-draft (sparse KV + half layers)", "compressed-draft",
            "draft (small drafter, full context)"}


@pytest.fixture(scope="module")
def tiny_doc(tmp_path_factory):
    torch.manual_seed(0)
    out = tmp_path_factory.mktemp("mmcost") / "cost.json"
    doc = run_bench("multimodal-cost", model="tiny", device="cpu", repeats=1, warmup=0, overrides=dict(SMALL), out=out)
    assert json.loads(out.read_text()) == doc
    assert "errors" not in doc and "skipped" not in doc and "partial" not in doc
    return doc


def test_tiny_suite_json_fields(tiny_doc):
    doc = tiny_doc
    assert doc["suite"] == "multimodal-cost" and doc["machine"]["device_type"] == "cpu"
    assert doc["model"]["models"]["tiny"]["target"]["lm"] == "tiny-lm" and "random" in doc["model"]["weights"]
    assert doc["workload"]["ks"] == [1, 3] and doc["workload"]["tokens"] == [8, 16]
    (pre,) = doc["prefill"]
    assert pre["prompt_tokens"] == 40 + doc["workload"]["text_tokens"]
    assert pre["compressed_draft_kept_tokens"] == 32 + 10  # image context: image_keep 0.25 of 40 visual tokens
    for key in ("target_prefill_ms", "target_prefill_with_probe_ms"):
        assert pre[key]["median"] > 0 and pre[key]["n"] == 1
    assert set(pre["drafter_prefill_ms"]) == {"compressed-draft", "draft (small drafter, full context)"}
    by = {(r["method"], r["batch"]): r for r in doc["runs"]}
    assert set(by) == {(m, b) for m in DRAFTERS | {"target verify"} for b in (1, 2)}
    for b in (1, 2):
        v = by[("target verify", b)]
        assert set(v["call_ms"]) == {"0", "1", "3"} and set(v["cost_ratio"]) == {"1", "3"}
        assert v["cost_ratio"]["3"] == pytest.approx(v["call_ms"]["3"]["median"] / v["call_ms"]["0"]["median"],
                                                     abs=1e-3)
        for m in DRAFTERS:
            r = by[(m, b)]
            assert r["draft_round_ms"]["3"]["median"] > 0
            assert r["draft_ms_per_token"]["3"] == pytest.approx(r["draft_round_ms"]["3"]["median"] / 3, abs=1e-3)


def test_tiny_suite_projection_is_labelled(tiny_doc):
    proj = tiny_doc["projection"]
    assert proj["label"].startswith("projected: cost measured here x acceptance measured on the trained pair")
    labels = {s["label"] for s in tiny_doc["acceptance_sources"]}
    assert labels == {"forced 1.0 (upper bound)", "tiny-vlm draft", "tiny-vlm text-draft"}
    assert len(proj["rows"]) == 2 * len(DRAFTERS) * len(labels) * 2  # batches x drafters x sources x N
    for row in proj["rows"]:
        assert row["label"] == "projected" and row["best_speedup"] == max(row["speedup"].values())
    assert any("no vision tower" in n for n in tiny_doc["notes"])


def test_projection_arithmetic():
    ms = {"median": 1.0, "min": 1.0, "max": 1.0, "n": 1}
    prefill = [{"model": "m", "visual_tokens": 10, "target_prefill_ms": {**ms, "median": 100.0},
                "target_prefill_with_probe_ms": {**ms, "median": 110.0},
                "drafter_prefill_ms": {"compressed-draft": {**ms, "median": 20.0}}}]
    runs = [{"model": "m", "visual_tokens": 10, "batch": 2, "method": "target verify",
             "call_ms": {"0": {**ms, "median": 10.0}, "4": {**ms, "median": 12.0}}},
            {"model": "m", "visual_tokens": 10, "batch": 2, "method": "compressed-draft",
             "draft_round_ms": {"4": {**ms, "median": 8.0}}}]
    src = [{"label": "a", "acceptance_rate": 0.5}]
    (row,) = project(prefill, runs, src, [33])["rows"]
    plain = 2 * 100 + 32 * 10
    spec = 2 * 110 + 2 * 20 + 32 / (expected_accepted(0.5, 4) + 1) * (12 + 8)
    assert row["speedup"]["4"] == pytest.approx(plain / spec, abs=1e-3)
    assert expected_accepted(1.0, 5) == 5.0 and expected_accepted(0.5, 2) == pytest.approx(0.75)


def test_acceptance_sources_given_and_committed():
    assert [s["acceptance_rate"] for s in acceptance_sources("0.6,0.9")] == [0.6, 0.9]
    committed = {s["label"]: s for s in acceptance_sources()}
    assert 0 < committed["tiny-vlm text-draft"]["acceptance_rate"] < committed["tiny-vlm draft"]["acceptance_rate"]
    assert "multimodal-tiny-vlm-cpu.json" in committed["tiny-vlm draft"]["source"]


@pytest.mark.parametrize("kwargs, field", [
    ({"model": "qwen2.5-vl-7b"}, "model"),
    ({"model": "llava-1.5-7b,tiny"}, "model"),
    ({"model": "gpt-7"}, "model"),
    ({"overrides": {"ks": "0,2"}}, "ks"),
    ({"overrides": {"ks": "128"}}, "ks"),
    ({"overrides": {"batches": "two"}}, "batches"),
    ({"overrides": {"contexts": "-5"}}, "contexts"),
    ({"overrides": {"new_tokens": "1"}}, "new_tokens"),
    ({"overrides": {"acceptance": "1.5"}}, "acceptance"),
    ({"overrides": {"acceptance_json": "/nonexistent.json"}}, "acceptance_json"),
    ({"overrides": {"time_budget_s": -1}}, "time_budget_s"),
    ({"overrides": {"visual_ratio": 2.0}}, "visual_ratio"),
    ({"overrides": {"video_keep": 0.0}}, "video_keep"),
    ({"overrides": {"bogus": 1}}, "bogus"),
    ({"repeats": 0}, "repeats"),
    ({"dtype": "int8"}, "dtype"),
])
def test_bad_values_raise_naming_the_field(kwargs, field):
    kwargs = {"model": "tiny", "device": "cpu", **kwargs}
    with pytest.raises(ValueError, match=field):
        run_multimodal_cost(**kwargs)


def test_cli_runs_the_suite(tmp_path, capsys):
    out = tmp_path / "c.json"
    rc = main(["bench", "multimodal-cost", "--model", "tiny", "--device", "cpu", "--repeats", "1", "--warmup", "0",
               "--set", "contexts=24", "--set", "batches=1", "--set", "ks=2", "--set", "new_tokens=8",
               "--set", "acceptance=0.7", "--out", str(out)])
    assert rc == 0
    doc = json.loads(out.read_text())
    assert [s["label"] for s in doc["acceptance_sources"]] == ["given 0.7"]
    assert "cost ratio" in capsys.readouterr().out
    assert main(["bench", "multimodal-cost", "--model", "qwen2.5-vl-7b", "--device", "cpu"]) == 2


def test_e2e_tiny_forced_acceptance():
    from diffspec.multimodal import loop

    saved = loop.greedy_accept
    doc = run_multimodal_cost("tiny", device="cpu", repeats=1, warmup=0,
                              overrides={"grid": False, "e2e_size": "tiny", "e2e_frames": 4, "e2e_side": 56,
                                         "e2e_new_tokens": 9, "e2e_k": 3, "e2e_rates": "1.0,0.5"})
    assert loop.greedy_accept is saved and doc["runs"] == [] and doc["model"]["name"] == "e2e only"
    e2e = doc["e2e"]
    assert e2e["label"].startswith("measured end to end at FORCED acceptance")
    assert e2e["workload"]["visual_tokens"] == 2 * 4 * 4 // 4
    runs = {r["method"]: r for r in e2e["runs"]}
    assert len(runs) == 2 + 3 * 2 and runs["baseline"]["speedup_vs_baseline"] == 1.0
    for name in ("self-draft (sparse KV)", "self-draft (sparse KV + half layers)", "compressed-draft"):
        full, half = runs[f"{name} @ forced 1"], runs[f"{name} @ forced 0.5"]
        assert full["acceptance_rate"] == 1.0 and full["target_calls"] == 1 + 2  # prefill + ceil(8 / (3 + 1))
        assert half["acceptance_rate"] < 1.0 and half["target_calls"] > full["target_calls"]


@pytest.mark.parametrize("overrides, field", [
    ({"e2e_size": "7b"}, "e2e_size"),
    ({"e2e_size": "13b"}, "e2e_size"),
    ({"e2e_size": "tiny", "e2e_rates": "0,1"}, "e2e_rates"),
    ({"e2e_size": "tiny", "e2e_rates": "high"}, "e2e_rates"),
    ({"e2e_size": "tiny", "e2e_frames": 3}, "e2e_frames"),
    ({"e2e_size": "tiny", "e2e_side": 50}, "e2e_side"),
    ({"e2e_size": "tiny", "e2e_k": 0}, "e2e_k"),
    ({"e2e_size": "tiny", "e2e_batches": "0"}, "e2e_batches"),
])
def test_e2e_bad_values_raise_naming_the_field(overrides, field):
    with pytest.raises(ValueError, match=field):
        run_multimodal_cost("tiny", device="cpu", overrides={"grid": False, **overrides})


def test_a_failing_cell_is_recorded_and_the_run_goes_on(tmp_path, monkeypatch):
    from diffspec.bench import mm_cost_cells

    real = mm_cost_cells.Cell.batch

    def flaky(self, B, *args, **kwargs):
        if B == 2:
            raise RuntimeError("boom at batch 2")
        return real(self, B, *args, **kwargs)

    monkeypatch.setattr(mm_cost_cells.Cell, "batch", flaky)
    ckpt = tmp_path / "partial.json"
    doc = run_multimodal_cost("tiny", device="cpu", repeats=1, warmup=0,
                              overrides={**SMALL, "batches": "1,2,4", "checkpoint": str(ckpt)})
    (err,) = doc["errors"]
    assert err["batch"] == 2 and "boom at batch 2" in err["error"] and err["stage"] == "verify/draft"
    assert {r["batch"] for r in doc["runs"]} == {1, 4}
    saved = json.loads(ckpt.read_text())
    assert "partial" not in saved and saved["errors"][0]["batch"] == 2 and len(saved["runs"]) == len(doc["runs"])


def test_time_budget_skips_cells():
    doc = run_multimodal_cost("tiny", device="cpu", repeats=1, warmup=0,
                              overrides={**SMALL, "contexts": "16,24", "time_budget_s": 1e-9})
    assert doc["runs"] == [] and {s["reason"] for s in doc["skipped"]} == {"time_budget_s exceeded"}
    assert len(doc["skipped"]) == 2 * 2
