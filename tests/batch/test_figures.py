"""The figures of ``diffspec generate`` add up, per item and in the summary, for every diffusion method on the
shipped tiny-dit (definitions: ``diffspec.stats.SpecStats``, ``docs/stats.md``)."""

import json
import re

import pytest
import torch

from diffspec import SpeculativePipeline
from diffspec.batch import merge_manifests
from diffspec.cli import main
from diffspec.models import load_pipeline

STEPS = 12
LABELS = ["circle", "square", "star"]
SEED = 3
METHODS = {"taylor": [], "speca": [], "coupling": ["--scheduler", "DDPMScheduler"],
           "autospec": ["--scheduler", "DDPMScheduler"]}


def _generate(out, method, capsys):
    argv = ["generate", "--model", "tiny-dit", "--method", method, *METHODS[method], "--class-labels",
            ",".join(LABELS), "--steps", str(STEPS), "--seed", str(SEED), "--out", str(out)]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    return [json.loads(x) for x in (out / "manifest.jsonl").read_text().splitlines()], printed


@pytest.mark.parametrize("method", list(METHODS))
def test_each_items_figures_follow_the_definitions_and_the_summary_is_their_mean(tmp_path, capsys, method):
    records, printed = _generate(tmp_path / "out", method, capsys)
    assert [r["status"] for r in records] == ["ok"] * len(LABELS)
    for r in records:
        calls = r["steps"] * r["branches"]  # the plain loop's sequential target calls
        assert r["branches"] == 1  # tiny-dit batches its CFG branches into one call
        assert r["full_steps"] + r["forecast_steps"] == pytest.approx(calls)
        assert 0 < r["target_calls"] <= calls
        assert r["step_speedup"] == calls / r["target_calls"]
        if method in ("coupling", "autospec"):  # every step is the target's, in parallel rounds
            assert (r["full_steps"], r["forecast_steps"]) == (STEPS, 0) and r["target_evals"] >= STEPS
        else:
            assert r["target_evals"] == pytest.approx(r["full_steps"]) and r["forecast_steps"] > 0
        assert r["acceptance"] is not None and 0 <= r["acceptance"] <= 1
    mean = sum(r["step_speedup"] for r in records) / len(records)
    assert merge_manifests(tmp_path / "out").mean_step_speedup == pytest.approx(mean)
    shown = re.findall(r"mean speedup ([0-9.]+)x \(steps / sequential target calls\)", printed)
    assert shown == [f"{mean:.2f}"] * 2  # the rank's line and the merged one


def test_an_items_figures_are_its_own_call_s(tmp_path, capsys):
    """Each line holds what a lone call of that item reports (not a figure carried over from other items)."""
    records, _ = _generate(tmp_path / "out", "coupling", capsys)
    from diffusers import DDPMScheduler

    pipe = load_pipeline("tiny-dit")
    pipe.scheduler = DDPMScheduler.from_config(pipe.scheduler.config)
    pipe.set_progress_bar_config(disable=True)
    spec = SpeculativePipeline.from_pipe(pipe, method="coupling")
    own = []
    for i, label in enumerate(LABELS):
        spec(class_labels=pipe.get_label_ids([label]), num_inference_steps=STEPS, output_type="np",
             generator=[torch.Generator("cpu").manual_seed(SEED + i)])
        own.append((spec.stats.target_calls, round(spec.stats.acceptance_rate, 4), spec.stats.speedup))
    assert [(r["target_calls"], r["acceptance"], r["step_speedup"]) for r in records] == own
