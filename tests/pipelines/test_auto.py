"""method="auto": the fastest diffusion method that meets a quality target, tuned on the call's prompts, cached."""

import json
import warnings

import pytest
import torch
from diffusers import DDPMScheduler

from diffspec import SpeculativePipeline
from diffspec.config import QUALITY_PRESETS, AutoConfig
from diffspec.metrics import psnr
from diffspec.models import load_pipeline
from diffspec.pipelines import auto_search
from diffspec.pipelines.auto_cache import CACHE_ENV, cache_dir
from diffspec.testing.image_pipelines import build_random_dit_pipeline

pytestmark = pytest.mark.usefixtures("one_thread")

CALL = {"class_labels": [0, 1], "num_inference_steps": 8}


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.fixture
def steady_clock(monkeypatch):
    """The clock check reads each candidate's call-count speedup: what a test of the choice's bookkeeping asserts must
    not hang on wall-clock time, which on a loaded CPU can rank a forecast below the plain loop (the clock rule
    itself: ``tests/pipelines/test_auto_wall.py``)."""
    monkeypatch.setattr(auto_search.Tuner, "verify", lambda self, result: result["speedup"])


def count_transformer_calls(pipe):
    """Full transformer evaluations: attention calls of its first block (a forecast step runs none)."""
    calls = []
    pipe.transformer.transformer_blocks[0].attn1.register_forward_pre_hook(lambda *_: calls.append(1))
    return calls


def measured(choice):
    return json.loads(open(choice["cache"]).read())["measured"]


def test_bad_quality_values_name_field_value_and_range(tiny_dit_pipe):
    for bad, allowed in (("best", r"'exact', 'high', 'balanced', 'fast' or a PSNR floor in dB in \(0, 100\]"),
                         (0, r"allowed \(0.0, 100.0\]"), (101, r"allowed \(0.0, 100.0\]"),
                         (float("nan"), r"a number in \(0.0, 100.0\]"), (True, "a number")):
        with pytest.raises(ValueError, match=rf"quality={bad!r}.*{allowed}"):
            SpeculativePipeline.from_pipe(tiny_dit_pipe, method="auto", quality=bad)
    with pytest.raises(ValueError, match=r"samples=0 is out of range: allowed \[1, 64\]"):
        AutoConfig(samples=0)
    assert AutoConfig().floor == QUALITY_PRESETS["balanced"] == 32.0 and AutoConfig(quality="exact").floor is None
    assert AutoConfig(quality=35).floor == 35.0


def test_balanced_picks_the_fastest_method_that_meets_the_floor_and_the_second_call_measures_nothing(cache,
                                                                                                     steady_clock):
    pipe = build_random_dit_pipeline()
    spec = SpeculativePipeline.from_pipe(pipe, method="auto", quality="balanced", samples=2)
    out = spec(**CALL, output_type="np")
    choice = spec.choice
    assert choice["method"] in ("taylor", "speca") and choice["psnr"] >= 32.0 and choice["speedup"] > 1.0
    assert spec.config.method == choice["method"] and out.spec_stats.extra["auto"]["speedup"] == choice["speedup"]
    meeting = [m for m in measured(choice).values() if m["psnr"] is not None and m["psnr"] >= 32.0]
    assert choice["speedup"] == max(m["speedup"] for m in meeting)
    assert choice["cache"].startswith(str(cache))  # the folder of DIFFSPEC_CACHE
    spec.disable()

    again = SpeculativePipeline.from_pipe(pipe, method="auto", quality="balanced", samples=2)  # a new process alike
    calls = count_transformer_calls(pipe)
    assert again.calibrate(**CALL)["config"] == choice["config"]
    assert calls == []  # no model call for tuning
    again(**CALL, output_type="np")
    assert len(calls) == again.stats.target_calls  # only the generation's own calls
    again.disable()


def test_exact_never_picks_a_relaxed_method(cache):
    pipe = build_random_dit_pipeline()  # DDIM on DiT: no eta, so no exact sampler; the pipeline runs unchanged
    spec = SpeculativePipeline.from_pipe(pipe, method="auto", quality="exact", samples=1)
    with pytest.warns(UserWarning, match="quality='exact' on DiTPipeline with DDIMScheduler: no method that meets it "
                      "speeds it up"):
        out = spec(**CALL, output_type="np", generator=torch.Generator().manual_seed(0))
    assert spec.choice["method"] == "none" and spec.inner is None
    plain = pipe(**CALL, output_type="np", generator=torch.Generator().manual_seed(0))
    assert torch.equal(torch.as_tensor(out.images), torch.as_tensor(plain.images))

    pipe = load_pipeline("tiny-dit")  # trained: its exact samplers accept drafts
    pipe.set_progress_bar_config(disable=True)
    pipe.scheduler = DDPMScheduler.from_config(pipe.scheduler.config)
    spec = SpeculativePipeline.from_pipe(pipe, method="auto", quality="exact", samples=1)
    with warnings.catch_warnings(record=True) as said:  # drafts can cost more than the calls they save on a CPU
        warnings.simplefilter("always")
        spec(class_labels=[0], num_inference_steps=20, output_type="np")
    if spec.choice["method"] == "none":
        assert "made fewer calls, none ran faster on this device" in str(said[-1].message)
    else:
        assert spec.choice["method"] in ("coupling", "autospec") and spec.config.exact
        assert spec.choice["measured_speedup"] > 1.0 and spec.choice["verified"]
    assert spec.choice["exact"]
    assert all(m["exact"] for m in measured(spec.choice).values())  # no relaxed candidate was even measured
    spec.disable()


def test_an_unreachable_floor_gives_the_best_reachable_quality_and_speedup(cache):
    pipe = load_pipeline("tiny-dit")  # trained: one forecast step of eight changes the image (random weights: not)
    pipe.set_progress_bar_config(disable=True)
    spec = SpeculativePipeline.from_pipe(pipe, method="auto", quality=100, samples=1)
    with pytest.raises(ValueError, match=r"quality=100 \(100.0 dB\) is out of reach on DiTPipeline.*best reachable "
                       r"is (taylor|speca) \(.*\): [\d.]+ dB \(worst sample [\d.]+ dB, "
                       r"95% of new items above [\d.]+ dB\), [\d.]+x fewer sequential transformer calls; pass "
                       r"quality <= [\d.]+"):
        spec(**CALL, output_type="np")


def test_an_interrupted_calibration_resumes(cache, monkeypatch):
    pipe = build_random_dit_pipeline()
    generate, runs = auto_search.Tuner._generate, []

    def interrupted(self, runner, count=None):
        if len(runs) == 4:
            raise KeyboardInterrupt
        runs.append(runner)
        return generate(self, runner, count)

    monkeypatch.setattr(auto_search.Tuner, "_generate", interrupted)
    spec = SpeculativePipeline.from_pipe(pipe, method="auto", quality="fast", samples=1)
    with pytest.raises(KeyboardInterrupt):
        spec.calibrate(**CALL)
    done = set(json.loads(next(cache.glob("*.json")).read_text())["measured"])
    assert len(done) == 3  # the reference, then three candidates

    rerun = []

    def spy(self, runner, count=None):
        if isinstance(runner, SpeculativePipeline) and count is None:  # count: a timed check of a measured one
            rerun.append(auto_search.candidate_key(runner.config))
        return generate(self, runner, count)

    monkeypatch.setattr(auto_search.Tuner, "_generate", spy)
    choice = spec.calibrate(**CALL)
    assert rerun and not done & set(rerun)  # measured candidates are not run again
    assert done < set(measured(choice)) and choice["psnr"] >= 26.0


def test_cache_folder_follows_the_environment_variable(monkeypatch, tmp_path):
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "here"))
    assert cache_dir() == tmp_path / "here"
    monkeypatch.delenv(CACHE_ENV)
    assert cache_dir().parts[-2:] == ("diffspec", "auto")


def test_auto_takes_a_drafter_for_multimodal_targets_only(tiny_dit_pipe):
    with pytest.raises(ValueError, match=r"method='auto' takes draft= \(a drafter model\) for multimodal targets only"):
        SpeculativePipeline.from_pipe(tiny_dit_pipe, method="auto", draft=torch.nn.Linear(1, 1))


def test_the_choice_holds_on_held_out_seeds_of_tiny_dit(cache):
    """The choice is made on seeds 5000 on; here it is checked on seeds 0-5 (the rate is printed)."""
    pipe = load_pipeline("tiny-dit")
    pipe.set_progress_bar_config(disable=True)
    call = {"class_labels": [0, 1, 2, 3], "num_inference_steps": 50}
    spec = SpeculativePipeline.from_pipe(pipe, method="auto", quality="balanced", samples=4)
    choice = spec.calibrate(**call)
    held_out = []
    for seed in range(6):
        kwargs = {"class_labels": [seed % 10], "num_inference_steps": 50, "output_type": "np"}
        image = spec(**kwargs, generator=torch.Generator().manual_seed(seed)).images
        spec.disable()
        full = pipe(**kwargs, generator=torch.Generator().manual_seed(seed)).images
        spec.enable()
        held_out.append(psnr(torch.as_tensor(image), torch.as_tensor(full), 1.0))
    rate = sum(p >= choice["floor"] for p in held_out) / len(held_out)
    print(f"held-out: {choice['method']} at {choice['speedup']}x, {rate:.0%} of 6 seeds >= {choice['floor']} dB "
          f"(PSNR {min(held_out)}..{max(held_out)}; calibration {choice['psnr']} dB)")
    assert rate == 1.0
    spec.disable()


def test_cli_generate_records_the_chosen_method_and_calibrate_is_its_explicit_form(cache, tmp_path, capsys,
                                                                                   steady_clock):
    from diffspec.cli import main

    args = ["--model", "tiny-dit", "--steps", "6", "--device", "cpu"]
    assert main(["calibrate", "--method", "auto", "--quality", "5", "--samples", "4", *args]) == 0
    said = capsys.readouterr().out
    assert "auto (quality 5.0): " in said and "fewer sequential transformer calls" in said
    files = set(cache.glob("*.json"))
    assert main(["generate", "--method", "auto", "--quality", "5", "--class-labels", "circle,square",
                 "--guidance-scale", "4", "--out", str(tmp_path / "out"), *args]) == 0
    assert set(cache.glob("*.json")) == files  # the same settings: the calibration's file
    records = [json.loads(line) for line in (tmp_path / "out" / "manifest.jsonl").read_text().splitlines()]
    chosen = json.loads(next(iter(files)).read_text())
    relaxed = [m for m in chosen["measured"].values() if not m["exact"]]  # 4 calibration samples measured again on 16
    assert relaxed and {m["samples"] for m in relaxed} == {AutoConfig().sample_count("diffusion")} == {16}
    assert {r["method"] for r in records} <= {"taylor", "speca"} and records[0]["config"]["method"] == records[0]["method"]
    assert chosen["settings"]["num_inference_steps"] == 6
    assert main(["generate", "--method", "taylor", "--quality", "fast", "--class-labels", "circle",
                 "--out", str(tmp_path / "x"), *args]) == 2
    assert "--quality applies to --method auto" in capsys.readouterr().err
