"""relaxed-action behind SpeculativePipeline: registry, action maps, episode history, drafters, save/load."""

from __future__ import annotations

import pytest
import torch

import diffspec
from diffspec import SpeculativePipeline
from diffspec.models.tiny_vla import (
    action_map,
    build_tiny_vla,
    encode_observation,
    load_tiny_vla,
    sample_episodes,
)
from diffspec.multimodal.action_map import ActionTokenMap


@pytest.fixture(scope="module")
def vla():
    model = build_tiny_vla(seed=3, hidden=32, layers=1)
    model.generation_config.pad_token_id = 0
    return model


def _obs(batch, t, seed=0):
    states, _ = sample_episodes(batch, t + 1, seed=seed)
    return encode_observation(states[:, t])


def test_registered_and_relaxed():
    info = {m.name: m for m in diffspec.methods("multimodal")}["relaxed-action"]
    assert info.status == "available" and not info.exact and info.config_class.__name__ == "RelaxedActionConfig"


def test_from_pipe_with_map_matches_plain_at_r0(vla):
    spec = SpeculativePipeline.from_pipe((vla, None), method="relaxed-action", action_map=action_map(),
                                         tolerance=0, draft_source="previous")
    for t in range(4):
        ids = _obs(3, t)
        out = spec(input_ids=ids)
        stats = spec.stats.to_dict()
        ref = spec.plain(input_ids=ids)
        assert torch.equal(out.tokens, ref.tokens) and torch.equal(out.actions, ref.actions)
        assert out.actions.shape == (3, 7) and out.spec_stats is spec.stats
        assert 1 <= stats["target_calls"] <= 7 and stats["extra"]["error_bound"] == 0.0
    assert spec.history.shape == (3, 8, 7)  # both calls per step pushed their action
    with pytest.raises(ValueError, match="reset_episode"):
        spec(input_ids=_obs(2, 0))
    spec.reset_episode()
    assert spec(input_ids=_obs(2, 0)).tokens.shape == (2, 7)
    with pytest.raises(ValueError, match="do_sample"):
        spec(input_ids=_obs(2, 0), do_sample=True)


def test_default_map_error_bound_and_mismatch(vla):
    spec = SpeculativePipeline.from_pipe(vla, method="relaxed-action", tolerance=3, draft_source="kalman")
    assert spec.action_map == action_map()
    spec(input_ids=_obs(1, 0))
    assert spec.stats.extra["error_bound"] == pytest.approx(3 * 2 / 256)
    with pytest.raises(ValueError, match="exceeds the model's output vocabulary"):
        SpeculativePipeline.from_pipe(vla, method="relaxed-action", action_map=ActionTokenMap(vocab_size=32000))
    with pytest.raises(ValueError, match="draft=<drafter model>"):
        SpeculativePipeline.from_pipe(vla, method="relaxed-action", draft_source="model")
    small = SpeculativePipeline.from_pipe(vla, method="relaxed-action", action_map=ActionTokenMap(vocab_size=300, n_dof=3))
    assert small.config.n_dof == 3 and small(input_ids=_obs(1, 0)).tokens.shape == (1, 3)


def test_model_drafter_equal_to_target_takes_one_pass(vla, tmp_path):
    vla.save_pretrained(tmp_path)
    loaded, amap = load_tiny_vla(tmp_path)
    spec = SpeculativePipeline.from_pipe(loaded, method="relaxed-action", action_map=amap, draft_source="model",
                                         draft=vla)
    ids = _obs(2, 5)
    out = spec(input_ids=ids)
    assert torch.equal(out.tokens, spec.plain(input_ids=ids).tokens)
    spec(input_ids=ids)
    assert spec.stats.target_calls == 1 and spec.stats.draft_calls == 7
    with pytest.raises(ValueError, match="not a tiny-vla folder"):
        load_tiny_vla(tmp_path / "missing")


def test_from_pretrained_reads_the_folders_action_map(vla, tmp_path):
    vla.save_pretrained(tmp_path)
    amap = ActionTokenMap(vocab_size=vla.config.vocab_size, n_bins=64, n_dof=3, low=-2.0, high=2.0)
    amap.save_pretrained(tmp_path)
    assert ActionTokenMap.from_pretrained(tmp_path) == amap
    spec = SpeculativePipeline.from_pretrained(tmp_path, method="relaxed-action", tolerance=0)
    assert spec.action_map == amap and spec.config.n_dof == 3 and spec.config.n_bins == 64
    out = spec(input_ids=_obs(1, 0))
    assert out.tokens.shape == (1, 3) and torch.equal(out.tokens, spec.plain(input_ids=_obs(1, 0)).tokens)
    given = ActionTokenMap(vocab_size=vla.config.vocab_size, n_dof=2)  # an explicit map wins over the file
    assert SpeculativePipeline.from_pretrained(tmp_path, method="relaxed-action", action_map=given).action_map == given
    (tmp_path / "action_map.json").write_text('{"vocab_size": 300, "bins": 4}')
    with pytest.raises(ValueError, match="unknown field"):
        ActionTokenMap.from_pretrained(tmp_path)


def test_openvla_style_config_and_the_shipped_name(tmp_path):
    import json

    (tmp_path / "config.json").write_text(json.dumps({"n_action_bins": 128, "text_config": {"vocab_size": 500}}))
    amap = ActionTokenMap.from_pretrained(tmp_path)
    assert (amap.vocab_size, amap.n_bins, amap.n_dof) == (500, 128, 7)
    assert ActionTokenMap.from_pretrained(tmp_path / "none") is None
    spec = SpeculativePipeline.from_pretrained("tiny-vla", method="relaxed-action", tolerance=5)
    assert spec.action_map.n_bins == 256 and spec.action_map.vocab_size == 387
