"""The shipped tiny-flux: a FluxPipeline that loads from its folder, draws what it is asked and takes the forecast."""

from __future__ import annotations

import pytest
import torch

from diffspec import SpeculativePipeline
from diffspec.bench.dit_cache_workloads import JUDGED_PROMPT_SEED
from diffspec.data import render_prompted_scenes
from diffspec.metrics import psnr
from diffspec.models import SHIPPED_MODELS, load_pipeline
from diffspec.models.dit import call_defaults
from diffspec.models.scene_judge import prompt_scores

PROMPTS = 48
MIN_PROMPT_ACCURACY = 0.4
"""These 48 seeded prompts score 0.50 (1000 prompts: 0.619, scripts/runs/tiny_flux.json); an untrained model, or one
whose weights load wrong, scores near 0 (the first attempt, on a VAE that could not hold the scenes: 0.10)."""


@pytest.fixture(scope="module")
def pipe():
    pipe = load_pipeline("tiny-flux")
    pipe.set_progress_bar_config(disable=True)
    return pipe


def _generate(pipe, prompts, runner=None, steps=28):
    generators = [torch.Generator().manual_seed(i) for i in range(len(prompts))]
    out = (runner or pipe)(prompts, num_inference_steps=steps, generator=generators, output_type="pt",
                           **call_defaults(pipe))
    return out.images * 2 - 1


def test_tiny_flux_is_a_float32_flux_pipeline_with_its_call_defaults(pipe):
    assert "tiny-flux" in SHIPPED_MODELS
    assert type(pipe).__name__ == "FluxPipeline" and type(pipe.transformer).__name__ == "FluxTransformer2DModel"
    assert {m.dtype for m in (pipe.transformer, pipe.text_encoder, pipe.text_encoder_2, pipe.vae)} == {torch.float32}
    assert len(pipe.transformer.transformer_blocks) == 2 and len(pipe.transformer.single_transformer_blocks) == 4
    assert call_defaults(pipe) == {"height": 32, "width": 32, "max_sequence_length": 24}
    out = pipe("a red star at the top left .", num_inference_steps=2, output_type="np")  # no size given: 32x32
    assert out.images.shape == (1, 32, 32, 3)


def test_tiny_flux_draws_what_it_is_asked(pipe):
    _, prompts = render_prompted_scenes(PROMPTS, seed=JUDGED_PROMPT_SEED)
    with torch.inference_mode():
        scores = prompt_scores(_generate(pipe, prompts), prompts)
    assert scores["prompt_accuracy"] >= MIN_PROMPT_ACCURACY, scores
    assert scores["count_accuracy"] >= 0.85 and scores["colour_accuracy"] >= 0.5, scores


def test_taylor_on_tiny_flux_stays_close_to_full_compute(pipe):
    _, prompts = render_prompted_scenes(4, seed=JUDGED_PROMPT_SEED)
    spec = SpeculativePipeline.from_pipe(pipe, method="taylor")
    try:
        with torch.inference_mode():
            fast = _generate(pipe, prompts, spec)
            assert spec.stats.target_calls < spec.stats.steps
    finally:
        spec.disable()
    with torch.inference_mode():
        full = _generate(pipe, prompts)
    assert psnr((fast + 1) / 2, (full + 1) / 2, 1.0) > 25.0
