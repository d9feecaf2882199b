"""The exact samplers on CUDA: a CPU generator (diffusers' usual ``torch.Generator()``) drives a GPU run,
and the exact-diffusion bench runs end to end on the GPU (skipped without CUDA)."""

import pytest
import torch
from diffusers import DDPMScheduler

from diffspec import SpeculativePipeline
from diffspec.bench import run_exact_diffusion
from diffspec.models import load_pipeline

pytestmark = pytest.mark.gpu


def _ddpm(pipe):
    """tiny-dit ships DDIM, which DiTPipeline runs deterministically (no eta): the exact samplers need DDPM."""
    pipe.scheduler = DDPMScheduler.from_config(pipe.scheduler.config)
    return pipe


def _latents(spec, device_of_generator, plain=False, steps=20):
    run = spec.plain if plain else spec
    generator = torch.Generator(device_of_generator).manual_seed(0)
    return run(class_labels=[1, 2, 3], num_inference_steps=steps, guidance_scale=4.0, output_type="latent",
               generator=generator).images.float().cpu()


@pytest.mark.parametrize("method", ["coupling", "autospec"])
def test_cpu_and_cuda_generators_drive_a_gpu_run(method):
    pipe = _ddpm(load_pipeline("tiny-dit", device="cuda"))
    spec = SpeculativePipeline.from_pipe(pipe, method=method, lookahead=4)
    for where in ("cpu", "cuda"):
        first, again = _latents(spec, where), _latents(spec, where)
        assert first.device.type == "cpu" and torch.isfinite(first).all()
        torch.testing.assert_close(first, again)  # one seed, one sample


def test_a_cpu_generator_gives_the_gpu_plain_sampler_the_cpu_noise():
    cpu_spec = SpeculativePipeline.from_pipe(_ddpm(load_pipeline("tiny-dit")), method="coupling")
    gpu_spec = SpeculativePipeline.from_pipe(_ddpm(load_pipeline("tiny-dit", device="cuda")), method="coupling")
    torch.testing.assert_close(_latents(gpu_spec, "cpu", plain=True), _latents(cpu_spec, "cpu", plain=True),
                               atol=2e-3, rtol=2e-3)


def test_exact_diffusion_bench_runs_on_the_gpu():
    doc = run_exact_diffusion("tiny-dit", methods=["coupling"], device="cuda", steps=[10], quality_samples=4,
                              repeats=1, warmup=0, show_progress=False)
    assert doc["machine"]["device_type"] == "cuda"
    assert all(run["quality"]["fid"] is not None for run in doc["runs"])
