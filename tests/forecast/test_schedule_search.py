import json

import pytest
import torch

from diffspec import SpeculativePipeline
from diffspec.bench.calibrate import calibrate_model
from diffspec.bench.dit_cache import make_workload
from diffspec.bench.equal_evals import candidate_grid
from diffspec.cli import main
from diffspec.config import SpecaConfig
from diffspec.forecast.calibrate import (
    CALIBRATION_FILE,
    calibrated_replay,
    load_calibration,
    resolve_replay,
)
from diffspec.forecast.schedule_search import even_schedule, refine_schedule, search_schedules
from diffspec.metrics import psnr
from diffspec.models import load_pipeline, resolve_model_path


@pytest.mark.parametrize("n_full,steps", [(3, 10), (6, 20), (12, 50), (18, 50), (49, 50), (50, 50)])
def test_even_schedule_keeps_warmup_and_last_step(n_full, steps):
    s = even_schedule(n_full, steps)
    assert len(s) == n_full == len(set(s)) and list(s) == sorted(s)
    assert s[:2] == (0, 1) and s[-1] == steps - 1
    gaps = [b - a for a, b in zip(s[1:], s[2:])]
    assert max(gaps) - min(gaps) <= 1  # evenly spaced after the warmup


@pytest.mark.parametrize("n_full", [0, 2, 51])
def test_even_schedule_rejects_sizes_it_cannot_place(n_full):
    with pytest.raises(ValueError, match="n_full"):
        even_schedule(n_full, 50)


def test_refine_schedule_climbs_to_the_optimum_and_keeps_the_ends():
    want = (0, 4, 9, 15, 19)
    calls = []

    def score(s):
        calls.append(s)
        return -sum(abs(a - b) for a, b in zip(s, want))

    found, value, tried = refine_schedule(score, (0, 1, 8, 14, 19), sweeps=10, min_gain=0.0)
    assert found == want and value == 0 and tried == len(calls)
    assert all(c[0] == 0 and c[-1] == 19 and list(c) == sorted(set(c)) for c in calls)


def test_refine_schedule_needs_more_than_min_gain():
    found, value, tried = refine_schedule(lambda s: 0.01 * s[1], (0, 1, 5, 9), min_gain=0.05)
    assert found == (0, 1, 5, 9) and tried > 1  # every move tried, none kept


def test_search_schedules_keeps_the_better_start():
    def score_for(granularity):
        return lambda s: -abs(s[2] - 12) - (0.5 if granularity == "module" else 0.0)

    rate = [1.0, 1.0] + [0.0] * 10 + [1.0] + [0.0] * 6 + [1.0]  # the gate ran steps 0, 1, 12 and 19 in full
    out = search_schedules(score_for, [4], 20, ("block", "module"), full_rate=rate, sweeps=1, show_progress=False)
    assert [(e["full_steps"], e["granularity"]) for e in out] == [(4, "block"), (4, "module")]
    block = out[0]
    assert block["starts"]["gate's placement"]["start"] == [0, 1, 12, 19]
    assert block["start"] == "gate's placement" and block["schedule"] == [0, 1, 12, 19] and block["psnr"] == 0
    assert block["starts"]["even grid"]["psnr"] < 0  # one sweep of +-2 moves cannot reach step 12 from the grid
    best = calibrated_replay({"schedules": out}, 4)
    assert (best.replay_steps, best.granularity, best.order) == ((0, 1, 12, 19), "block", 2)  # block scored higher
    assert calibrated_replay({"schedules": out}, 4, "module").granularity == "module"
    with pytest.raises(ValueError, match=r"full_steps=5 .*\(4, 'block'\)"):
        calibrated_replay({"schedules": out}, 5)


def test_calibrated_schedules_are_saved_replayed_and_offered_to_the_equal_evals_search(tmp_path):
    steps = 12
    record, path = calibrate_model("tiny-dit-random", target_psnr=40.0, steps=steps, samples=1, out=tmp_path,
                                   overrides={"k_min": 0}, schedules=[5], show_progress=False)
    assert json.loads(path.read_text())["schedules"] == record["schedules"]
    (entry,) = record["schedules"]
    assert entry["full_steps"] == 5 and entry["granularity"] == "block" and len(entry["schedule"]) == 5
    assert set(entry["starts"]) == {"even grid", "gate's placement"}
    assert entry["psnr"] >= max(r["start_psnr"] for r in entry["starts"].values())  # the search never loses
    # replaying the saved schedule gives the PSNR the search recorded
    workload = make_workload("tiny-dit-random", device=torch.device("cpu"), dtype=torch.float32, steps=steps, batch=1,
                             guidance_scale=4.0)
    arm = workload.method_arm("speca", calibrated_replay(record, 5))
    with torch.inference_mode():
        reference = workload.generate([5000])
        arm.enable()
        try:
            replayed = arm.run([5000])
        finally:
            arm.disable()
    assert psnr(replayed, reference) == pytest.approx(entry["psnr"], abs=1e-3)
    grid = candidate_grid("speca-replay", [6.0], full_rate=record["full_rate"], schedules=record["schedules"])
    assert {"granularity": "block", "order": 2, "replay_steps": tuple(entry["schedule"])} in grid


def test_calibrate_cli_schedules_are_checked_before_the_search(tmp_path, capsys):
    args = ["calibrate", "--model", "tiny-dit-random", "--steps", "10", "--samples", "1", "--out", str(tmp_path)]
    assert main([*args, "--schedules", "11"]) == 2
    assert "schedules=11" in capsys.readouterr().err and not (tmp_path / CALIBRATION_FILE).exists()
    assert main([*args, "--schedules", "4", "--schedule-granularities", "blocks"]) == 2
    assert "schedule_granularities='blocks'" in capsys.readouterr().err
    # a model whose blocks have no module table: refused before the threshold search, not after it
    wan = ["calibrate", "--model", "tiny-wan", "--steps", "10", "--samples", "1", "--out", str(tmp_path)]
    assert main([*wan, "--schedules", "4", "--schedule-granularities", "block,module"]) == 2
    assert "schedule_granularities='module': granularity='module' is not supported for WanTransformerBlock" in (
        capsys.readouterr().err)
    assert not (tmp_path / CALIBRATION_FILE).exists()


def test_replay_full_steps_reads_the_shipped_schedule():
    pipe = load_pipeline("tiny-dit")
    pipe.set_progress_bar_config(disable=True)
    spec = SpeculativePipeline.from_pipe(pipe, method="speca", replay_full_steps=12)
    want = calibrated_replay(load_calibration(resolve_model_path("tiny-dit")), 12)
    cfg = spec.config
    assert (cfg.replay_steps, cfg.granularity, cfg.order, cfg.replay_full_steps) == (
        want.replay_steps, want.granularity, want.order, None)
    assert spec.schedule_source.endswith(CALIBRATION_FILE)
    with torch.inference_mode():
        spec(class_labels=[1, 2], generator=[torch.Generator().manual_seed(s) for s in (0, 1)],
             num_inference_steps=50, output_type="pt")
    assert spec.stats.target_evals == 12  # per row: exactly the schedule's full steps
    assert spec.schedule_steps == 50
    # the schedule was searched for 50 steps: another step count is refused before any block runs
    with pytest.raises(ValueError, match=r"num_inference_steps=20: .*searched for 50 steps"), torch.inference_mode():
        spec(class_labels=[1], num_inference_steps=20, output_type="pt")


def test_replay_steps_beyond_the_generation_are_refused():
    pipe = load_pipeline("tiny-dit")
    pipe.set_progress_bar_config(disable=True)
    spec = SpeculativePipeline.from_pipe(pipe, method="speca", replay_steps=(0, 1, 5, 9))
    with torch.inference_mode():
        spec(class_labels=[1], num_inference_steps=10, output_type="pt")  # in range: runs
        assert spec.stats.target_evals == 4
        with pytest.raises(ValueError, match=r"replay_steps reach step 9 but this generation has 8 steps"):
            spec(class_labels=[1], num_inference_steps=8, output_type="pt")


def test_replay_full_steps_errors_name_what_is_missing(tmp_path):
    with pytest.raises(ValueError, match="replay_full_steps=12 and replay_steps"):
        SpecaConfig(replay_full_steps=12, replay_steps=(0, 5))
    with pytest.raises(ValueError, match="replay_full_steps=0"):
        SpecaConfig(replay_full_steps=0)
    with pytest.raises(ValueError, match="diffspec calibrate"):
        resolve_replay(SpecaConfig(replay_full_steps=12), tmp_path)
    (tmp_path / CALIBRATION_FILE).write_text(json.dumps({"tau0": 0.1, "beta": 1.0, "tau_min": 0.0}))
    with pytest.raises(ValueError, match="full_steps=12 .*none"):
        resolve_replay(SpecaConfig(replay_full_steps=12), tmp_path)
    assert resolve_replay(SpecaConfig(), tmp_path) == (SpecaConfig(), None, None)
