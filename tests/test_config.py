import pytest

from diffspec import ForecastConfig, SpecStats


@pytest.mark.parametrize(
    "field,value,match",
    [
        ("order", -1, r"order=-1 is out of range: allowed \[0, 8\]"),
        ("interval", 0, r"interval=0 is out of range: allowed \[1, 1000\]"),
        ("warmup", 1.5, r"warmup=1.5 must be an integer"),
        ("form", "spline", r"form='spline' is not supported: choose one of 'newton', 'taylor'"),
        ("abscissa", "time", r"abscissa='time'"),
        ("granularity", "layer", r"granularity='layer'"),
        ("last_step_full", 1, r"last_step_full=1"),
    ],
)
def test_bad_values_name_field_value_and_range(field, value, match):
    with pytest.raises(ValueError, match=match):
        ForecastConfig(**{field: value})


def test_config_is_frozen_and_replace_validates():
    cfg = ForecastConfig()
    with pytest.raises(AttributeError):
        cfg.order = 3  # type: ignore[misc]
    assert cfg.replace(order=2).order == 2
    with pytest.raises(ValueError, match="has no field"):
        cfg.replace(orderr=2)
    with pytest.raises(ValueError, match="interval"):
        cfg.replace(interval=-3)
    assert cfg.to_dict()["method"] == "taylor"


def test_stats_reset_and_rates():
    s = SpecStats(method="taylor", full_steps=2, forecast_steps=6, accepted=3, proposed=4, extra={"a": 1})
    assert s.forecast_fraction == 0.75 and s.acceptance_rate == 0.75
    d = s.to_dict()
    assert d["forecast_fraction"] == 0.75 and d["extra"] == {"a": 1}
    s.reset()
    assert s.method == "taylor" and s.full_steps == 0 and s.extra == {}
