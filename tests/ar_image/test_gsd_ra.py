"""``gsd`` with residual alternatives (``clusters`` + ``width``): the cluster test inside ``mc-sjd-ra``'s loop."""

import pytest
import torch
from ar_checks import committed_law_z, plant_stale_rows, toy_conditionals, worst_draft_z
from ar_stepping import tiny_llamagen_target

from diffspec import SpeculativePipeline
from diffspec.ar_image import residual as residual_module
from diffspec.ar_image.cluster import ClusterAcceptance
from diffspec.ar_image.config import GSDConfig, MCSJDRAConfig, tokens_fed_per_call
from diffspec.ar_image.jacobi import jacobi_sample
from diffspec.ar_image.plain import plain_sample
from diffspec.ar_image.residual import residual_sample
from diffspec.ar_image.targets.toy import ToyTableTarget
from diffspec.stats import SpecStats

FREE = {"temperature": 1.0}


def gen(seed=0):
    return torch.Generator().manual_seed(seed)


def ra(target, labels, rule=None, window=16, width=3, depth=4, follow=2, seed=0, stats=None):
    session = target.start(class_labels=labels, guidance_scale=1.0)
    return residual_sample(session, target.num_tokens, window, width, depth, follow, "uniform", FREE, gen(seed), stats,
                           acceptance=rule)


def test_one_token_clusters_are_mc_sjd_ra():
    """K = codebook size is the exact test: the same tokens as the exact sampler on the same seed, no TV spent."""
    target = ToyTableTarget(vocab=5, grid=(3, 4), seed=1)
    stats = SpecStats()
    ref = ra(target, [0, 1] * 300)
    got = ra(target, [0, 1] * 300, ClusterAcceptance(torch.arange(5)), stats=stats)
    assert torch.equal(ref, got)
    assert stats.extra["relaxed_tv"] < 1e-6


def test_clusters_commit_more_tokens_per_call_than_either_parent():
    """Residual alternatives add to the cluster test's gain: more tokens per call than exact mc-sjd-ra and than the
    cluster test in the plain Jacobi loop, with the TV it spends reported."""
    target = ToyTableTarget(vocab=6, grid=(4, 8), seed=0, scale=1.0)
    rule = ClusterAcceptance(torch.arange(6) % 2)
    exact, relaxed, jacobi = SpecStats(), SpecStats(), SpecStats()
    ra(target, [0] * 512, stats=exact)
    ra(target, [0] * 512, rule, stats=relaxed)
    jacobi_sample(target.start(class_labels=[0] * 512), target.num_tokens, 16, "maximal", "uniform", FREE, gen(),
                  jacobi, acceptance=rule)
    assert relaxed.extra["tokens_per_call"] > exact.extra["tokens_per_call"] + 0.1
    assert relaxed.extra["tokens_per_call"] > jacobi.extra["tokens_per_call"] + 0.1
    assert relaxed.extra["residual_hits"] > 0 and 0.01 < relaxed.extra["relaxed_tv"] < 0.5
    assert "relaxed_tv" not in exact.extra


def record_rounds(monkeypatch, relaxed_redraft=False):
    """Spy on the sampler: each round's chain ``(q, draft, valid)``; ``relaxed_redraft`` plants the bug of
    re-drafting the window by the relaxed rule's own outputs while recording ``q = p``."""
    rounds, verify, drafts = [], residual_module.verify, residual_module.window_drafts

    def spy_drafts(tokens, commit, length):
        pos, valid, draft = drafts(tokens, commit, length)
        rounds.append([draft.clone(), valid.clone()])
        return pos, valid, draft

    def spy_verify(p, law, q, draft, generator):
        res, exact, tv = verify(p, law, q, draft, generator)
        if draft.shape == rounds[-1][0].shape and len(rounds[-1]) == 2:  # the chain's test (not a sibling's walk)
            rounds[-1].insert(0, q.clone())
            return res, res if relaxed_redraft else exact, tv
        return res, exact, tv

    monkeypatch.setattr(residual_module, "window_drafts", spy_drafts)
    monkeypatch.setattr(residual_module, "verify", spy_verify)
    return rounds


@pytest.mark.parametrize("planted", [False, True], ids=["sampler", "planted-relaxed-redraft"])
def test_every_draft_follows_its_recorded_q(planted, monkeypatch):
    """The bookkeeping under the relaxed rule: every chain draft was drawn from the q recorded for it (|z| < 5 over
    5e4 toy sequences); re-drafting from the rule's own outputs (which do not follow p) fails it."""
    rounds = record_rounds(monkeypatch, relaxed_redraft=planted)
    target = ToyTableTarget(seed=0)
    ra(target, [1] * 50_000, ClusterAcceptance(torch.arange(3) % 2), window=8, width=1, depth=2, follow=1)
    assert len(rounds) >= 3 and all(len(r) == 3 for r in rounds)
    worst = worst_draft_z([tuple(r) for r in rounds[1:]])  # the first round's drafts are inits
    assert (worst > 8.0) if planted else (0.0 < worst < 5.0)


def record_tests(monkeypatch):
    """Spy on the sampler: each round's chain ``q`` (the first test after a window move) and its commit points."""
    rounds, verify, shift = [], residual_module.verify, residual_module.shift_window

    def spy_verify(p, law, q, draft, generator):
        if not rounds or len(rounds[-1]) == 3:
            rounds.append([q.clone()])
        return verify(p, law, q, draft, generator)

    def spy_shift(session, tokens, commit, new_commit, *args):
        rounds[-1] += [commit.clone(), new_commit.clone()]
        return shift(session, tokens, commit, new_commit, *args)

    monkeypatch.setattr(residual_module, "verify", spy_verify)
    monkeypatch.setattr(residual_module, "shift_window", spy_shift)
    return rounds


@pytest.mark.parametrize("case", ["relaxed", "exact-sampler", "planted-stale-rows", "planted-exact-walk"])
def test_every_committed_token_follows_the_rules_law(case, monkeypatch):
    """End to end: each committed token follows the cluster rule's emitted law for the true conditional given the
    row's own prefix and the q its draft was tested with (p past the window), whether the chain, a residual draw or
    the walk after a sibling committed it (|z| < 5 over 3e4 toy sequences); without a rule (exact ``mc-sjd-ra``),
    the true conditional itself. Planted: the walk reading the chain's (stale) rows, or testing against p instead
    of the rule's law, fail it."""
    rounds = record_tests(monkeypatch)
    target, labels = ToyTableTarget(vocab=6, grid=(3, 5), seed=3, scale=1.0), [0, 1] * 15_000
    rule = None if case == "exact-sampler" else ClusterAcceptance(torch.arange(6) % 2)
    if case == "planted-exact-walk":  # the walk tests 1 + follow = 3 drafts, the chain 8
        law = residual_module.emitted_law
        monkeypatch.setattr(residual_module, "emitted_law", lambda r, p, q: p.clone() if q.shape[1] == 3 else law(r, p, q))
    if case == "planted-stale-rows":
        plant_stale_rows(monkeypatch)
    stats = SpecStats()
    session = target.start(class_labels=labels)
    out = residual_sample(session, target.num_tokens, 8, 2, 4, 2, "uniform", FREE, gen(5), stats, acceptance=rule)
    assert stats.extra["residual_hits"] > 3000 and len(rounds) >= 3
    law = (lambda p, q: p) if rule is None else rule.emitted_law
    worst = committed_law_z(toy_conditionals(target, labels, out), out, [tuple(r) for r in rounds], law)
    assert (worst > 6.0) if case.startswith("planted") else (worst < 5.0)


def test_point_mass_drafts_keep_greedy_identical_to_plain_on_llamagen():
    """Greedy rows with repeat inits: every draft's q is one-hot, so the cluster rule takes the exact test and the
    output is plain greedy decoding, through the real KV cache (trees, sibling commits, CFG)."""
    target = tiny_llamagen_target(0)
    labels, greedy = [0, 3, 1, 4], {"temperature": 0.0}
    ref = plain_sample(target.start(class_labels=labels, guidance_scale=2.0), 16, greedy, gen())
    rule = ClusterAcceptance.fit(target.token_embeddings(), 8)
    for window, width, depth, follow in ((4, 4, 3, 2), (40, 3, 2, 5)):
        session = target.start(class_labels=labels, guidance_scale=2.0)
        out = residual_sample(session, 16, window, width, depth, follow, "repeat", greedy, gen(1), acceptance=rule)
        assert torch.equal(out, ref)


def test_pipeline_runs_the_relaxed_loop_and_reports_it():
    target = tiny_llamagen_target(1)
    spec = SpeculativePipeline.from_pipe(target, method="gsd", clusters=8, width=4, window=6, follow=2)
    spec.set_progress_bar_config(disable=True)
    out = spec(class_labels=[0, 3] * 8, guidance_scale=2.0, generator=gen(2), output_type="tokens")
    assert out.tokens.shape == (16, 16)
    assert spec.stats.extra["residual_hits"] > 0 and spec.stats.extra["relaxed_tv"] > 0
    assert spec.stats.extra["tree_nodes"] == 6 + 5 * 4 * 3


def test_tokens_fed_per_call_matches_mc_sjd_ra():
    for n in (64, 256):
        ra_config = GSDConfig(clusters=26, width=4, depth=8)
        assert tokens_fed_per_call(ra_config, n) == tokens_fed_per_call(MCSJDRAConfig(), n)
    assert tokens_fed_per_call(GSDConfig(clusters=26, width=4), 256) == 1 + 64 + 16 * 4 * 4
    assert tokens_fed_per_call(GSDConfig(clusters=26), 256) == 65


@pytest.mark.parametrize("kw, named", [
    ({"width": 4}, "clusters"),
    ({"width": 4, "clusters": 8, "cluster_rule": "lumped"}, "cluster_rule='lumped'"),
    ({"width": 4, "clusters": 8, "coupling": "gumbel"}, "coupling='gumbel'"),
    ({"width": 65, "clusters": 8}, r"width.*\[0, 64\]"),
    ({"width": 4, "clusters": 8, "follow": -1}, r"follow.*\[0, 64\]"),
    ({"width": 4, "clusters": 8, "depth": 0}, r"depth.*\[1, 4096\]"),
])
def test_bad_settings_are_named(kw, named):
    with pytest.raises(ValueError, match=named):
        GSDConfig(**kw)


def test_lumped_rule_has_no_emitted_law_to_test_against():
    with pytest.raises(ValueError, match="lumped"):
        ClusterAcceptance(torch.arange(4) % 2, "lumped").emitted_law(torch.full((1, 4), 0.25), torch.full((1, 4), 0.25))


def test_residual_of_a_rejected_draft_never_lies_in_its_cluster():
    """Why siblings skip the draft's cluster: under the min-tv law a draft can be rejected only where the law lies
    under q, and then the residual (law - q)_+ has no mass anywhere in that draft's cluster (one-hot q excepted)."""
    g = gen(4)
    vocab, k = 12, 4
    p = (torch.randn(2000, vocab, generator=g) * 2).softmax(-1)
    q = (torch.randn(2000, vocab, generator=g) * 2).softmax(-1)
    rule = ClusterAcceptance(torch.arange(vocab) % k)
    law = rule.emitted_law(p, q)
    residual = (law - q).clamp_min(0)
    rejectable = law < q - 1e-6  # (rows, V): tokens a draft at which can be rejected
    per_cluster = torch.zeros(2000, k).index_add_(1, rule.assignment, residual)  # residual mass of each cluster
    mass_in_own = per_cluster.gather(1, rule.assignment.expand(2000, -1))  # of each token's own cluster
    assert rejectable.sum() > 1000 and float(mass_in_own[rejectable].max()) < 1e-6
    assert float(residual.sum(-1).min()) >= 0 and float((residual.sum(-1) > 1e-3).float().mean()) > 0.5
    unreach = residual_module.unreachable(rule, q[:3], torch.tensor([0, 1, 5]))
    assert unreach.tolist() == [[t % k == d % k for t in range(vocab)] for d in (0, 1, 5)]
    onehot = torch.zeros(1, vocab).index_fill_(1, torch.tensor([2]), 1.0)
    assert residual_module.unreachable(rule, onehot, torch.tensor([2])).nonzero()[:, 1].tolist() == [2]
