"""The nodes refuse contradictory and non-finite settings when the workflow runs the node, before any sampling
(ComfyUI's own min/max checks let NaN through: every comparison with it is false)."""

import math
import sys
from unittest import mock

import pytest
from comfy_fakes import fake_comfy_modules, toy_patcher

from diffspec.comfyui import SpecaForecast, SpeculativeSamplerNode, TaylorForecast


def _defaults(node_cls):
    return {name: spec[1]["default"] for name, spec in node_cls.INPUT_TYPES()["required"].items() if "default" in spec[1]}


@pytest.mark.parametrize("settings, match", [
    ({"k_min": 10, "k_max": 2}, r"k_min=10 with k_max=2: no draft would ever be checked"),
    ({"tau0": 0.01, "tau_min": 0.5}, r"tau_min=0.5 is above tau0=0.01"),
    ({"tau0": math.nan}, r"tau0=nan"),
    ({"beta": math.inf}, r"beta=inf is not finite"),
    ({"tau_min": math.inf}, r"tau_min=inf is not finite"),
])
def test_speca_node_refuses(settings, match):
    with pytest.raises(ValueError, match=match):
        SpecaForecast().patch(toy_patcher(), **{**_defaults(SpecaForecast), **settings})


def test_taylor_node_refuses_fewer_full_steps_than_its_warmup():
    with pytest.raises(ValueError, match=r"full_steps=3 with warmup=3"):
        TaylorForecast().patch(toy_patcher(), **{**_defaults(TaylorForecast), "full_steps": 3, "warmup": 3})


@pytest.mark.parametrize("eta, s_noise, match", [
    (math.nan, 1.0, r"eta=nan"), (1.0, math.nan, r"s_noise=nan"), (1.0, math.inf, r"s_noise=inf"),
    (0.0, 1.0, r"eta=0.0 is out of range"),
])
def test_sampler_node_refuses_before_sampling(eta, s_noise, match):
    with mock.patch.dict(sys.modules, fake_comfy_modules()), pytest.raises(ValueError, match=match):
        SpeculativeSamplerNode().get_sampler("euler_ancestral", 4, True, 16, eta, s_noise)
