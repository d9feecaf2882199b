"""Every method config refuses non-finite numbers and contradictory fields up front, naming them."""

import dataclasses
import math
import typing

import pytest

import diffspec
from diffspec import AutospecConfig, CouplingConfig, ForecastConfig, SpecaConfig
from diffspec.ar_image.config import GSDConfig, MCSJDConfig
from diffspec.multimodal.action_config import RelaxedActionConfig
from diffspec.multimodal.compressed_config import CompressedDraftConfig
from diffspec.multimodal.config import DraftConfig, TextDraftConfig
from diffspec.multimodal.self_config import SelfDraftConfig

CONFIGS = [m.config_class for m in diffspec.methods(available_only=True)]
INF_ALLOWED = {(SpecaConfig, "tau0", math.inf)}  # documented: no draft is ever rejected
"""Non-finite values with a documented meaning."""


def _float_fields(cls):
    hints = typing.get_type_hints(cls)
    return [f.name for f in dataclasses.fields(cls) if "float" in str(hints[f.name])]


NON_FINITE = [(cls, name, value) for cls in CONFIGS for name in _float_fields(cls)
              for value in (math.nan, math.inf, -math.inf) if (cls, name, value) not in INF_ALLOWED]


def test_every_config_with_a_float_field_is_covered():
    covered = {cls for cls, _, _ in NON_FINITE}
    assert {ForecastConfig, SpecaConfig, CouplingConfig, GSDConfig, RelaxedActionConfig, CompressedDraftConfig,
            SelfDraftConfig} <= covered
    assert all(cls in covered for cls in CONFIGS if _float_fields(cls))


@pytest.mark.parametrize("cls, name, value", NON_FINITE,
                         ids=[f"{c.__name__}-{n}-{v}" for c, n, v in NON_FINITE])
def test_non_finite_numbers_are_refused_naming_the_field(cls, name, value):
    with pytest.raises(ValueError, match=rf"^{name}={value!r} "):
        cls(**{name: value})


def test_tau0_inf_means_unverified_forecasting():
    config = SpecaConfig(tau0=math.inf, k_min=10, k_max=2)  # no verifier: k_min has no checks to delay
    assert config.tau(0.5) == math.inf


# (config class, arguments, the error naming every field of the relation): one row per relation
RELATIONS = [
    (ForecastConfig, {"warmup": 4, "full_steps": 4}, r"full_steps=4 with warmup=4: .*full_steps >= warmup \+ 1 = 5"),
    (SpecaConfig, {"k_min": 10, "k_max": 2}, r"k_min=10 with k_max=2: no draft would ever be checked"),
    (SpecaConfig, {"k_min": 7, "k_max": 8}, r"k_min=7 with k_max=8: .*allowed k_min <= k_max - 2 = 6"),
    (SpecaConfig, {"tau0": 0.01, "beta": 0.3, "tau_min": 0.5}, r"tau_min=0.5 is above tau0=0.01"),
    (SpecaConfig, {"replay_steps": [0, 3], "replay_full_steps": 4}, r"replay_full_steps=4 and replay_steps"),
    (CouplingConfig, {"lookahead": 8, "max_lookahead": 4}, r"max_lookahead=4 is out of range: allowed \[lookahead=8"),
    (AutospecConfig, {"lookahead": 8, "max_lookahead": 4}, r"max_lookahead=4 is out of range: allowed \[lookahead=8"),
    (MCSJDConfig, {"cuda_graphs": True, "coupling": "gumbel"}, r"cuda_graphs=True does not support coupling='gumbel'"),
    (GSDConfig, {"clusters": 8, "max_tv": 0.1}, r"clusters=8 replaces the group test; max_tv and min_run"),
    (GSDConfig, {"clusters": 8, "min_run": 2}, r"clusters=8 replaces the group test; max_tv and min_run"),
    (GSDConfig, {"width": 4}, r"width=4 .*needs clusters set.*clusters=None"),
    (GSDConfig, {"width": 4, "clusters": 8, "cluster_rule": "lumped"}, r"width=4 .*cluster_rule='lumped'"),
    (GSDConfig, {"width": 4, "clusters": 8, "coupling": "gumbel"}, r"width=4 .*coupling='gumbel'"),
    (DraftConfig, {"num_draft_tokens": 8, "max_draft_tokens": 4},
     r"max_draft_tokens=4 is out of range: allowed \[num_draft_tokens=8"),
    (TextDraftConfig, {"num_draft_tokens": 8, "max_draft_tokens": 4}, r"max_draft_tokens=4 .*num_draft_tokens=8"),
    (CompressedDraftConfig, {"num_draft_tokens": 8, "max_draft_tokens": 4}, r"max_draft_tokens=4 .*num_draft_tokens=8"),
    (SelfDraftConfig, {"num_draft_tokens": 8, "max_draft_tokens": 4}, r"max_draft_tokens=4 .*num_draft_tokens=8"),
    (SelfDraftConfig, {"visual_top_k": 0, "visual_ratio": 0.0},
     r"visual_top_k=0, visual_ratio=0 and draft_layers=None drafts with the full target"),
    (RelaxedActionConfig, {"tolerance": 8, "n_bins": 8}, r"tolerance=8 is out of range: allowed \[0, n_bins - 1 = 7\]"),
]


@pytest.mark.parametrize("cls, kwargs, match", RELATIONS,
                         ids=[f"{c.__name__}-{'-'.join(k)}" for c, k, _ in RELATIONS])
def test_contradictory_fields_are_refused_naming_both(cls, kwargs, match):
    with pytest.raises(ValueError, match=match):
        cls(**kwargs)


def test_the_boundary_of_each_new_relation_is_allowed():
    assert ForecastConfig(warmup=4, full_steps=5).full_steps == 5
    assert SpecaConfig(k_min=6, k_max=8).k_min == 6 and SpecaConfig(k_min=0, k_max=2).k_max == 2
    assert SpecaConfig(tau0=0.05, beta=2.0, tau_min=0.05).tau(1.0) == 0.1
    # the replay modes run no verifier: k_min / k_max are unused there
    assert SpecaConfig(k_min=5, k_max=2, replay_steps=[0, 4]).replay_steps == (0, 4)
    assert SpecaConfig(k_min=5, k_max=2, replay_full_steps=6).replay_full_steps == 6


def test_filled_in_thresholds_keep_tau_min_below_tau0():
    """Unset thresholds come from the calibration file or the fallback; a filled value never contradicts a set one."""
    assert SpecaConfig(tau0=0.01).with_fallback().tau_min == 0.01  # fallback tau_min 0.02 lowered to tau0
    assert SpecaConfig(tau_min=0.5).with_fallback().tau0 == 0.5  # fallback tau0 0.1 raised to tau_min
    filled = SpecaConfig(tau0=0.05).with_fallback()
    assert (filled.tau0, filled.beta, filled.tau_min) == (0.05, 0.3, 0.02)
