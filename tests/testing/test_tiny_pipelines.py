"""Tiny random-weight video pipelines, saved locally and driven by ``diffspec generate`` (no hub)."""

import json

import numpy as np
import pytest

from diffspec.batch import read_video
from diffspec.batch.media import has_ffmpeg
from diffspec.cli import main
from diffspec.testing.pipeline_parts import build_word_tokenizer
from diffspec.testing.tiny_pipelines import TINY_PIPELINES, save_tiny_pipeline

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py

# family → (height, width, frames): sizes the family's VAE and patching accept (Allegro's VAE decodes
# 24-frame, 128-pixel tiles only)
SHAPES = {"tiny-wan": (32, 32, 5), "tiny-wan22": (32, 32, 5), "tiny-wan22-i2v": (32, 32, 5), "tiny-cogvideox": (32, 32, 9), "tiny-ltx": (32, 64, 9),
          "tiny-hunyuanvideo": (32, 32, 5), "tiny-skyreelsv2": (32, 32, 5), "tiny-mochi": (32, 32, 7),
          "tiny-allegro": (128, 128, 24), "tiny-easyanimate": (32, 32, 5)}
IMAGE_SHAPES = {"tiny-flux-random": (16, 24), "tiny-chroma": (16, 24), "tiny-lumina2": (32, 48),
                "tiny-auraflow": (16, 24), "tiny-cogview3plus": (32, 48),
                "tiny-hidream": (256, 256)}


IMAGE_INPUT = {"tiny-wan22-i2v"}
"""Pipelines whose calls need an ``image`` (the items give one)."""


@pytest.fixture
def ftfy_or_identity(monkeypatch):
    """SkyReelsV2Pipeline and WanImageToVideoPipeline clean prompts with ``ftfy.fix_text`` without checking that
    ftfy is installed (WanPipeline checks); where it is not, the identity stands in (what fix_text does to plain
    ASCII)."""
    import importlib.util
    import types

    if importlib.util.find_spec("ftfy") is None:
        from diffusers.pipelines.skyreels_v2 import pipeline_skyreels_v2
        from diffusers.pipelines.wan import pipeline_wan_i2v

        for module in (pipeline_skyreels_v2, pipeline_wan_i2v):
            monkeypatch.setattr(module, "ftfy", types.SimpleNamespace(fix_text=lambda text: text), raising=False)


def test_every_builder_has_a_shape():
    assert set(SHAPES) | set(IMAGE_SHAPES) == set(TINY_PIPELINES)


def test_word_tokenizer_is_offline_and_pads():
    tok = build_word_tokenizer(8)
    enc = tok(["a red fox", "zebra"], padding="max_length", max_length=8)
    assert enc["input_ids"][1][:2] == [tok.unk_token_id, tok.pad_token_id] and enc["attention_mask"][0][3] == 0


def test_load_pipeline_turns_on_tiling_for_a_tiles_only_vae(tmp_path):
    """AutoencoderKLAllegro.decode raises NotImplementedError without tiling, a switch save_pretrained
    does not keep: load_pipeline (the CLI's and SpeculativePipeline.from_pretrained's loader) turns it on."""
    from diffspec.models import load_pipeline

    assert load_pipeline(save_tiny_pipeline("tiny-allegro", tmp_path / "allegro")).vae.use_tiling


@pytest.mark.parametrize("name", list(SHAPES))
def test_generate_videos_with_taylor_and_speca(tmp_path, name, capsys, ftfy_or_identity):
    folder = save_tiny_pipeline(name, tmp_path / name)
    height, width, frames = SHAPES[name]
    items = tmp_path / "items.jsonl"
    image = {}
    if name in IMAGE_INPUT:  # the first frame, from the prompt file's folder
        from diffspec.batch import write_image

        write_image(tmp_path / "first.png", np.random.default_rng(0).integers(0, 256, (height, width, 3), np.uint8))
        image = {"image": "first.png"}
    items.write_text("\n".join(json.dumps({**o, **image}) for o in [
        {"id": "t", "prompt": "a red fox runs in the snow", "method": "taylor", "config": {"warmup": 2}},
        {"id": "s", "prompt": "a cat sits", "method": "speca", "config": {"warmup": 2}, "fps": 8},
        {"id": "n", "prompt": "a boat", "method": "none", "steps": 3},
    ]) + "\n")
    fmt = "mp4" if has_ffmpeg() else "webp"
    out = tmp_path / "out"
    argv = ["generate", "--model", str(folder), "--prompt-file", str(items), "--height", str(height), "--width",
            str(width), "--num-frames", str(frames), "--steps", "8", "--video-format", fmt, "--out", str(out)]
    assert main(argv) == 0, capsys.readouterr().err
    lines = {r["id"]: r for r in map(json.loads, (out / "manifest.jsonl").read_text().splitlines())}
    assert all(r["status"] == "ok" and r["path"].endswith(f".{fmt}") for r in lines.values())
    for r in lines.values():
        assert read_video(out / r["path"]).shape == (frames, height, width, 3)
    for key in ("t", "s"):
        assert lines[key]["forecast_steps"] > 0 and lines[key]["step_speedup"] > 1.0
    assert lines["s"]["fps"] == 8 and lines["s"]["config"]["tau0"] is not None
    assert lines["n"]["step_speedup"] == 1.0
    if fmt == "mp4":
        import imageio_ffmpeg

        meta = next(imageio_ffmpeg.read_frames(str(out / lines["s"]["path"])))
        assert meta["fps"] == 8


@pytest.mark.parametrize("name", list(IMAGE_SHAPES))
def test_generate_images_from_text(tmp_path, name, capsys):
    from PIL import Image

    folder = save_tiny_pipeline(name, tmp_path / name)
    height, width = IMAGE_SHAPES[name]
    items = tmp_path / "items.jsonl"
    items.write_text(json.dumps({"prompt": "a red fox", "negative_prompt": "dark"}) + "\n"
                     + json.dumps({"prompt": "a cat", "method": "speca", "config": {"warmup": 2}}) + "\n")
    out = tmp_path / "out"
    argv = ["generate", "--model", str(folder), "--prompt-file", str(items), "--height", str(height), "--width",
            str(width), "--steps", "8", "--out", str(out)]
    assert main(argv) == 0, capsys.readouterr().err
    lines = [json.loads(x) for x in (out / "manifest.jsonl").read_text().splitlines()]
    assert [r["status"] for r in lines] == ["ok", "ok"] and all(r["step_speedup"] > 1 for r in lines)
    assert all(Image.open(out / r["path"]).size == (width, height) for r in lines)
    items.write_text(json.dumps({"prompt": "a fox", "num_frames": 5}) + "\n")
    assert main([*argv[:-2], "--out", str(tmp_path / "o2")]) == 2
    pipeline_class = json.loads((folder / "model_index.json").read_text())["_class_name"]
    assert f"field 'num_frames' is not an argument of {pipeline_class}" in capsys.readouterr().err
