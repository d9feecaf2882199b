"""Real processes: a run killed mid-way resumes cleanly; 1 and 2 launched processes give the same files."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from PIL import Image

import diffspec
from diffspec.cli import main

ROOT = Path(diffspec.__file__).resolve().parents[1]


def _env():
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "SLURM_PROCID", "SLURM_NTASKS"):
        env.pop(name, None)
    return env


def _lines(path):
    return path.read_text().splitlines() if path.is_file() else []


def _wait_for_lines(proc, manifest, n, timeout=180.0):
    deadline = time.monotonic() + timeout
    while len(_lines(manifest)) < n:
        assert proc.poll() is None, f"the run ended early: {proc.communicate()}"
        assert time.monotonic() < deadline, "the run made no progress"
        time.sleep(0.05)


def _outputs(out):
    files = sorted(p for p in out.glob("*/*") if not p.name.startswith(".tmp-"))
    return files


def _decodes(path):
    with Image.open(path) as img:
        img.load()
    return True


@pytest.mark.slow
def test_killed_runs_resume_without_loss_or_duplicates(tmp_path, dit_dir):
    items = tmp_path / "items.txt"
    n = 24
    items.write_text("".join(f"class{i % 4}\n" for i in range(n)))
    out = tmp_path / "out"
    argv = ["generate", "--model", str(dit_dir), "--prompt-file", str(items), "--steps", "40", "--out", str(out)]
    manifest = out / "manifest-rank0.jsonl"
    # SIGTERM: unwinds, removes its temporary file, exits 143
    proc = subprocess.Popen([sys.executable, "-m", "diffspec", *argv], cwd=ROOT, env=_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _wait_for_lines(proc, manifest, 2)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 143 and "rerun the same command to resume" in err
    assert not list(out.glob("*/.tmp-*"))
    after_term = len(_lines(manifest))
    # SIGKILL: no chance to clean up; whatever is under a final name must still be whole
    proc = subprocess.Popen([sys.executable, "-m", "diffspec", *argv], cwd=ROOT, env=_env(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _wait_for_lines(proc, manifest, after_term + 2)
    proc.kill()
    proc.wait(timeout=60)
    killed = [json.loads(x) for x in _lines(manifest) if x.strip().endswith("}")]
    assert all(_decodes(p) for p in _outputs(out))
    assert 4 <= len(killed) < n
    # the rerun finishes the batch: every item once, every file decodes, finished items untouched
    assert main(argv) == 0
    merged = [json.loads(x) for x in (out / "manifest.jsonl").read_text().splitlines()]
    assert len(merged) == n and len({r["key"] for r in merged}) == n and all(r["status"] == "ok" for r in merged)
    assert sorted(out / r["path"] for r in merged) == _outputs(out)
    assert all(_decodes(p) for p in _outputs(out))
    before = {r["key"]: r["finished"] for r in killed}
    assert all(r["finished"] == before[r["key"]] for r in merged if r["key"] in before)
    assert not list(out.glob("*/.tmp-*"))


@pytest.mark.slow
def test_one_and_two_launched_processes_write_identical_files(tmp_path, dit_dir):
    items = tmp_path / "items.jsonl"
    objs = [{"class_label": i % 4, "method": ["taylor", "speca", "none"][i % 3]} for i in range(9)]
    objs.append({"class_label": 1, "config": {"interval": 0}})  # fails, alone, on whichever rank has it
    items.write_text("".join(json.dumps(o) + "\n" for o in objs))
    args = ["generate", "--model", str(dit_dir), "--prompt-file", str(items), "--steps", "8"]
    assert main([*args, "--out", str(tmp_path / "one")]) == 1  # one process: failures give exit 1
    # `accelerate launch --cpu` starts a single process whatever --num_processes says; --multi_gpu
    # starts N processes through torch's elastic launcher (RANK/WORLD_SIZE/LOCAL_RANK), on CPU too.
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
           "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
           "-m", "diffspec", *args, "--out", str(tmp_path / "two")]
    done = subprocess.run(cmd, cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]  # under a launcher a failed item does not stop the ranks
    assert "rank 0/2: 5 items" in done.stdout and "rank 1/2: 5 items" in done.stdout
    assert "9 ok, 1 failed" in done.stdout and "interval=0 is out of range" in done.stderr

    def shas(out):
        merged = [json.loads(x) for x in (out / "manifest.jsonl").read_text().splitlines()]
        return {r["key"]: r["sha256"] for r in merged if r["status"] == "ok"}

    one, two = shas(tmp_path / "one"), shas(tmp_path / "two")
    assert len(one) == 9 and one == two


@pytest.mark.slow
def test_a_second_unranked_process_on_one_folder_is_refused_while_the_first_runs(tmp_path, dit_dir, capsys):
    items = tmp_path / "items.txt"
    items.write_text("".join(f"class{i % 4}\n" for i in range(12)))
    out = tmp_path / "out"
    argv = ["generate", "--model", str(dit_dir), "--prompt-file", str(items), "--steps", "40", "--out", str(out)]
    proc = subprocess.Popen([sys.executable, "-m", "diffspec", *argv], cwd=ROOT, env=_env(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait_for_lines(proc, out / "manifest-rank0.jsonl", 1)
        assert main(argv) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("diffspec: error: another unranked `diffspec generate` is writing to") and "\n" not in err
        assert "--rank R --world-size N" in err and "torchrun" in err
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=120)
    assert main(argv) == 0  # resumes once the first has stopped: every item once
    merged = [json.loads(x) for x in (out / "manifest.jsonl").read_text().splitlines()]
    assert len(merged) == 12 and len({r["key"] for r in merged}) == 12
    assert len({r["key"] for r in map(json.loads, _lines(out / "manifest-rank0.jsonl"))}) == 12
