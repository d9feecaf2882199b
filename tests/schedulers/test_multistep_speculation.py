"""`coupling` and `autospec` on SDE-DPM-Solver++ 2M (a kernel with a history) keep the plain sampler's law.

A small nonlinear epsilon model on 8-dimensional states; two-sample tests (energy distance with a
permutation test, per-coordinate KS with Bonferroni) of final samples against the plain sampler on
independent seeds. A planted bug (the committed history not updated after a round, so later steps
use a stale previous output) must fail the same test, for both samplers.
"""

import pytest
import torch
from diffusers import DPMSolverMultistepScheduler

from diffspec import AutospecConfig, CouplingConfig
from diffspec.bench.twosample import same_law
from diffspec.schedulers.autospec import AutospecSampler
from diffspec.schedulers.gaussian import GaussianTransition
from diffspec.schedulers.speculative import SpeculativeSampler, chain_history, plain_sample
from diffspec.stats import SpecStats

STEPS, DIM = 20, 8
WEIGHT = torch.randn(DIM, DIM, generator=torch.Generator().manual_seed(0)) / DIM**0.5


def kernel(order=2):
    return GaussianTransition(DPMSolverMultistepScheduler(algorithm_type="sde-dpmsolver++", solver_order=order), STEPS)


SIGMA = -kernel().k_out  # sigma_t at each step (epsilon prediction: x0 = (x - sigma_t eps) / alpha_t)


def denoise(x, steps, traj):
    """A fixed nonlinear epsilon model: the N(0, I)-data posterior ``sigma_t x`` plus a state-dependent bend."""
    s = SIGMA[steps].view(-1, 1)
    return s * x + 0.5 * s * torch.tanh(x @ WEIGHT)


def samples(sampler, n, seed):
    return sampler.sample(torch.randn(n, DIM, generator=torch.Generator().manual_seed(seed)),
                          torch.Generator().manual_seed(seed + 1))


def plain(n, order=2):
    k = kernel(order)
    return plain_sample(k, denoise, torch.randn(n, DIM, generator=torch.Generator().manual_seed(1)),
                        torch.Generator().manual_seed(2))


@pytest.fixture(scope="module")
def reference():
    return plain(300)


def _stale(hist, new, committed):
    """Planted bug: the committed history is never updated after a round (a stale multistep term)."""
    return hist


class StaleCoupling(SpeculativeSampler):
    _committed_history = staticmethod(_stale)


class StaleAutospec(AutospecSampler):
    _committed_history = staticmethod(_stale)


@pytest.mark.parametrize("make", [
    lambda s: SpeculativeSampler(kernel(), denoise, CouplingConfig(lookahead=4), s),
    lambda s: AutospecSampler(kernel(), denoise, AutospecConfig(lookahead=4), s),
    lambda s: SpeculativeSampler(kernel(3), denoise, CouplingConfig(lookahead=4), s),
], ids=["coupling-2M", "autospec-2M", "coupling-3M"])
def test_speculative_multistep_samples_have_the_plain_law(reference, make):
    stats = SpecStats()
    sampler = make(stats)
    out = samples(sampler, 300, seed=10)
    assert 0.1 < stats.acceptance_rate < 0.98, stats.acceptance_rate  # accepts and reflections both happened
    assert stats.target_calls < STEPS
    ref = reference if sampler.kernel.history == 1 else plain(300, order=3)
    report = same_law(ref, out)
    assert report["passed"], report


@pytest.mark.parametrize("cls,config", [(StaleCoupling, CouplingConfig), (StaleAutospec, AutospecConfig)])
def test_a_stale_history_fails_the_same_test(reference, cls, config):
    out = samples(cls(kernel(), denoise, config(lookahead=4), SpecStats()), 300, seed=10)
    report = same_law(reference, out)
    assert not report["passed"], report


def test_chain_history_gathers_the_outputs_before_each_depth_latest_first():
    hist = torch.tensor([[[-1.0], [-2.0]]])  # committed: step n-1 -> -1, step n-2 -> -2
    new = torch.tensor([[[10.0], [11.0], [12.0]]])  # drafted / verified depths 0, 1, 2
    got = chain_history(hist, new, torch.zeros(4, dtype=torch.long), torch.arange(4)).squeeze(-1)
    assert got.tolist() == [[-1.0, -2.0], [10.0, -1.0], [11.0, 10.0], [12.0, 11.0]]


@pytest.mark.slow
@pytest.mark.parametrize("cls,config", [(SpeculativeSampler, CouplingConfig), (AutospecSampler, AutospecConfig)])
def test_speculative_multistep_samples_have_the_plain_law_at_3000(cls, config):
    stats = SpecStats()
    out = samples(cls(kernel(), denoise, config(lookahead=4), stats), 3000, seed=20)
    report = same_law(plain(3000), out)
    assert report["passed"], report
