"""ClusterAcceptance (``gsd`` with ``clusters=K``): cluster law exact, closed-form token law, pipeline wiring."""

from __future__ import annotations

import pytest
import torch
from ar_checks import chi2_fit

from diffspec import SpeculativePipeline
from diffspec.ar_image.cluster import ClusterAcceptance, min_tv_law
from diffspec.ar_image.config import GSDConfig
from diffspec.ar_image.jacobi import jacobi_sample
from diffspec.ar_image.targets.toy import ToyTableTarget, sequence_codes
from diffspec.speculation.sampling import MRSResult, acceptance_prob, mrs
from diffspec.stats import SpecStats

P = torch.tensor([0.30, 0.25, 0.20, 0.12, 0.08, 0.05])
Q = torch.tensor([0.05, 0.10, 0.15, 0.20, 0.25, 0.25])
CLUSTERS = torch.tensor([0, 0, 1, 1, 2, 2])


def gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def drafts(m: int = 200_000):
    draft = torch.multinomial(Q, m, replacement=True, generator=gen(1))
    return P.expand(m, 6), Q.expand(m, 6), draft


def closed_form(p, q, ids):
    """The emitted law o(y) = q(y) min(1, P/Q) + p(y) (1 - Q/P)_+ by a loop over tokens."""
    out = torch.zeros_like(p)
    for y in range(len(p)):
        big_p, big_q = float(p[ids == ids[y]].sum()), float(q[ids == ids[y]].sum())
        out[y] = q[y] * min(1.0, big_p / big_q) + p[y] * max(0.0, 1 - big_q / big_p)
    return out


def test_cluster_law_is_exact_and_token_law_matches_the_closed_form():
    """2e5 drafts x ~ q at one position: the emitted tokens' clusters follow P (chi-square), the tokens
    follow the closed form, whose TV from p is the reported relaxation; it accepts more than exact MRS."""
    pp, qq, draft = drafts()
    res = ClusterAcceptance(CLUSTERS, rule="lumped")(pp, qq, draft, gen(2))
    law = closed_form(P, Q, CLUSTERS)
    assert abs(float(law.sum()) - 1) < 1e-6
    assert chi2_fit(CLUSTERS[res.tokens], torch.zeros(3).index_add_(0, CLUSTERS, P))[2] > 1e-3
    assert chi2_fit(res.tokens, law)[2] > 1e-3
    assert chi2_fit(res.tokens, P)[2] < 1e-8  # the token law itself is relaxed
    tv = 0.5 * float((law - P).abs().sum())
    assert tv > 0.05 and torch.allclose(res.relaxation, torch.full_like(res.relaxation, tv), atol=1e-6)
    exact = mrs(pp, qq, draft, gen(2))
    assert res.accepted.float().mean() > exact.accepted.float().mean() + 0.05


def test_planted_bias_fails_the_cluster_law():
    """The same test with the token residual (p - q)_+ (the group rule's) drifts the cluster law."""
    pp, qq, draft = drafts()
    ids = CLUSTERS
    big_p = torch.zeros(3).index_add_(0, ids, P)
    big_q = torch.zeros(3).index_add_(0, ids, Q)
    masses = (big_p[ids[draft]], big_q[ids[draft]])
    biased = mrs(pp, qq, draft, gen(2), accept_mass=masses)
    assert chi2_fit(ids[biased.tokens], big_p)[2] < 1e-8


@pytest.mark.parametrize("rule", ["lumped", "min-tv"])
def test_singleton_clusters_are_the_exact_test(rule):
    pp, qq, draft = drafts(50_000)
    res = ClusterAcceptance(torch.arange(6), rule=rule)(pp, qq, draft, gen(2))
    exact = mrs(pp, qq, draft, gen(2))
    assert torch.equal(res.accepted, exact.accepted)
    assert float((res.tokens == exact.tokens).float().mean()) > 0.999  # residual rounding only
    assert float(res.relaxation.max()) < 1e-6


def test_vectorised_over_rows_and_positions():
    """Random (3, 5, 12) rows with 4 clusters: acceptance masses and relaxation match a per-row loop."""
    g = gen(0)
    p = (torch.randn(3, 5, 12, generator=g) * 2).softmax(-1)
    q = (torch.randn(3, 5, 12, generator=g) * 2).softmax(-1)
    draft = torch.multinomial(q.reshape(-1, 12), 1, generator=g).reshape(3, 5)
    ids = torch.arange(12) % 4
    res = ClusterAcceptance(ids, rule="lumped")(p, q, draft, gen(1))
    assert isinstance(res, MRSResult) and res.tokens.shape == draft.shape
    u = torch.rand((3, 5, 2), generator=gen(1))
    for b in range(3):
        for j in range(5):
            x = int(draft[b, j])
            a = acceptance_prob(p[b, j][ids == ids[x]].sum(), q[b, j][ids == ids[x]].sum())
            assert bool(res.accepted[b, j]) == bool(u[b, j, 0] < a)
            law = closed_form(p[b, j], q[b, j], ids)
            assert abs(float(res.relaxation[b, j]) - 0.5 * float((law - p[b, j]).abs().sum())) < 1e-5


def random_laws(shape=(4, 7), vocab=12, seed=0):
    g = gen(seed)
    p = (torch.randn(*shape, vocab, generator=g, dtype=torch.float64) * 2).softmax(-1)
    q = (torch.randn(*shape, vocab, generator=g, dtype=torch.float64) * 2).softmax(-1)
    return p, q


@pytest.mark.parametrize("clusters", [1, 3, 4, 12])
def test_min_tv_law_keeps_the_cluster_law_and_acceptance_and_meets_the_tv_bound(clusters):
    """On random (4, 7, 12) laws: o(c) = P(c), sum_x min(q, o) = sum_c min(P, Q) (the lumped test's acceptance),
    TV(o, p) = acceptance - exact acceptance (the least possible), never more than the lumped law's TV;
    singleton clusters give o = p."""
    p, q = random_laws()
    ids = torch.arange(12) % clusters
    law = min_tv_law(p, q, ids, clusters)

    def lump(x):
        return torch.zeros(*x.shape[:-1], clusters, dtype=x.dtype).index_add_(-1, ids, x)

    assert float(law.min()) >= 0
    torch.testing.assert_close(lump(law), lump(p))
    accept = torch.minimum(lump(p), lump(q)).sum(-1)
    torch.testing.assert_close(torch.minimum(q, law).sum(-1), accept)
    tv = 0.5 * (law - p).abs().sum(-1)
    torch.testing.assert_close(tv, accept - torch.minimum(p, q).sum(-1))
    lumped = torch.stack([closed_form(p[b, j], q[b, j], ids) for b in range(4) for j in range(7)]).reshape(p.shape)
    assert bool((tv <= 0.5 * (lumped - p).abs().sum(-1) + 1e-12).all())
    if clusters == 12:
        torch.testing.assert_close(law, p)


def test_min_tv_rule_emits_its_law_with_the_lumped_acceptance():
    """2e5 drafts at one position: rule="min-tv" emits min_tv_law (chi-square), clusters follow P, it accepts as
    often as the lumped rule, and reports a smaller TV than the lumped rule's on these laws."""
    pp, qq, draft = drafts()
    res = ClusterAcceptance(CLUSTERS, rule="min-tv")(pp, qq, draft, gen(2))
    law = min_tv_law(P, Q, CLUSTERS, 3)
    assert chi2_fit(res.tokens, law)[2] > 1e-3
    assert chi2_fit(CLUSTERS[res.tokens], torch.zeros(3).index_add_(0, CLUSTERS, P))[2] > 1e-3
    lumped = ClusterAcceptance(CLUSTERS, rule="lumped")(pp, qq, draft, gen(2))
    assert abs(float(res.accepted.float().mean() - lumped.accepted.float().mean())) < 0.01
    tv = 0.5 * float((law - P).abs().sum())
    assert torch.allclose(res.relaxation, torch.full_like(res.relaxation, tv), atol=1e-6)
    assert tv < float(lumped.relaxation[0]) - 0.01
    with pytest.raises(ValueError, match="rule"):
        ClusterAcceptance(CLUSTERS, rule="nearest")


def test_fit_is_deterministic_groups_near_vectors_and_checks_its_input():
    g = gen(0)
    centres = torch.randn(4, 3, generator=g) * 10
    vectors = (centres.repeat_interleave(8, 0) + 0.01 * torch.randn(32, 3, generator=g))
    rule = ClusterAcceptance.fit(vectors, 4)
    assert torch.equal(rule.assignment, ClusterAcceptance.fit(vectors, 4).assignment)
    assert rule.num_clusters == 4

    def inertia(ids):
        return sum(float((vectors[ids == c] - vectors[ids == c].mean(0)).square().sum()) for c in ids.unique())

    assert inertia(rule.assignment) < 0.2 * inertia(torch.arange(32) % 4)  # near vectors share clusters
    assert torch.equal(ClusterAcceptance.fit(vectors, 32).assignment, torch.arange(32))
    for bad in (0, 33):
        with pytest.raises(ValueError, match="clusters"):
            ClusterAcceptance.fit(vectors, bad)
    with pytest.raises(ValueError, match="1-D"):
        ClusterAcceptance(torch.zeros(2, 2, dtype=torch.long))
    with pytest.raises(ValueError, match="partition covers"):
        rule(torch.full((1, 5), 0.2), torch.full((1, 5), 0.2), torch.tensor([0]), gen(0))


@pytest.mark.parametrize("rule", ["lumped", "min-tv"])
def test_jacobi_loop_keeps_each_cluster_law_given_the_prefix(rule):
    """Toy AR table, 1e5 sequences through the mc-sjd loop: the first token's cluster and the second's given
    the first token follow the target (chi-square, Bonferroni over prefixes); the token law does not. (The
    joint law of the cluster sequence is not kept: a relaxed choice inside a cluster changes what follows.)"""
    target, m = ToyTableTarget(seed=0), 100_000
    vocab, n = target.codebook_size, target.num_tokens
    ids = torch.arange(vocab) % 2
    stats = SpecStats()
    session = target.start(class_labels=[1] * m, guidance_scale=1.0)
    tokens = jacobi_sample(session, n, 16, "maximal", "uniform", {"temperature": 1.0}, gen(0), stats,
                           acceptance=ClusterAcceptance(ids, rule=rule))
    law = target.joint(1).reshape(vocab, vocab, -1).sum(-1)  # (t1, t2)
    first = torch.zeros(2, dtype=law.dtype).index_add_(0, ids, law.sum(1))
    assert chi2_fit(ids[tokens[:, 0]], first)[2] > 1e-3
    p_values = []
    for v in range(vocab):
        given = tokens[tokens[:, 0] == v, 1]
        if len(given) >= 500:
            cond = torch.zeros(2, dtype=law.dtype).index_add_(0, ids, law[v] / law[v].sum())
            p_values.append(chi2_fit(ids[given], cond)[2])
    assert len(p_values) >= 2 and min(p_values) * len(p_values) > 1e-3
    assert chi2_fit(sequence_codes(tokens, vocab), target.joint(1))[2] < 1e-8
    assert stats.extra["relaxed_tv"] > 0.01


@pytest.fixture(scope="module")
def tiny_ar():
    return SpeculativePipeline.from_pretrained("tiny-ar", method="mc-sjd").pipe


def spec_run(target, method, labels, **kw):
    spec = SpeculativePipeline.from_pipe(target, method=method, **kw)
    spec.set_progress_bar_config(disable=True)
    out = spec(class_labels=labels, generator=[gen(i) for i in range(len(labels))], output_type="tokens")
    return out.tokens, spec


@pytest.mark.parametrize(("source", "cluster_rule"), [("codebook", "lumped"), ("embeddings", "lumped"),
                                                    ("codebook", "min-tv")])
def test_gsd_clusters_on_tiny_ar(tiny_ar, source, cluster_rule):
    labels = list(range(10))
    _, exact = spec_run(tiny_ar, "mc-sjd", labels, window=32)
    _, relaxed = spec_run(tiny_ar, "gsd", labels, window=32, clusters=16, embed_source=source,
                          cluster_rule=cluster_rule)
    assert relaxed.stats.extra["tokens_per_call"] > exact.stats.extra["tokens_per_call"]
    assert 0 < relaxed.stats.extra["relaxed_tv"] < 0.5
    (rule,) = relaxed._rules.values()
    assert isinstance(rule, ClusterAcceptance) and rule.num_clusters == 16 and rule.rule == cluster_rule
    with pytest.raises(ValueError, match="clusters"):
        spec_run(tiny_ar, "gsd", [0], window=32, clusters=tiny_ar.codebook_size + 1)


def test_config_validation():
    assert GSDConfig().clusters is None and GSDConfig().cluster_rule == "min-tv"
    for kw in ({"clusters": 0}, {"clusters": 1.5}, {"clusters": 8, "max_tv": 0.1}, {"clusters": 8, "min_run": 1}):
        with pytest.raises(ValueError, match="clusters"):
            GSDConfig(**kw)
    with pytest.raises(ValueError, match="cluster_rule"):
        GSDConfig(clusters=8, cluster_rule="nearest")
