"""Reflection maximal coupling: acceptance = 2 Phi(-delta/2), output law N(b, s^2 I), accepted = draft."""

import math

import pytest
import torch
from scipy import stats

from diffspec.kernels import reflection_coupling
from diffspec.speculation.coupling import acceptance_probability, first_rejections


def _couple(d: int, delta: float, n: int, seed: int, s: float = 0.7):
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(d, generator=g).expand(n, d).contiguous()
    direction = torch.randn(d, generator=g)
    direction /= direction.norm()
    b = a + s * delta * direction
    z = torch.randn(n, d, generator=g)
    y = a + s * z
    u = torch.rand(n, generator=g)
    return a, b, y, reflection_coupling(y, z, a, b, torch.full((n,), s), u), direction, s


@pytest.mark.parametrize("d", [1, 16, 4096])
@pytest.mark.parametrize("delta", [0.0, 1e-9, 0.1, 1.0, 3.0])
def test_acceptance_rate_is_two_phi_minus_half_delta(d, delta):
    n = 20000 if d < 4096 else 4000
    *_, out, _, _ = _couple(d, delta, n, seed=d + int(delta * 100))
    p = float(acceptance_probability(delta))
    rate = out.accepted.double().mean().item()
    tol = 4.5 * math.sqrt(max(p * (1 - p), 1e-12) / n) + 1e-12
    assert abs(rate - p) <= tol, (rate, p, tol)
    assert torch.allclose(out.delta, torch.full((n,), delta, dtype=torch.float64), rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("d,delta", [(1, 1.0), (16, 0.1), (16, 3.0), (4096, 1.0)])
def test_output_law_is_the_target_gaussian(d, delta):
    n = 20000 if d < 4096 else 5000
    _, b, _, out, direction, s = _couple(d, delta, n, seed=7 + d)
    white = (out.sample - b) / s
    # along the reflection axis (where a biased coupling shows) and along random directions
    projections = [white @ direction]
    g = torch.Generator().manual_seed(99)
    for _ in range(3):
        v = torch.randn(d, generator=g)
        projections.append(white @ (v / v.norm()))
    pvalues = [stats.kstest(p.double().numpy(), "norm").pvalue for p in projections]
    assert min(pvalues) > 1e-3 / len(pvalues), pvalues  # Bonferroni


def test_a_biased_coupling_fails_the_same_test():
    """Power check: outputting the draft always (no reflection) is caught along the reflection axis."""
    n, d, delta = 20000, 16, 1.0
    _, b, y, _, direction, s = _couple(d, delta, n, seed=3)
    p = stats.kstest((((y - b) / s) @ direction).double().numpy(), "norm").pvalue
    assert p < 1e-6


def test_accepted_rows_are_bit_identical_to_the_draft_and_rejected_are_reflections():
    a, b, y, out, _, s = _couple(64, 1.0, 2000, seed=5)
    acc = out.accepted
    assert acc.any() and (~acc).any()
    assert torch.equal(out.sample[acc], y[acc])
    # a reflection keeps the distance to b: ||x - b|| = s ||z||
    z = (y - a) / s
    assert torch.allclose((out.sample[~acc] - b[~acc]).norm(dim=1), s * z[~acc].norm(dim=1), rtol=1e-4)


def test_equal_means_always_accept_and_log_ratio_matches_densities():
    a = torch.randn(4, 3, 5)
    z = torch.randn(4, 3, 5)
    out = reflection_coupling(a + z, z, a, a.clone(), torch.ones(4), torch.full((4,), 1e-12))
    assert out.accepted.all() and torch.equal(out.sample, a + z)
    b = a + 0.3 * torch.randn(4, 3, 5)
    s = torch.tensor([0.5, 1.0, 2.0, 0.1])
    y = a + s.view(4, 1, 1) * z
    out = reflection_coupling(y, z, a, b, s, torch.rand(4))
    log_q = -((y - b) ** 2).flatten(1).sum(1) / (2 * s**2)
    log_p = -((y - a) ** 2).flatten(1).sum(1) / (2 * s**2)
    assert torch.allclose(out.log_ratio.float(), log_q - log_p, rtol=1e-4, atol=1e-4)


def test_shape_errors_and_first_rejections():
    with pytest.raises(ValueError, match="must have one shape"):
        reflection_coupling(torch.zeros(2, 3), torch.zeros(2, 4), torch.zeros(2, 3), torch.zeros(2, 3),
                            torch.ones(2), torch.rand(2))
    with pytest.raises(ValueError, match=r"must be \(2,\)"):
        reflection_coupling(*(torch.zeros(2, 3),) * 4, torch.ones(3), torch.rand(2))
    acc = torch.tensor([[True, True, False, True], [False, True, True, True], [True, True, True, True]])
    assert first_rejections(acc, torch.tensor([4, 4, 3])).tolist() == [3, 1, 3]
