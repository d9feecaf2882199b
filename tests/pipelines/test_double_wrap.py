"""One method per pipeline at a time: wrapping a pipeline whose modules already carry diffspec hooks is refused
(hooks would stack: mixed statistics, forecasts of forecasts, wrappers left behind by ``disable()``), and
``disable()`` leaves every module of every component as it was, with several denoisers and a ControlNet too."""

import copy

import pytest
import torch
from torch import nn

from diffspec import SpeculativePipeline
from diffspec.testing.random_transformers import build_flux_controlnet
from diffspec.testing.tiny_pipelines import build_tiny_pipeline

pytestmark = pytest.mark.usefixtures("one_thread")
STEPS = 30
DOUBLE_WRAP = r"already carries diffspec 'taylor' hooks.*spec\.disable\(\)"


def module_state(pipe):
    """Per module of every component: its instance ``forward`` (None: the class's) and how many hooks it has."""
    return {(name, path): (m.__dict__.get("forward"), len(m._forward_hooks), len(m._forward_pre_hooks))
            for name, component in pipe.components.items() if isinstance(component, nn.Module)
            for path, m in component.named_modules()}


def assert_untouched(pipe, before, skip=()):
    """Every module as in ``before`` (and none with an instance ``forward``), but those of the ``skip`` components."""
    after = module_state(pipe)
    changed = sorted(key for key in before if key[0] not in skip and after[key] != before[key])
    assert not changed, f"modules still patched: {changed[:5]}"
    assert all(state[0] is None for key, state in after.items() if key[0] not in skip)


def _dit(pipe, seed=0):
    return pipe(class_labels=[1, 2], num_inference_steps=STEPS, guidance_scale=1.0,
                generator=torch.Generator().manual_seed(seed), output_type="np").images


def test_wrapping_a_wrapped_pipeline_is_refused_and_disable_restores_every_module(tiny_dit_pipe):
    pipe = tiny_dit_pipe
    before = module_state(pipe)
    baseline = _dit(pipe)
    spec = SpeculativePipeline.from_pipe(pipe, method="taylor", interval=4, warmup=2)
    single = _dit(spec)
    single_stats = (spec.stats.full_steps, spec.stats.forecast_steps)
    for method in ("speca", "taylor", "coupling"):  # coupling would sample a forecast transformer: not exact
        with pytest.raises(ValueError, match=DOUBLE_WRAP):
            SpeculativePipeline.from_pipe(pipe, method=method)
    # the refused attempts changed nothing: the first wrapper runs and counts as before
    assert (_dit(spec) == single).all() and (spec.stats.full_steps, spec.stats.forecast_steps) == single_stats
    assert sum(single_stats) == STEPS
    spec.disable()
    assert_untouched(pipe, before)
    assert (_dit(pipe) == baseline).all()
    again = SpeculativePipeline.from_pipe(pipe, method="speca")  # free again after disable()
    again.disable()
    assert_untouched(pipe, before)


def test_a_disabled_wrapper_cannot_be_enabled_over_another(tiny_dit_pipe):
    pipe = tiny_dit_pipe
    before = module_state(pipe)
    first = SpeculativePipeline.from_pipe(pipe, method="taylor", interval=4)
    first.disable()
    second = SpeculativePipeline.from_pipe(pipe, method="speca")
    with pytest.raises(ValueError, match=r"already carries diffspec 'speca' hooks.*spec\.disable\(\)"):
        first.enable()
    assert not first.enabled and second.enabled
    second.disable()
    first.enable()  # now it may
    assert first.enabled
    first.disable()
    assert_untouched(pipe, before)


def test_a_pipeline_sharing_a_wrapped_transformer_is_refused(tiny_dit_pipe):
    """diffusers' ``DiffusionPipeline.from_pipe`` shares components: the hooks are on the module, not the pipeline."""
    pipe = tiny_dit_pipe
    spec = SpeculativePipeline.from_pipe(pipe, method="taylor")
    sibling = type(pipe)(**pipe.components)
    with pytest.raises(ValueError, match=r"DiTPipeline\.transformer already carries diffspec 'taylor' hooks"):
        SpeculativePipeline.from_pipe(sibling, method="taylor")
    spec.disable()
    SpeculativePipeline.from_pipe(sibling, method="taylor").disable()


@pytest.fixture(scope="module")
def wan22():
    pipe = build_tiny_pipeline("tiny-wan22")
    pipe.set_progress_bar_config(disable=True)
    return pipe


def test_both_wan22_experts_are_guarded_and_restored(wan22):
    before = module_state(wan22)
    spec = SpeculativePipeline.from_pipe(wan22, method="taylor")
    assert set(spec.hooks) == {"transformer", "transformer_2"}
    with pytest.raises(ValueError, match=r"WanPipeline\.transformer already carries"):
        SpeculativePipeline.from_pipe(wan22, method="speca")
    spec.disable()
    assert_untouched(wan22, before)
    # the second expert alone claimed (through a pipeline sharing it): the wrap is refused before any hook is set
    held = SpeculativePipeline.from_pipe(type(wan22)(**{**wan22.components, "transformer": None}), method="taylor")
    assert list(held.hooks) == ["transformer_2"]
    with pytest.raises(ValueError, match=r"WanPipeline\.transformer_2 already carries diffspec 'taylor' hooks"):
        SpeculativePipeline.from_pipe(wan22, method="taylor")
    assert_untouched(wan22, before, skip=("transformer_2",))
    with pytest.raises(ValueError, match=r"WanTransformer3DModel already carries diffspec 'taylor' hooks"):
        spec.enable()  # the first expert attaches, the second is held: the first is detached again
    assert not spec.enabled
    assert_untouched(wan22, before, skip=("transformer_2",))
    held.disable()
    assert_untouched(wan22, before)


def test_a_controlnet_is_guarded_and_restored():
    from diffusers import FluxControlNetPipeline

    flux = build_tiny_pipeline("tiny-flux-random")
    pipe = FluxControlNetPipeline(**flux.components, controlnet=build_flux_controlnet(flux.transformer, 1, 1, seed=1))
    before = module_state(pipe)
    spec = SpeculativePipeline.from_pipe(pipe, method="taylor", granularity="module")  # blocks and submodules
    assert spec.controlnet_forecast is not None
    with pytest.raises(ValueError, match=DOUBLE_WRAP):
        SpeculativePipeline.from_pipe(pipe, method="taylor")
    spec.disable()
    assert_untouched(pipe, before)
    # the ControlNet alone claimed (a pipeline sharing it, with its own transformer): refused before any hook is set
    other = FluxControlNetPipeline(**{**pipe.components, "transformer": copy.deepcopy(pipe.transformer)})
    held = SpeculativePipeline.from_pipe(other, method="taylor")
    with pytest.raises(ValueError, match=r"FluxControlNetPipeline\.controlnet already carries"):
        SpeculativePipeline.from_pipe(pipe, method="taylor")
    assert_untouched(pipe, before, skip=("controlnet",))
    held.disable()
    assert_untouched(pipe, before)
