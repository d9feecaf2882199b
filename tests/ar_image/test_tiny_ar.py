"""The shipped tiny-ar reference model: loads as a LlamaGenTarget, is trained, conditional, small."""

import math

import pytest
import torch
import torch.nn.functional as F

from diffspec.ar_image.targets.llamagen_session import LlamaGenTarget
from diffspec.ar_image.targets.patch_vq import PatchVQ
from diffspec.data import render_shapes
from diffspec.models import SHIPPED_MODELS, load_ar_target, resolve_model_path

MAX_SHIPPED_BYTES = 6_000_000


@pytest.fixture(scope="module")
def target() -> LlamaGenTarget:
    return load_ar_target("tiny-ar")


def test_shipped_weights_stay_small():
    folder = resolve_model_path("tiny-ar")
    assert folder == SHIPPED_MODELS["tiny-ar"]
    files = [p for p in folder.rglob("*") if p.is_file()]
    assert {p.suffix for p in files} <= {".json", ".safetensors"}
    assert sum(p.stat().st_size for p in files) < MAX_SHIPPED_BYTES


def test_loads_as_llamagen_target_with_the_patch_tokenizer(target: LlamaGenTarget):
    assert isinstance(target, LlamaGenTarget) and isinstance(target.decoder, PatchVQ)
    assert target.codebook_size == target.decoder.config.codebook_size == 1024
    assert target.grid == target.decoder.grid == (8, 8) and target.num_tokens == 64
    assert target.codebook.shape == (1024, 48)
    assert not target.model.training


def test_missing_folder_is_rejected(tmp_path):
    with pytest.raises(ValueError, match="gpt/config.json"):
        load_ar_target(tmp_path)
    with pytest.raises(ValueError, match="tiny-ar"):
        load_ar_target("no-such-model")


@torch.no_grad()
def test_greedy_generation_gives_valid_tokens_and_images(target: LlamaGenTarget):
    labels = torch.tensor([0, 3, 7])
    session = target.start(class_labels=labels, guidance_scale=3.0)
    tokens = torch.empty(3, target.num_tokens, dtype=torch.long)
    logits = session.first_logits
    for i in range(target.num_tokens):
        assert torch.isfinite(logits).all()
        tokens[:, i] = logits.argmax(-1)
        if i + 1 < target.num_tokens:
            logits = session.step(tokens[:, i : i + 1], torch.full((3,), i))[:, 0]
    assert int(tokens.min()) >= 0 and int(tokens.max()) < target.codebook_size
    images = target.decode_tokens(tokens)
    assert images.shape == (3, 3, 32, 32) and float(images.abs().max()) <= 1.0
    # without CFG the session's cached logits equal the teacher-forcing forward of the same tokens
    plain = target.start(class_labels=labels, guidance_scale=1.0)
    rows = torch.cat([plain.first_logits[:, None], plain.step(tokens[:, :-1], torch.zeros(3, dtype=torch.long))], 1)
    assert torch.allclose(rows, target.model(tokens, labels), atol=1e-4)


@torch.no_grad()
def test_model_is_trained_and_class_conditional(target: LlamaGenTarget):
    images, labels = render_shapes(200, seed=7)  # held out from the training seeds
    tokens = target.decoder.encode(images)

    def ce(cond: torch.Tensor) -> float:
        return float(F.cross_entropy(target.model(tokens, cond).flatten(0, 1), tokens.flatten()))

    right, wrong = ce(labels), ce((labels + 1 + torch.arange(200) % 9) % 10)
    assert right < math.log(1024) - 1.0  # far below the uniform law's 6.93 nats
    assert right < wrong - 0.02  # the label carries information


def test_from_pretrained_tiny_ar_runs_mc_sjd_with_its_default_guidance():
    from diffspec import SpeculativePipeline

    spec = SpeculativePipeline.from_pretrained("tiny-ar", method="mc-sjd", temperature=0.0)
    assert spec.pipe.default_guidance_scale == 3.0
    out = spec(class_labels=[1, 4], output_type="pt")
    assert out.images.shape == (2, 3, 32, 32) and spec.stats.target_evals == 2 * spec.stats.target_calls
    assert torch.equal(out.tokens, spec.plain(class_labels=[1, 4], output_type="tokens").tokens)
