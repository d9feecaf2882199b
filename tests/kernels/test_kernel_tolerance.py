"""Relaxed tolerance kernels (action bins, codec beta) vs their torch references, and the rules themselves."""

import pytest
import torch

from diffspec.kernels import beta_tolerance, bin_tolerance

pytest.importorskip("triton")


def _scores(n, length, vocab, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, length, vocab, generator=g) * 2
    x[0, 0, :] = float("-inf")  # an all-removed row: argmax 0, as torch
    x[0, 0, 3] = 1.0
    x[1 % n, -1, vocab - 2] = x[1 % n, -1, vocab - 1] = 50.0  # a tie at the vocab edge: first index wins
    if vocab > 4096:
        x[-1, 0, 4095] = x[-1, 0, 4096] = 60.0  # a tie across the block edge
    return x.to(dtype), g


@pytest.mark.parametrize("case", [(5, 7, 300, torch.float32, False, 3), (3, 4, 4099, torch.bfloat16, True, 9),
                                  (2, 3, 513, torch.float16, True, 0)])
def test_bin_tolerance_matches_reference(case):
    n, length, vocab, dtype, reverse, r = case
    x, g = _scores(n, length, vocab, dtype, seed=vocab)
    first_id, n_bins = vocab - 256, 256
    t_ref = x.float().argmax(-1)
    shift = torch.randint(-2 * r - 2, 2 * r + 3, (n, length), generator=g)
    drafts = (t_ref + shift).clamp(0, vocab - 1)
    drafts[0, -1] = first_id - 1  # a non-action draft next to the action range
    always = torch.rand(n, length, generator=g) < 0.2
    ref = bin_tolerance(x, drafts, first_id=first_id, n_bins=n_bins, reverse=reverse, tolerance=r, always=always,
                        backend="torch")
    out = bin_tolerance(x, drafts, first_id=first_id, n_bins=n_bins, reverse=reverse, tolerance=r, always=always,
                        backend="triton")
    assert all(torch.equal(a, b) for a, b in zip(out, ref))
    assert torch.equal(ref[0], t_ref) and ref[1].any() and not ref[1].all()
    # the rule itself: action pairs pass iff within r bins, else iff equal
    act = lambda ids: (ids >= first_id) & (ids < vocab)  # noqa: E731
    both = act(drafts) & act(t_ref)
    assert torch.equal(ref[1], torch.where(both, (drafts - t_ref).abs() <= r, drafts == t_ref))
    passed = (ref[1] | always).long()
    assert torch.equal(ref[2], passed.cumprod(1).sum(1))


@pytest.mark.parametrize("case", [(6, 5, 2, 301, torch.float32, 0.5), (4, 3, 3, 4097, torch.float16, 0.2),
                                  (3, 4, 0, 129, torch.bfloat16, 1.0)])
def test_beta_tolerance_matches_reference(case):
    n, length, d, vocab, dtype, beta = case
    x, g = _scores(n, length, vocab, dtype, seed=vocab + d)
    probs = x.float().softmax(-1)
    drafts = torch.multinomial(probs[:, :max(d, 1)].reshape(-1, vocab), 1, generator=g).view(n, -1)[:, :d]
    relaxed = torch.arange(n) % 3 != 0
    ref = beta_tolerance(x, drafts, beta=beta, relaxed=relaxed, backend="torch")
    out = beta_tolerance(x, drafts, beta=beta, relaxed=relaxed, backend="triton")
    assert torch.equal(out[0], ref[0]) and torch.equal(out[1], ref[1])
    assert torch.equal(ref[0], x.float().argmax(-1)) and ref[1].shape == (n, d)
    if d and beta < 1:  # the rule: p(d) >= beta * max p on relaxed rows (up to rounding), d == t elsewhere
        pd = probs[:, :d].gather(-1, drafts[..., None])[..., 0]
        rule = (drafts == ref[0][:, :d]) | (relaxed[:, None] & (pd >= beta * probs[:, :d].amax(-1)))
        assert torch.equal(ref[1], rule) and ref[1].any() and not ref[1].all()


def test_errors():
    x, d = torch.zeros(1, 2, 8), torch.zeros(1, 2, dtype=torch.long)
    with pytest.raises(ValueError, match="tolerance=-1"):
        bin_tolerance(x, d, first_id=4, n_bins=4, reverse=False, tolerance=-1)
    with pytest.raises(ValueError, match=r"\(B, L, V\)"):
        bin_tolerance(x[0], d, first_id=4, n_bins=4, reverse=False, tolerance=1)
    with pytest.raises(ValueError, match="beta=0.0"):
        beta_tolerance(x, d, beta=0.0, relaxed=torch.ones(1, dtype=torch.bool))
    with pytest.raises(ValueError, match="D <= L"):
        beta_tolerance(x, torch.zeros(1, 3, dtype=torch.long), beta=0.5, relaxed=torch.ones(1, dtype=torch.bool))
