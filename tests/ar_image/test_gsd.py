"""``gsd`` (grouped speculative decoding, relaxed): the group rule, its reduction to mc-sjd, its gain and its cost."""

from __future__ import annotations

import pytest
import torch
from ar_checks import chi2_fit, committed_law_z, plant_kept_old_q, toy_conditionals, worst_draft_z

from diffspec import SpeculativePipeline, methods
from diffspec.ar_image import jacobi as jacobi_module
from diffspec.ar_image.cluster import ClusterAcceptance, cluster_sum
from diffspec.ar_image.config import GSDConfig
from diffspec.ar_image.group import GroupAcceptance, distance_quantile
from diffspec.ar_image.jacobi import jacobi_sample
from diffspec.ar_image.targets.toy import ToyTableTarget, sequence_codes
from diffspec.speculation.sampling import mrs, point_mass, uniform
from diffspec.stats import SpecStats

FREE = {"temperature": 1.0}


def gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def random_pq(shape=(3, 5), vocab=12, seed=0):
    g = gen(seed)
    p = (torch.randn(*shape, vocab, generator=g) * 2).softmax(-1)
    q = (torch.randn(*shape, vocab, generator=g) * 2).softmax(-1)
    draft = torch.multinomial(q.reshape(-1, vocab), 1, generator=g).reshape(shape)
    return p, q, draft


def brute_cluster(p_row, x, group_size, delta_p, emb=None, dist=0.5):
    """Reference: the cluster of one draft by a plain loop over ranks."""
    order = sorted(range(len(p_row)), key=lambda t: (-float(p_row[t]), t))
    r = order.index(int(x))
    members = set()
    for k in range(r - group_size // 2, r - group_size // 2 + group_size):
        if 0 <= k < len(order):
            y = order[k]
            ok = abs(float(p_row[y]) - float(p_row[x])) < delta_p
            if emb is not None:
                ok = ok and float(((emb[y] - emb[x]) ** 2).sum()) < dist
            if ok or y == int(x):
                members.add(y)
    return members


@pytest.mark.parametrize("table", [True, False], ids=["near-table", "gathered"])
@pytest.mark.parametrize("group_size, delta_p, with_emb", [(5, 0.05, False), (6, 1.0, True), (12, 0.2, True)])
def test_cluster_matches_a_loop_reference(group_size, delta_p, with_emb, table, monkeypatch):
    """Both distance-filter paths (precomputed (V, V) table; per-draft embedding gather) match a loop."""
    if not table:
        monkeypatch.setattr("diffspec.ar_image.group.NEAR_TABLE_MAX_CODES", 0)
    p, q, draft = random_pq(seed=group_size)
    p[0, 0, :4] = p[0, 0, :4].mean()  # ties: the stable order decides
    p = p / p.sum(-1, keepdim=True)
    emb = torch.randn(12, 4, generator=gen(7)) * 0.4 if with_emb else None
    rule = GroupAcceptance(group_size, delta_p, 0.5, emb)
    tokens, keep = rule.cluster(p, draft)
    assert (rule._near is not None) == (table and with_emb)
    for b in range(p.shape[0]):
        for j in range(p.shape[1]):
            got = set(tokens[b, j][keep[b, j]].tolist())
            assert got == brute_cluster(p[b, j], draft[b, j], group_size, delta_p, emb)


@pytest.mark.parametrize("rule", [GroupAcceptance(1, 1.0), GroupAcceptance(9, 0.0),
                                  GroupAcceptance(9, 1.0, 0.0, torch.randn(12, 3))])
def test_degenerate_group_is_the_exact_test_bit_for_bit(rule):
    p, q, draft = random_pq(shape=(4, 6))
    ref, res = mrs(p, q, draft, gen(3)), rule(p, q, draft, gen(3))
    assert torch.equal(ref.tokens, res.tokens) and torch.equal(ref.accepted, res.accepted)
    assert float(res.relaxation.abs().max()) == 0.0


def test_point_mass_drafts_take_the_exact_test_unless_asked():
    """A one-hot q (first drafts under init="repeat") is tested exactly; group_onehot=True groups it."""
    p, q_model, draft = random_pq(shape=(4, 6))
    q = torch.zeros_like(p).scatter_(-1, draft.unsqueeze(-1), 1.0)
    ref = mrs(p, q, draft, gen(3))
    res = GroupAcceptance(9, 1.0)(p, q, draft, gen(3))
    assert torch.equal(ref.tokens, res.tokens) and torch.equal(ref.accepted, res.accepted)
    assert float(res.relaxation.abs().max()) == 0.0
    grouped = GroupAcceptance(9, 1.0, group_onehot=True)(p, q, draft, gen(3))
    assert float(grouped.relaxation.min()) > 0.0  # p(C) > p(x) everywhere here
    assert grouped.accepted.sum() > ref.accepted.sum()
    mixed = q.clone()
    mixed[0] = q_model[0]  # row 0 drafted from a model row: the group test applies there only
    got = GroupAcceptance(9, 1.0)(p, mixed, draft, gen(3))
    assert float(got.relaxation[0].max()) > 0.0 and float(got.relaxation[1:].abs().max()) == 0.0


def test_group_test_law_and_reported_tv():
    """One position, 2e5 drafts x ~ q: the output law moves away from p by at most the reported budget."""
    vocab, m = 6, 200_000
    p = torch.tensor([0.30, 0.25, 0.20, 0.12, 0.08, 0.05])
    q = torch.tensor([0.05, 0.10, 0.15, 0.20, 0.25, 0.25])
    draft = torch.multinomial(q, m, replacement=True, generator=gen(1))
    pp, qq = p.expand(m, vocab), q.expand(m, vocab)
    exact = mrs(pp, qq, draft, gen(2))
    relaxed = GroupAcceptance(4, 1.0)(pp, qq, draft, gen(2))
    tv = {k: 0.5 * float((torch.bincount(r.tokens, minlength=vocab) / m - p).abs().sum())
          for k, r in (("exact", exact), ("relaxed", relaxed))}
    noise = 0.01  # ~ sqrt(V / m)
    assert tv["exact"] < noise
    budget = float(relaxed.relaxation.mean())
    assert tv["relaxed"] > 5 * noise and tv["relaxed"] <= budget + noise
    assert relaxed.accepted.float().mean() > exact.accepted.float().mean() + 0.05


@pytest.mark.parametrize("max_tv", [0.0, 0.05, 0.15])
def test_max_tv_caps_the_relaxation_and_the_law(max_tv):
    """max_tv clamps each draft's acceptance to within max_tv of the exact test: the reported relaxation
    never exceeds it, the output law stays within it of p (Monte Carlo over 2e5 drafts), max_tv=0 accepts
    as the exact test does, and a cap above the paper rule's relaxation changes nothing."""
    vocab, m = 6, 200_000
    p = torch.tensor([0.30, 0.25, 0.20, 0.12, 0.08, 0.05])
    q = torch.tensor([0.05, 0.10, 0.15, 0.20, 0.25, 0.25])
    draft = torch.multinomial(q, m, replacement=True, generator=gen(1))
    pp, qq = p.expand(m, vocab), q.expand(m, vocab)
    free = GroupAcceptance(4, 1.0)(pp, qq, draft, gen(2))
    capped = GroupAcceptance(4, 1.0, max_tv=max_tv)(pp, qq, draft, gen(2))
    assert float(capped.relaxation.max()) <= max_tv + 1e-6
    assert float(free.relaxation.max()) > 0.15  # the cap binds in every case here
    tv = 0.5 * float((torch.bincount(capped.tokens, minlength=vocab) / m - p).abs().sum())
    assert tv <= max_tv + 0.01  # 0.01 ~ sqrt(V / m)
    exact = mrs(pp, qq, draft, gen(2))
    gain = float(capped.accepted.float().mean() - exact.accepted.float().mean())
    if max_tv == 0:
        assert abs(gain) < 1e-3 and float(capped.relaxation.max()) == 0.0
    else:
        assert 0 < gain <= max_tv + 0.01
    unbound = GroupAcceptance(4, 1.0, max_tv=1.0)(pp, qq, draft, gen(2))
    assert float((unbound.tokens == free.tokens).float().mean()) > 0.9999  # "u < a" vs "u q(C) < p(C)": rounding


@pytest.mark.parametrize("min_run", [0, 1, 3, 20])
def test_min_run_keeps_a_group_acceptance_only_before_an_exact_run(min_run):
    """min_run against a loop over window positions on the same uniforms: the exact decision, plus a
    group-only acceptance where the exact test accepts the next min_run drafts (to the window's end);
    every other position is the exact rule's outcome, token for token."""
    p, q, draft = random_pq(shape=(40, 9), vocab=6, seed=3)
    rule = GroupAcceptance(4, 1.0, min_run=min_run)
    res = rule(p, q, draft, gen(5))
    exact = mrs(p, q, draft, gen(5))
    u = uniform((*draft.shape, 2), gen(5))[..., 0]
    tokens, keep = rule.cluster(p, draft)
    pc, qc = ((t.gather(-1, tokens) * keep).sum(-1) for t in (p, q))
    px, qx = p.gather(-1, draft[..., None])[..., 0], q.gather(-1, draft[..., None])[..., 0]
    ex, grp = u * qx < px, u * qc < pc
    length = draft.shape[1]
    want = torch.zeros_like(ex)
    for b in range(draft.shape[0]):
        for j in range(length):
            paying = bool(ex[b, j + 1:min(j + min_run, length - 1) + 1].all())
            want[b, j] = bool(ex[b, j]) or (bool(grp[b, j]) and paying)
    assert torch.equal(res.accepted, want) and torch.equal(exact.accepted, ex)
    assert torch.equal(res.tokens, torch.where(want, draft, exact.tokens))
    taken = (want & ~ex).sum()
    assert taken > 0 and (res.relaxation > 0).sum() >= taken
    if min_run == 0:
        assert torch.equal(want, ex | grp)


def run_toy(target, labels, seed=0, acceptance=None, coupling="maximal", window=16, stats=None):
    session = target.start(class_labels=labels, guidance_scale=1.0)
    return jacobi_sample(session, target.num_tokens, window, coupling, "uniform", FREE, gen(seed), stats,
                         acceptance=acceptance)


@pytest.mark.parametrize("coupling", ["maximal", "gumbel", "independent"])
def test_gsd_with_group_one_is_mc_sjd_on_the_toy(coupling):
    target = ToyTableTarget(vocab=5, grid=(3, 4), seed=1)
    ref = run_toy(target, [0, 1] * 200, coupling=coupling, window=4)
    got = run_toy(target, [0, 1] * 200, coupling=coupling, window=4, acceptance=GroupAcceptance(1, 0.15))
    assert torch.equal(ref, got)


def test_large_group_changes_the_law_and_accepts_more():
    """The knob is real: G = V, delta_p = 1 fails the full-joint chi-square that mc-sjd passes."""
    target, m = ToyTableTarget(seed=0), 100_000
    law = target.joint(1)
    exact_stats, gsd_stats = SpecStats(), SpecStats()
    exact = run_toy(target, [1] * m, stats=exact_stats)
    relaxed = run_toy(target, [1] * m, acceptance=GroupAcceptance(3, 1.0), stats=gsd_stats)
    assert chi2_fit(sequence_codes(exact, 3), law)[2] > 1e-3
    assert chi2_fit(sequence_codes(relaxed, 3), law)[2] < 1e-8
    assert gsd_stats.accepted / gsd_stats.proposed > exact_stats.accepted / exact_stats.proposed
    assert gsd_stats.extra["tokens_per_call"] > exact_stats.extra["tokens_per_call"]
    assert "relaxed_tv" not in exact_stats.extra and gsd_stats.extra["relaxed_tv"] > 0.01


@pytest.fixture(scope="module")
def tiny_ar():
    return SpeculativePipeline.from_pretrained("tiny-ar", method="mc-sjd").pipe


def spec_tokens(target, method, labels, seed=0, **kw):
    spec = SpeculativePipeline.from_pipe(target, method=method, **kw)
    spec.set_progress_bar_config(disable=True)
    gens = [gen(seed + i) for i in range(len(labels))]
    out = spec(class_labels=labels, generator=gens, output_type="tokens")
    return out.tokens, spec.stats


@pytest.mark.parametrize("kw", [{"group_size": 1}, {"delta_p": 0.0}, {"embed_dist": 0.0}])
def test_gsd_degenerate_is_mc_sjd_on_tiny_ar(tiny_ar, kw):
    labels = [0, 3, 7, 9]
    ref, _ = spec_tokens(tiny_ar, "mc-sjd", labels, window=16)
    got, stats = spec_tokens(tiny_ar, "gsd", labels, window=16, **kw)
    assert torch.equal(ref, got)
    assert stats.extra["relaxed_tv"] == 0.0


def test_gsd_accepts_more_than_mc_sjd_on_tiny_ar(tiny_ar):
    labels = list(range(10))
    _, exact = spec_tokens(tiny_ar, "mc-sjd", labels, window=32)
    _, relaxed = spec_tokens(tiny_ar, "gsd", labels, window=32, group_size=50)
    assert tiny_ar.token_embeddings().shape == (tiny_ar.codebook_size, tiny_ar.model.config.dim)
    assert relaxed.accepted / relaxed.proposed > exact.accepted / exact.proposed
    assert relaxed.extra["step_compression"] > exact.extra["step_compression"]
    assert 0 < relaxed.extra["relaxed_tv"] < 0.5


def test_max_tv_bounds_the_budget_on_tiny_ar(tiny_ar):
    """On a real target the capped rule spends at most max_tv per draft, and less than the free rule."""
    labels = list(range(10))
    _, free = spec_tokens(tiny_ar, "gsd", labels, window=32, group_size=50, delta_p=1.0)
    _, capped = spec_tokens(tiny_ar, "gsd", labels, window=32, group_size=50, delta_p=1.0, max_tv=0.05)
    assert 0 < capped.extra["relaxed_tv"] <= 0.05 < free.extra["relaxed_tv"]


def test_min_run_spends_less_budget_on_tiny_ar(tiny_ar):
    """min_run spends less TV than the free rule. (It no longer out-compresses mc-sjd: its look-ahead leaves
    the window's drafts unfit for a coupling, so they are re-drafted by fresh draws.)"""
    labels = list(range(10))
    _, free = spec_tokens(tiny_ar, "gsd", labels, window=32, group_size=50)
    _, paying = spec_tokens(tiny_ar, "gsd", labels, window=32, group_size=50, min_run=2)
    assert 0 < paying.extra["relaxed_tv"] < free.extra["relaxed_tv"]


def test_distance_quantile_matches_a_loop_and_samples_large_sets():
    v = torch.randn(30, 4, generator=gen(5))
    pairs = [float(((v[i] - v[j]) ** 2).sum()) for i in range(30) for j in range(30) if i != j]
    for qu in (0.05, 0.5, 1.0):
        assert distance_quantile(v, qu) == pytest.approx(float(torch.tensor(pairs).quantile(qu)), rel=1e-4)
    big = torch.randn(300, 4, generator=gen(6))
    assert distance_quantile(big, 0.1, max_rows=64) == distance_quantile(big, 0.1, max_rows=64)  # fixed sample
    assert distance_quantile(big, 0.1, max_rows=64) == pytest.approx(distance_quantile(big, 0.1), rel=0.2)


@pytest.mark.parametrize("source", ["embeddings", "codebook"])
def test_embed_quantile_sets_the_filter_from_the_chosen_vectors(tiny_ar, source):
    spec = SpeculativePipeline.from_pipe(tiny_ar, method="gsd", group_size=50, embed_source=source, embed_quantile=0.05)
    rule = spec._acceptance(spec.config)
    vectors = tiny_ar.codebook if source == "codebook" else tiny_ar.token_embeddings()
    assert torch.equal(rule.embeddings, vectors.float())
    assert rule.embed_dist == distance_quantile(vectors, 0.05) != GSDConfig().embed_dist
    assert spec._acceptance(spec.config) is rule  # kept across calls: the distance table is built once
    labels = list(range(6))
    _, tight = spec_tokens(tiny_ar, "gsd", labels, window=32, group_size=50, embed_source=source, embed_quantile=0.001)
    _, wide = spec_tokens(tiny_ar, "gsd", labels, window=32, group_size=50, embed_source=source, embed_quantile=1.0)
    assert tight.extra["relaxed_tv"] < wide.extra["relaxed_tv"]


def test_codebook_source_needs_a_codebook():
    spec = SpeculativePipeline.from_pipe(ToyTableTarget(seed=0), method="gsd", embed_source="codebook")
    with pytest.raises(ValueError, match="embed_source"):
        spec(class_labels=[0], generator=gen(0), output_type="tokens")


def test_transformers_targets_expose_their_image_token_embeddings():
    pytest.importorskip("transformers")
    from test_emu3 import tiny_emu3
    from test_janus import tiny_janus

    from diffspec.ar_image.targets.emu3 import Emu3Target
    from diffspec.ar_image.targets.janus import JanusTarget

    janus = JanusTarget(tiny_janus())
    ids = torch.tensor([[0, 5, 63]])
    with torch.no_grad():
        assert torch.allclose(janus.token_embeddings()[ids[0]], janus.model.prepare_embeddings_for_image_generation(ids)[0])
    emu3 = Emu3Target(tiny_emu3(), height=2, width=2)
    emb = emu3.token_embeddings()
    assert emb.shape[0] == emu3.codebook_size
    with torch.no_grad():
        assert torch.allclose(emb[-1], emu3.model.get_input_embeddings()(emu3.vocab_ids[-1:])[0])


def test_config_validation_and_registry():
    assert GSDConfig().group_size == 25 and not GSDConfig.exact
    for field, value in [("group_size", 0), ("delta_p", 1.5), ("embed_dist", -1.0), ("coupling", "none"),
                         ("window", 0), ("init", "zeros"), ("group_onehot", 1), ("embed_source", "vq"),
                         ("embed_quantile", 0.0), ("embed_quantile", 1.5), ("max_tv", -0.1), ("max_tv", 1.5), ("min_run", -1)]:
        with pytest.raises(ValueError, match=field):
            GSDConfig(**{field: value})
    info = {m.name: m for m in methods("ar_image", available_only=True)}["gsd"]
    assert info.config_class is GSDConfig and info.exact is False


class Spy:
    """An acceptance rule that records the ``(q, draft)`` of every call before deciding."""

    def __init__(self, rule):
        self.rule, self.seen = rule, []

    def __call__(self, p, q, draft, generator):
        self.seen.append((q.clone(), draft.clone()))
        return self.rule(p, q, draft, generator)


@pytest.mark.parametrize("rule", [ClusterAcceptance(torch.arange(3) % 2, "lumped"),
                                  ClusterAcceptance(torch.arange(3) % 2, "min-tv"),
                                  GroupAcceptance(3, 1.0), GroupAcceptance(3, 1.0, min_run=1)],
                         ids=["lumped", "min-tv", "group", "group-min-run"])
def test_relaxed_rules_keep_every_draft_distributed_as_its_q(rule, monkeypatch):
    """The Jacobi loop's bookkeeping under a relaxed rule: every draft the rule sees was drawn from the q it is
    told (mean of one-hot(draft) - q is 0 per window slot and token, |z| < 5 over 5e4 toy sequences). A relaxed
    rule's own outputs do not follow p, so re-drafting the window from them while recording q = p fails this
    (|z| of 20-70 before the fix)."""
    positions = []
    forced = jacobi_module.window_forced
    monkeypatch.setattr(jacobi_module, "window_forced", lambda s, pos: positions.append(pos) or forced(s, pos))
    target, m = ToyTableTarget(seed=0), 50_000
    spy = Spy(rule)
    run_toy(target, [1] * m, acceptance=spy)
    n, length = target.num_tokens, spy.seen[0][1].shape[1]
    rounds = [pos for pos in positions if pos.shape[1] == length + 1]
    assert len(rounds) == len(spy.seen) >= 3
    seen = [(q, draft, pos[:, :length] < n) for (q, draft), pos in zip(spy.seen, rounds)]
    assert 0.0 < worst_draft_z(seen[1:]) < 5.0  # the first round's drafts are inits


def lumped_law(rule):
    """The lumped rule's emitted law in closed form, ``q min(1, P/Q) + p (1 - Q/P)_+`` (module docstring)."""
    def law(p, q):
        ids = rule.assignment.expand(p.shape)
        big_p, big_q = (cluster_sum(t, rule.assignment, rule.num_clusters).gather(-1, ids) for t in (p, q))
        out = q * (big_p / big_q).clamp(max=1) + p * (1 - big_q / big_p).clamp_min(0)
        return torch.where(point_mass(q).unsqueeze(-1), p, out)
    return law


@pytest.mark.parametrize("rule, planted", [("min-tv", False), ("lumped", False), ("min-tv", True)],
                         ids=["min-tv", "lumped", "planted-kept-old-q"])
def test_every_committed_token_follows_the_rules_law(rule, planted, monkeypatch):
    """End to end in the Jacobi loop: each committed token follows the cluster rule's emitted law for the true
    conditional given the row's prefix and the q its draft was tested with (|z| < 5 over 3e4 toy sequences); a kept
    draft keeping its old q (drafts no longer follow the q they are tested with) fails it."""
    target, labels = ToyTableTarget(vocab=6, grid=(3, 5), seed=3, scale=1.0), [0, 1] * 15_000
    cluster = ClusterAcceptance(torch.arange(6) % 2, rule)
    spy = Spy(cluster)
    acceptance = plant_kept_old_q(monkeypatch, spy) if planted else spy
    rounds, shift = [], jacobi_module.shift_window

    def spy_shift(session, tokens, commit, new_commit, *args):
        rounds.append((spy.seen[-1][0], commit.clone(), new_commit.clone()))
        return shift(session, tokens, commit, new_commit, *args)

    monkeypatch.setattr(jacobi_module, "shift_window", spy_shift)
    session = target.start(class_labels=labels)
    out = jacobi_sample(session, target.num_tokens, 8, "maximal", "uniform", FREE, gen(5), acceptance=acceptance)
    law = cluster.emitted_law if rule == "min-tv" else lumped_law(cluster)
    worst = committed_law_z(toy_conditionals(target, labels, out), out, rounds, law)
    assert (worst > 6.0) if planted else (worst < 5.0)


@pytest.mark.parametrize("rule", ["lumped", "min-tv"])
def test_cluster_rules_test_point_mass_drafts_exactly_unless_asked(rule):
    """A one-hot q (first drafts under init="repeat": the token to the left) takes the exact test; with
    group_onehot=True the cluster test keeps it with its cluster's whole mass."""
    p, q_model, draft = random_pq(shape=(4, 6))
    q = torch.zeros_like(p).scatter_(-1, draft.unsqueeze(-1), 1.0)
    ids = torch.arange(p.shape[-1]) % 3
    ref = mrs(p, q, draft, gen(3))
    res = ClusterAcceptance(ids, rule)(p, q, draft, gen(3))
    assert torch.equal(ref.tokens, res.tokens) and torch.equal(ref.accepted, res.accepted)
    assert torch.equal(res.exact_tokens, ref.tokens) and float(res.relaxation.abs().max()) == 0.0
    grouped = ClusterAcceptance(ids, rule, group_onehot=True)(p, q, draft, gen(3))
    assert float(grouped.relaxation.min()) > 0.0 and grouped.accepted.sum() > ref.accepted.sum()
    assert torch.equal(grouped.exact_tokens, ref.tokens)  # the re-draft stays the exact test's
    mixed = q.clone()
    mixed[0] = q_model[0]  # row 0 drafted from a model row: the cluster test applies there only
    got = ClusterAcceptance(ids, rule)(p, mixed, draft, gen(3))
    assert float(got.relaxation[0].max()) > 0.0 and float(got.relaxation[1:].abs().max()) == 0.0
