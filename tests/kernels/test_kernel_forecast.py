"""Forecast / L1-error kernels vs their torch references (Triton interpreter on CPU), and the anchor ring."""

import pytest
import torch

from diffspec.forecast.taylor import TaylorForecaster, combine
from diffspec.kernels import AnchorRing, forecast, l1_error

triton = pytest.importorskip("triton")

DTYPES = [torch.float32, torch.bfloat16, torch.float16]
# odd shapes: inner sizes below, at and just past the kernel's block (2048) and a 1-row case
SHAPES = [(3, 7, 11), (2, 2048), (1, 2049), (5, 4097)]


def _anchors(shape, n, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(shape, generator=g).to(dtype) for _ in range(n)], torch.randn(shape, generator=g).to(dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_forecast_matches_reference(shape, dtype):
    anchors, true = _anchors(shape, 3, dtype, seed=sum(shape))
    weights = [1.0, -3.0, 3.0]  # order-2 Newton weights at uniform spacing
    ref = forecast(anchors, weights, true=true, backend="torch")
    out = forecast(anchors, weights, true=true, backend="triton")
    assert out[0].dtype == torch.float32
    torch.testing.assert_close(out[0], ref[0], rtol=1e-6, atol=1e-5)
    torch.testing.assert_close(out[1], ref[1], rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(out[2], ref[2], rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("dtype", DTYPES)
def test_per_row_weights_ring_and_out_dtype(dtype):
    ring = AnchorRing(slots=3)
    g = torch.Generator().manual_seed(1)
    for _ in range(5):  # wraps around: order is no longer the slot order
        ring.append(torch.randn(4, 3, 333, generator=g).to(dtype))
    assert ring.order == [2, 0, 1]
    w = torch.randn(3, 4, generator=g)
    ref = forecast(ring.buffer, w, order=ring.order, backend="torch", out_dtype=dtype)
    out = forecast(ring.buffer, w, order=ring.order, backend="triton", out_dtype=dtype)
    assert out.dtype == dtype
    tol = {torch.float32: 1e-5}.get(dtype, 1e-2)
    torch.testing.assert_close(out.float(), ref.float(), rtol=tol, atol=tol)


def test_ring_writes_only_the_new_slot():
    ring = AnchorRing(slots=2)
    ring.append(torch.zeros(2, 3))
    ring.append(torch.ones(2, 3))
    kept = ring.buffer[1].clone()
    ring.append(torch.full((2, 3), 5.0))
    assert ring.order == [1, 0] and torch.equal(ring.buffer[1], kept)
    assert torch.equal(forecast(ring.buffer, [-1.0, 2.0], order=ring.order), torch.full((2, 3), 9.0))


@pytest.mark.parametrize("base", [False, True])
@pytest.mark.parametrize("dtype", DTYPES)
def test_l1_error_matches_reference(dtype, base):
    (draft, b), true = _anchors((3, 5, 413), 2, dtype, seed=7)
    ref = l1_error(draft, true, b if base else None, backend="torch")
    out = l1_error(draft, true, b if base else None, backend="triton")
    for o, r in zip(out, ref):
        torch.testing.assert_close(o, r, rtol=1e-5, atol=1e-4)


def test_reference_is_the_forecasters_arithmetic():
    """The reference reproduces the pre-kernel combine bit for bit (a changed sum order would not)."""
    anchors, _ = _anchors((2, 9, 31), 3, torch.bfloat16, seed=3)
    weights = [0.3, -1.7, 2.4]
    old = anchors[0].to(torch.float32) * weights[0]
    for a, w in zip(anchors[1:], weights[1:]):
        old.add_(a, alpha=w)
    assert torch.equal(combine(anchors, weights), old)
    f = TaylorForecaster(order=1)
    f.update(0.0, anchors[0])
    f.update(1.0, anchors[1])
    f.update(2.0, anchors[2][:1], rows=[0])  # rows diverge: per-row weights
    w_rows = torch.tensor([[2.0, -2.0], [-1.0, 3.0]])  # slots x rows: Newton weights at x = 3
    expect = torch.zeros(2, 9, 31)
    for slot, w in enumerate(w_rows):
        expect.addcmul_(f._slots[slot].float(), w.view(2, 1, 1))
    assert torch.equal(f.forecast(3.0), expect)


def test_shape_errors():
    with pytest.raises(ValueError, match="one shape"):
        forecast([torch.zeros(2, 3), torch.zeros(2, 4)], [1.0, 1.0])
    with pytest.raises(ValueError, match="weights for 2 anchors"):
        forecast([torch.zeros(2, 3)] * 2, [1.0])
    with pytest.raises(ValueError, match="order="):
        forecast(torch.zeros(2, 2, 3), [1.0, 1.0])
    with pytest.raises(ValueError, match=r"\[2, 2\]"):
        forecast([torch.zeros(2, 3)] * 2, torch.zeros(3, 2))
