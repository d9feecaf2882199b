"""The shipped ``tiny-ar-tex`` AR model (textured shapes) and the per-variant reference classifiers."""

from __future__ import annotations

import pytest
import torch
from safetensors import safe_open

from diffspec.data import render_shapes
from diffspec.models import (
    REFERENCE_CLASSIFIERS,
    SHIPPED_MODELS,
    class_accuracy,
    load_ar_target,
    load_reference_classifier,
    reference_fid,
)
from diffspec.models.int8_weights import FILENAME

TEX = {"background": "textured", "texture_strength": 0.7, "noise": 0.05}  # tiny-ar-tex's data variant


def _stored_dtypes(path) -> set[torch.dtype]:
    with safe_open(str(path), "pt") as f:
        return {f.get_tensor(k).dtype for k in f.keys()}


def test_tiny_ar_tex_loads_as_float32_from_int8_file():
    folder = SHIPPED_MODELS["tiny-ar-tex"]
    assert _stored_dtypes(folder / "gpt" / FILENAME) == {torch.int8, torch.float16}
    assert (folder / "gpt" / FILENAME).stat().st_size < 3_000_000
    target = load_ar_target("tiny-ar-tex")
    assert target.grid == (8, 8) and target.codebook_size == 1024 and target.num_tokens == 64
    assert {p.dtype for p in target.model.parameters()} == {torch.float32}
    assert target.default_guidance_scale == 3.0
    assert target.reference_classifier == "shapes-tex"
    assert load_ar_target("tiny-ar").reference_classifier == "shapes"  # the plain model keeps its classifier


@pytest.mark.parametrize("model", ["tiny-ar-tex", "tiny-ar-noisy"])
def test_textured_ar_models_generate_through_the_pipeline(model):
    from diffspec import SpeculativePipeline

    spec = SpeculativePipeline.from_pretrained(model, method="mc-sjd")
    spec.set_progress_bar_config(disable=True)
    out = spec(class_labels=[3], generator=torch.Generator().manual_seed(0), output_type="tokens")
    assert out.tokens.shape == (1, 64) and 0 <= int(out.tokens.min()) and int(out.tokens.max()) < 1024
    assert spec.stats.target_calls < 64


@pytest.mark.parametrize("model", ["tiny-ar-tex", "tiny-ar-noisy"])
def test_textured_ar_models_ship_a_drafter(model):
    from diffspec import SpeculativePipeline

    spec = SpeculativePipeline.from_pretrained(model, method="lantern")
    spec.set_progress_bar_config(disable=True)
    out = spec(class_labels=[0, 5], generator=[torch.Generator().manual_seed(s) for s in (0, 1)],
               output_type="tokens")
    assert out.tokens.shape == (2, 64) and spec.stats.draft_calls > 0


def test_textured_classifier_fits_textured_images():
    images, labels = render_shapes(400, seed=123, **TEX)
    assert _stored_dtypes(REFERENCE_CLASSIFIERS["shapes-tex"] / "model.safetensors") <= {torch.float16, torch.int64}
    assert {p.dtype for p in load_reference_classifier(classifier="shapes-tex").parameters()} == {torch.float32}
    assert class_accuracy(images, labels, classifier="shapes-tex") > 0.85
    # its statistics are of textured images: real textured images sit closer to them than to the plain ones
    fid_tex = reference_fid(images, classifier="shapes-tex")
    noise = torch.rand(400, 3, 32, 32, generator=torch.Generator().manual_seed(0)) * 2 - 1
    assert fid_tex < 0.2 * reference_fid(noise, classifier="shapes-tex")
    plain, _ = render_shapes(400, seed=123)
    assert fid_tex < reference_fid(plain, classifier="shapes-tex")


def test_classifier_name_is_validated():
    images, labels = render_shapes(4, seed=0)
    with pytest.raises(ValueError, match="classifier='digits'.*shapes, shapes-tex"):
        class_accuracy(images, labels, classifier="digits")
    with pytest.raises(ValueError, match="classifier='digits'"):
        reference_fid(images, classifier="digits")


def test_unknown_reference_classifier_in_model_folder(tmp_path):
    import json
    import shutil

    folder = tmp_path / "m"
    shutil.copytree(SHIPPED_MODELS["tiny-ar"], folder)
    (folder / "generation_config.json").write_text(json.dumps({"reference_classifier": "nope"}))
    with pytest.raises(ValueError, match="reference_classifier='nope'"):
        load_ar_target(folder)
