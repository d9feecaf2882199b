"""method="auto" on AR image and multimodal targets: chosen on the device's measured cost, verified, cached."""

import json

import pytest
import torch

from diffspec import SpeculativePipeline
from diffspec.config import AUTO_SAMPLES, AutoConfig
from diffspec.models import load_ar_target
from diffspec.pipelines.auto_ar import GSD_TV_CAPS, ar_candidates, relaxed_cap
from diffspec.pipelines.auto_cache import CACHE_ENV
from diffspec.pipelines.auto_cost import CLOCK_MARGIN, CostCurve, clock_pick
from diffspec.pipelines.auto_mm import mm_candidates, rows

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.fixture(scope="module")
def tiny_ar():
    return load_ar_target("tiny-ar")


@pytest.fixture(scope="module")
def tiny_vlm():
    from diffspec.data import render_scenes
    from diffspec.models.tiny_vlm import MAX_CAPTION_TOKENS, caption_inputs, load_tiny_vlm

    target, processor, drafter, _ = load_tiny_vlm()
    inputs = caption_inputs(processor, render_scenes(4, seed=10**6)[0])
    return target, processor, drafter, {**inputs, "max_new_tokens": MAX_CAPTION_TOKENS, "do_sample": False}


def forbid_measuring(monkeypatch):
    def refuse(*_, **__):
        raise AssertionError("measured again")

    for tuner in ("auto_ar.ARTuner", "auto_mm.MultimodalTuner"):
        for name in ("measure_cost", "run", "runners"):
            monkeypatch.setattr(f"diffspec.pipelines.{tuner}.{name}", refuse)


def test_candidates_follow_the_quality_preset():
    assert relaxed_cap(AutoConfig(quality="exact")) is None and relaxed_cap(AutoConfig(quality="high")) is None
    assert relaxed_cap(AutoConfig(quality="balanced")) == GSD_TV_CAPS["balanced"]
    assert relaxed_cap(AutoConfig(quality=20)) == GSD_TV_CAPS["fast"]
    exact = ar_candidates(64, None)
    assert all(c.exact for c in exact) and {c.method for c in exact} == {"mc-sjd", "sjd-pac", "mc-sjd-ra"}
    assert max(c.window for c in exact) == 63  # clipped to the image
    relaxed = [c for c in ar_candidates(64, 0.1) if not c.exact]
    assert relaxed and all(c.method == "gsd" and c.max_tv == 0.1 for c in relaxed)
    assert {c.method for c in mm_candidates(16, True)} == {"draft", "self-draft"}
    assert {c.method for c in mm_candidates(16, False)} == {"self-draft"}
    batch = {"input_ids": torch.tensor([[1, 2], [3, 4]]), "pixel_values": torch.zeros(2, 3)}
    assert [r["pixel_values"].shape[0] for r in rows(batch, 3)] == [1, 1, 1]
    assert rows({"input_ids": torch.zeros(2, 2), "pixel_values": torch.zeros(5, 3)}, 2)[0]["input_ids"].shape[0] == 2


def test_exact_on_tiny_ar_picks_an_exact_method_reports_both_speedups_and_the_second_call_measures_nothing(
        cache, tiny_ar, monkeypatch):
    spec = SpeculativePipeline.from_pipe(tiny_ar, method="auto", quality="exact", samples=1)
    spec.set_progress_bar_config(disable=True)
    out = spec(class_labels=[3], generator=torch.Generator().manual_seed(0), output_type="tokens")
    choice = spec.choice
    assert choice["method"] in ("mc-sjd", "sjd-pac", "mc-sjd-ra") and spec.config.exact and out.tokens.shape == (1, 64)
    measured = json.loads(open(choice["cache"]).read())["measured"]
    assert all(m["exact"] for m in measured.values()) and "plain" in measured
    report = out.spec_stats.extra["auto"]
    assert report["speedup"] > 1.0 and report["measured_speedup"] > 0 and report["calibration_s"] > 0
    assert report["predicted_s"] < report["plain_s"]

    forbid_measuring(monkeypatch)
    again = SpeculativePipeline.from_pipe(tiny_ar, method="auto", quality="exact", samples=1)  # a new process alike
    again.set_progress_bar_config(disable=True)
    assert again.calibrate(class_labels=[5])["config"] == choice["config"]  # other labels, same settings


def test_ar_calibrates_on_64_images_unless_told_and_measures_again_for_more(tiny_ar, cache, monkeypatch):
    from diffspec.pipelines import auto_ar

    runs = []
    monkeypatch.setattr(auto_ar.ARTuner, "run", lambda self, config: runs.append(len(self.items)) or {
        "calls_per_item": 10.0, "tokens_fed": 1 if config is None else 9, "wall_s": 0.01, "samples": len(self.items)})
    monkeypatch.setattr(auto_ar.ARTuner, "measure_cost", lambda self, configs: {"target": CostCurve({1: 0.01})})
    monkeypatch.setattr(auto_ar.ARTuner, "runners", lambda self, config: (lambda: None, lambda: None))
    for samples in (4, 2, None):
        SpeculativePipeline.from_pipe(tiny_ar, method="auto", quality="exact", samples=samples).calibrate(
            class_labels=[1, 2])
    candidates = len(ar_candidates(tiny_ar.num_tokens, None)) + 1  # and the plain loop
    assert runs == [4] * candidates + [AUTO_SAMPLES["ar_image"]] * candidates  # 2 reuses what 4 measured


def test_bad_inputs_are_refused(tiny_ar, cache):
    with pytest.raises(ValueError, match="draft= .*multimodal targets only"):
        SpeculativePipeline.from_pipe(tiny_ar, method="auto", draft=torch.nn.Linear(1, 1))
    spec = SpeculativePipeline.from_pipe(tiny_ar, method="auto")
    with pytest.raises(ValueError, match="pass class_labels= or prompt="):
        spec.calibrate(guidance_scale=3.0)
    with pytest.raises(ValueError, match="unsupported target tuple"):
        SpeculativePipeline.from_pipe((torch.nn.Linear(1, 1), None), method="auto")


def test_multimodal_auto_on_tiny_vlm_picks_a_draft_length_and_the_second_call_measures_nothing(
        cache, tiny_vlm, monkeypatch):
    target, processor, drafter, call = tiny_vlm
    spec = SpeculativePipeline.from_pipe((target, processor), method="auto", draft=drafter, samples=1)
    out = spec(**call)
    plain = spec.run_unchanged(**call)
    assert spec.choice["method"] in ("draft", "self-draft") and torch.equal(out.sequences, plain.sequences)
    assert out.spec_stats.extra["auto"]["measured_speedup"] > 0 and set(spec.choice["cost"]) == {"target", "drafter"}

    forbid_measuring(monkeypatch)
    again = SpeculativePipeline.from_pipe((target, processor), method="auto", draft=drafter, samples=1)
    assert again.calibrate(**call)["config"] == spec.choice["config"]


def test_the_three_best_predicted_are_timed_and_the_clock_picks_beyond_its_noise(cache, tiny_ar):
    """Predictions rank the candidates, the clock decides among the best three when one runs more than 5% faster than
    the best predicted (speed itself is claimed by `diffspec bench auto`, not here)."""
    spec = SpeculativePipeline.from_pipe(tiny_ar, method="auto", quality="exact", samples=2)
    spec.set_progress_bar_config(disable=True)
    choice = spec.calibrate(class_labels=[0, 1])
    verified = choice["verified"]
    assert 1 <= len(verified) <= 3 and all(v["speedup"] > 1.0 for v in verified)
    assert choice["config"] in [v["config"] for v in verified]
    timed = [v["measured_speedup"] for v in verified]
    assert choice["measured_speedup"] == timed[clock_pick(timed)]
    assert choice["measured_speedup"] == max(timed) or max(timed) <= timed[0] * (1 + CLOCK_MARGIN)
    assert choice["speedup"] in [v["speedup"] for v in verified]


def test_calibrate_auto_takes_an_ar_model_and_the_cli_names_the_choice(cache, capsys):
    from diffspec.cli import main

    assert main(["calibrate", "--model", "tiny-ar", "--method", "auto", "--quality", "exact", "--samples", "2"]) == 0
    out = capsys.readouterr().out
    assert "auto (quality 'exact'):" in out and ": exact," in out and "measured wall-clock" in out
    assert main(["generate", "--model", "tiny-ar", "--method", "auto", "--prompt-file", __file__, "--out",
                 str(cache / "out")]) == 2
    assert "holds an AR image model, which SpeculativePipeline.from_pretrained" in capsys.readouterr().err
