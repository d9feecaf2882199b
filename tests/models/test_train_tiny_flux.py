"""The tiny-flux training script: its tokenizer, and a short run that writes a loadable FluxPipeline folder."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))
from train_tiny_flux import MAX_SEQUENCE_LENGTH, build_tokenizer, tokenize  # noqa: E402


def test_tokenizer_reads_every_prompt_word_and_ends_with_eos():
    from diffspec.data import render_prompted_scenes

    tok = build_tokenizer()
    _, prompts = render_prompted_scenes(50, seed=1)
    ids = tokenize(tok, prompts)
    assert ids.shape == (50, MAX_SEQUENCE_LENGTH) and not (ids == tok.unk_token_id).any()
    lengths = (ids != tok.pad_token_id).sum(1)
    assert int(lengths.max()) <= 17 and bool((ids[torch.arange(50), lengths - 1] == tok.eos_token_id).all())


def test_a_short_run_writes_a_float32_flux_pipeline_with_an_int8_transformer(tmp_path):
    from diffspec.models import load_pipeline

    out = tmp_path / "tiny-flux"
    cmd = [sys.executable, str(ROOT / "scripts" / "train_tiny_flux.py"), "--out", str(out), "--steps", "2",
           "--vae", str(ROOT / "diffspec" / "weights" / "tiny-dit" / "vae"),
           "--data", "200", "--batch-size", "4", "--width", "32", "--double", "1", "--single", "1",
           "--record", str(tmp_path / "record.json"), "--eval-samples", "4"]
    subprocess.run(cmd, check=True, cwd=ROOT, capture_output=True)
    assert {f.name for f in (out / "transformer").iterdir()} == {"config.json", "model.int8.safetensors"}
    pipe = load_pipeline(out)
    assert type(pipe).__name__ == "FluxPipeline"
    assert {m.dtype for m in (pipe.transformer, pipe.text_encoder, pipe.text_encoder_2, pipe.vae)} == {torch.float32}
    settings = json.loads((out / "diffspec_model.json").read_text())
    assert settings["call_defaults"]["max_sequence_length"] == MAX_SEQUENCE_LENGTH and settings["steps"] == 28
    record = json.loads((tmp_path / "record.json").read_text())
    assert record["steps"] == 2 and 0 <= record["eval"]["prompt_accuracy"] <= 1
    assert (tmp_path / "record_samples.png").is_file()
