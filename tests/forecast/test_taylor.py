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


def test_rows_updated_separately_forecast_from_their_own_anchors():
    """Per-row updates: each row must match a forecaster that only ever saw that row."""
    g = torch.Generator().manual_seed(0)
    batch = TaylorForecaster(order=2)
    singles = [TaylorForecaster(order=2) for _ in range(3)]
    plan = [(0.0, None), (1.0, None), (2.5, [0, 2]), (3.0, [1]), (4.0, [0]), (5.5, [1, 2]), (6.0, None)]
    for k, (x, rows) in enumerate(plan):
        value = torch.randn(3, 4, generator=g)
        original = value.clone()
        if rows is not None and k % 2:  # a sub-batch: just the updated rows, in order
            batch.update(x, value[rows], rows)
            for i, r in enumerate(rows):
                singles[r].update(x, value[rows][i : i + 1])
        else:
            batch.update(x, value, rows)
            for r in rows if rows is not None else range(3):
                singles[r].update(x, value[r : r + 1])
        assert torch.equal(value, original)  # the caller's tensor is never written
        for target in (x + 0.5, x + 2.0):
            expected = torch.cat([s.forecast(target) for s in singles])
            torch.testing.assert_close(batch.forecast(target), expected, rtol=1e-5, atol=1e-5)
    assert batch.num_anchors == 3
