"""Shared statistics for the ar_image exactness tests (chi-square goodness of fit / homogeneity)."""

from __future__ import annotations

import torch
from scipy import stats


def chi2_fit(samples: torch.Tensor, law: torch.Tensor, min_expected: float = 5.0) -> tuple[float, int, float]:
    """Chi-square of integer ``samples`` (cell indices) against ``law``; sparse cells pooled.

    Returns ``(statistic, degrees of freedom, p-value)``.
    """
    counts = torch.bincount(samples.reshape(-1), minlength=law.numel()).double()
    expected = law.double() * samples.numel()
    big = expected >= min_expected
    obs = torch.cat([counts[big], counts[~big].sum().reshape(1)])
    exp = torch.cat([expected[big], expected[~big].sum().reshape(1)])
    keep = exp > 0
    stat = float(((obs[keep] - exp[keep]) ** 2 / exp[keep]).sum())
    dof = int(keep.sum()) - 1
    return stat, dof, float(stats.chi2.sf(stat, dof))


def chi2_two_sample(a: torch.Tensor, b: torch.Tensor, cells: int, min_count: float = 5.0) -> float:
    """p-value of a chi-square homogeneity test of two samples of cell indices in ``[0, cells)``."""
    ca = torch.bincount(a.reshape(-1), minlength=cells).double()
    cb = torch.bincount(b.reshape(-1), minlength=cells).double()
    big = (ca + cb) >= min_count
    table = torch.stack([torch.cat([ca[big], ca[~big].sum().reshape(1)]),
                         torch.cat([cb[big], cb[~big].sum().reshape(1)])])
    table = table[:, table.sum(0) > 0]
    if table.shape[1] < 2:
        return 1.0
    return float(stats.chi2_contingency(table.numpy(), correction=False)[1])


def check_cfg_forced_and_warpers(run, samples: int = 100_000) -> None:
    """A sampler on a toy table with two forced positions, CFG 2.5 and every warper: forced tokens are kept, the joint
    law is the guided, warped one (and not the unguided one), and every call evaluates both CFG branches.

    ``run(target, labels, guidance_scale, sampling, stats)`` returns the sampled tokens.
    """
    from diffspec.ar_image.targets.toy import ToyTableTarget, sequence_codes
    from diffspec.stats import SpecStats

    target = ToyTableTarget(vocab=4, grid=(2, 3), seed=1, forced={2: 3, 4: 0})
    sampling = {"temperature": 0.8, "top_k": 3, "top_p": 0.95}
    counters = SpecStats()
    tokens = run(target, [0] * samples, 2.5, sampling, counters)
    assert bool((tokens[:, 2] == 3).all()) and bool((tokens[:, 4] == 0).all())
    law = target.joint(0, guidance_scale=2.5, **sampling)
    assert chi2_fit(sequence_codes(tokens, 4), law)[2] > 1e-3
    assert counters.target_evals == 2 * counters.target_calls
    assert chi2_fit(sequence_codes(tokens, 4), target.joint(0, guidance_scale=1.0))[2] < 1e-8


def toy_greedy_case() -> tuple:
    """``(target, labels, reference)``: a toy table with a forced position and CFG 1.7, and its plain greedy tokens."""
    from diffspec.ar_image.plain import plain_sample
    from diffspec.ar_image.targets.toy import ToyTableTarget

    target = ToyTableTarget(vocab=5, grid=(4, 6), seed=2, scale=1.0, forced={7: 1})
    labels = [0, 1, 1, 0, 1, 0, 0, 1]
    ref = plain_sample(target.start(class_labels=labels, guidance_scale=1.7), target.num_tokens,
                       {"temperature": 0.0}, torch.Generator().manual_seed(0))
    return target, labels, ref


def worst_draft_z(rounds: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]], min_rows: int = 1000) -> float:
    """Largest ``|z|`` of ``mean(one_hot(draft) - q)`` per window slot and token over rows, for rounds
    ``(q (B, L, V), draft (B, L), valid (B, L))``: about N(0, 1) when every draft was drawn from the ``q`` recorded
    for it. Slots with fewer than ``min_rows`` valid rows are skipped; pass the rounds after the first (inits)."""
    worst = 0.0
    for q, draft, valid in rounds:
        diff = torch.nn.functional.one_hot(draft, q.shape[-1]).double() - q.double()
        v = valid.double().unsqueeze(-1)  # slots past the image end repeat its last token
        count = v.sum(0).clamp_min(2)
        mean = (diff * v).sum(0) / count
        se = (((diff - mean) ** 2 * v).sum(0) / (count - 1)).sqrt() / count.sqrt()
        z = (mean / se.clamp_min(1e-12))[v.sum(0).squeeze(-1) >= min_rows]
        worst = max([worst, *z.abs().flatten().tolist()])
    return worst


def toy_conditionals(target, labels: list[int], tokens: torch.Tensor, guidance_scale: float = 1.0) -> torch.Tensor:
    """``(B, N, V)`` the toy's law of each position given the row's own tokens before it, read off its tables."""
    n, v = tokens.shape[1], target.codebook_size
    padded = torch.cat([torch.full((tokens.shape[0], 2), v), tokens], 1)
    lab = torch.as_tensor(labels).unsqueeze(1).expand(-1, n)
    return target.mixed_logits(lab, padded[:, :n], padded[:, 1:n + 1], guidance_scale).double().softmax(-1)


def committed_law_z(p: torch.Tensor, tokens: torch.Tensor, rounds: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]],
                    law) -> float:
    """Largest ``|z|`` over positions and tokens of ``sum over rows of (one_hot(token) - expected law)``.

    ``p`` ``(B, N, V)``: the true conditionals along the sampled ``tokens`` (:func:`toy_conditionals`); ``rounds``:
    ``(q (B, L, V), commit (B,), new_commit (B,))`` of every round, ``q`` the laws of the window drafts the round
    tested. A token committed at window offset ``o < L`` should follow ``law(p, q[o])`` (the test's emitted law,
    whatever path committed it: the chain, a residual draw, a walk after a sibling); any other (the first token, a
    bonus draw, a draw past the window) ``p``. Each expectation is fixed before its token is drawn, so the sums are
    martingales: ``z`` is about N(0, 1) for a correct sampler, whatever its drafts were.
    """
    batch, n, vocab = p.shape
    expected = p.clone()
    covered = torch.zeros(batch, n, dtype=torch.long)
    cols = torch.arange(n)
    for q, commit, new_commit in rounds:
        length = q.shape[1]
        off = cols - commit.unsqueeze(1)
        mine = (off >= 0) & (cols < new_commit.unsqueeze(1))
        covered += mine.long()
        tested = mine & (off < length)
        q_at = q.double().gather(1, off.clamp(0, length - 1).unsqueeze(-1).expand(-1, -1, vocab))
        expected = torch.where(tested.unsqueeze(-1), law(p, q_at), expected)
    assert bool((covered[:, 1:] == 1).all()), "every position after the first is committed by exactly one round"
    diff = torch.nn.functional.one_hot(tokens, vocab).double() - expected
    var = (expected * (1 - expected)).sum(0)
    z = diff.sum(0) / var.clamp_min(1e-12).sqrt()
    return float(z[var > 25].abs().max())


# Planted biases: each reproduces a known bookkeeping mistake inside a sampler, for the exactness tests to catch.

def plant_kept_old_q(monkeypatch, rule=None):
    """The official MC scheduler's bookkeeping in the Jacobi loop: a draft the maximal coupling kept keeps its OLD
    ``q`` (the law recorded for it is no longer the one it follows). Patches the window shift and returns the
    acceptance rule to pass to ``jacobi_sample``: ``rule`` (default: exact MRS), remembering each round's test."""
    from diffspec.ar_image import jacobi as jacobi_module
    from diffspec.speculation.sampling import mrs

    test, last = mrs if rule is None else rule, {}

    def acceptance(p, q, draft, generator):
        res = test(p, q, draft, generator)
        last.update(q=q, accepted=res.accepted)
        return res

    shift = jacobi_module.shift_window

    def kept_old_q(session, tokens, commit, new_commit, commit_vals, redraft, q_redraft, init, generator):
        q_redraft = torch.where(last["accepted"].unsqueeze(-1), last["q"], q_redraft)
        return shift(session, tokens, commit, new_commit, commit_vals, redraft, q_redraft, init, generator)

    monkeypatch.setattr(jacobi_module, "shift_window", kept_old_q)
    return acceptance


def plant_stale_rows(monkeypatch):
    """``mc-sjd-ra``: the tokens after a picked sibling are drawn from the chain's rows (conditioned on the rejected
    draft) instead of the sibling's group's: its walk reads rows from the sibling's offset ``j`` on."""
    from diffspec.ar_image import residual as residual_module

    follow = residual_module.follow_sibling
    monkeypatch.setattr(residual_module, "follow_sibling",
                        lambda p, q, draft, base, j, *args: follow(p, q, draft, j, j, *args))


def plant_no_residual(monkeypatch):
    """``sjd-pac``: every sibling is tested against the same ``p`` (no residual update after a rejected sibling)."""
    from diffspec.ar_image import pac as pac_module

    monkeypatch.setattr(pac_module, "residual_law", lambda p, q: p)
