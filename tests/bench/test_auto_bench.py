"""The auto suite: its JSON rows and the table the docs show."""

import json

import pytest

from diffspec.bench import SUITES
from diffspec.bench.auto import auto_table, run_auto
from diffspec.bench.report import markdown_table


def test_unknown_models_are_refused():
    assert SUITES["auto"] is run_auto
    with pytest.raises(ValueError, match="auto: unknown model.*tiny-x; choose from tiny-dit, tiny-ar, tiny-vlm"):
        run_auto("tiny-ar,tiny-x")


def test_the_table_gives_each_choice_its_cost_payback_and_held_out_rate():
    auto = {"quality": "exact", "choice": "mc-sjd", "calibration_s": 12.5, "pays_off_after_items": 40,
            "held_out_rate": 1.0}
    doc = {"suite": "auto", "runs": [
        {"model": "tiny-ar", "method": "baseline", "per_item_s": {"median": 0.2}, "speedup_vs_baseline": 1.0},
        {"model": "tiny-ar", "method": "auto (exact)", "config": {"method": "mc-sjd", "window": 8},
         "per_item_s": {"median": 0.1}, "speedup_vs_baseline": 2.0, "auto": auto}]}
    text = markdown_table(json.loads(json.dumps(doc)))
    assert text == auto_table(doc)
    assert "| tiny-ar | auto (exact) | mc-sjd {'window': 8} | 0.1 | 2.0 | 12.5 | 40 | 1.0 |" in text.splitlines()
