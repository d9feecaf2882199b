"""A ControlNet under a fixed forecast schedule: it runs in full on the transformer's full steps only and its outputs
are forecast on the others (:mod:`diffspec.forecast.controlnet`), on a tiny random-weight ``FluxControlNetPipeline``."""

import contextlib
from dataclasses import dataclass

import pytest
import torch
from forecast_checks import record_runs

from diffspec import SpeculativePipeline
from diffspec.config import SpecaConfig
from diffspec.forecast.controlnet import ControlNetForecast, map_tensors
from diffspec.forecast.gate import Schedule
from diffspec.stats import SpecStats
from diffspec.testing.random_transformers import build_flux_controlnet
from diffspec.testing.tiny_pipelines import build_tiny_pipeline

STEPS = 12


@pytest.fixture(scope="module")
def pipe():
    from diffusers import FluxControlNetPipeline

    torch.set_num_threads(1)
    flux = build_tiny_pipeline("tiny-flux-random")
    controlnet = build_flux_controlnet(flux.transformer, 1, 2, std=0.3, seed=1)
    pipe = FluxControlNetPipeline(**flux.components, controlnet=controlnet)
    pipe.set_progress_bar_config(disable=True)
    return pipe


CONTROL = torch.rand(1, 3, 16, 16, generator=torch.Generator().manual_seed(7))


def _run(pipe, **kwargs):
    return pipe(prompt="a red fox", control_image=CONTROL, height=16, width=16, num_inference_steps=STEPS,
                guidance_scale=1.0, generator=torch.Generator().manual_seed(0), output_type="pt", **kwargs)


@contextlib.contextmanager
def _controlnet_runs(pipe):
    """Per ControlNet call, whether its blocks ran."""
    with record_runs({"controlnet": pipe.controlnet}, lambda m: m.transformer_blocks[0].ff) as runs:
        yield runs["controlnet"]


def _rel(a, b):
    return float((a - b).norm() / b.norm())


def test_the_controlnet_runs_on_full_steps_only_and_its_forecast_stays_close(pipe):
    baseline = _run(pipe).images
    assert _rel(baseline, _run(pipe, controlnet_conditioning_scale=0.0).images) > 0.05  # the ControlNet matters
    spec = SpeculativePipeline.from_pipe(pipe, method="taylor", interval=3, warmup=2)
    assert spec.controlnet_forecast is not None
    with _controlnet_runs(pipe) as runs:
        out = _run(spec)
    full = Schedule(2, 3).without_rejections(STEPS)
    assert runs == full and not all(full)
    stats = out.spec_stats
    assert stats.extra["controlnet_full"] == sum(full) and stats.extra["controlnet_forecast"] == STEPS - sum(full)
    assert stats.extra["controlnet_cache_gb"] > 0
    forecast_err = _rel(out.images, baseline)
    spec.controlnet_forecast.detach()  # the ControlNet in full on every step, the transformer forecast as before
    every_step_err = _rel(_run(spec).images, baseline)
    print(f"taylor vs plain: ControlNet forecast {forecast_err:.4f}, ControlNet every step {every_step_err:.4f}")
    assert forecast_err < 2 * every_step_err + 1e-3
    spec.disable()
    assert torch.equal(_run(pipe).images, baseline) and "forward" not in pipe.controlnet.__dict__


def test_interval_one_is_bit_identical(pipe):
    baseline = _run(pipe).images
    spec = SpeculativePipeline.from_pipe(pipe, method="taylor", interval=1)
    assert torch.equal(_run(spec).images, baseline)
    spec.disable()


def test_a_conditioning_scale_switch_runs_the_controlnet_and_restarts_its_anchors(pipe):
    """``control_guidance_end=0.5`` sets the ControlNet's scale to 0 half way: that step runs in full (the forecast
    of the scaled residuals would carry the old scale on), later forecasts come from anchors at the new scale."""
    baseline = _run(pipe, control_guidance_end=0.5).images
    spec = SpeculativePipeline.from_pipe(pipe, method="taylor", interval=3, warmup=2)
    with _controlnet_runs(pipe) as runs:
        out = _run(spec, control_guidance_end=0.5)
        spec.controlnet_forecast.detach()
        every_step = _run(spec, control_guidance_end=0.5)
    spec.disable()
    switch = STEPS // 2  # controlnet_keep: 1 while i / len(timesteps) < 0.5
    assert runs[switch] and runs[switch + 1]  # the switch restarts the warmup: a full call, then a second anchor
    # after the switch the residuals are zero, forecast exactly: no more error than with the ControlNet every step
    assert _rel(out.images, baseline) <= _rel(every_step.images, baseline) + 2e-3


def test_a_verified_speca_forecasts_the_controlnet_only_before_unchecked_drafts(pipe):
    """A checked draft may be recomputed in full, which needs the ControlNet's true outputs: the ControlNet runs on
    every full or checked step and is forecast only where the transformer drafts without a check (``k_min`` drafts
    after each full step). Every draft checked and rejected (``tau0=0``, ``k_min=0``): bit-identical to the plain
    pipeline, ControlNet included."""
    baseline = _run(pipe).images
    strict = SpeculativePipeline.from_pipe(pipe, method="speca", tau0=0.0, beta=1.0, tau_min=0.0, k_min=0)
    with _controlnet_runs(pipe) as runs:
        out = _run(strict)
    strict.disable()
    assert torch.equal(out.images, baseline) and all(runs) and out.spec_stats.extra["rejections"] > 0

    spec = SpeculativePipeline.from_pipe(pipe, method="speca", tau0=1e-3, beta=1.0, tau_min=1e-3, k_min=2, k_max=6,
                                         warmup=2)
    calls = []
    hooks = spec.hooks["transformer"]
    original = hooks._pre_forward

    def record(module, args, kwargs):  # the transformer's own plan for each call: full, checked, or unchecked draft
        result = original(module, args, kwargs)
        calls.append("full" if hooks.call.mode == "full" else "checked" if hooks.call.run_verifier else "draft")
        return result

    hooks._pre_forward = record
    spec.disable()
    spec.enable()
    with _controlnet_runs(pipe) as runs:
        out = _run(spec)
    spec.disable()
    assert "draft" in calls and "checked" in calls
    assert runs == [c != "draft" for c in calls]
    stats = out.spec_stats
    assert stats.extra["controlnet_forecast"] == calls.count("draft") and stats.extra["rejections"] > 0
    assert torch.isfinite(out.images).all()

    spec = SpeculativePipeline.from_pipe(pipe, method="speca", tau0=float("inf"), k_max=3, warmup=2)
    assert spec.controlnet_forecast.plan is None  # no verifier: taylor's fixed schedule
    out = _run(spec).images
    spec.disable()
    taylor = SpeculativePipeline.from_pipe(pipe, method="taylor", interval=3, warmup=2)
    assert torch.equal(out, _run(taylor).images)  # tau = inf equals taylor at interval k_max, ControlNet included
    taylor.disable()
    with pytest.raises(ValueError, match="verifier"):
        ControlNetForecast(pipe.controlnet, SpecaConfig(tau0=0.1), SpecStats())


@dataclass
class _Output:
    samples: tuple
    single: tuple | None


def test_map_tensors_keeps_structure_and_none_fields():
    """diffusers' ControlNet outputs hold tuples, lists, dicts and ``None`` fields (FluxControlNetOutput with no
    single blocks): every tensor is visited once, in order, and the structure rebuilt as it was."""
    from diffusers.models.controlnets.controlnet_flux import FluxControlNetOutput

    out = FluxControlNetOutput(controlnet_block_samples=(torch.ones(1), torch.zeros(2)),
                               controlnet_single_block_samples=None)
    seen = []
    again = map_tensors(out, lambda t: seen.append(t.shape) or t + 1)
    assert seen == [torch.Size([1]), torch.Size([2])] and again.controlnet_single_block_samples is None
    assert torch.equal(again.controlnet_block_samples[1], torch.ones(2))
    nested = map_tensors(((torch.ones(1),), [None, {0: torch.ones(1)}], _Output((torch.ones(1),), None)),
                         lambda t: t * 3)
    assert nested[1][1][0].item() == 3 and nested[2].samples[0].item() == 3 and nested[2].single is None


def test_instance_forwards_set_before_attaching_are_kept_and_restored():
    """accelerate's offload hooks (``enable_model_cpu_offload`` on the ControlNet, sequential offload on blocks with
    parameters of their own) replace ``forward`` on the instance: they run inside the wrappers and are put back on
    ``disable()``, not deleted with them."""
    from accelerate.hooks import ModelHook, add_hook_to_module
    from diffusers import FluxControlNetPipeline

    flux = build_tiny_pipeline("tiny-flux-random")
    pipe = FluxControlNetPipeline(**flux.components, controlnet=build_flux_controlnet(flux.transformer, 1, 2, std=0.3))
    pipe.set_progress_bar_config(disable=True)
    seen = []

    class Count(ModelHook):
        def pre_forward(self, module, *args, **kwargs):
            seen.append(type(module).__name__)
            return args, kwargs

    block = pipe.transformer.single_transformer_blocks[0]
    for module in (pipe.controlnet, block):
        add_hook_to_module(module, Count())
    hooked = {m: m.__dict__["forward"] for m in (pipe.controlnet, block)}
    baseline = _run(pipe).images
    seen.clear()
    spec = SpeculativePipeline.from_pipe(pipe, method="taylor", interval=3, warmup=2)
    out = _run(spec)
    full = out.spec_stats.full_steps
    assert seen.count("FluxControlNetModel") == full and seen.count("FluxSingleTransformerBlock") == full
    spec.disable()
    assert all(m.__dict__["forward"] is forward for m, forward in hooked.items())
    seen.clear()
    assert torch.equal(_run(pipe).images, baseline) and seen.count("FluxControlNetModel") == STEPS


def test_supports_only_controlnets_that_take_the_timestep():
    class NoTimestep(torch.nn.Module):
        def forward(self, x):
            return x

    assert ControlNetForecast.supports(build_flux_controlnet(build_tiny_pipeline("tiny-flux-random").transformer, 1, 1))
    assert not ControlNetForecast.supports(NoTimestep()) and not ControlNetForecast.supports(None)


def test_a_consumed_output_list_does_not_empty_the_forecast():
    """HunyuanDiT's transformer pops its ControlNet samples from the list it is given: a forecast step must still
    return a whole list (the anchors' structure is a copy), with every sample forecast."""
    from diffspec.config import ForecastConfig

    class ListControlNet(torch.nn.Module):
        def forward(self, hidden_states, timestep):
            return [hidden_states * timestep, hidden_states * timestep * 2]

    stats = SpecStats()
    forecast = ControlNetForecast(ListControlNet(), ForecastConfig(interval=3, warmup=2, order=1), stats,
                                  num_steps_fn=lambda: 8)
    forecast.attach()
    x = torch.ones(2, 3)
    for t in torch.linspace(1.0, 0.125, 8):
        samples = forecast.controlnet(hidden_states=x, timestep=t)
        first = samples.pop(0)  # consumed, as HunyuanDiT does
        torch.testing.assert_close(first, x * t)  # linear in t: an order-1 forecast is exact
        torch.testing.assert_close(samples.pop(0), 2 * x * t)
    assert stats.extra["controlnet_forecast"] > 0
    forecast.detach()
