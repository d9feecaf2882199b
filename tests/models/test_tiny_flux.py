"""The shipped tiny-flux: a FluxPipeline folder that draws what its prompts ask (scored by the scene judge)."""

import pytest
import torch

from diffspec.data import render_prompted_scenes
from diffspec.models import SHIPPED_MODELS, load_pipeline
from diffspec.models.dit import call_defaults
from diffspec.models.scene_judge import prompt_scores

PROMPTS = render_prompted_scenes(20, seed=4242)[1]


@pytest.fixture(scope="module")
def pipe():
    pipe = load_pipeline("tiny-flux")
    pipe.set_progress_bar_config(disable=True)
    return pipe


def test_it_loads_as_a_float32_flux_pipeline_with_its_call_defaults():
    from diffusers import DiffusionPipeline, FluxPipeline, FluxTransformer2DModel

    raw = DiffusionPipeline.from_pretrained(SHIPPED_MODELS["tiny-flux"])
    assert isinstance(raw, FluxPipeline) and isinstance(raw.transformer, FluxTransformer2DModel)
    assert len(raw.transformer.transformer_blocks) >= 1 and len(raw.transformer.single_transformer_blocks) >= 1
    assert {m.dtype for m in (raw.transformer, raw.text_encoder, raw.text_encoder_2, raw.vae)} == {torch.float32}
    assert call_defaults(raw) == {"height": 32, "width": 32, "max_sequence_length": 24}


def test_its_samples_follow_their_prompts(pipe):
    out = pipe(PROMPTS, num_inference_steps=14, max_sequence_length=24, output_type="pt",
               generator=[torch.Generator().manual_seed(i) for i in range(len(PROMPTS))])
    assert out.images.shape == (20, 3, 32, 32)  # load_pipeline sets the 32x32 size default
    assert prompt_scores(out.images * 2 - 1, PROMPTS)["prompt_accuracy"] >= MIN_PROMPT_ACCURACY


def test_taylor_runs_on_it_with_fewer_transformer_calls(pipe):
    from diffspec import SpeculativePipeline

    spec = SpeculativePipeline.from_pipe(pipe, method="taylor")
    out = spec(PROMPTS[:2], num_inference_steps=28, generator=torch.Generator().manual_seed(0), output_type="pt",
               **call_defaults(pipe))
    assert out.images.shape == (2, 3, 32, 32) and spec.stats.target_calls < 28
    spec.disable()
