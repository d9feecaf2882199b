"""speca's replay mode: a recorded full-step schedule replayed without the verifier."""

import pytest
import torch

from diffspec.bench.equal_evals import candidate_grid
from diffspec.config import ForecastConfig, SpecaConfig
from diffspec.forecast.calibrate import replay_schedule, step_full_rate
from diffspec.forecast.gate import Schedule
from diffspec.forecast.hooks import ForecastHooks
from diffspec.stats import SpecStats
from diffspec.testing.random_transformers import build_transformer, make_call, timesteps_for

STEPS = 16


def _run(name, config, batch=1):
    model = build_transformer(name)
    x, call = make_call(name, batch=batch)
    stats = SpecStats(method="speca")
    ForecastHooks(model, config, stats, num_steps_fn=lambda: STEPS).attach()
    with torch.no_grad():
        for t in timesteps_for(name, STEPS):
            x = x - 0.05 * call(model, x, t)
    return x, stats


@pytest.mark.parametrize("name", ["tiny-dit-random", "tiny-flux-random"])
def test_replaying_taylors_schedule_is_bit_identical_to_taylor(name):
    taylor_cfg = ForecastConfig(order=2, interval=4, warmup=2)
    plan = Schedule.of(taylor_cfg).without_rejections(STEPS)
    steps = tuple(s for s, full in enumerate(plan) if full)
    taylor, t_stats = _run(name, taylor_cfg, batch=2)
    replay, r_stats = _run(name, SpecaConfig(order=2, replay_steps=steps), batch=2)
    assert torch.equal(replay, taylor)
    assert r_stats.full_steps == t_stats.full_steps == len(steps)
    assert "checks" not in r_stats.extra and "verifier_evals" not in r_stats.extra  # no check cost


def test_replay_runs_exactly_the_listed_steps_and_differs_from_another_schedule():
    a, stats_a = _run("tiny-dit-random", SpecaConfig(order=1, replay_steps=(0, 1, 2, 9, 15)))
    b, _ = _run("tiny-dit-random", SpecaConfig(order=1, replay_steps=(0, 1, 2, 5, 15)))
    assert stats_a.full_steps == 5 and stats_a.forecast_steps == STEPS - 5
    assert not torch.equal(a, b)  # the schedule is really replayed: moving one full step changes the output


def test_gate_records_where_it_ran_in_full():
    # thresholds that reject nothing: the gate's full steps are its forced ones (warmup, k_max, last)
    cfg = SpecaConfig(tau0=1e30, beta=1.0, tau_min=0.0, k_min=1, k_max=4, warmup=2)
    _, stats = _run("tiny-dit-random", cfg, batch=2)
    expected = [float(f) for f in Schedule.of(cfg).without_rejections(STEPS)]
    assert step_full_rate(stats) == expected
    # thresholds that reject every check: every step from warmup on is full
    _, stats = _run("tiny-dit-random", cfg.replace(tau0=0.0, k_min=0), batch=2)
    assert step_full_rate(stats) == [1.0] * STEPS


def test_replay_schedule_follows_the_gates_density():
    record = [1.0, 1.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 1.0, 0.0, 1.0]
    own = tuple(s for s, r in enumerate(record) if r)
    assert replay_schedule(record, len(own)) == own  # a 0/1 record at its own size: its own steps
    assert replay_schedule(record, 3) == (0, 4, 10)  # thinned over the whole record, not its first steps
    assert replay_schedule([1.0, 0.3, 0.3, 0.9, 0.0, 1.0], 4) == (0, 2, 3, 5)
    assert replay_schedule([0.0, 1.0, 1.0], 1) == (0,)  # step 0 always (anchors)
    assert replay_schedule([0.0, 0.0, 0.0], 2) == (0, 1)  # no density: filled in step order
    with pytest.raises(ValueError, match="n_full=12"):
        replay_schedule(record, 12)


@pytest.mark.parametrize("bad", [(), (0, 0), (-1, 2), "0,1", (0, 1.5), (True,)])
def test_bad_replay_steps_name_the_field(bad):
    with pytest.raises(ValueError, match="replay_steps"):
        SpecaConfig(replay_steps=bad)


def test_replay_steps_are_sorted():
    assert SpecaConfig(replay_steps=[5, 0, 2]).replay_steps == (0, 2, 5)


def test_equal_evals_replay_candidates_hit_the_budget_sizes():
    rate = [1.0] * 3 + [0.5] * 44 + [1.0] * 3
    grid = candidate_grid("speca-replay", [13.0, 20.0], full_rate=rate)
    sizes = sorted({len(g["replay_steps"]) for g in grid})
    assert sizes == [11, 12, 13, 18, 19, 20] and len(grid) == 4 * len(sizes)
    with pytest.raises(ValueError, match="full_rate"):
        candidate_grid("speca-replay", [13.0])


def test_taylor_full_steps_spreads_them_evenly_at_any_step_count():
    from diffspec.forecast.schedule_search import even_schedule

    cfg = ForecastConfig(order=2, warmup=2, full_steps=6)
    taylor, stats = _run("tiny-dit-random", cfg, batch=2)
    replay, _ = _run("tiny-dit-random", SpecaConfig(order=2, replay_steps=even_schedule(6, STEPS, 2)), batch=2)
    assert torch.equal(taylor, replay) and stats.full_steps == 6  # the even grid, placed for STEPS steps
    assert Schedule.of(cfg).for_steps(40).fixed == frozenset(even_schedule(6, 40, 2))
    assert sum(Schedule.of(cfg).for_steps(40).without_rejections(40)) == 6
    with pytest.raises(ValueError, match=r"full_steps=6 \(warmup=2\) does not fit a generation of 5 steps"):
        Schedule.of(cfg).for_steps(5)
    with pytest.raises(ValueError, match="full_steps=6 needs the generation's step count"):
        Schedule.of(cfg).for_steps(None)
    with pytest.raises(ValueError, match="full_steps=2"):
        ForecastConfig(warmup=2, full_steps=2)
