"""``diffspec bench multimodal-action`` on the shipped tiny VLA (short workload)."""

from __future__ import annotations

import json

import pytest

from diffspec.bench import run_multimodal_action
from diffspec.bench.report import markdown_table
from diffspec.cli import main


def test_suite_json_and_table():
    doc = run_multimodal_action(steps=4, repeats=1, warmup=0, episodes=1, tolerances="0,5", sources="kalman",
                                show_progress=False)
    assert doc["suite"] == "multimodal-action" and doc["workload"]["tokens"] == 7
    base, r0, r5 = doc["runs"]
    assert base["method"] == "baseline" and base["passes_per_action"] == 7.0
    assert r0["config"] == {"tolerance": 0, "draft_source": "kalman"} and r0["quality"]["exact"]
    assert r0["quality"]["max_abs_action_error"] == 0.0 and r0["passes_per_action"] <= 7
    assert r5["quality"]["error_bound_per_token"] == pytest.approx(5 * 2 / 256)
    assert "| `relaxed-action` | 5 | kalman |" in markdown_table(doc)
    loops = [run["quality"]["closed_loop"] for run in doc["runs"]]
    assert loops[1] == {**loops[0], "passes_per_action": loops[1]["passes_per_action"]}  # r=0: same trajectory
    assert all(0 <= lp["success_rate"] <= 1 and lp["final_distance_mean"] >= 0 for lp in loops)
    assert doc["workload"]["closed_loop"]["expert"]["final_distance_mean"] >= 0
    with pytest.raises(ValueError, match="unknown --set"):
        run_multimodal_action(overrides={"nope": 1})


def test_cli(tmp_path, capsys):
    out = tmp_path / "a.json"
    assert main(["bench", "multimodal-action", "--steps", "2", "--repeats", "1", "--warmup", "0", "--set", "episodes=1",
                 "--set", "tolerances=3", "--set", "sources=previous", "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert [r["method"] for r in doc["runs"]] == ["baseline", "relaxed-action"]
    assert "passes/action" in capsys.readouterr().out
