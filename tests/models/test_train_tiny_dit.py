"""The tiny-dit training script's schedule and its growth of a saved model by identity blocks."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
from train_tiny_dit import build_transformer, learning_rate, load_into, sample_timesteps  # noqa: E402


def test_learning_rate_warms_up_then_decays_to_zero():
    lrs = [learning_rate(s, 1e-3, 10, 100) for s in range(101)]
    assert lrs[9] == pytest.approx(1e-3) and lrs[0] == pytest.approx(1e-4)
    assert all(a >= b for a, b in zip(lrs[9:], lrs[10:]))
    assert lrs[100] == 0.0 and learning_rate(500, 1e-3, 10, 100) == 0.0


def test_grown_model_computes_what_the_saved_one_did(tmp_path):
    torch.manual_seed(0)
    small = build_transformer(layers=2, heads=2, head_dim=8).eval()
    small.save_pretrained(tmp_path)
    grown = build_transformer(layers=3, heads=2, head_dim=8).eval()
    assert load_into(grown, tmp_path) == 2
    x, t, y = torch.randn(2, 4, 16, 16), torch.tensor([10, 900]), torch.tensor([3, 1000])
    with torch.no_grad():
        torch.testing.assert_close(grown(x, timestep=t, class_labels=y).sample, small(x, timestep=t, class_labels=y).sample)


def test_a_wider_model_does_not_load(tmp_path):
    build_transformer(layers=2, heads=2, head_dim=8).save_pretrained(tmp_path)
    with pytest.raises((ValueError, RuntimeError)):
        load_into(build_transformer(layers=2, heads=2, head_dim=16), tmp_path)


def test_the_constant_schedule_reproduces_the_shipped_runs_rate():
    assert [learning_rate(s, 5e-4, 0, 100, "constant") for s in (0, 50, 5000)] == [5e-4] * 3


def test_training_timesteps_cover_the_range_and_logit_normal_favours_the_middle():
    g = torch.Generator().manual_seed(0)
    uniform, middle = sample_timesteps(20000, "uniform", g, "cpu"), sample_timesteps(20000, "logit-normal", g, "cpu")
    for t in (uniform, middle):
        assert t.dtype == torch.long and 0 <= int(t.min()) and int(t.max()) <= 999
    inner = lambda t: ((t >= 250) & (t < 750)).double().mean().item()  # noqa: E731
    assert abs(inner(uniform) - 0.5) < 0.02 and inner(middle) > 0.65


def test_the_velocity_target_is_what_the_saved_v_prediction_sampler_inverts():
    """A model that predicts the training target exactly lets the saved DDIM sampler recover the data."""
    from diffusers import DDIMScheduler, DDPMScheduler

    train = DDPMScheduler(num_train_timesteps=1000, beta_schedule="linear", beta_start=1e-4, beta_end=0.02)
    sample = DDIMScheduler(num_train_timesteps=1000, beta_schedule="linear", beta_start=1e-4, beta_end=0.02,
                           clip_sample=False, set_alpha_to_one=False, prediction_type="v_prediction")
    g = torch.Generator().manual_seed(0)
    x0, noise = torch.randn(2, 4, 16, 16, generator=g), torch.randn(2, 4, 16, 16, generator=g)
    sample.set_timesteps(50)
    x = noise
    for t in sample.timesteps:
        t_batch = torch.full((2,), int(t))
        eps = (x - train.alphas_cumprod[t].sqrt() * x0) / (1 - train.alphas_cumprod[t]).sqrt()
        x = sample.step(train.get_velocity(x0, eps, t_batch), t, x).prev_sample
    torch.testing.assert_close(x, x0, atol=0.05, rtol=0)


def test_one_latent_per_token_keeps_the_weights_and_quadruples_the_tokens():
    coarse, fine = build_transformer(layers=1, heads=2, head_dim=8), build_transformer(layers=1, heads=2, head_dim=8,
                                                                                        patch_size=1)
    x, t, y = torch.randn(2, 4, 16, 16), torch.tensor([10, 900]), torch.tensor([3, 1000])
    assert fine.pos_embed.pos_embed.shape[1] == 4 * coarse.pos_embed.pos_embed.shape[1] == 256
    assert sum(p.numel() for p in fine.parameters()) < sum(p.numel() for p in coarse.parameters())
    with torch.no_grad():
        assert fine(x, timestep=t, class_labels=y).sample.shape == (2, 4, 16, 16)
