"""The auto suite: its JSON rows and the table the docs show."""

import json

import pytest
import torch

from diffspec.bench import SUITES
from diffspec.bench import auto as auto_bench
from diffspec.bench.auto import auto_table, best_hand_tuned, run_auto
from diffspec.bench.report import markdown_table
from diffspec.config import SpecaConfig
from diffspec.forecast.calibrate import probe_config
from diffspec.pipelines.auto_search import candidate_key


def test_unknown_models_are_refused():
    assert SUITES["auto"] is run_auto
    with pytest.raises(ValueError, match="auto: unknown model.*tiny-x; choose from tiny-dit, tiny-flux, tiny-ar, "
                       "tiny-ar-tex, tiny-ar-noisy, tiny-vlm"):
        run_auto("tiny-ar,tiny-x")


def test_the_table_gives_each_choice_its_cost_payback_and_held_out_rate():
    auto = {"quality": "exact", "choice": "mc-sjd", "calibration_s": 12.5, "pays_off_after_items": 40,
            "held_out_rate": 1.0, "speed_vs_best_hand_tuned": 1.05}
    doc = {"suite": "auto", "runs": [
        {"model": "tiny-ar", "method": "baseline", "per_item_s": {"median": 0.2}, "speedup_vs_baseline": 1.0},
        {"model": "tiny-ar", "method": "auto (exact)", "config": {"method": "mc-sjd", "window": 8},
         "per_item_s": {"median": 0.1}, "speedup_vs_baseline": 2.0, "auto": auto}]}
    text = markdown_table(json.loads(json.dumps(doc)))
    assert text == auto_table(doc)
    assert "| tiny-ar | auto (exact) | mc-sjd {'window': 8} | 0.1 | 2.0 | 12.5 | 40 | 1.0 | 1.05 |" in text.splitlines()


def test_the_best_hand_tuned_arm_is_the_fastest_setting_meeting_the_floor_on_the_held_out_items(monkeypatch, tmp_path):
    monkeypatch.setenv("DIFFSPEC_CACHE", str(tmp_path))
    monkeypatch.setattr(auto_bench, "DIT_STEPS", 8)
    monkeypatch.setattr(auto_bench, "HELD_OUT", 3)
    model = auto_bench._Model("tiny-dit", torch.device("cpu"))
    found = best_hand_tuned(model, {"loose": 5.0, "strict": 99.0})
    assert "strict" not in found  # no forecast reproduces the full run to 99 dB
    loose = found["loose"]
    assert loose["held_out_rate"] >= 0.95 and min(loose["psnr_samples"]) >= 5.0 and len(loose["psnr_samples"]) == 3
    cached = json.loads(next(tmp_path.glob("*.json")).read_text())["measured"]
    probe = candidate_key(probe_config(SpecaConfig()))  # speca's probe run is a measurement, never a candidate
    rivals = [r for k, r in cached.items() if k != probe and not r["exact"] and min(r["psnr_samples"]) >= 5.0]
    assert loose["speedup"] == max(r["speedup"] for r in rivals) > 1.0


def test_the_rival_of_a_preset_is_the_fastest_oracle_arm_meeting_its_floor():
    per_item = {"best hand-tuned (balanced)": 0.08, "best hand-tuned (fast)": 0.09, "auto (fast)": 0.085}
    floors = {"balanced": 32.0, "fast": 26.0}
    assert auto_bench._best_rival("tiny-flux", "fast", per_item, floors) == "best hand-tuned (balanced)"
    assert auto_bench._best_rival("tiny-flux", "balanced", per_item, floors) == "best hand-tuned (balanced)"
    assert auto_bench._best_rival("tiny-dit", "balanced", {"best hand-tuned (fast)": 0.1}, floors) is None


def test_a_hand_set_arm_shows_its_held_out_rate_at_each_preset():
    doc = {"suite": "auto", "runs": [
        {"model": "tiny-flux", "method": "taylor", "config": {"method": "taylor", "order": 1},
         "per_item_s": {"median": 0.1}, "speedup_vs_baseline": 2.2,
         "held_out": {"rate": {"balanced": 0.62, "fast": 0.851}, "psnr": 33.0, "psnr_min": 12.0}}]}
    assert "| balanced 0.62, fast 0.85 |" in auto_table(doc)


def test_held_out_items_are_judged_against_full_compute_computed_once(monkeypatch):
    monkeypatch.setattr(auto_bench, "DIT_STEPS", 6)
    monkeypatch.setattr(auto_bench, "HELD_OUT", 2)
    model = auto_bench._Model("tiny-dit", torch.device("cpu"))
    taylor = model.wrap("taylor", full_steps=4)
    taylor.disable()
    calls = []
    plain = model.plain(taylor)
    monkeypatch.setattr(model, "plain", lambda spec: lambda **kw: calls.append(1) or plain(**kw))
    with torch.inference_mode():
        values, again = model.held_out_psnr(taylor), model.held_out_psnr(taylor)
    assert len(calls) == 2 and values == again and all(0 < v < 100 for v in values)
    floor = max(values)
    assert model.held_out(taylor, {"floor": floor, "exact": False, "config": {}}) == sum(v >= floor for v in values) / 2
    assert len(calls) == 2
