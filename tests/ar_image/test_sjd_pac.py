"""``sjd-pac`` (MC-SJD + a tree of alternatives at the window start): exactness on the toy table target."""

import pytest
import torch
from ar_checks import check_cfg_forced_and_warpers, chi2_fit, plant_no_residual, toy_greedy_case
from ar_stepping import tiny_llamagen_target

from diffspec.ar_image.config import SJDPACConfig, tokens_fed_per_call
from diffspec.ar_image.jacobi import jacobi_sample
from diffspec.ar_image.pac import pac_layout, pac_sample
from diffspec.ar_image.plain import plain_sample
from diffspec.ar_image.targets.toy import ToyTableTarget, sequence_codes
from diffspec.ar_image.tree import StaticTree
from diffspec.stats import SpecStats

M = 100_000
FREE = {"temperature": 1.0}


def gen(seed=0):
    return torch.Generator().manual_seed(seed)


def pac(target, labels, window=16, width=4, depth=3, init="uniform", guidance_scale=1.0, sampling=FREE, seed=0,
        stats=None, **kw):
    session = target.start(class_labels=labels, guidance_scale=guidance_scale)
    return pac_sample(session, target.num_tokens, window, width, depth, init, sampling, gen(seed), stats, **kw)


def p_value(target, tokens, label=1, **law_kw):
    return chi2_fit(sequence_codes(tokens, target.codebook_size), target.joint(label, **law_kw))[2]


def test_layout_chain_and_tree():
    depth, anc, chain = pac_layout(StaticTree((3, 3)), 5, "cpu")
    assert depth.tolist() == [1] * 3 + [2] * 9 + [3, 4, 5]
    assert chain.tolist() == [0, 3, 12, 13, 14]
    # the chain's tail sees the main path and itself, never an alternative
    assert anc[14].nonzero().flatten().tolist() == [0, 3, 12, 13, 14]
    assert anc[7].nonzero().flatten().tolist() == [1, 7]  # level-2 node 4 = child 1 of level-1 node 1


@pytest.mark.parametrize("window, width, depth, init", [
    (16, 4, 3, "uniform"),        # whole image in the window, 4th sibling exhausts V = 3 (invalid nodes)
    (2, 3, 3, "uniform-onehot"),  # depth clipped to the window, bonus tokens, one-hot q (no alternatives)
    (4, 2, 2, "repeat"),          # chain tail past the tree, round-to-round coupling
])
def test_full_joint_law(window, width, depth, init):
    target = ToyTableTarget(seed=0)
    stats = SpecStats()
    tokens = pac(target, [1] * M, window, width, depth, init, stats=stats)
    assert p_value(target, tokens) > 1e-3
    if init != "uniform-onehot":
        assert stats.extra["alternative_hits"] > 0  # the alternatives were used, so the test covers them


def test_planted_bias_no_residual_update_is_rejected(monkeypatch):
    """Testing every sibling against the same p (no residual update) over-emits: the test must see it."""
    target = ToyTableTarget(seed=0)
    plant_no_residual(monkeypatch)
    tokens = pac(target, [1] * M, 16, 4, 3)
    assert p_value(target, tokens) < 1e-8


def test_cfg_forced_tokens_and_warpers():
    check_cfg_forced_and_warpers(lambda target, labels, cfg, sampling, stats: pac(
        target, labels, 3, 3, 2, guidance_scale=cfg, sampling=sampling, stats=stats))


@pytest.mark.parametrize("init", ["uniform", "repeat"])
def test_greedy_is_identical_to_plain(init):
    target, labels, ref = toy_greedy_case()
    for window, width, depth in ((1, 4, 3), (3, 2, 3), (8, 4, 3), (40, 3, 2)):
        out = pac(target, labels, window, width, depth, init, guidance_scale=1.7, sampling={"temperature": 0.0})
        assert torch.equal(out, ref)


def test_row_result_does_not_depend_on_the_batch():
    target = ToyTableTarget(vocab=4, grid=(3, 5), seed=3)
    both = pac_sample(target.start(class_labels=[0, 1]), target.num_tokens, 4, 3, 2, "uniform", FREE,
                      [gen(5), gen(6)])
    alone = pac_sample(target.start(class_labels=[1]), target.num_tokens, 4, 3, 2, "uniform", FREE, [gen(6)])
    assert torch.equal(both[1], alone[0])


def test_alternatives_raise_tokens_per_call_over_mc_sjd():
    target = ToyTableTarget(vocab=4, grid=(4, 8), seed=0, scale=2.0)
    mc, tree = SpecStats(), SpecStats()
    jacobi_sample(target.start(class_labels=[0] * 512), target.num_tokens, 16, "maximal", "uniform", FREE, gen(),
                  mc)
    pac(target, [0] * 512, 16, 4, 3, stats=tree)
    assert tree.target_calls == tree.extra["iterations"] + 1
    assert tree.extra["tree_nodes"] == 4 + 16 + 64 + 13
    assert tokens_fed_per_call(SJDPACConfig(window=16), target.num_tokens) == tree.extra["tree_nodes"] + 1
    assert tree.extra["tokens_per_call"] > mc.extra["tokens_per_call"] + 0.1


@pytest.mark.parametrize("field, value, allowed", [
    ("width", 0, "[1, 16]"), ("width", 17, "[1, 16]"), ("depth", 0, "[1, 8]"), ("depth", 2.5, "[1, 8]"),
    ("window", 0, "[1, 4096]"), ("coupling", "gumbel", "maximal"), ("init", "zeros", "uniform"),
])
def test_bad_config_values_are_named(field, value, allowed):
    with pytest.raises(ValueError, match=field) as err:
        SJDPACConfig(**{field: value})
    assert repr(value) in str(err.value) and allowed in str(err.value)


def test_session_without_trees_is_refused():
    class NoTree:
        pass

    session = NoTree()
    with pytest.raises(ValueError, match="step_tree"):
        pac_sample(session, 6, 4, 2, 2, "uniform", FREE, gen())  # type: ignore[arg-type]


@pytest.mark.parametrize("seed", [0, 1])
def test_greedy_identical_to_plain_on_llamagen_kv_cache(seed):
    """The real static KV cache path (step_tree, commit_tree, ragged rows, CFG) on a random tiny LlamaGen."""
    target = tiny_llamagen_target(seed)
    labels, greedy = [0, 3, 1, 4], {"temperature": 0.0}
    ref = plain_sample(target.start(class_labels=labels, guidance_scale=2.0), 16, greedy, gen())
    for window, width, depth in ((4, 4, 3), (40, 3, 2), (1, 2, 1)):
        session = target.start(class_labels=labels, guidance_scale=2.0)
        out = pac_sample(session, 16, window, width, depth, "uniform", greedy, gen(seed))
        assert torch.equal(out, ref)
    # sampled: alternatives are taken on this target, and the pipeline path runs
    from diffspec import SpeculativePipeline

    spec = SpeculativePipeline.from_pipe(target, method="sjd-pac", window=6)
    spec.set_progress_bar_config(disable=True)
    out = spec(class_labels=labels * 8, guidance_scale=2.0, generator=gen(seed), output_type="tokens")
    assert out.tokens.shape == (32, 16) and spec.stats.extra["alternative_hits"] > 0
