"""The search behind method="auto": taylor ladders refined by bisection where they stop."""

from diffspec.pipelines.auto_cache import AutoCache
from diffspec.pipelines.auto_search import Tuner


def fake_tuner(tmp_path, monkeypatch, fewest_passing: int) -> tuple[Tuner, list[int]]:
    """A tuner whose taylor measurements meet 32 dB from ``fewest_passing`` full steps up; records what it runs."""
    tuner = Tuner(None, [{"num_inference_steps": 50}], AutoCache(tmp_path / "c.json", {}, {}), floor=32.0,
                  show_progress=False)
    ran = []

    def measure(config):
        ran.append(config.full_steps)
        bound = 32.0 + config.full_steps - fewest_passing
        return {"method": "taylor", "config": config.to_dict(), "exact": False, "psnr_bound": bound,
                "speedup": 50 / config.full_steps}

    monkeypatch.setattr(tuner, "measure", measure)
    return tuner, ran


def test_the_ladder_is_refined_by_bisection_where_it_stops(tmp_path, monkeypatch):
    tuner, ran = fake_tuner(tmp_path, monkeypatch, fewest_passing=18)
    results = tuner.taylor(50, order=1)
    assert ran == [38, 25, 20, 16, 18, 17]  # the ladder stops at 16; 18 meets the floor, 17 does not
    assert min(r["config"]["full_steps"] for r in results if tuner.meets(r)) == 18


def test_a_first_rung_below_the_floor_is_refined_up_to_full_compute(tmp_path, monkeypatch):
    tuner, ran = fake_tuner(tmp_path, monkeypatch, fewest_passing=45)
    results = tuner.taylor(50, order=2)
    assert ran == [38, 44, 47, 45]
    assert min(r["config"]["full_steps"] for r in results if tuner.meets(r)) == 45


def test_a_ladder_that_never_fails_is_not_refined(tmp_path, monkeypatch):
    tuner, ran = fake_tuner(tmp_path, monkeypatch, fewest_passing=1)
    tuner.taylor(50, order=1)
    assert ran == [38, 25, 20, 16, 12, 10, 8, 5]


def test_a_front_loaded_ladder_keeps_its_warmup_while_bisecting(tmp_path, monkeypatch):
    tuner, ran = fake_tuner(tmp_path, monkeypatch, fewest_passing=18)
    results = tuner.taylor(50, order=1, warmup=12)
    assert ran == [38, 25, 20, 16, 18, 17] and {r["config"]["warmup"] for r in results} == {12}


def test_a_later_ladder_measures_only_what_could_beat_the_choice_so_far(tmp_path, monkeypatch):
    tuner, ran = fake_tuner(tmp_path, monkeypatch, fewest_passing=17)
    results = tuner.taylor(50, order=2, warmup=12, below=18)  # 18 full steps already met the floor
    assert ran == [16, 17] and [r["config"]["full_steps"] for r in results if tuner.meets(r)] == [17]
