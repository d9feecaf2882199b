import re

import pytest
import torch

import diffspec
from diffspec import ForecastConfig, SpeculativePipeline


def test_registry_lists_name_family_exactness_and_config():
    table = {m.name: m for m in diffspec.methods()}
    assert table["taylor"].family == "diffusion" and table["taylor"].exact is False
    assert table["taylor"].config_class is ForecastConfig and table["taylor"].status == "available"
    assert {"speca", "coupling", "autospec", "sjd", "mc-sjd", "gsd", "lantern", "lantern++", "draft"} <= set(table)
    assert [m.name for m in diffspec.methods("diffusion", available_only=True)] == ["taylor", "speca", "coupling",
                                                                                     "autospec"]
    assert table["speca"].config_class is diffspec.SpecaConfig and table["speca"].exact is False
    assert table["coupling"].config_class is diffspec.CouplingConfig and table["coupling"].exact is True
    assert table["autospec"].config_class is diffspec.AutospecConfig and table["autospec"].exact is True
    with pytest.raises(ValueError, match="family"):
        diffspec.methods("audio")


def test_unknown_method_lists_available(tiny_dit_pipe):
    with pytest.raises(ValueError, match=r"unknown method 'tayler'; available methods: taylor, speca, coupling"):
        SpeculativePipeline.from_pipe(tiny_dit_pipe, method="tayler")


def test_method_of_wrong_family_is_rejected(tiny_dit_pipe):
    with pytest.raises(ValueError, match=r"'sjd' is a ar_image method but the target is a diffusion target"):
        SpeculativePipeline.from_pipe(tiny_dit_pipe, method="sjd")


def test_planned_method_says_not_implemented(monkeypatch):
    # a registry entry of its own: the real planned entries get implemented one by one
    planned = diffspec.api._planned("future-method", "multimodal", True, "not implemented yet")
    monkeypatch.setitem(diffspec.api._REGISTRY, "future-method", planned)
    with pytest.raises(ValueError, match="planned but not implemented"):
        diffspec.api.resolve_config("future-method", {})


def test_unsupported_target_lists_supported():
    with pytest.raises(ValueError, match="unsupported target Linear.*DiffusionPipeline"):
        SpeculativePipeline.from_pipe(torch.nn.Linear(2, 2), method="taylor")


def test_unet_pipeline_is_rejected():
    from diffusers import DDPMPipeline, DDPMScheduler, UNet2DModel

    unet = UNet2DModel(sample_size=8, in_channels=3, out_channels=3, block_out_channels=(8, 8), norm_num_groups=8,
                       down_block_types=("DownBlock2D", "DownBlock2D"), up_block_types=("UpBlock2D", "UpBlock2D"),
                       layers_per_block=1)
    pipe = DDPMPipeline(unet=unet, scheduler=DDPMScheduler())
    with pytest.raises(ValueError, match="no `transformer` component.*DiTTransformer2DModel"):
        SpeculativePipeline.from_pipe(pipe, method="taylor")


def test_overrides_and_config_objects(tiny_dit_pipe):
    spec = SpeculativePipeline.from_pipe(tiny_dit_pipe, method="taylor", interval=3, order=2)
    assert spec.config == ForecastConfig(interval=3, order=2)
    spec.disable()
    spec = SpeculativePipeline.from_pipe(tiny_dit_pipe, method=ForecastConfig(order=0), interval=2)
    assert spec.config.order == 0 and spec.config.interval == 2
    spec.disable()
    with pytest.raises(ValueError, match="interval=0 is out of range"):
        SpeculativePipeline.from_pipe(tiny_dit_pipe, method="taylor", interval=0)
    with pytest.raises(ValueError, match="has no field"):
        SpeculativePipeline.from_pipe(tiny_dit_pipe, method="taylor", threshold=0.1)


@pytest.mark.parametrize(("model", "method", "needle"), [
    ("tiny-dit", "mc-sjd", "'mc-sjd' is a ar_image method but 'tiny-dit' holds a diffusion model; methods for it: "
                           "taylor, speca, coupling, autospec"),
    ("tiny-ar", "taylor", "'taylor' is a diffusion method but 'tiny-ar' holds a ar_image model"),
    ("tiny-vla", "speca", "'speca' is a diffusion method but 'tiny-vla' holds a multimodal model"),
    ("tiny-dit", "tayler", "unknown method 'tayler'"),
])
def test_from_pretrained_refuses_a_method_before_loading_any_weight(monkeypatch, model, method, needle):
    import diffspec.models
    import diffspec.multimodal.loading

    def must_not_load(*args, **kwargs):
        raise AssertionError("weights were loaded before the method was checked")

    for module, name in ((diffspec.models, "load_pipeline"), (diffspec.models, "load_ar_target"),
                         (diffspec.multimodal.loading, "load_target"), (diffspec.multimodal.loading, "load_model")):
        monkeypatch.setattr(module, name, must_not_load)
    with pytest.raises(ValueError, match=re.escape(needle)):
        SpeculativePipeline.from_pretrained(model, method=method)
