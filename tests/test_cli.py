import argparse
import itertools
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import diffspec
from diffspec.cli import build_parser, main, parse_overrides


@pytest.fixture(scope="module")
def local_pipe_dir(tmp_path_factory):
    from diffspec.models import save_dit_pipeline
    from diffspec.testing.image_pipelines import build_random_dit_pipeline

    return save_dit_pipeline(build_random_dit_pipeline(seed=0), tmp_path_factory.mktemp("pipe") / "tiny-dit-random")


def _error_line(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert err.startswith("diffspec: error: ") and "\n" not in err and "Traceback" not in err
    return err


def _manifest(out):
    return [json.loads(x) for x in (out / "manifest.jsonl").read_text().splitlines()]


def test_generate_writes_pngs_and_a_manifest(tmp_path, local_pipe_dir):
    out = tmp_path / "out"
    rc = main(["generate", "--model", str(local_pipe_dir), "--method", "taylor", "--class-labels",
               "class0,class3,1", "--steps", "8", "--seed", "5", "--batch-size", "2", "--set", "interval=2",
               "--out", str(out)])
    assert rc == 0
    lines = _manifest(out)
    assert [x["index"] for x in lines] == [0, 1, 2] and all(x["status"] == "ok" for x in lines)
    assert [x["path"] for x in lines] == [f"{x['key'][:2]}/{x['key']}.png" for x in lines]
    assert [x["seed"] for x in lines] == [5, 6, 7] and [x["prompt"] for x in lines] == ["class0", "class3", "1"]
    assert lines[0]["method"] == "taylor" and lines[0]["config"]["interval"] == 2
    assert lines[0]["full_steps"] + lines[0]["forecast_steps"] == 8
    assert lines[0]["step_speedup"] == 8 / lines[0]["target_calls"]  # SpecStats.speedup (docs/stats.md)
    assert Image.open(out / lines[2]["path"]).size == (16, 16)
    assert (out / "manifest-rank0.jsonl").is_file()
    assert not list(out.glob("**/.tmp-*"))


def test_an_image_depends_on_its_seed_not_on_its_batch(tmp_path, local_pipe_dir):
    args = ["generate", "--model", str(local_pipe_dir), "--method", "none", "--class-labels", "0,1,2", "--steps", "4"]
    assert main([*args, "--batch-size", "3", "--out", str(tmp_path / "a")]) == 0
    assert main([*args, "--batch-size", "1", "--out", str(tmp_path / "b")]) == 0
    a_lines, b_lines = _manifest(tmp_path / "a"), _manifest(tmp_path / "b")
    assert [x["key"] for x in a_lines] == [x["key"] for x in b_lines]  # batch size is not part of the key
    for la, lb in zip(a_lines, b_lines):
        a = np.asarray(Image.open(tmp_path / "a" / la["path"]), dtype=int)
        b = np.asarray(Image.open(tmp_path / "b" / lb["path"]), dtype=int)
        assert np.abs(a - b).max() <= 1  # batched matmuls may round differently


def test_generate_shipped_model_from_prompt_file(tmp_path):
    prompts = tmp_path / "p.txt"
    prompts.write_text("# comment\ncircle\n\nstar\n")
    assert main(["generate", "--model", "tiny-dit", "--prompt-file", str(prompts), "--steps", "5",
                 "--out", str(tmp_path / "o")]) == 0
    lines = _manifest(tmp_path / "o")
    assert [x["prompt"] for x in lines] == ["circle", "star"] and [x["line"] for x in lines] == [2, 4]
    assert Image.open(tmp_path / "o" / lines[1]["path"]).size == (32, 32)


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["generate", "--model", "no-such-model", "--class-labels", "0", "--out", "x"], "no-such-model"),
        (["generate", "--class-labels", "0", "--steps", "0", "--out", "x"], "must be >= 1"),
        (["generate", "--class-labels", "0", "--method", "warp", "--out", "x"], "unknown method 'warp'"),
        (["generate", "--class-labels", "0", "--method", "lantern", "--out", "x"], "lantern"),
        (["generate", "--class-labels", "0", "--method", "mc-sjd", "--out", "x"], "'mc-sjd' is an ar_image method"),
        (["generate", "--class-labels", "zebra", "--out", "x"], "unknown class 'zebra'"),
        (["generate", "--prompt-file", "missing.txt", "--out", "x"], "missing.txt"),
        (["generate", "--class-labels", "0", "--set", "interval=0", "--out", "x"], "interval"),
        (["generate", "--class-labels", "0", "--set", "interval", "--out", "x"], "KEY=VALUE"),
        (["generate", "--out", "x"], "exactly one of"),
        (["bench", "warp-suite"], "unknown benchmark suite"),
        (["bench", "dit-cache", "--model", "flux-1024", "--device", "cpu"], "meant for a GPU"),
        (["frobnicate"], "invalid choice"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(argv, needle, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    assert needle in _error_line(capsys)


def test_info_lists_versions_models_and_methods(capsys):
    assert main(["info", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["models"]["tiny-dit"]["classes"][:2] == ["circle", "square"] and data["devices"][0] == "cpu"
    assert data["models"]["tiny-ar"]["family"] == "ar_image" and data["models"]["tiny-vla"]["family"] == "multimodal"
    assert {"name": "taylor", "family": "diffusion", "kind": "relaxed", "status": "available"} in data["methods"]


def _section(text, title):
    """The indented lines under ``title:`` of ``diffspec info``'s output."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(title))
    return [line for line in itertools.takewhile(lambda x: x.startswith("  "), lines[start + 1:])]


def test_info_aligns_its_columns_and_names_each_models_classes(capsys):
    from diffspec.models import SHIPPED_MODELS

    assert main(["info"]) == 0
    out = capsys.readouterr().out
    models, methods = _section(out, "models"), _section(out, "methods")
    assert [row.split()[0] for row in models] == ["name", *SHIPPED_MODELS]
    rows = {row.split()[0]: row for row in models[1:]}
    assert "circle, square, triangle" in rows["tiny-dit"] and "DiTPipeline" in rows["tiny-dit"]
    assert "ids 0-9" in rows["tiny-ar"] and "FluxPipeline" in rows["tiny-flux"] and "text prompts" in rows["tiny-flux"]
    for table in (models, methods):  # each column starts where its header does, in every row
        header = table[0]
        starts = [m.start() for m in re.finditer(r"(?<=  )\S", header)]
        for row in table[1:]:
            assert all(row[s - 2:s] == "  " and row[s] != " " for s in starts), (header, row)
    assert all(not line.endswith(" ") for line in out.splitlines())


def test_help_imports_neither_torch_nor_diffusers():
    """``diffspec --help`` (and ``info``'s parser, every command's) builds without torch: checked in a fresh
    process's sys.modules, not by timing it. ``generate --help`` lists the methods from the registry (torch)."""
    code = ("import sys\nfrom diffspec.cli import main\n"
            "for argv in (['--help'], ['merge', '--help']):\n"
            "    try:\n        main(argv)\n    except SystemExit:\n        pass\n"
            "print('HEAVY', sorted(m for m in ('torch', 'diffusers', 'transformers', 'numpy') if m in sys.modules))\n")
    root = Path(diffspec.__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": str(root)}
    done = subprocess.run([sys.executable, "-c", code], cwd=root, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "usage: diffspec" in done.stdout and done.stdout.splitlines()[-1] == "HEAVY []"


def test_every_flag_has_help_and_generate_help_lists_the_diffusion_methods(capsys):
    from diffspec.api import methods

    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    for name, parser in sub.choices.items():  # generate, bench and every other command
        for action in parser._actions:
            assert action.help or getattr(action, "help_fn", None), f"{name} {action.option_strings or action.dest}"
    with pytest.raises(SystemExit):
        main(["generate", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert all(m.name in text for m in methods("diffusion", available_only=True))
    assert "acceleration method: taylor, speca, coupling, autospec; or 'none'" in text


def test_bench_cli_writes_json(tmp_path, capsys):
    out = tmp_path / "b.json"
    assert main(["bench", "dit-cache", "--model", "tiny-flux-random", "--methods", "taylor,fewer-steps", "--steps", "6",
                 "--repeats", "1", "--warmup", "0", "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert [r["method"] for r in doc["runs"]] == ["baseline", "taylor", "fewer-steps"]
    assert "| `taylor` |" in capsys.readouterr().out


def test_parse_overrides_types():
    assert parse_overrides(["a=3", "b=0.5", "c=true", "d=taylor"]) == {"a": 3, "b": 0.5, "c": True, "d": "taylor"}
