"""The patch k-means tokenizer of tiny-ar: round trip, determinism, save/load, k-means, entropy stats."""

import math

import pytest
import torch

from diffspec.ar_image.targets.patch_vq import PatchVQ, PatchVQConfig, kmeans, nearest_code
from diffspec.ar_image.token_stats import entropy_summary, per_token_entropy
from diffspec.data import render_shapes


@pytest.fixture(scope="module")
def images() -> torch.Tensor:
    return render_shapes(96, seed=11)[0]


@pytest.fixture(scope="module")
def vq(images: torch.Tensor) -> PatchVQ:
    return PatchVQ.fit(images, PatchVQConfig(codebook_size=64, kmeans_iters=5), seed=3)


def test_config_validation_names_field():
    with pytest.raises(ValueError, match="codebook_size=1"):
        PatchVQConfig(codebook_size=1)
    with pytest.raises(ValueError, match="image_size=30"):
        PatchVQConfig(image_size=30, patch_size=4)
    assert PatchVQConfig(image_size=32, patch_size=4).grid == (8, 8)


def test_decode_of_encode_is_a_fixed_point(vq: PatchVQ, images: torch.Tensor):
    tokens = vq.encode(images[:8])
    assert tokens.shape == (8, 64) and tokens.dtype == torch.int64
    assert int(tokens.min()) >= 0 and int(tokens.max()) < 64
    decoded = vq.decode_code(tokens)
    assert decoded.shape == (8, 3, 32, 32) and float(decoded.abs().max()) <= 1.0
    # codes are (near) their own nearest code: encoding a decoded image gives back the tokens
    assert torch.equal(vq.encode(decoded), tokens)


def test_decode_pastes_codes_in_raster_order(vq: PatchVQ):
    tokens = torch.arange(64).view(1, 64)
    img = vq.decode_code(tokens)
    # token at grid (r, c) = (2, 5) fills pixels [8:12, 20:24]
    patch = vq.codebook[2 * 8 + 5].view(3, 4, 4).clamp(-1, 1)
    assert torch.equal(img[0, :, 8:12, 20:24], patch)
    assert torch.equal(vq.patchify(img)[0], vq.codebook.clamp(-1, 1))


def test_reconstruction_beats_a_tiny_codebook(images: torch.Tensor, vq: PatchVQ):
    held = render_shapes(32, seed=12)[0]

    def mse(model: PatchVQ) -> float:
        return float((model.decode_code(model.encode(held)) - held).pow(2).mean())

    small = PatchVQ.fit(images, PatchVQConfig(codebook_size=4, kmeans_iters=5), seed=3)
    assert mse(vq) < 0.7 * mse(small)


def test_fit_is_deterministic_and_seed_dependent(images: torch.Tensor, vq: PatchVQ):
    again = PatchVQ.fit(images, PatchVQConfig(codebook_size=64, kmeans_iters=5), seed=3)
    assert torch.equal(again.codebook, vq.codebook)
    other = PatchVQ.fit(images, PatchVQConfig(codebook_size=64, kmeans_iters=5), seed=4)
    assert not torch.equal(other.codebook, vq.codebook)


def test_save_load_round_trip(tmp_path, vq: PatchVQ, images: torch.Tensor):
    vq.save_pretrained(tmp_path / "tok")
    loaded = PatchVQ.from_pretrained(tmp_path / "tok")
    assert loaded.config == vq.config
    assert torch.equal(loaded.codebook, vq.codebook)
    assert torch.equal(loaded.encode(images[:4]), vq.encode(images[:4]))


def test_decode_rejects_bad_tokens_and_grids(vq: PatchVQ):
    with pytest.raises(ValueError, match="grid"):
        vq.decode_code(torch.zeros(1, 63, dtype=torch.long))
    with pytest.raises(ValueError, match=r"\[0, 64\)"):
        vq.decode_code(torch.full((1, 64), 64))
    assert vq.decode_code(torch.zeros(2, 32, dtype=torch.long), grid=(4, 8)).shape == (2, 3, 16, 32)


def test_kmeans_finds_separated_clusters_and_reseeds_empty_ones():
    g = torch.Generator().manual_seed(0)
    centres = torch.tensor([[0.0, 0.0], [5.0, 5.0], [-5.0, 5.0]])
    x = (centres[:, None] + 0.1 * torch.randn(3, 50, 2, generator=g)).reshape(-1, 2)
    c = kmeans(x, 3, 10, torch.Generator().manual_seed(1))
    assert torch.cdist(c, centres).min(1).values.max() < 0.1
    # duplicated points force empty clusters; every centroid still ends on a data point cluster
    dup = torch.cat([torch.zeros(20, 2), torch.ones(1, 2)])
    c2 = kmeans(dup, 2, 3, torch.Generator().manual_seed(0))
    assert sorted(c2.sum(1).tolist()) == [0.0, 2.0]
    assert nearest_code(x[:5], c).shape == (5,)
    with pytest.raises(ValueError, match="k=4"):
        kmeans(x[:3], 4, 1, g)


def test_entropy_stats_match_closed_forms():
    probs = torch.tensor([[0.5, 0.25, 0.25, 0.0], [0.95, 0.05, 0.0, 0.0]])
    h, top1 = per_token_entropy(probs.log())
    expected0 = -(0.5 * math.log(0.5) + 2 * 0.25 * math.log(0.25))
    expected1 = -(0.95 * math.log(0.95) + 0.05 * math.log(0.05))
    assert torch.allclose(h, torch.tensor([expected0, expected1]), atol=1e-6)
    assert torch.allclose(top1, torch.tensor([0.5, 0.95]))
    s = entropy_summary(probs.log())
    assert s["frac_top1_gt_0_9"] == 0.5 and s["rows"] == 2
    assert abs(s["mean_entropy_nats"] - (expected0 + expected1) / 2) < 1e-6
