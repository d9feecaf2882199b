"""The shipped tiny VLA: its task, its weights, and relaxed-action on it (trained behaviour)."""

from __future__ import annotations

import pytest
import torch

from diffspec import SpeculativePipeline
from diffspec.models.tiny_vla import (
    WEIGHTS,
    encode_observation,
    expert_action,
    load_tiny_vla,
    sample_episodes,
)


@pytest.fixture(scope="module")
def vla():
    return load_tiny_vla()


@pytest.fixture(scope="module")
def episodes():
    return sample_episodes(8, 40, seed=777)  # held out (training used seed 1)


def test_task_is_smooth_and_reaches_goal(episodes):
    states, actions = episodes
    assert actions.abs().max() <= 1 and torch.allclose(actions, expert_action(states))
    step = (actions[:, 1:, :6] - actions[:, :-1, :6]).abs()
    assert float(step.mean()) < 0.03  # consecutive actions are close: drafts from history are good
    final = (states[:, -1, 3:] - states[:, -1, :3]).norm(dim=-1)
    assert float(final.max()) < 0.1


def test_weights_small_and_loaded(vla):
    model, amap = vla
    assert (WEIGHTS / "model.safetensors").stat().st_size <= 3 * 2**20
    assert amap.n_dof == 7 and amap.n_bins == 256 and amap.vocab_size == model.config.vocab_size


def _greedy_actions(model, amap, states):
    spec = SpeculativePipeline.from_pipe(model, method="relaxed-action", action_map=amap)
    spec.disable()
    return torch.stack([spec(input_ids=encode_observation(states[:, t])).actions for t in range(states.shape[1])], 1)


def test_predicts_held_out_actions(vla, episodes):
    model, amap = vla
    states, actions = episodes
    pred = _greedy_actions(model, amap, states)
    err = (pred - actions).abs()
    # measured: mean 0.017, 82% of tokens in the exact bin (train_log.json, 50 held-out episodes)
    assert float(err.mean()) < 0.03
    assert float((amap.actions_to_bins(pred) == amap.actions_to_bins(actions)).float().mean()) > 0.7


def test_relaxed_action_on_trained_model(vla, episodes):
    model, amap = vla
    states, _ = episodes
    plain = _greedy_actions(model, amap, states)
    result = {}
    for r in (0, 9):
        spec = SpeculativePipeline.from_pipe(model, method="relaxed-action", action_map=amap, tolerance=r)
        acts, passes = [], 0
        for t in range(states.shape[1]):  # 8 episodes as the rows of one batch, each with its own history
            acts.append(spec(input_ids=encode_observation(states[:, t])).actions)
            passes += spec.stats.target_calls
        result[r] = (torch.stack(acts, 1), passes / states.shape[1])
    assert torch.equal(result[0][0], plain)  # r = 0: exact greedy at batch 8
    assert result[9][1] < result[0][1] < 7  # batch-8 passes per step: all rows must finish
    assert float((result[9][0] - plain).abs().mean()) < 0.06


def test_closed_loop_rollout_of_the_expert_reaches_the_goal_and_matches_the_open_loop_episodes():
    from diffspec.models.tiny_vla import SUCCESS_RADIUS, expert_action, final_distance, rollout

    states, actions = sample_episodes(8, 60, seed=5)
    again_s, again_a = rollout(expert_action, states[:, 0], 60)
    assert torch.equal(states, again_s) and torch.equal(actions, again_a)
    assert (final_distance(states, actions) < SUCCESS_RADIUS).all()
    frozen = rollout(lambda s: torch.zeros(s.shape[0], 7), states[:, 0], 60)  # a policy that never moves
    assert torch.allclose(final_distance(*frozen), (states[:, 0, 3:] - states[:, 0, :3]).norm(dim=-1))
