import sys
from pathlib import Path

import pytest
import torch

from diffspec.speculation.sampling import (
    GumbelTable,
    force,
    gumbel,
    gumbel_argmax,
    mrs,
    sample,
    uniform,
    warp,
)

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "ar_image"))
from ar_checks import chi2_fit  # noqa: E402  (shared test statistics)

M = 200_000


def gen(seed=0):
    return torch.Generator().manual_seed(seed)


def test_warp_temperature_topk_topp():
    logits = torch.tensor([[1.0, 3.0, 2.0, 0.0]])
    assert warp(logits, temperature=0).tolist() == [[0.0, 1.0, 0.0, 0.0]]
    full = torch.softmax(logits / 0.5, -1)
    assert torch.allclose(warp(logits, temperature=0.5), full)
    top2 = warp(logits, top_k=2)
    assert torch.allclose(top2, torch.softmax(torch.tensor([[-1e9, 3.0, 2.0, -1e9]]), -1))
    p = torch.softmax(logits, -1)[0]  # ~[0.09, 0.64, 0.24, 0.03]
    nucleus = warp(logits, top_p=0.8)[0]  # 0.64 < 0.8 -> needs the 0.24 token too, then stops
    assert (nucleus > 0).tolist() == [False, True, True, False]
    assert torch.allclose(nucleus[1:3], p[1:3] / p[1:3].sum())
    assert (warp(logits, top_p=0.5)[0] > 0).tolist() == [False, True, False, False]  # top-1 always kept


def test_sample_law_and_zero_probability_tokens():
    p = torch.tensor([0.0, 0.5, 0.0, 0.3, 0.2])
    draws = sample(p.expand(M, -1), gen())
    assert not bool(((draws == 0) | (draws == 2)).any())
    assert chi2_fit(draws, p)[2] > 1e-3


@pytest.mark.parametrize("case", ["random", "disjoint", "onehot", "equal"])
def test_mrs_marginal_is_p_for_any_q(case):
    g = gen(1)
    v = 6
    p = torch.softmax(torch.randn(v, generator=g) * 1.5, -1)
    q = {"random": torch.softmax(torch.randn(v, generator=g) * 1.5, -1),
         "disjoint": torch.tensor([0.0, 0, 0, 0, 0.5, 0.5]),
         "onehot": torch.tensor([0.0, 0, 1, 0, 0, 0]),
         "equal": p}[case]
    if case == "disjoint":
        p = torch.tensor([0.4, 0.3, 0.2, 0.1, 0.0, 0.0])
    draft = sample(q.expand(M, -1), g)
    res = mrs(p.expand(M, -1), q.expand(M, -1), draft, g)
    assert chi2_fit(res.tokens, p)[2] > 1e-3
    tv = 0.5 * float((p - q).abs().sum())
    same = float((res.tokens == draft).double().mean())
    assert abs(same - (1 - tv)) < 5 * (0.25 / M) ** 0.5  # maximal coupling: P(same) = 1 - TV
    assert torch.equal(res.tokens[res.accepted], draft[res.accepted])


def test_mrs_catches_a_rewarped_residual():
    # sampling the residual through the temperature warper again (the official code's habit) is biased
    g = gen(2)
    p = torch.tensor([0.5, 0.3, 0.2])
    q = torch.tensor([0.2, 0.1, 0.7])
    draft = sample(q.expand(M, -1), g)
    res = mrs(p.expand(M, -1), q.expand(M, -1), draft, g)
    resid = (p - q).clamp(min=0)
    rewarped = warp(resid.clamp(min=1e-30).log(), temperature=0.5)
    bad = torch.where(res.accepted, draft, sample(rewarped.expand(M, -1), g))
    assert chi2_fit(res.tokens, p)[2] > 1e-3
    assert chi2_fit(bad, p)[2] < 1e-6


def test_gumbel_argmax_law_and_collision_bound():
    g = gen(3)
    p = torch.softmax(torch.randn(5, generator=g), -1)
    p2 = torch.softmax(torch.log(p) + 0.3 * torch.randn(5, generator=g), -1)
    noise = gumbel(uniform((M, 5), g))
    a, b = gumbel_argmax(p.expand(M, -1), noise), gumbel_argmax(p2.expand(M, -1), noise)
    assert chi2_fit(a, p)[2] > 1e-3 and chi2_fit(b, p2)[2] > 1e-3
    tv = 0.5 * float((p - p2).abs().sum())
    same = float((a == b).double().mean())
    assert (1 - tv) / (1 + tv) - 0.01 <= same <= 1 - tv + 0.01


def test_gumbel_table_fixed_in_flight_fresh_after_commit():
    table = GumbelTable(batch=2, slots=4, vocab=3, generator=gen(4))
    pos = torch.tensor([[2, 3, 4, 5], [0, 1, 2, 3]])
    before = table.noise(pos)
    table.advance(torch.tensor([2, 0]), torch.tensor([4, 0]))  # row 0 commits 2 and 3, row 1 nothing
    after = table.noise(pos)
    assert torch.equal(after[1], before[1])
    assert torch.equal(after[0, 2:], before[0, 2:])  # positions 4, 5 still in flight
    assert not torch.isclose(after[0, :2], before[0, :2]).any()  # slots now serve positions 6, 7


def test_per_row_generators_are_independent_of_the_batch():
    p = torch.softmax(torch.randn(3, 7, generator=gen(5)), -1)
    both = sample(p[:2].unsqueeze(1).expand(-1, 50, -1), [gen(10), gen(11)])
    alone = sample(p[1:2].unsqueeze(1).expand(-1, 50, -1), [gen(11)])
    assert torch.equal(both[1], alone[0])
    with pytest.raises(ValueError, match="2 generators for a batch of 3"):
        uniform((3, 4), [gen(), gen()])


def test_force_is_one_hot():
    probs = force(torch.full((2, 2, 4), 0.25), torch.tensor([[-1, 3], [0, -1]]))
    assert probs[0, 1].tolist() == [0, 0, 0, 1] and probs[1, 0].tolist() == [1, 0, 0, 0]
    assert probs[0, 0].tolist() == [0.25] * 4
