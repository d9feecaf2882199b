"""Pipelines with more than one denoiser: Wan 2.2 A14B's two experts (``transformer`` for the high-noise steps,
``transformer_2`` after the boundary) and Ideogram 4's ``unconditional_transformer``. Every one is forecast, on
the pipeline's step count, each with its own warmup from the step it takes over."""

import pytest
import torch
from forecast_checks import record_runs

from diffspec import SpeculativePipeline
from diffspec.config import ForecastConfig
from diffspec.forecast.gate import Schedule
from diffspec.forecast.hooks import ForecastHooks
from diffspec.forecast.steps import StepTracker
from diffspec.stats import SpecStats
from diffspec.testing.random_transformers import build_transformer, make_call, timesteps_for
from diffspec.testing.tiny_pipelines import build_tiny_pipeline

STEPS = 12


@pytest.fixture(scope="module")
def wan22():
    torch.set_num_threads(1)
    return build_tiny_pipeline("tiny-wan22")


def _run(pipe, seed=0):
    return pipe(prompt="a red fox", num_frames=5, height=32, width=32, num_inference_steps=STEPS, guidance_scale=4.0,
                generator=torch.Generator().manual_seed(seed), output_type="pt")


def _block_runs(pipe):
    """Per expert: for each of its calls, whether its first block's feed-forward ran (a full call) or not (a draft;
    the block itself is still called, its wrapper returning the forecast)."""
    experts = {name: getattr(pipe, name) for name in ("transformer", "transformer_2")}
    return record_runs(experts, lambda model: model.blocks[0].ffn)


def test_both_wan22_experts_forecast_each_with_its_own_warmup(wan22):
    baseline = _run(wan22).frames
    high = int((wan22.scheduler.timesteps >= 900).sum())
    assert 0 < high < STEPS - 4  # both experts have steps (3 and 9 at shift 3)
    spec = SpeculativePipeline.from_pipe(wan22, method="taylor", interval=3, warmup=2)
    assert set(spec.hooks) == {"transformer", "transformer_2"}
    with _block_runs(wan22) as runs:
        out = _run(spec)
    # two CFG calls per step; the schedule of each expert counts from the step it takes over
    sched = Schedule(2, 3)
    expected, since = [], None
    for step in range(STEPS):
        first = 0 if step < high else high
        since = None if step == first else since
        expected.append(sched.forced_full(step, STEPS, since, first))
        since = 0 if expected[-1] else since + 1
    assert runs["transformer"] == [f for f in expected[:high] for _ in range(2)]
    assert runs["transformer_2"] == [f for f in expected[high:] for _ in range(2)]
    assert not all(expected[high:]) and expected[high] and expected[high + 1]  # warmup again at the switch
    stats = out.spec_stats
    assert stats.full_steps == 2 * sum(expected) and stats.forecast_steps == 2 * (STEPS - sum(expected))
    assert (stats.steps, stats.branches) == (STEPS, 2) and stats.speedup == 2 * STEPS / stats.target_calls
    psnr = -10 * torch.log10(((out.frames - baseline) ** 2).mean())
    assert not torch.equal(out.frames, baseline) and psnr > 20

    spec.disable()
    assert torch.equal(_run(wan22).frames, baseline)
    assert "forward" not in wan22.transformer_2.blocks[0].__dict__


def test_wan22_interval_one_is_bit_identical_and_speca_forecasts_the_low_noise_expert(wan22):
    baseline = _run(wan22).frames
    spec = SpeculativePipeline.from_pipe(wan22, method="taylor", interval=1)
    assert torch.equal(_run(spec).frames, baseline)
    spec.disable()
    spec = SpeculativePipeline.from_pipe(wan22, method="speca", tau0=float("inf"), k_max=3, k_min=1, warmup=2)
    with _block_runs(wan22) as runs:
        out = _run(spec)
    spec.disable()
    assert torch.isfinite(out.frames).all() and not all(runs["transformer_2"]) and all(runs["transformer_2"][:4])


def test_a_pipeline_with_only_the_low_noise_expert_is_forecast():
    """Wan 2.2 pipelines may be saved without ``transformer`` (both are optional components)."""
    pipe = build_tiny_pipeline("tiny-wan22")
    pipe.register_modules(transformer=None)
    pipe.register_to_config(boundary_ratio=1.001)  # every step (t <= 1000) below the boundary: transformer_2 alone
    spec = SpeculativePipeline.from_pipe(pipe, method="taylor", interval=3, warmup=2)
    assert list(spec.hooks) == ["transformer_2"]
    out = _run(spec)
    assert torch.isfinite(out.frames).all() and out.spec_stats.forecast_steps > 0
    spec.disable()


def test_a_shared_tracker_counts_the_steps_of_conditional_and_unconditional_transformers():
    """Ideogram 4 calls its conditional ``transformer`` and its ``unconditional_transformer`` once per step at the
    same timestep: with one tracker both see the pipeline's steps (the second call is branch 1), both forecast on
    the same schedule, and the combination equals each one hooked alone."""
    name = "tiny-ideogram4"
    cond, uncond = build_transformer(name, seed=0), build_transformer(name, seed=1)
    x0, call = make_call(name, batch=2)
    ts = timesteps_for(name, STEPS)
    config = ForecastConfig(interval=3, warmup=2)

    def loop(hook_both):
        stats, tracker = SpecStats(), StepTracker(increasing=True)
        hooks = [ForecastHooks(m, config, stats, num_steps_fn=lambda: STEPS, tracker=tracker if hook_both else None)
                 for m in (cond, uncond)]
        for h in hooks:
            h.attach()
        x, outs = x0.clone(), []
        for i, t in enumerate(ts):
            c, u = call(cond, x, t), call(uncond, x, t)
            outs.append((c, u))
            x = x + (ts[i + 1] - t if i + 1 < len(ts) else -t) * (u + 2.0 * (c - u))
        for h in hooks:
            h.detach()
        return outs, stats

    together, stats = loop(True)
    apart, _ = loop(False)  # own trackers: each transformer is called once per step anyway
    full = sum(Schedule(2, 3).without_rejections(STEPS))
    assert (stats.full_steps, stats.forecast_steps) == (2 * full, 2 * (STEPS - full))
    for (c1, u1), (c2, u2) in zip(together, apart):
        assert torch.equal(c1, c2) and torch.equal(u1, u2)


def test_a_shared_tracker_must_read_timesteps_one_way():
    with pytest.raises(ValueError, match="increasing"):
        ForecastHooks(build_transformer("tiny-ideogram4"), ForecastConfig(), SpecStats(), tracker=StepTracker())


def test_compile_covers_both_experts():
    pipe = build_tiny_pipeline("tiny-wan22")
    spec = SpeculativePipeline.from_pipe(pipe, method="taylor", interval=3, warmup=2)
    eager = _run(spec).frames
    assert spec.compile(backend="eager") is spec
    for model in (pipe.transformer, pipe.transformer_2):
        assert all(b._compiled_call_impl is not None for b in model.blocks)
    torch.testing.assert_close(_run(spec).frames, eager, rtol=1e-4, atol=1e-5)
    spec.disable()
