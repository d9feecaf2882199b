import json

import pytest

from diffspec.bench.calibrate import calibrate_model
from diffspec.cli import main
from diffspec.config import SpecaConfig
from diffspec.forecast.calibrate import (
    CALIBRATION_FILE,
    load_calibration,
    resolve_thresholds,
)


def test_calibration_reaches_the_target_and_is_loaded_by_default(tmp_path):
    record, path = calibrate_model("tiny-dit-random", target_psnr=45.0, steps=16, samples=1, out=tmp_path,
                                   overrides={"k_min": 0}, show_progress=False)
    assert path == tmp_path / CALIBRATION_FILE and load_calibration(tmp_path)["tau0"] == record["tau0"]
    assert record["reached"] and record["psnr"] >= 45.0
    grid = record["grid"]
    assert len(grid) == 60 and record["full_steps"] == min(g["full_steps"] for g in grid if g["psnr"] >= 45.0)
    assert min(g["full_steps"] for g in grid) < max(g["full_steps"] for g in grid)  # the grid spans real choices
    cfg, source = resolve_thresholds(SpecaConfig(), tmp_path)
    assert (cfg.tau0, cfg.beta, cfg.tau_min) == (record["tau0"], record["beta"], 0.0) and source == str(path)
    assert resolve_thresholds(SpecaConfig(), tmp_path / "nowhere") == (SpecaConfig().with_fallback(), "fallback")


def test_calibrate_cli(tmp_path, capsys):
    out = tmp_path / "new" / "folder"  # made by the command
    assert main(["calibrate", "--model", "tiny-dit-random", "--steps", "12", "--samples", "1", "--target-psnr", "40",
                 "--set", "k_min=0", "--out", str(out)]) == 0
    assert "wrote" in capsys.readouterr().out
    assert json.loads((out / CALIBRATION_FILE).read_text())["steps"] == 12
    (tmp_path / "file").write_text("")
    assert main(["calibrate", "--model", "tiny-dit-random", "--out", str(tmp_path / "file")]) == 2
    assert "is not a folder" in capsys.readouterr().err
    assert main(["calibrate", "--model", "tiny-dit-random"]) == 2  # no folder to write into
    assert "--out" in capsys.readouterr().err
    assert main(["calibrate", "--model", "tiny-dit-random", "--target-psnr", "-3", "--out", str(tmp_path)]) == 2
    assert "target_psnr=-3" in capsys.readouterr().err


def test_corrupt_calibration_file_is_a_clear_error(tmp_path):
    (tmp_path / CALIBRATION_FILE).write_text("{not json")
    with pytest.raises(ValueError, match="diffspec calibrate"):
        load_calibration(tmp_path)


def test_calibrate_a_text_pipeline_folder_and_speca_loads_it(tmp_path, capsys):
    """A text-conditioned pipeline (a tiny random-weight FLUX saved locally): ``diffspec calibrate`` generates the
    prompts of --prompt-file at the size asked for, saves the record next to the model, and ``speca`` on that folder
    reads its thresholds by default; the record names the prompts and sizes it was fitted on."""
    from diffspec import SpeculativePipeline
    from diffspec.testing.tiny_pipelines import save_tiny_pipeline

    folder = save_tiny_pipeline("tiny-flux-random", tmp_path / "flux")
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("a red fox\n# a comment\na blue boat\n")
    argv = ["calibrate", "--model", str(folder), "--steps", "8", "--samples", "2", "--target-psnr", "30",
            "--prompt-file", str(prompts), "--height", "16", "--width", "24"]
    assert main(argv) == 0, capsys.readouterr().err
    record = load_calibration(folder)
    assert record["prompts"] == ["a red fox", "a blue boat"] and record["call_kwargs"] == {"height": 16, "width": 24}
    assert record["steps"] == 8 and record["psnr"] >= 30.0
    spec = SpeculativePipeline.from_pretrained(folder, method="speca")
    assert spec.threshold_source == str(folder / CALIBRATION_FILE) and spec.config.tau0 == record["tau0"]
    spec.disable()
    assert main([*argv[:-6], "--prompt-file", str(tmp_path / "none.txt")]) == 2
    assert "--prompt-file" in capsys.readouterr().err


def test_prompts_are_refused_for_a_class_conditional_model(tmp_path):
    with pytest.raises(ValueError, match="class-conditional"):
        calibrate_model("tiny-dit", steps=4, samples=1, out=tmp_path, prompts=["a fox"], show_progress=False)
