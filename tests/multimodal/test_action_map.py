"""ActionTokenMap conversions, the tolerance rule and the training-free action drafts."""

from __future__ import annotations

import pytest
import torch

from diffspec.multimodal.action_config import RelaxedActionConfig
from diffspec.multimodal.action_draft import kalman_draft, previous_draft
from diffspec.multimodal.action_loop import tolerance_ok
from diffspec.multimodal.action_map import ActionTokenMap


def test_openvla_order_and_round_trip():
    amap = ActionTokenMap(vocab_size=32000)
    a = torch.linspace(-1, 1, 1001)[:, None].expand(-1, 7)
    ids = amap.actions_to_tokens(a)
    assert int(ids.min()) == 32000 - 256 and int(ids.max()) == 31999
    assert bool((ids[1:] <= ids[:-1]).all())  # higher id = smaller action (OpenVLA)
    back = amap.tokens_to_actions(ids)
    assert float((back - a).abs().max()) <= float(amap.bin_width.max()) / 2 + 1e-6
    bins = torch.arange(256)[:, None].expand(-1, 7)
    assert torch.equal(amap.tokens_to_bins(amap.bins_to_tokens(bins)), bins)
    assert torch.equal(amap.actions_to_bins(amap.bins_to_actions(bins)), bins)


def test_forward_order_per_dof_bounds_and_clipping():
    amap = ActionTokenMap(vocab_size=100, n_bins=10, n_dof=2, low=(0.0, -2.0), high=(1.0, 2.0), reverse=False)
    assert amap.bin_width.tolist() == pytest.approx([0.1, 0.4])
    ids = amap.actions_to_tokens(torch.tensor([[0.05, -3.0], [0.95, 1.99]]))
    assert ids.tolist() == [[90, 90], [99, 99]]
    assert amap.tokens_to_actions(ids)[1].tolist() == pytest.approx([0.95, 1.8])
    assert amap.is_action(torch.tensor([89, 90, 99, 100])).tolist() == [False, True, True, False]
    assert amap.tolerance_bound(3) == pytest.approx(1.2)


@pytest.mark.parametrize("kwargs, match", [
    (dict(vocab_size=100, n_bins=200), "n_bins=200"),
    (dict(vocab_size=100, n_bins=10, n_dof=2, low=(0.0,)), "one per DoF"),
    (dict(vocab_size=100, n_bins=10, n_dof=1, low=1.0, high=1.0), "high must exceed low"),
    (dict(vocab_size=100, n_bins=1), "n_bins=1"),
])
def test_map_validation(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ActionTokenMap(**kwargs)


def test_config_validation():
    with pytest.raises(ValueError, match="draft_source='nope'"):
        RelaxedActionConfig(draft_source="nope")
    with pytest.raises(ValueError, match="tolerance=-1"):
        RelaxedActionConfig(tolerance=-1)
    with pytest.raises(ValueError, match="tolerance=9"):
        RelaxedActionConfig(tolerance=9, n_bins=8)


def test_tolerance_rule():
    amap = ActionTokenMap(vocab_size=50, n_bins=20, n_dof=4)
    d = torch.tensor([[40, 40, 40, 5]])
    t = torch.tensor([[40, 43, 44, 5]])  # bin distances 0, 3, 4; last pair: equal non-action ids
    assert tolerance_ok(d, t, amap, 0).tolist() == [[True, False, False, True]]
    assert tolerance_ok(d, t, amap, 3).tolist() == [[True, True, False, True]]
    assert tolerance_ok(d, torch.tensor([[7, 40, 40, 6]]), amap, 19).tolist() == [[False, True, True, False]]


def test_drafts():
    h = torch.zeros(2, 0, 3)
    assert previous_draft(h).tolist() == [[0.0] * 3] * 2 and kalman_draft(h, process_noise=1e-3, measurement_noise=1e-4).shape == (2, 3)
    line = (0.05 * torch.arange(6.0) - 0.4)[None, :, None].expand(2, -1, 3)
    assert torch.allclose(kalman_draft(line, process_noise=1e-3, measurement_noise=1e-6), torch.full((2, 3), -0.1), atol=1e-3)
    assert torch.allclose(kalman_draft(line[:, :2], process_noise=1e-3, measurement_noise=1e-6),
                          torch.full((2, 3), -0.3), atol=1e-3)  # two actions: linear extrapolation
    const = torch.full((1, 4, 7), 0.3)
    assert torch.allclose(kalman_draft(const, process_noise=1e-3, measurement_noise=1e-4), const[:, 0], atol=1e-5)
    assert torch.equal(previous_draft(line), line[:, -1])
