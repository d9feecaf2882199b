"""The shared value checks: call arguments (nested, by name) and numbers (finite unless a field allows inf)."""

import math

import numpy as np
import pytest
import torch

from diffspec.checks import check_finite_arguments, check_float, named_arguments


def test_nested_values_are_named_and_masks_are_left_alone():
    with pytest.raises(ValueError, match=r"^sigmas\[1\]=nan is not finite"):
        check_finite_arguments({"sigmas": [1.0, math.nan, 0.0]})
    with pytest.raises(ValueError, match=r"^joint_attention_kwargs\['scale'\]=inf"):
        check_finite_arguments({"joint_attention_kwargs": {"scale": math.inf}})
    with pytest.raises(ValueError, match=r"^ip_adapter_image_embeds\[0\] holds 2 non-finite"):
        check_finite_arguments({"ip_adapter_image_embeds": [torch.tensor([math.inf, -math.inf, 0.0])]})
    with pytest.raises(ValueError, match=r"^image holds 1 non-finite"):
        check_finite_arguments({"image": np.array([[0.5, np.nan]])})
    check_finite_arguments({"prompt_attention_mask": torch.tensor([0.0, -math.inf]), "prompt": ["a", "b"],
                            "num_inference_steps": 4, "class_labels": torch.tensor([1, 2]), "generator": None})


def test_positional_arguments_are_named_from_the_first_signature_that_has_them():
    def run(*args, **kwargs):
        pass

    def pipe(class_labels, guidance_scale=4.0):
        pass

    assert named_arguments([run, pipe], ([1], 2.0), {}) == {"class_labels": [1], "guidance_scale": 2.0}
    assert named_arguments([run], ([1],), {"x": 1}) == {"argument 0": [1], "x": 1}


def test_infinity_only_where_allowed():
    with pytest.raises(ValueError, match=r"^tau_min=inf is not finite: allowed \[0.0, inf\)$"):
        check_float("tau_min", math.inf, 0.0)
    check_float("tau0", math.inf, 0.0, allow_inf=True)
    with pytest.raises(ValueError, match=r"^tau0=nan must be a number in \[0.0, inf\]$"):
        check_float("tau0", math.nan, 0.0, allow_inf=True)
