"""``diffspec generate`` / ``merge`` in process, on a tiny random-weight DiT saved locally."""

import json

import numpy as np
import pytest
from PIL import Image

from diffspec.cli import main

STEPS = ["--steps", "6"]


def _items(tmp_path, *objs):
    path = tmp_path / "items.jsonl"
    path.write_text("".join(json.dumps(o) + "\n" for o in objs))
    return path


def _merged(out):
    return [json.loads(x) for x in (out / "manifest.jsonl").read_text().splitlines()]


def _outputs(out):
    return {r["key"]: r["sha256"] for r in _merged(out) if r["status"] == "ok"}


def _error(capsys):
    err = capsys.readouterr().err.strip()
    assert err.startswith("diffspec: error: ") and "\n" not in err and "Traceback" not in err
    return err


ITEMS = [{"id": "a", "class_label": "class0"}, {"id": "b", "class_label": 1, "seed": 42},
         {"id": "c", "class_label": "class2", "method": "speca", "config": {"k_max": 3, "k_min": 1}},
         {"id": "d", "class_label": "class3", "method": "none", "steps": 4},
         {"id": "e", "class_label": "class1", "config": {"order": 2}}]


def test_jsonl_batch_with_per_item_methods_then_resume(tmp_path, dit_dir, capsys):
    items, out = _items(tmp_path, *ITEMS), tmp_path / "out"
    argv = ["generate", "--model", str(dit_dir), "--prompt-file", str(items), *STEPS, "--out", str(out)]
    assert main(argv) == 0
    lines = _merged(out)
    assert [r["id"] for r in lines] == ["a", "b", "c", "d", "e"] and all(r["status"] == "ok" for r in lines)
    by_id = {r["id"]: r for r in lines}
    assert by_id["b"]["seed"] == 42 and by_id["a"]["seed"] == 0 and by_id["e"]["seed"] == 4
    assert by_id["c"]["method"] == "speca" and by_id["c"]["config"]["k_max"] == 3
    assert by_id["c"]["config"]["tau0"] is not None  # the resolved thresholds are recorded
    assert by_id["d"]["config"] is None and by_id["d"]["step_speedup"] == 1.0 and by_id["d"]["steps"] == 4
    assert by_id["e"]["config"]["order"] == 2 and by_id["e"]["full_steps"] < 6
    for r in lines:
        assert Image.open(out / r["path"]).size == (16, 16)
    assert "5 generated" in capsys.readouterr().out

    first = {r["key"]: r["finished"] for r in lines}
    assert main(argv) == 0  # everything is done: nothing is regenerated
    assert "0 generated, 5 already done" in capsys.readouterr().out
    (out / by_id["c"]["path"]).unlink()  # a lost file is made again, alone
    assert main(argv) == 0
    assert "1 generated, 4 already done" in capsys.readouterr().out
    again = _merged(out)
    assert len(again) == 5 and [r["key"] for r in again if r["finished"] != first[r["key"]]] == [by_id["c"]["key"]]
    assert again[2]["sha256"] == by_id["c"]["sha256"]  # same seed, same bytes


def test_a_bad_item_fails_alone(tmp_path, dit_dir, capsys):
    items = _items(tmp_path, ITEMS[0], {"id": "bad", "class_label": 1, "config": {"interval": 0}}, ITEMS[1],
                   {"id": "worse", "class_label": 2, "method": "none", "config": {"order": 1}})
    out = tmp_path / "out"
    assert main(["generate", "--model", str(dit_dir), "--prompt-file", str(items), *STEPS, "--out", str(out)]) == 1
    captured = capsys.readouterr()
    assert "2 generated" in captured.out and "2 failed" in captured.out
    assert "item failed: line 2 (bad): interval=0 is out of range" in captured.err
    status = {r["id"]: (r["status"], r.get("error")) for r in _merged(out)}
    assert status["a"][0] == status["b"][0] == "ok"
    assert status["bad"][0] == "failed" and "interval" in status["bad"][1]
    assert status["worse"][0] == "failed" and "method other than 'none'" in status["worse"][1]
    assert main(["merge", str(out)]) == 0
    assert "2 ok, 2 failed" in capsys.readouterr().out


def test_ranks_split_the_items_and_their_union_is_the_single_run(tmp_path, dit_dir, capsys):
    items = _items(tmp_path, *ITEMS)
    base = ["generate", "--model", str(dit_dir), "--prompt-file", str(items), *STEPS]
    assert main([*base, "--out", str(tmp_path / "one")]) == 0
    split = tmp_path / "two"
    assert main([*base, "--rank", "1", "--world-size", "2", "--out", str(split)]) == 0
    assert not (split / "manifest.jsonl").exists() and "diffspec merge" in capsys.readouterr().out
    assert main([*base, "--rank", "0", "--world-size", "2", "--out", str(split)]) == 0
    assert "merged" in capsys.readouterr().out  # the last rank to finish merges
    per_rank = [len((split / f"manifest-rank{r}.jsonl").read_text().splitlines()) for r in (0, 1)]
    assert sorted(per_rank) == [2, 3]
    assert _outputs(split) == _outputs(tmp_path / "one")


def test_slurm_variables_pick_the_shard(tmp_path, dit_dir, capsys, monkeypatch):
    monkeypatch.setenv("SLURM_PROCID", "2")
    monkeypatch.setenv("SLURM_NTASKS", "3")
    items = _items(tmp_path, *ITEMS)
    out = tmp_path / "out"
    assert main(["generate", "--model", str(dit_dir), "--prompt-file", str(items), *STEPS, "--out", str(out)]) == 0
    assert "rank 2/3: 1 items" in capsys.readouterr().out
    assert [p.name for p in out.glob("manifest*")] == ["manifest-rank2.jsonl"]


def test_videos_flags_are_refused_for_an_image_pipeline(tmp_path, dit_dir, capsys):
    items = _items(tmp_path, {"class_label": 0, "num_frames": 5})
    assert main(["generate", "--model", str(dit_dir), "--prompt-file", str(items), "--out", str(tmp_path / "o")]) == 2
    assert "line 1: field 'num_frames' is not an argument of DiTPipeline" in _error(capsys)


def test_an_image_field_is_refused_for_a_pipeline_without_that_argument(tmp_path, dit_dir, capsys):
    from diffspec.batch import write_image

    write_image(tmp_path / "edges.png", np.zeros((8, 8, 3), np.uint8))
    items = _items(tmp_path, {"class_label": 0, "control_image": "edges.png"})
    assert main(["generate", "--model", str(dit_dir), "--prompt-file", str(items), "--out", str(tmp_path / "o")]) == 2
    assert "line 1: field 'control_image' is not an argument of DiTPipeline" in _error(capsys)


def test_a_controlnet_pipeline_takes_each_items_control_image(tmp_path, capsys):
    """A tiny random-weight FluxControlNetPipeline saved locally: items with different control images run (one call
    per image), with taylor forecasting the ControlNet too; the image changes the output, and a rerun skips both."""
    from diffusers import FluxControlNetPipeline

    from diffspec.batch import write_image
    from diffspec.testing.random_transformers import build_flux_controlnet
    from diffspec.testing.tiny_pipelines import build_tiny_pipeline

    flux = build_tiny_pipeline("tiny-flux-random")
    controlnet = build_flux_controlnet(flux.transformer, 1, 2, std=0.3)
    FluxControlNetPipeline(**flux.components, controlnet=controlnet).save_pretrained(tmp_path / "cn")
    gen = np.random.default_rng(0)
    for name in ("a", "b"):
        write_image(tmp_path / f"{name}.png", gen.integers(0, 256, (16, 16, 3), dtype=np.uint8))
    items = _items(tmp_path, {"id": "a", "prompt": "a fox", "control_image": "a.png", "seed": 3},
                   {"id": "b", "prompt": "a fox", "control_image": "b.png", "seed": 3})
    out = tmp_path / "out"
    argv = ["generate", "--model", str(tmp_path / "cn"), "--prompt-file", str(items), "--height", "16", "--width", "16",
            "--steps", "8", "--set", "warmup=2", "--out", str(out)]
    assert main(argv) == 0
    capsys.readouterr()
    records = {r["id"]: r for r in _merged(out)}
    assert all(r["status"] == "ok" for r in records.values())
    assert records["a"]["control_image"]["file"] == "a.png" and records["a"]["sha256"] != records["b"]["sha256"]
    assert records["a"]["controlnet_calls"] == records["a"]["full_steps"] < 8  # the ControlNet forecast as well
    assert main(argv) == 0
    assert "0 generated, 2 already done" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("lines", "extra", "needle"),
    [
        (['{"class_label": 0}', '{"class_label": 1'], [], "items.jsonl line 2: not valid JSON"),
        (['{"class_label": 0, "method": "warp"}'], [], "line 1: field 'method': unknown method 'warp'"),
        (['{"class_label": 0, "sampler": "x"}'], [], "line 1: unknown field 'sampler'"),
        (['{"class_label": "zebra"}'], [], "line 1: unknown class 'zebra'"),
        (['{"prompt": "a cat"}', '{"class_label": "class1"}'], [], "line 1: unknown class 'a cat'"),
        (['{"class_label": 0}'], ["--model", "/no/such/folder"], "/no/such/folder"),
        (['{"class_label": 0}'], ["--video-format", "avi"], "video format 'avi' is not supported"),
        (['{"class_label": 0}'], ["--rank", "1"], "both --rank and --world-size"),
        (['{"class_label": 0}'], ["--rank", "2", "--world-size", "2"], "rank 2 is out of range"),
        (['{"class_label": 0, "guidance_scale": Infinity}'], [], "line 1: field 'guidance_scale' must be a finite"),
        (['{"class_label": 0, "guidance_scale": NaN}'], [], "line 1: field 'guidance_scale' must be a finite"),
        (['{"class_label": 0, "guidance_scale": -1e999}'], [], "line 1: field 'guidance_scale' must be a finite"),
        (['{"class_label": 0}'], ["--guidance-scale", "inf"], "--guidance-scale: 'inf' is not a finite number"),
        (['{"class_label": 0}'], ["--guidance-scale", "nan"], "--guidance-scale: 'nan' is not a finite number"),
        (['{"class_label": 0}'], ["--height", "100000"], "--height: 100000 is out of range; must be 1 to 8192"),
        (['{"class_label": 0}'], ["--width", "0"], "--width: 0 is out of range; must be 1 to 8192"),
        (['{"class_label": 0, "width": 100000}'], [], "line 1: field 'width'=100000 is out of range; must be 1 to"),
    ],
)
def test_bad_input_is_one_line_naming_the_line_or_flag(tmp_path, dit_dir, capsys, lines, extra, needle):
    items = tmp_path / "items.jsonl"
    items.write_text("\n".join(lines) + "\n")
    argv = ["generate", "--model", str(dit_dir), "--prompt-file", str(items), "--out", str(tmp_path / "o"), *extra]
    assert main(argv) == 2
    assert needle in _error(capsys)


def test_an_unwritable_output_folder_is_refused_before_loading(tmp_path, dit_dir, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    argv = ["generate", "--model", str(dit_dir), "--class-labels", "0", "--out", str(blocker / "out")]
    assert main(argv) == 2
    assert "--out" in (err := _error(capsys)) and "is not a writable folder" in err


@pytest.mark.parametrize(("extra", "needle"), [(["--model", "/no/such/model", "--class-labels", "0"], "/no/such/model"),
                                               (["--class-labels", "zebra"], "unknown class 'zebra'")])
def test_refused_input_leaves_no_output_folder(tmp_path, dit_dir, capsys, extra, needle):
    out = tmp_path / "deep" / "out"
    assert main(["generate", "--model", str(dit_dir), *extra, "--out", str(out)]) == 2
    assert needle in _error(capsys) and not (tmp_path / "deep").exists()


def test_a_long_value_is_cut_short_in_the_error(tmp_path, dit_dir, capsys):
    prompts = tmp_path / "p.txt"
    prompts.write_text("x" * 2**20 + "\n")
    argv = ["generate", "--model", str(dit_dir), "--prompt-file", str(prompts), "--out", str(tmp_path / "o")]
    assert main(argv) == 2
    err = _error(capsys)
    assert "line 1: unknown class 'xxxx" in err and "xxx..." in err and len(err) < 400


def test_exact_methods_run_on_a_scheduler_swapped_in_by_name(tmp_path, dit_dir, capsys):
    base = ["generate", "--model", str(dit_dir), "--class-labels", "0", "--method", "coupling", *STEPS]
    assert main([*base, "--out", str(tmp_path / "own")]) == 1  # the saved DDIM pipeline samples deterministically
    assert "no stochastic sampler" in capsys.readouterr().err
    assert main([*base, "--scheduler", "DDPMScheduler", "--out", str(out := tmp_path / "ddpm")]) == 0
    [row] = _merged(out)
    assert row["status"] == "ok" and row["target_calls"] <= 6


def test_an_unknown_scheduler_is_refused_before_anything_is_made(tmp_path, dit_dir, capsys):
    out = tmp_path / "out"
    argv = ["generate", "--model", str(dit_dir), "--class-labels", "0", "--scheduler", "UNet2DModel", "--out", str(out)]
    assert main(argv) == 2
    assert "--scheduler 'UNet2DModel' is not a diffusers scheduler class" in _error(capsys) and not out.exists()


def test_merge_of_a_folder_without_manifests(tmp_path, capsys):
    assert main(["merge", str(tmp_path)]) == 2
    assert "manifest-rank" in _error(capsys)
    assert main(["merge", str(tmp_path / "nope")]) == 2
    assert "is not a folder" in _error(capsys)


def test_a_model_folders_call_defaults_apply_where_items_are_silent(tmp_path, capsys):
    """diffspec_model.json's call_defaults (size, max_sequence_length) fill in what neither flags nor items set."""
    from diffspec.testing.tiny_pipelines import save_tiny_pipeline

    folder = save_tiny_pipeline("tiny-flux-random", tmp_path / "flux")
    (folder / "diffspec_model.json").write_text(json.dumps({"call_defaults": {"height": 20, "width": 12,
                                                                              "max_sequence_length": 8}}))
    items = _items(tmp_path, {"id": "own", "prompt": "a fox"}, {"id": "set", "prompt": "a fox", "height": 16})
    out = tmp_path / "out"
    assert main(["generate", "--model", str(folder), "--prompt-file", str(items), "--steps", "2", "--method", "none",
                 "--out", str(out)]) == 0
    capsys.readouterr()
    records = {r["id"]: r for r in _merged(out)}
    sizes = {k: Image.open(out / r["path"]).size for k, r in records.items()}
    assert sizes == {"own": (12, 20), "set": (12, 16)}
