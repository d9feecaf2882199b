"""``lantern`` / ``lantern++`` arms of the ar-image suite and the shipped tiny-ar drafter."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from diffspec import SpeculativePipeline
from diffspec.ar_image.drafter import EagleDrafter
from diffspec.ar_image.targets.llamagen import LlamaGenTransformer
from diffspec.ar_image.targets.llamagen_config import LlamaGenConfig
from diffspec.ar_image.targets.patch_vq import PatchVQ, PatchVQConfig
from diffspec.bench import run_bench
from diffspec.bench.report import markdown_table


def _model_folder(tmp_path: Path) -> Path:
    torch.manual_seed(0)
    config = LlamaGenConfig(dim=32, n_layer=2, n_head=2, vocab_size=16, num_classes=10, block_size=16, multiple_of=16)
    LlamaGenTransformer(config).eval().save_pretrained(tmp_path / "m" / "gpt")
    EagleDrafter(config).eval().save_pretrained(tmp_path / "m" / "drafter")
    vq = PatchVQ(PatchVQConfig(image_size=32, patch_size=8, codebook_size=16), torch.rand(16, 3 * 8 * 8) * 2 - 1)
    vq.save_pretrained(tmp_path / "m" / "tokenizer")
    return tmp_path / "m"


def test_lantern_arms_in_ar_image_suite(tmp_path: Path) -> None:
    doc = run_bench("ar-image", model=str(_model_folder(tmp_path)), methods=["lantern", "lantern++"], repeats=1,
                    warmup=0, quality_samples=8, show_progress=False, overrides={"window": 8})  # window: Jacobi only
    runs = {r["method"]: r for r in doc["runs"]}
    assert list(runs) == ["baseline", "lantern", "lantern++"]
    assert runs["baseline"]["quality"]["exact"] is True
    for name in ("lantern", "lantern++"):
        run = runs[name]
        assert run["quality"]["exact"] is False and run["config"]["method"] == name
        assert 1 <= run["target_calls"] <= 16 and run["draft_calls"] > 0
        assert 0.0 <= run["tv_budget_mean"] and 0.0 <= run["quality"]["same_seed"]["vs_baseline"]["token_disagreement"] <= 1.0
    assert "(relaxed)" in markdown_table(doc)


def test_tiny_ar_ships_a_drafter_used_by_default() -> None:
    folder = Path(__file__).parents[2] / "diffspec" / "weights" / "tiny-ar" / "drafter"
    if not (folder / "config.json").is_file():
        pytest.skip("tiny-ar drafter not trained yet")
    record = json.loads((folder / "training.json").read_text())
    assert record["history"][-1]["loss"] < record["history"][0]["loss"]
    spec = SpeculativePipeline.from_pretrained("tiny-ar", method="lantern")
    spec.set_progress_bar_config(disable=True)
    out = spec(class_labels=[3, 5], output_type="tokens", generator=torch.Generator().manual_seed(0))
    assert out.tokens.shape == (2, 64) and spec.stats.accepted > 0
    assert spec.stats.extra["step_compression"] > 1.0
