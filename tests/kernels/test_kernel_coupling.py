"""Reflection-coupling kernel vs its torch reference (the reference is tested against the math in tests/speculation)."""

import pytest
import torch

from diffspec.kernels import reflection_coupling

triton = pytest.importorskip("triton")

TOL = {torch.float32: (1e-5, 1e-5), torch.bfloat16: (1e-2, 2e-2), torch.float16: (1e-3, 2e-3)}


def _case(shape, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    rows = shape[0]
    view = (rows,) + (1,) * (len(shape) - 1)
    a = torch.randn(shape, generator=g)
    scale = torch.linspace(0.0, 0.1, rows).view(view)  # row 0: equal laws (always accepted), then farther
    b = a + scale * torch.randn(shape, generator=g)
    z = torch.randn(shape, generator=g)
    s = torch.rand(rows, generator=g) + 0.5
    y = a + s.view(view) * z
    u = torch.rand(rows, generator=g)
    return [t.to(dtype) for t in (y, z, a, b)] + [s, u]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("shape", [(6, 3, 17, 19), (4, 2048), (3, 4, 1, 513)])
def test_coupling_matches_reference(shape, dtype):
    args = _case(shape, dtype, seed=shape[-1])
    ref = reflection_coupling(*args, backend="torch")
    out = reflection_coupling(*args, backend="triton")
    assert torch.equal(out.accepted, ref.accepted)
    assert ref.accepted.any() and not ref.accepted.all()  # both branches are exercised
    torch.testing.assert_close(out.log_ratio, ref.log_ratio, rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(out.delta, ref.delta, rtol=1e-9, atol=1e-12)
    rtol, atol = TOL[dtype]
    torch.testing.assert_close(out.sample, ref.sample, rtol=rtol, atol=atol)
    kept = ref.accepted
    assert torch.equal(out.sample[kept], args[0][kept])  # accepted rows are the draft, bit for bit


def test_coupling_shape_errors():
    with pytest.raises(ValueError, match="one shape"):
        reflection_coupling(torch.zeros(2, 3), torch.zeros(2, 4), torch.zeros(2, 3), torch.zeros(2, 3),
                            torch.ones(2), torch.rand(2))
    with pytest.raises(ValueError, match=r"must be \(2,\)"):
        reflection_coupling(*(torch.zeros(2, 3),) * 4, torch.ones(3), torch.rand(2))
