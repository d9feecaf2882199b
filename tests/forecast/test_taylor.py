import math
import random

import pytest
import torch

from diffspec.forecast.taylor import TaylorForecaster, newton_weights, taylor_weights


def _poly(coefs, x):
    return sum(c * x**i for i, c in enumerate(coefs))


@pytest.mark.parametrize("order", [0, 1, 2, 3, 4])
def test_newton_is_exact_on_polynomials_at_random_spacing(order):
    rng = random.Random(order)
    for _ in range(20):
        xs = sorted(rng.uniform(-5, 5) for _ in range(order + 1))
        coefs = torch.randn(order + 1, 7, dtype=torch.float64)
        f = TaylorForecaster(order, "newton")
        for x in xs:
            f.update(x, _poly(coefs, x))
        target = rng.uniform(-8, 8)
        torch.testing.assert_close(f.forecast(target).double(), _poly(coefs, target), rtol=1e-4, atol=1e-3)


def _reference_taylor(xs, values, x, order):
    """TaylorSeer's official recursion, written on tensors step by step."""
    levels_prev = None
    x_prev = None
    for xk, fk in zip(xs, values):
        levels = [fk]
        if levels_prev is not None:
            for i in range(min(order, len(levels_prev))):
                levels.append((levels[i] - levels_prev[i]) / (xk - x_prev))
        levels_prev, x_prev = levels, xk
    return sum(d * (x - x_prev) ** i / math.factorial(i) for i, d in enumerate(levels_prev))


@pytest.mark.parametrize("order", [1, 2, 3])
def test_taylor_form_matches_official_recursion(order):
    g = torch.Generator().manual_seed(order)
    xs = [0.0, 1.0, 2.0, 6.0, 11.0, 15.0][: order + 3]  # warmup at gap 1, then larger gaps
    values = [torch.randn(5, generator=g, dtype=torch.float64) for _ in xs]
    f = TaylorForecaster(order, "taylor")
    for x, v in zip(xs, values):
        f.update(x, v)
    # the forecaster keeps only order+1 anchors; the recursion on the same window must agree
    window = slice(len(xs) - (order + 1), None)
    ref = _reference_taylor(xs[window], values[window], 18.0, order)
    torch.testing.assert_close(f.forecast(18.0).double(), ref, rtol=1e-5, atol=1e-6)


def test_forms_agree_up_to_order_one_and_differ_at_two():
    xs = [0.0, 2.0, 5.0]
    assert newton_weights(xs[1:], 7.0) == pytest.approx(taylor_weights(xs[1:], 7.0))
    assert newton_weights(xs, 7.0) != pytest.approx(taylor_weights(xs, 7.0))
    # uniform spacing, m=2: quadratic terms s(s+1)/2 vs s^2/2
    assert sum(newton_weights([0.0, 1.0, 2.0], 3.0)) == pytest.approx(1.0)


def test_uses_available_order_until_enough_anchors():
    f = TaylorForecaster(order=3)
    f.update(0.0, torch.full((2,), 4.0))
    assert torch.equal(f.forecast(5.0), torch.full((2,), 4.0))
    f.update(1.0, torch.full((2,), 5.0))
    torch.testing.assert_close(f.forecast(3.0), torch.full((2,), 7.0))


def test_forecast_is_fp32_from_bf16_anchors():
    f = TaylorForecaster(order=1)
    base = torch.full((4,), 1000.0)
    f.update(0.0, base.bfloat16())
    f.update(1.0, (base + 8).bfloat16())
    out = f.forecast(2.0)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, base + 16)
    assert f.nbytes == 2 * 4 * 2


def test_duplicate_abscissa_replaces_anchor_and_bad_form_rejected():
    f = TaylorForecaster(order=1)
    f.update(1.0, torch.zeros(1))
    f.update(1.0, torch.ones(1))
    assert f.num_anchors == 1
    with pytest.raises(ValueError, match="form"):
        TaylorForecaster(1, "spline")
