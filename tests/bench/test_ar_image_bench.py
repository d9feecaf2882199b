"""The ar-image benchmark suite on a tiny random-weight AR model folder (structure, counting, test power)."""

from __future__ import annotations

import pytest
import torch

from diffspec.ar_image.targets.llamagen import LlamaGenTransformer
from diffspec.ar_image.targets.llamagen_config import LlamaGenConfig
from diffspec.ar_image.targets.patch_vq import PatchVQ, PatchVQConfig
from diffspec.bench import run_bench
from diffspec.bench.ar_image import token_homogeneity


def _model_folder(tmp_path):
    torch.manual_seed(0)
    config = LlamaGenConfig(dim=32, n_layer=2, n_head=2, vocab_size=16, num_classes=10, block_size=16, multiple_of=16)
    LlamaGenTransformer(config).eval().save_pretrained(tmp_path / "m" / "gpt")
    vq = PatchVQ(PatchVQConfig(image_size=32, patch_size=8, codebook_size=16), torch.rand(16, 3 * 8 * 8) * 2 - 1)
    vq.save_pretrained(tmp_path / "m" / "tokenizer")
    return tmp_path / "m"


def test_ar_image_suite_json(tmp_path):
    out = tmp_path / "ar.json"
    doc = run_bench("ar-image", out=out, model=str(_model_folder(tmp_path)), methods=["sjd", "mc-sjd"], repeats=1,
                    warmup=0, quality_samples=12, show_progress=False)
    assert out.is_file() and doc["suite"] == "ar-image"
    runs = {r["method"]: r for r in doc["runs"]}
    assert list(runs) == ["baseline", "sjd", "mc-sjd"]
    assert runs["baseline"]["target_calls"] == 16 and runs["baseline"]["step_compression"] == 1.0
    for name in ("sjd", "mc-sjd"):
        assert 1 <= runs[name]["target_calls"] <= 16
        assert runs[name]["quality"]["token_two_sample"]["positions"] == 16
        assert runs[name]["quality"]["exact"] is True
    assert doc["model"]["grid"] == [4, 4] and 0 < doc["model"]["token_entropy"]["mean_entropy_nats"] < 2.8
    assert doc["peers_not_run"]


def test_token_homogeneity_has_power():
    g = torch.Generator().manual_seed(0)
    law = torch.softmax(torch.randn(8, 6, generator=g), -1)
    a = torch.multinomial(law, 2000, replacement=True, generator=g).T
    b = torch.multinomial(law, 2000, replacement=True, generator=g).T
    assert token_homogeneity(a, b, 6)["passed"]
    biased = law.clone()
    biased[3] = torch.softmax(biased[3].log() + torch.tensor([0.4, 0, 0, 0, 0, 0]), -1)
    c = torch.multinomial(biased, 2000, replacement=True, generator=g).T
    report = token_homogeneity(a, c, 6)
    assert not report["passed"] and report["bonferroni_p"] < 1e-3


def test_ar_image_report_table(tmp_path):
    from diffspec.bench.report import headline, markdown_table

    doc = run_bench("ar-image", model=str(_model_folder(tmp_path)), methods=["sjd"], repeats=1, warmup=0,
                    quality_samples=4, show_progress=False)
    assert "16 tokens" in headline(doc)
    table = markdown_table(doc).splitlines()
    assert len(table) == 4 and table[2].startswith("| `baseline` |") and "1.00x" in table[2]


def test_ar_image_suite_relaxed_gsd_arm(tmp_path):
    doc = run_bench("ar-image", model=str(_model_folder(tmp_path)), methods=["mc-sjd", "gsd-G25"], repeats=1,
                    warmup=0, quality_samples=6, show_progress=False)
    runs = {r["method"]: r for r in doc["runs"]}
    gsd, exact = runs["gsd-G25"], runs["mc-sjd"]
    assert gsd["config"]["group_size"] == 25 and gsd["quality"]["exact"] is False and exact["quality"]["exact"]
    assert 0 <= gsd["relaxed_tv"] <= 1 and "relaxed_tv" not in exact
    assert 0 <= gsd["quality"]["relaxed_tv"] <= 1 and "relaxed_tv" not in exact["quality"]
    for run in (gsd, exact):
        same = run["quality"]["same_seed"]
        assert same["samples"] == 6 and 0 <= same["vs_baseline"]["token_disagreement"] <= 1
    assert "vs_mc_sjd" in gsd["quality"]["same_seed"] and "vs_mc_sjd" not in exact["quality"]["same_seed"]


def test_same_seed_difference_counts_tokens_and_psnr():
    from diffspec.bench.ar_image import same_seed_difference

    a = torch.zeros(2, 4, dtype=torch.long)
    b = a.clone()
    b[0, :2] = 1
    img = torch.zeros(2, 3, 4, 4)
    assert same_seed_difference(a, a, img, img) == {"token_disagreement": 0.0, "psnr": 100.0}
    other = img.clone()
    other[0] = 1.0  # MSE 1 on a range of 2: 10 log10(4) dB for that image
    report = same_seed_difference(b, a, other, img)
    assert report["token_disagreement"] == 0.25 and abs(report["psnr"] - (100 + 10 * 0.60206) / 2) < 1e-3


def test_ar_image_uses_the_model_folders_reference_classifier(tmp_path):
    import json

    folder = _model_folder(tmp_path)
    (folder / "generation_config.json").write_text(json.dumps({"reference_classifier": "shapes-tex"}))
    doc = run_bench("ar-image", model=str(folder), methods=["sjd"], repeats=1, warmup=0, quality_samples=4,
                    show_progress=False)
    assert doc["model"]["reference_classifier"] == "shapes-tex"
    default = run_bench("ar-image", model=str(_model_folder(tmp_path / "plain")), methods=["sjd"], repeats=1,
                        warmup=0, quality_samples=4, show_progress=False)
    assert default["model"]["reference_classifier"] == "shapes"


def test_seed_offset_moves_the_quality_seeds(tmp_path):
    folder = _model_folder(tmp_path)
    kw = dict(model=str(folder), methods=["gsd-G100-emb05-dp0.3"], repeats=1, warmup=0, quality_samples=4,
              show_progress=False)
    doc = run_bench("ar-image", overrides={"seed_offset": 1000}, **kw)
    assert doc["workload"]["seed_offset"] == 1000
    gsd = next(r for r in doc["runs"] if r["method"] != "baseline")
    assert gsd["config"]["embed_quantile"] == 0.05 and gsd["config"]["delta_p"] == 0.3
    with pytest.raises(ValueError, match="seed_offset"):
        run_bench("ar-image", overrides={"seed_offset": 7}, **kw)


def test_every_arm_is_a_valid_config():
    """Each named arm resolves to its method's config (a typo in a field name or value fails here, not mid-run)."""
    from diffspec.api import resolve_config
    from diffspec.bench.ar_image import ARMS

    for name, arm in ARMS.items():
        info, config = resolve_config(arm["method"], {k: v for k, v in arm.items() if k != "method"})
        assert info.name == arm["method"], name
    assert resolve_config("gsd", {k: v for k, v in ARMS["gsd-G100-emb03-dp0.5-run1"].items()
                                  if k != "method"})[1].min_run == 1
