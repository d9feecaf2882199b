import pytest
import torch

from diffspec.data import render_shapes
from diffspec.models import (
    SHIPPED_MODELS,
    class_accuracy,
    load_reference_classifier,
    paired_accuracy,
    reference_fid,
    resolve_model_path,
)


def test_resolve_model_path(tmp_path):
    assert resolve_model_path("tiny-dit") == SHIPPED_MODELS["tiny-dit"]
    assert resolve_model_path(str(tmp_path)) == tmp_path
    with pytest.raises(ValueError, match="tiny-dit"):
        resolve_model_path("no-such-model")


def test_shipped_dit_pipeline_loads_and_generates():
    from diffusers import DiffusionPipeline, DiTPipeline

    pipe = DiffusionPipeline.from_pretrained(resolve_model_path("tiny-dit"))
    assert isinstance(pipe, DiTPipeline) and pipe.transformer.dtype == torch.float32
    pipe.set_progress_bar_config(disable=True)
    ids = pipe.get_label_ids(["circle", "star"])
    out = pipe(class_labels=ids, num_inference_steps=4, generator=torch.Generator().manual_seed(0), output_type="np")
    assert out.images.shape == (2, 32, 32, 3)


def test_classifier_accuracy_on_fresh_images():
    images, labels = render_shapes(256, seed=424242)
    assert class_accuracy(images, labels) > 0.9
    assert load_reference_classifier().features(images[:4]).shape == (4, 128)


def test_paired_accuracy_against_a_direct_count():
    """The paired change equals the difference of the two accuracies; its error comes from the discordant seeds."""
    images, labels = render_shapes(64, seed=7)
    noisy = images.clone()
    noisy[:16] = torch.rand_like(noisy[:16]) * 2 - 1  # a quarter of the seeds ruined
    got = paired_accuracy(noisy, images, labels)
    assert got["accuracy_delta"] == pytest.approx(class_accuracy(noisy, labels) - class_accuracy(images, labels), abs=1e-4)
    assert got["accuracy_delta"] < 0 < got["accuracy_delta_se"]
    same = paired_accuracy(images, images, labels)
    assert same == {"accuracy_delta": 0.0, "accuracy_delta_se": 0.0, "class_agreement": 1.0}
    with pytest.raises(ValueError, match="pair up"):
        paired_accuracy(images[:8], images[:9], labels[:8])


def test_reference_fid_separates_real_from_noise():
    real, _ = render_shapes(500, seed=99)
    noise = torch.rand(500, 3, 32, 32) * 2 - 1
    fid_real, fid_noise = reference_fid(real), reference_fid(noise)
    assert fid_real < 0.1 * fid_noise


def test_shipped_dit_samples_are_recognisable_by_the_classifier():
    """The shipped tiny-dit must draw its classes: accuracy far above chance (0.1) on 100 samples."""
    from diffusers import DiTPipeline

    pipe = DiTPipeline.from_pretrained(resolve_model_path("tiny-dit"))
    pipe.set_progress_bar_config(disable=True)
    labels = torch.arange(100) % 10
    generators = [torch.Generator().manual_seed(1000 + i) for i in range(100)]
    images = pipe(class_labels=labels.tolist(), generator=generators, num_inference_steps=25, guidance_scale=4.0,
                  output_type="pt").images
    assert class_accuracy(images * 2 - 1, labels) > 0.35


def test_shipped_weights_fit_their_budget():
    """All of diffspec/weights stays within 20,000,000 bytes (narrow storage: ``scripts/store_weights.py``)."""
    from diffspec.models import WEIGHTS

    assert sum(p.stat().st_size for p in WEIGHTS.rglob("*") if p.is_file()) <= 20_000_000


@pytest.mark.parametrize("model", ["tiny-ar", "tiny-ar-tex", "tiny-ar-noisy"])
def test_shipped_gpts_are_stored_int8_and_load_as_float32(model):
    from diffspec.models import load_gpt
    from diffspec.models.int8_weights import FILENAME

    folder = SHIPPED_MODELS[model] / "gpt"
    assert sorted(p.name for p in folder.glob("*.safetensors")) == [FILENAME]
    assert {p.dtype for p in load_gpt(folder).parameters()} == {torch.float32}
