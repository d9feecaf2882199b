"""Node contract (V1 schema), clone-not-mutate, patch/wrapper installation, packaging entry points."""

import copy
import json
import subprocess
import sys
import types
from pathlib import Path
from unittest import mock

import pytest
import torch
from comfy_fakes import FakeBaseModel, FakeModelPatcher, ToyFlux, make_inputs, sample, toy_patcher

from diffspec.comfyui import (
    NODE_CLASS_MAPPINGS,
    NODE_DISPLAY_NAME_MAPPINGS,
    BlockPatch,
    ComfyForecast,
    ForecastStats,
    SpecaForecast,
    TaylorForecast,
    apply_forecast,
    find_block_lists,
    forecast_of,
)
from diffspec.comfyui.patching import wrapper_types
from diffspec.config import ForecastConfig, SpecaConfig

ROOT = Path(__file__).resolve().parents[2]
COMFY_TYPES = {"MODEL", "LATENT", "STRING", "INT", "FLOAT", "BOOLEAN", "SAMPLER"}


def _defaults(node_cls):
    return {name: spec[1]["default"] for name, spec in node_cls.INPUT_TYPES()["required"].items() if "default" in spec[1]}


@pytest.mark.parametrize("key", sorted(NODE_CLASS_MAPPINGS))
def test_v1_schema(key):
    node = NODE_CLASS_MAPPINGS[key]
    assert NODE_DISPLAY_NAME_MAPPINGS[key].startswith("diffspec ")
    inputs = node.INPUT_TYPES()
    assert set(inputs) == {"required"}
    for name, spec in inputs["required"].items():
        assert isinstance(spec, tuple) and len(spec) == 2 and isinstance(spec[1], dict), name
        kind, opts = spec
        if isinstance(kind, list):  # a combo
            assert opts["default"] in kind
        else:
            assert kind in COMFY_TYPES, (name, kind)
        if kind in ("INT", "FLOAT"):
            assert opts["min"] <= opts["default"] <= opts["max"] and opts["step"] > 0
        assert opts.get("tooltip") or kind in ("MODEL", "LATENT"), name
    assert isinstance(node.RETURN_TYPES, tuple) and set(node.RETURN_TYPES) <= COMFY_TYPES
    assert len(node.RETURN_NAMES) == len(node.RETURN_TYPES)
    assert callable(getattr(node, node.FUNCTION)) and node.CATEGORY == "diffspec" and node.DESCRIPTION
    params = list(getattr(node, node.FUNCTION).__code__.co_varnames[1:getattr(node, node.FUNCTION).__code__.co_argcount])
    assert sorted(params) == sorted(inputs["required"])  # ComfyUI calls FUNCTION with the inputs by name


def test_node_list():
    assert set(NODE_DISPLAY_NAME_MAPPINGS.values()) == {
        "diffspec SpecA Forecast", "diffspec Taylor Forecast", "diffspec Forecast Stats",
        "diffspec Speculative Sampler", "diffspec Sampler Stats"}
    assert set(NODE_CLASS_MAPPINGS) == set(NODE_DISPLAY_NAME_MAPPINGS)
    samplers = [k for k, n in NODE_CLASS_MAPPINGS.items() if "SAMPLER" in n.RETURN_TYPES]
    assert samplers == ["DiffspecSpeculativeSampler"]  # tested in test_comfy_sampler.py


@pytest.mark.parametrize("node_cls, method", [(TaylorForecast, "taylor"), (SpecaForecast, "speca")])
def test_clone_not_mutate_and_what_is_installed(node_cls, method):
    original = toy_patcher()
    original.model_options["transformer_options"]["other_node"] = {"kept": 1}
    before_options, before_wrappers = copy.deepcopy(original.model_options), copy.deepcopy(original.wrappers)
    (patched,) = node_cls().patch(original, **_defaults(node_cls))
    assert patched is not original and patched.model is original.model
    assert original.model_options == before_options and original.wrappers == before_wrappers
    assert original.replace_calls == []
    assert patched.replace_calls == [("dit", "double_block", i) for i in range(2)] + [
        ("dit", "single_block", i) for i in range(3)]
    replace = patched.model_options["transformer_options"]["patches_replace"]["dit"]
    forecast = forecast_of(patched)
    assert isinstance(forecast, ComfyForecast) and forecast.config.method == method
    assert all(isinstance(p, BlockPatch) and p.forecast is forecast for p in replace.values())
    assert patched.model_options["transformer_options"]["other_node"] == {"kept": 1}
    outer, apply_model = wrapper_types()
    assert set(patched.wrappers) == {outer, apply_model}
    assert all(list(w) == ["diffspec"] and len(w["diffspec"]) == 1 for w in patched.wrappers.values())
    # the last list is split for the verifier only
    assert [replace[("single_block", i)].at.split for i in range(3)] == [method == "speca"] * 3
    assert not any(replace[("double_block", i)].at.split for i in range(2))


def test_clones_of_the_patched_model_share_state_and_stats():
    patched = apply_forecast(toy_patcher(), ForecastConfig())
    clone = patched.clone()
    assert forecast_of(clone) is forecast_of(patched)
    patch = clone.model_options["transformer_options"]["patches_replace"]["dit"][("double_block", 0)]
    assert patch.forecast is forecast_of(patched)
    x0, sigmas, contexts = make_inputs(steps=8)
    sample(clone, x0, sigmas, contexts)
    assert forecast_of(patched).stats.full_steps > 0


def test_reapplying_replaces_ours_and_chains_a_foreign_patch():
    calls = []

    def foreign(args, extra):
        calls.append(1)
        return extra["original_block"](args)

    base = toy_patcher()
    base.set_model_patch_replace(foreign, "dit", "double_block", 0)
    once = apply_forecast(base, ForecastConfig())
    twice = apply_forecast(once, SpecaConfig())
    replace = twice.model_options["transformer_options"]["patches_replace"]["dit"]
    assert replace[("double_block", 0)].inner is foreign and replace[("double_block", 1)].inner is None
    assert forecast_of(twice).config.method == "speca"
    assert all(len(w["diffspec"]) == 1 for w in twice.wrappers.values())
    x0, sigmas, contexts = make_inputs(steps=10)
    sample(twice, x0, sigmas, contexts)
    full_calls = forecast_of(twice).stats.target_calls
    assert len(calls) == full_calls  # the foreign patch ran on full steps only, inside ours


def test_unsupported_models_are_named():
    unet = FakeModelPatcher(FakeBaseModel(torch.nn.Sequential(torch.nn.Linear(2, 2))))
    with pytest.raises(ValueError, match="Flux"):
        TaylorForecast().patch(unet, **_defaults(TaylorForecast))
    with pytest.raises(TypeError, match="ModelPatcher"):
        apply_forecast(object(), ForecastConfig())
    with pytest.raises(ValueError, match="granularity"):
        apply_forecast(toy_patcher(), ForecastConfig(granularity="module"))
    with pytest.raises(ValueError, match="k_max=0"):
        SpecaForecast().patch(toy_patcher(), **{**_defaults(SpecaForecast), "k_max": 0})
    assert find_block_lists(ToyFlux()) == [("double_block", 2), ("single_block", 3)]


def test_stats_node():
    node = ForecastStats()
    plain = toy_patcher()
    assert "no diffspec forecast" in node.report(plain, {"samples": 0})["result"][1]
    (patched,) = TaylorForecast().patch(plain, **_defaults(TaylorForecast))
    assert "no sampling run yet" in node.report(patched, {"samples": 0})["result"][1]
    x0, sigmas, contexts = make_inputs(steps=12)
    latent = {"samples": sample(patched, x0, sigmas, contexts)}
    out = node.report(patched, latent)
    samples, text = out["result"]
    assert samples is latent and out["ui"]["text"] == [text]
    head, body = text.split("\n", 1)
    assert head.startswith("diffspec taylor: full_steps 5, forecast_steps 7")  # steps 0-2, 7 and 11 full
    assert json.loads(body)["target_calls"] == 5
    # full_steps instead of the interval: that many full steps, spread over the run's 12 steps
    (spread,) = TaylorForecast().patch(plain, **{**_defaults(TaylorForecast), "full_steps": 6})
    sample(spread, x0, sigmas, contexts)
    assert node.report(spread, latent)["result"][1].startswith("diffspec taylor: full_steps 6, forecast_steps 6")


def test_wrapper_types_come_from_comfy_when_importable():
    assert wrapper_types() == ("outer_sample", "apply_model")
    ext = types.ModuleType("comfy.patcher_extension")
    ext.WrappersMP = types.SimpleNamespace(OUTER_SAMPLE="OS", APPLY_MODEL="AM")
    comfy = types.ModuleType("comfy")
    comfy.patcher_extension = ext
    with mock.patch.dict(sys.modules, {"comfy": comfy, "comfy.patcher_extension": ext}):
        assert wrapper_types() == ("OS", "AM")
        patched = apply_forecast(toy_patcher(), ForecastConfig())
        assert set(patched.wrappers) == {"OS", "AM"}


def test_import_needs_neither_comfy_nor_diffusers():
    code = ("import sys, diffspec.comfyui as c; assert c.NODE_CLASS_MAPPINGS; "
            "print(sorted(m for m in ('comfy', 'diffusers', 'transformers') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
