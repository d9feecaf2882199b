"""``mc-sjd-ra`` (MC-SJD + residual alternatives): layout, exactness on the toy table target and on LlamaGen's cache."""

import pytest
import torch
from ar_checks import check_cfg_forced_and_warpers, chi2_fit, plant_stale_rows, toy_greedy_case
from ar_stepping import tiny_llamagen_target

from diffspec.ar_image.config import MCSJDRAConfig
from diffspec.ar_image.jacobi import jacobi_sample
from diffspec.ar_image.plain import plain_sample
from diffspec.ar_image.residual import residual_gumbel, residual_sample, sibling_layout
from diffspec.ar_image.targets.toy import ToyTableTarget, sequence_codes
from diffspec.stats import SpecStats

M = 100_000
FREE = {"temperature": 1.0}


def gen(seed=0):
    return torch.Generator().manual_seed(seed)


def ra(target, labels, window=16, width=2, depth=3, follow=2, init="uniform", guidance_scale=1.0, sampling=FREE,
       seed=0, stats=None, **kw):
    session = target.start(class_labels=labels, guidance_scale=guidance_scale)
    return residual_sample(session, target.num_tokens, window, width, depth, follow, init, sampling, gen(seed), stats,
                           **kw)


def p_value(target, tokens, label=1, **law_kw):
    return chi2_fit(sequence_codes(tokens, target.codebook_size), target.joint(label, **law_kw))[2]


def test_layout_groups_hang_under_the_chain_prefix():
    depth, anc = sibling_layout(4, 2, 2, 1, "cpu")
    # chain 0..3 at depths 1..4; groups (offset 0: nodes 4-5, 6-7; offset 1: nodes 8-9, 10-11)
    assert depth.tolist() == [1, 2, 3, 4, 1, 2, 1, 2, 2, 3, 2, 3]
    assert anc[5].nonzero().flatten().tolist() == [4, 5]  # offset 0 sibling's follower: no chain node
    assert anc[11].nonzero().flatten().tolist() == [0, 10, 11]  # offset 1: under chain node 0, own group only
    assert anc[3].nonzero().flatten().tolist() == [0, 1, 2, 3]  # the chain never sees a sibling


def test_residual_gumbel_draws_the_residual_law():
    p = torch.tensor([0.5, 0.3, 0.2, 0.0])
    q = torch.tensor([0.1, 0.6, 0.2, 0.1])
    u = torch.rand(200_000, 4, generator=gen(1))
    draws = residual_gumbel(p.expand(200_000, -1), q.expand(200_000, -1), -torch.log(-torch.log(u)))
    freq = torch.bincount(draws, minlength=4).double() / 200_000
    assert torch.allclose(freq, torch.tensor([1.0, 0.0, 0.0, 0.0], dtype=torch.double))  # (p - q)_+ = [0.4, 0, 0, 0]
    q2 = torch.tensor([0.4, 0.4, 0.1, 0.1])
    draws = residual_gumbel(p.expand(200_000, -1), q2.expand(200_000, -1), -torch.log(-torch.log(u)))
    freq = torch.bincount(draws, minlength=4).double() / 200_000
    assert torch.allclose(freq, torch.tensor([0.5, 0.0, 0.5, 0.0], dtype=torch.double), atol=0.01)
    same = residual_gumbel(p.unsqueeze(0), p.unsqueeze(0), torch.zeros(1, 4))  # no residual mass: a draw of p
    assert same.item() == 0


@pytest.mark.parametrize("window, width, depth, follow, init", [
    (16, 2, 3, 2, "uniform"),         # whole image in the window, followers past the image end
    (2, 2, 3, 1, "uniform-onehot"),   # depth clipped to window - 1, one-hot q
    (4, 2, 2, 3, "repeat"),           # chain tail past the groups, followers past the window
    (6, 1, 5, 0, "uniform"),          # a sibling alone: one extra token on a hit
])
def test_full_joint_law(window, width, depth, follow, init):
    target = ToyTableTarget(seed=0)
    stats = SpecStats()
    tokens = ra(target, [1] * M, window, width, depth, follow, init, stats=stats)
    assert p_value(target, tokens) > 1e-3
    assert stats.extra["residual_hits"] > 0  # the siblings' rows were used, so the test covers them


@pytest.mark.parametrize("follow", [0, 3])
def test_planted_bias_stale_rows_after_a_sibling_is_rejected(follow, monkeypatch):
    """Drawing the tokens after a picked sibling from the chain's rows (conditioned on the rejected draft)."""
    target = ToyTableTarget(seed=0)
    plant_stale_rows(monkeypatch)
    tokens = ra(target, [1] * M, 16, 2, 3, follow)
    assert p_value(target, tokens) < 1e-8


def test_cfg_forced_tokens_and_warpers():
    check_cfg_forced_and_warpers(lambda target, labels, cfg, sampling, stats: ra(
        target, labels, 3, 2, 2, 2, guidance_scale=cfg, sampling=sampling, stats=stats))


@pytest.mark.parametrize("init", ["uniform", "repeat"])
def test_greedy_is_identical_to_plain(init):
    target, labels, ref = toy_greedy_case()
    for window, width, depth, follow in ((1, 4, 3, 2), (3, 2, 3, 1), (8, 4, 3, 3), (40, 3, 2, 0)):
        out = ra(target, labels, window, width, depth, follow, init, guidance_scale=1.7, sampling={"temperature": 0.0})
        assert torch.equal(out, ref)


def test_row_result_does_not_depend_on_the_batch():
    target = ToyTableTarget(vocab=4, grid=(3, 5), seed=3)
    both = residual_sample(target.start(class_labels=[0, 1]), target.num_tokens, 4, 2, 3, 2, "uniform", FREE,
                           [gen(5), gen(6)])
    alone = residual_sample(target.start(class_labels=[1]), target.num_tokens, 4, 2, 3, 2, "uniform", FREE, [gen(6)])
    assert torch.equal(both[1], alone[0])


def test_residual_alternatives_raise_tokens_per_call_over_mc_sjd():
    target = ToyTableTarget(vocab=6, grid=(4, 8), seed=0, scale=1.0)
    mc, alt = SpecStats(), SpecStats()
    jacobi_sample(target.start(class_labels=[0] * 512), target.num_tokens, 16, "maximal", "uniform", FREE, gen(), mc)
    ra(target, [0] * 512, 16, 3, 4, 2, stats=alt)
    assert alt.target_calls == alt.extra["iterations"] + 1
    assert alt.extra["tree_nodes"] == 16 + 4 * 3 * 3
    assert alt.extra["tokens_per_call"] > mc.extra["tokens_per_call"] + 0.1


@pytest.mark.parametrize("field, value, allowed", [
    ("width", 0, "[1, 64]"), ("width", 65, "[1, 64]"), ("depth", 0, "[1, 4096]"), ("follow", -1, "[0, 64]"),
    ("follow", 1.5, "[0, 64]"), ("window", 0, "[1, 4096]"), ("init", "zeros", "uniform"),
])
def test_bad_config_values_are_named(field, value, allowed):
    with pytest.raises(ValueError, match=field) as err:
        MCSJDRAConfig(**{field: value})
    assert repr(value) in str(err.value) and allowed in str(err.value)


def test_width_must_leave_room_in_the_codebook():
    target = ToyTableTarget(vocab=3, seed=0)
    with pytest.raises(ValueError, match=r"width=3 .* \[1, 2\]"):
        ra(target, [0], width=3)


def test_session_without_trees_is_refused():
    class NoTree:
        pass

    with pytest.raises(ValueError, match="step_tree"):
        residual_sample(NoTree(), 6, 4, 2, 2, 1, "uniform", FREE, gen())  # type: ignore[arg-type]


@pytest.mark.parametrize("seed", [0, 1])
def test_greedy_identical_to_plain_on_llamagen_kv_cache(seed):
    """The real static KV cache path (step_tree, commit_tree of a sibling's group, ragged rows, CFG)."""
    from diffspec import SpeculativePipeline
    target = tiny_llamagen_target(seed)
    labels, greedy = [0, 3, 1, 4], {"temperature": 0.0}
    ref = plain_sample(target.start(class_labels=labels, guidance_scale=2.0), 16, greedy, gen())
    for window, width, depth, follow in ((4, 4, 3, 2), (40, 3, 2, 5), (1, 2, 1, 0)):
        session = target.start(class_labels=labels, guidance_scale=2.0)
        out = residual_sample(session, 16, window, width, depth, follow, "uniform", greedy, gen(seed))
        assert torch.equal(out, ref)
    # sampled: siblings are picked on this target, and the pipeline path runs
    spec = SpeculativePipeline.from_pipe(target, method="mc-sjd-ra", window=6, follow=2)
    spec.set_progress_bar_config(disable=True)
    out = spec(class_labels=labels * 8, guidance_scale=2.0, generator=gen(seed), output_type="tokens")
    assert out.tokens.shape == (32, 16) and spec.stats.extra["residual_hits"] > 0


@pytest.mark.parametrize("window, width, depth, follow", [(16, 3, 4, 2), (3, 2, 8, 1), (1, 2, 3, 0)])
def test_tokens_fed_per_call_matches_the_sampler(window, width, depth, follow):
    from diffspec.ar_image.config import tokens_fed_per_call

    target = ToyTableTarget(vocab=4, grid=(3, 5), seed=0)
    stats = SpecStats()
    ra(target, [0, 1], window, width, depth, follow, stats=stats)
    config = MCSJDRAConfig(window=window, width=width, depth=depth, follow=follow)
    assert tokens_fed_per_call(config, target.num_tokens) == stats.extra["tree_nodes"] + 1
