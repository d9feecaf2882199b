"""``diffspec generate`` / ``merge`` under faults: a full disk, non-finite outputs, damaged files, a second process."""

import errno
import json
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image

from diffspec.cli import main

STEPS = ["--steps", "4", "--method", "none"]


def _merged(out):
    return [json.loads(x) for x in (out / "manifest.jsonl").read_text().splitlines()]


def _shas(out):
    return {r["key"]: r["sha256"] for r in _merged(out) if r["status"] == "ok"}


def _error_lines(err):
    assert "Traceback" not in err
    return [line for line in err.splitlines() if line.startswith("diffspec:")]


def _disk_full(monkeypatch, *, after, manifest=True):
    """Images fail with ENOSPC after ``after`` successful ones (each failed save leaves a partial file behind it);
    with ``manifest``, manifest lines then fail too, half written first."""
    from diffspec.batch import manifest as manifest_module

    saved, full = [0], [False]
    real_save, real_write = Image.Image.save, manifest_module._write_all

    def save(self, fp, *args, **kwargs):
        if saved[0] >= after:
            full[0] = True
        if full[0]:
            with open(fp, "wb") as fh:
                fh.write(b"\x89PNG\r\n")
            raise OSError(errno.ENOSPC, "No space left on device")
        saved[0] += 1
        return real_save(self, fp, *args, **kwargs)

    def write_all(fd, data):
        if full[0] and manifest:
            real_write(fd, data[: len(data) // 2])
            raise OSError(errno.ENOSPC, "No space left on device")
        real_write(fd, data)

    monkeypatch.setattr(Image.Image, "save", save)
    monkeypatch.setattr(manifest_module, "_write_all", write_all)


@pytest.mark.parametrize("manifest_full", [True, False], ids=["disk-full", "outputs-full"])
def test_a_full_disk_stops_with_one_line_and_a_rerun_completes(tmp_path, dit_dir, capsys, monkeypatch,
                                                               manifest_full):
    from diffspec.batch import read_records

    out = tmp_path / "out"
    argv = ["generate", "--model", str(dit_dir), "--class-labels", "0,1,2,3,0,1", *STEPS, "--out", str(out)]
    with monkeypatch.context() as patch:
        _disk_full(patch, after=2, manifest=manifest_full)
        assert main(argv) == 1
    captured = capsys.readouterr()
    (line,) = _error_lines(captured.err)
    assert line.startswith("diffspec: error: ") and "No space left on device" in line and "rerun" in line
    records, unreadable = read_records(out)
    assert unreadable == 0  # no cut line
    assert [r["status"] for r in records] == ["ok", "ok"] + ([] if manifest_full else ["failed"])
    if not manifest_full:  # the failed item says why, in one line
        assert "No space left on device" in records[2]["error"] and "\n" not in records[2]["error"]
    assert not list(out.glob("*/.tmp-*")) and len(list(out.glob("*/*.png"))) == 2
    assert not (out / "manifest.jsonl").exists()
    # space freed: the rerun makes the rest, every item once, the same files as a clean run
    assert main(argv) == 0
    assert "4 generated, 2 already done" in capsys.readouterr().out
    merged = _merged(out)
    assert len(merged) == 6 and len({r["key"] for r in merged}) == 6 and {r["status"] for r in merged} == {"ok"}
    clean = tmp_path / "clean"
    assert main([*argv[:-1], str(clean)]) == 0
    assert _shas(out) == _shas(clean)


def test_the_manifest_is_cut_back_when_a_line_cannot_be_written(tmp_path, monkeypatch):
    from diffspec.batch import ManifestWriter, read_records
    from diffspec.batch import manifest as manifest_module

    with ManifestWriter(tmp_path, 0) as m:
        m.write({"key": "a", "status": "failed", "finished": 1.0})
        real = manifest_module._write_all

        def half(fd, data):
            real(fd, data[:7])
            raise OSError(errno.ENOSPC, "No space left on device")

        monkeypatch.setattr(manifest_module, "_write_all", half)
        with pytest.raises(OSError, match="No space left"):
            m.write({"key": "b", "status": "failed", "finished": 2.0})
        monkeypatch.undo()
        m.write({"key": "c", "status": "failed", "finished": 3.0})
    records, unreadable = read_records(tmp_path)
    assert [r["key"] for r in records] == ["a", "c"] and unreadable == 0


def test_a_non_finite_output_is_failed_not_written(tmp_path, dit_dir):
    """``guidance_scale=inf`` (through the Python API: the CLI refuses it) makes the sampler diverge to NaN."""
    from diffspec.batch import GenItem, generate_batch, read_records
    from diffspec.models import load_pipeline

    pipe = load_pipeline(dit_dir)
    pipe.set_progress_bar_config(disable=True)
    items = [GenItem(index=i, line=0, id=str(i), prompt=None, class_label=i, seed=i, steps=3, method="none",
                     guidance_scale=g) for i, g in enumerate([float("inf"), 4.0])]
    summary = generate_batch(pipe, items, tmp_path, model={"name": "dit", "fingerprint": "0"}, show_progress=False)
    assert (summary.generated, summary.failed) == (1, 1)
    records = {r["id"]: r for r in read_records(tmp_path)[0]}
    assert records["0"]["status"] == "failed" and "NaN" in records["0"]["error"] and records["0"]["path"] is None
    assert records["1"]["status"] == "ok"
    assert [p.name for p in tmp_path.glob("*/*.png")] == [records["1"]["path"].split("/")[1]]


def test_outputs_that_no_model_makes_are_named():
    from diffspec.batch.media import output_problem

    rng = np.random.default_rng(0)
    image = rng.random((8, 8, 3)).astype(np.float32)
    assert output_problem(image) is None and output_problem((image * 255).astype(np.uint8)) is None
    nan, inf = image.copy(), image.copy()
    nan[0, 0, 0], inf[1, 1, 1] = np.nan, np.inf
    assert "1 NaN" in output_problem(nan) and "1 infinite" in output_problem(inf)
    assert "one value" in output_problem(np.zeros((4, 8, 8, 3), np.float32))  # a black video
    assert "one value" in output_problem(np.full((8, 8, 3), 255, np.uint8))


def test_a_damaged_output_is_found_and_made_again(tmp_path, dit_dir, capsys):
    out = tmp_path / "out"
    argv = ["generate", "--model", str(dit_dir), "--class-labels", "0,1,2", *STEPS, "--out", str(out)]
    assert main(argv) == 0
    capsys.readouterr()
    first = _merged(out)
    assert all(r["size"] == (out / r["path"]).stat().st_size for r in first)  # recorded with the sha256
    cut, flipped = out / first[0]["path"], out / first[1]["path"]
    cut.write_bytes(cut.read_bytes()[:100])  # truncated
    data = bytearray(flipped.read_bytes())
    data[-20] ^= 0xFF  # same size, other bytes
    flipped.write_bytes(bytes(data))
    assert main(["merge", str(out)]) == 1  # the size gives the truncated file away without hashing
    assert "2 ok, 0 failed, 1 damaged" in capsys.readouterr().out
    assert main(["merge", "--verify", str(out)]) == 1
    assert "1 ok, 0 failed, 2 damaged" in capsys.readouterr().out
    assert [r["status"] for r in _merged(out)] == ["damaged", "damaged", "ok"]
    assert main(argv) == 0  # the rerun checks what it skips
    text = capsys.readouterr().out
    assert "2 generated, 1 already done" in text and "2 listed outputs missing or damaged" in text
    assert _shas(out) == {r["key"]: r["sha256"] for r in first}
    assert main(["merge", "--verify", str(out)]) == 0
    assert "3 ok, 0 failed" in capsys.readouterr().out
    cut.unlink()
    assert main(["merge", "--verify", str(out)]) == 1
    assert "2 ok, 0 failed, 1 missing" in capsys.readouterr().out


def test_a_second_unranked_run_on_one_folder_is_refused(tmp_path, dit_dir, capsys):
    from diffspec.batch.lock import LOCK_NAME

    out = tmp_path / "out"
    out.mkdir()
    argv = ["generate", "--model", str(dit_dir), "--class-labels", "0,1", *STEPS, "--out", str(out)]
    hold = ("import sys, time\nfrom filelock import FileLock\nlock = FileLock(sys.argv[1])\nlock.acquire()\n"
            "print('held', flush=True)\ntime.sleep(120)\n")
    holder = subprocess.Popen([sys.executable, "-c", hold, str(out / LOCK_NAME)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        assert main(argv) == 2
        (line,) = _error_lines(capsys.readouterr().err)
        assert str(out) in line and all(w in line for w in ("--rank", "--world-size", "torchrun", "accelerate"))
        assert not list(out.glob("manifest*"))
        assert main([*argv, "--rank", "1", "--world-size", "2"]) == 0  # ranked runs take no lock
    finally:
        holder.kill()
        holder.wait()
    assert main(argv) == 0  # the folder is free again
    assert "1 generated, 1 already done" in capsys.readouterr().out
