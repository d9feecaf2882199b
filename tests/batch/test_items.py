import json

import numpy as np
import pytest

from diffspec.batch import (
    ItemDefaults,
    ItemError,
    ManifestWriter,
    World,
    item_key,
    items_from_prompts,
    merge_manifests,
    model_identity,
    read_items,
    read_records,
    read_video,
    shard,
    write_image,
    write_video,
)
from diffspec.batch.manifest import completed
from diffspec.batch.media import has_ffmpeg, sha256_file

MODEL = {"name": "m", "fingerprint": "0" * 16}


def _jsonl(tmp_path, *lines, name="items.jsonl"):
    path = tmp_path / name
    path.write_text("\n".join(lines) + "\n")
    return path


def _key(item, **kw):
    return item_key(item, MODEL, **{"dtype": "float32", "version": "0", "config": None, "fmt": "png", **kw})


def test_jsonl_items_take_flag_defaults_and_per_item_seeds(tmp_path):
    path = _jsonl(tmp_path, "# a comment", '{"id": "fox", "prompt": "a fox", "seed": 9, "frames": 5}', "",
                  '{"class_label": 3, "method": "none", "steps": 4, "config": {}}',
                  '{"prompt": "p", "config": {"interval": 2}, "guidance_scale": 2}')
    items = read_items(path, ItemDefaults(steps=7, seed=100, overrides={"order": 2}))
    assert [it.id for it in items] == ["fox", "1", "2"] and [it.line for it in items] == [2, 4, 5]
    assert [it.seed for it in items] == [9, 101, 102]  # base seed + item index when unset
    assert items[0].num_frames == 5 and items[0].steps == 7 and items[1].steps == 4
    assert items[1].class_label == 3 and items[1].method == "none"
    assert items[2].overrides == {"order": 2, "interval": 2} and items[2].guidance_scale == 2.0


def test_text_prompt_file_and_copies(tmp_path):
    path = _jsonl(tmp_path, "circle", "star", name="p.txt")
    items = read_items(path, ItemDefaults(seed=5), copies=2)
    assert [(it.id, it.prompt, it.seed) for it in items] == [
        ("0-0", "circle", 5), ("0-1", "circle", 6), ("2-0", "star", 7), ("2-1", "star", 8)]
    assert [it.seed for it in items_from_prompts(["a", "b"], ItemDefaults(seed=3))] == [3, 4]


@pytest.mark.parametrize(
    ("line", "needle"),
    [
        ('{"prompt": "a", ', "line 2: not valid JSON"),
        ('["a"]', "line 2: expected a JSON object"),
        ('{"prompt": "a", "step": 3}', "line 2: unknown field 'step'"),
        ('{"prompt": "a", "steps": 0}', "line 2: field 'steps'=0 is out of range"),
        ('{"prompt": "a", "steps": "many"}', "line 2: field 'steps' must be an integer"),
        ('{"prompt": "a", "seed": 1.5}', "field 'seed' must be an integer"),
        ('{"seed": 1}', "exactly one of the fields 'prompt' and 'class_label'"),
        ('{"prompt": "a", "class_label": 1}', "exactly one of"),
        ('{"prompt": "a", "config": [1]}', "field 'config' must be an object"),
        ('{"prompt": 3}', "field 'prompt' must be a string"),
        ('{"prompt": "a", "id": "x"}', "line 2: id 'x' repeats the item of line 1"),
    ],
)
def test_bad_lines_name_the_line_and_field(tmp_path, line, needle):
    path = _jsonl(tmp_path, '{"prompt": "ok", "id": "x"}', line)
    with pytest.raises(ItemError, match=None) as info:
        read_items(path)
    assert needle in str(info.value)


def test_missing_and_empty_files(tmp_path):
    with pytest.raises(ItemError, match="does not exist"):
        read_items(tmp_path / "nope.jsonl")
    with pytest.raises(ItemError, match="holds no item"):
        read_items(_jsonl(tmp_path, "# only a comment"))


def test_an_undecodable_line_a_folder_and_long_values_are_named_shortly(tmp_path):
    path = tmp_path / "p.txt"
    path.write_bytes("circle\nstar \u2605\n".encode() + b"bad \xff byte\n")
    with pytest.raises(ItemError, match=r"prompt file '.*p.txt' line 3: not UTF-8 text \(byte 0xff at column 5\)"):
        read_items(path)
    with pytest.raises(ItemError, match=r"prompt file '.*' is a folder, not a file"):
        read_items(tmp_path)
    long = "y" * 10_000
    path = _jsonl(tmp_path, json.dumps({"prompt": "a", "seed": long}), json.dumps({long: 1, "prompt": "b"}))
    with pytest.raises(ItemError) as info:
        read_items(path)
    assert str(info.value) == f"line 1: field 'seed' must be an integer, got '{'y' * 79}..."
    path = _jsonl(tmp_path, json.dumps({long: 1, "prompt": "b"}))
    with pytest.raises(ItemError, match=r"line 1: unknown field 'y+\.\.\.; item fields are") as info:
        read_items(path)
    assert len(str(info.value)) < 400


def test_key_depends_on_what_decides_the_output(tmp_path):
    item = read_items(_jsonl(tmp_path, '{"prompt": "a", "seed": 1}'))[0]
    other = read_items(_jsonl(tmp_path, '{"prompt": "a", "seed": 2}'))[0]
    assert _key(item) == _key(item) and len(_key(item)) == 20
    assert len({_key(item), _key(other), _key(item, dtype="bfloat16"), _key(item, version="1"),
                _key(item, config={"interval": 3}), _key(item, fmt="mp4")}) == 6


def test_model_identity_hashes_configs_not_the_path(tmp_path):
    for name in ("a", "b"):
        (tmp_path / name / "transformer").mkdir(parents=True)
        (tmp_path / name / "model_index.json").write_text('{"x": 1}')
        (tmp_path / name / "transformer" / "config.json").write_text('{"layers": 2}')
    assert model_identity(tmp_path / "a", "m") == model_identity(tmp_path / "b", "m")
    (tmp_path / "b" / "transformer" / "config.json").write_text('{"layers": 3}')
    assert model_identity(tmp_path / "a")["fingerprint"] != model_identity(tmp_path / "b")["fingerprint"]


def test_world_detection_from_launchers():
    assert World.detect(env={}) == World(0, 1, 0, "single")
    assert World.detect(env={"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1"}) == World(3, 4, 1, "torchrun")
    slurm = {"SLURM_PROCID": "5", "SLURM_NTASKS": "8", "SLURM_LOCALID": "1"}
    assert World.detect(env=slurm) == World(5, 8, 1, "slurm")
    assert World.detect(1, 2, env=slurm) == World(1, 2, 1, "flags")
    assert World(1, 2, 1).device(None, True, 2) == "cuda:1" and World(1, 2, 1).device("cpu", True, 2) == "cpu"
    with pytest.raises(ValueError, match="out of range"):
        World.detect(env={"RANK": "2", "WORLD_SIZE": "2"})
    with pytest.raises(ValueError, match="SLURM_NTASKS='x' is not an integer"):
        World.detect(env={"SLURM_PROCID": "0", "SLURM_NTASKS": "x"})
    with pytest.raises(ValueError, match="both --rank and --world-size"):
        World.detect(rank=1, env={})


@pytest.mark.parametrize("size", [1, 2, 3, 7])
def test_shards_partition_the_items_evenly(size):
    keys = [f"{i * 7919 % 101:03d}" for i in range(23)]
    parts = [shard(keys, r, size) for r in range(size)]
    assert sorted(i for p in parts for i in p) == list(range(23))
    assert max(map(len, parts)) - min(map(len, parts)) <= 1


def test_manifest_survives_a_cut_line_and_merge_keeps_latest_ok(tmp_path):
    (tmp_path / "ab").mkdir()
    (tmp_path / "ab" / "ab1.png").write_bytes(b"x")
    with ManifestWriter(tmp_path, 0) as m:
        m.write({"key": "ab1", "index": 1, "status": "failed", "error": "boom", "finished": 1.0})
        m.write({"key": "ab1", "index": 1, "status": "ok", "path": "ab/ab1.png", "sha256": sha256_file(
            tmp_path / "ab" / "ab1.png"), "seconds": 2.0, "step_speedup": 3.0, "finished": 2.0})
    with open(tmp_path / "manifest-rank1.jsonl", "w") as fh:  # a run killed mid-line
        fh.write(json.dumps({"key": "cd2", "index": 0, "status": "failed", "error": "bad", "finished": 0.5}) + "\n")
        fh.write('{"key": "ef3", "ind')
    with ManifestWriter(tmp_path, 1) as m:  # the next run of rank 1 starts on a fresh line
        m.write({"key": "gh4", "index": 2, "status": "ok", "path": "gh/gh4.png", "finished": 3.0})
    records, bad = read_records(tmp_path)
    assert bad == 1 and [r["key"] for r in records] == ["cd2", "ab1", "ab1", "gh4"]
    assert set(completed(tmp_path)) == {"ab1"}  # gh4's file is missing
    summary = merge_manifests(tmp_path, verify=True)
    merged = [json.loads(x) for x in (tmp_path / "manifest.jsonl").read_text().splitlines()]
    assert [(r["key"], r["status"]) for r in merged] == [("cd2", "failed"), ("ab1", "ok"), ("gh4", "missing")]
    assert (summary.ok, summary.failed, summary.missing, summary.mean_step_speedup) == (1, 1, 1, 3.0)
    (tmp_path / "ab" / "ab1.png").write_bytes(b"changed")
    assert merge_manifests(tmp_path, verify=True).ok == 0


def test_merge_refuses_a_folder_without_manifests(tmp_path):
    with pytest.raises(ValueError, match="manifest-rank"):
        merge_manifests(tmp_path)


@pytest.mark.parametrize("fmt", ["mp4", "webp", "gif"])
def test_videos_are_written_atomically_and_decode(tmp_path, fmt):
    if fmt == "mp4" and not has_ffmpeg():
        pytest.skip("imageio-ffmpeg not installed")
    frames = np.random.default_rng(0).random((5, 32, 48, 3)).astype(np.float32)
    sha = write_video(tmp_path / "v" / f"a.{fmt}", frames, fps=8, fmt=fmt)
    assert sha == sha256_file(tmp_path / "v" / f"a.{fmt}")
    assert write_video(tmp_path / "v" / f"b.{fmt}", frames, fps=8, fmt=fmt) == sha  # deterministic bytes
    decoded = read_video(tmp_path / "v" / f"a.{fmt}")
    assert decoded.shape == (5, 32, 48, 3) and decoded.dtype == np.uint8
    if fmt == "webp":  # lossless
        assert np.array_equal(decoded, (frames * 255).round().astype(np.uint8))
    assert sorted(p.name for p in (tmp_path / "v").iterdir()) == [f"a.{fmt}", f"b.{fmt}"]


def test_a_failed_write_leaves_nothing(tmp_path):
    def explode(tmp):
        tmp.write_bytes(b"half")
        raise KeyboardInterrupt

    from diffspec.batch.media import write_atomic

    with pytest.raises(KeyboardInterrupt):
        write_atomic(tmp_path / "x.png", explode)
    assert list(tmp_path.iterdir()) == []
    write_image(tmp_path / "ok.png", np.zeros((4, 4, 3)))
    assert oct((tmp_path / "ok.png").stat().st_mode & 0o777) != oct(0o600)


def test_pipelines_that_need_a_negative_prompt_get_an_empty_one():
    """EasyAnimatePipeline iterates over negative_prompt (default None) under guidance: items without one get ""."""
    import dataclasses

    from diffspec.batch import GenItem, PipelineAdapter

    def call(self, prompt=None, negative_prompt=None, num_frames=49, num_inference_steps=50, output_type="pil",
             generator=None):
        pass

    easy, other = type("EasyAnimatePipeline", (), {"__call__": call}), type("WanPipeline", (), {"__call__": call})
    items = [GenItem(index=i, line=i + 1, id=str(i), prompt="a fox", seed=i, steps=4, method="none") for i in range(2)]
    assert PipelineAdapter(easy()).kwargs(items)["negative_prompt"] == ["", ""]
    assert "negative_prompt" not in PipelineAdapter(other()).kwargs(items)
    items = [dataclasses.replace(it, negative_prompt="dark") for it in items]
    assert PipelineAdapter(easy()).kwargs(items)["negative_prompt"] == ["dark", "dark"]


def test_image_fields_resolve_from_the_prompt_file_and_key_by_content(tmp_path):
    """``image`` / ``control_image`` name files, relative to the prompt file's folder; the key holds the file's name
    and a hash of its bytes: the same images in a moved folder key the same, a changed image keys anew."""
    for folder in ("a", "b"):
        (tmp_path / folder / "edges").mkdir(parents=True)
        write_image(tmp_path / folder / "edges" / "fox.png", np.zeros((8, 8, 3), np.uint8))
    keys = []
    for folder in ("a", "b"):
        path = _jsonl(tmp_path / folder, '{"prompt": "a fox", "control_image": "edges/fox.png", "seed": 1}')
        (item,) = read_items(path)
        assert item.control_image == str(tmp_path / folder / "edges" / "fox.png") and item.image is None
        assert item.input_images() == {"control_image": item.control_image}
        keys.append(_key(item))
    assert keys[0] == keys[1]
    write_image(tmp_path / "b" / "edges" / "fox.png", np.full((8, 8, 3), 255, np.uint8))
    from diffspec.batch.items import _file_digest

    _file_digest.cache_clear()
    (item,) = read_items(tmp_path / "b" / "items.jsonl")
    assert _key(item) != keys[0] and item.fields()["control_image"]["file"] == "fox.png"


@pytest.mark.parametrize("value, needle", [('"missing.png"', "is not a file"), ("3", "must be a string")])
def test_a_bad_image_field_names_the_line(tmp_path, value, needle):
    path = _jsonl(tmp_path, '{"prompt": "a"}', f'{{"prompt": "b", "image": {value}}}')
    with pytest.raises(ItemError, match=f"line 2: field 'image'.*{needle}"):
        read_items(path)
