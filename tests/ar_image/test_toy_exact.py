"""Full-joint exactness of the plain loop, sjd and mc-sjd on the toy table target (729 cells, 1e5 samples)."""

import pytest
import torch
from ar_checks import chi2_fit, plant_kept_old_q

from diffspec.ar_image.jacobi import jacobi_sample
from diffspec.ar_image.plain import plain_sample
from diffspec.ar_image.targets.toy import ToyTableTarget, sequence_codes
from diffspec.stats import SpecStats

M = 100_000
FREE = {"temperature": 1.0}


def gen(seed=0):
    return torch.Generator().manual_seed(seed)


def run(target, method, labels, guidance_scale=1.0, sampling=FREE, seed=0, window=16, stats=None, **kw):
    session = target.start(class_labels=labels, guidance_scale=guidance_scale)
    if method == "plain":
        return plain_sample(session, target.num_tokens, sampling, gen(seed), stats)
    coupling, init = method
    return jacobi_sample(session, target.num_tokens, window, coupling, init, sampling, gen(seed), stats, **kw)


def p_value(target, tokens, label=1, **law_kw):
    return chi2_fit(sequence_codes(tokens, target.codebook_size), target.joint(label, **law_kw))[2]


METHODS = [  # (method, window): window 16 covers the whole toy image, window 2 exercises bonus tokens
    ("plain", 0),
    (("independent", "uniform"), 16),
    (("independent", "uniform-onehot"), 16),
    (("independent", "repeat"), 2),
    (("maximal", "uniform"), 16),
    (("maximal", "uniform-onehot"), 2),
    (("maximal", "repeat"), 16),
    (("maximal", "repeat"), 2),
    (("gumbel", "uniform"), 2),
    (("gumbel", "repeat"), 16),
]


@pytest.mark.parametrize("method, window", METHODS,
                         ids=lambda m: m if isinstance(m, (str, int)) else "-".join(m))
def test_full_joint_law(method, window):
    target = ToyTableTarget(seed=0)
    tokens = run(target, method, [1] * M, window=window)
    assert p_value(target, tokens) > 1e-3


@pytest.mark.parametrize("init", ["uniform", "uniform-onehot", "repeat"])
def test_planted_old_q_bookkeeping_is_rejected(init, monkeypatch):
    """The official MC scheduler's kept-token old-q bookkeeping must fail the same test."""
    target = ToyTableTarget(seed=0)
    tokens = run(target, ("maximal", init), [1] * M, acceptance=plant_kept_old_q(monkeypatch))
    assert p_value(target, tokens) < 1e-8


@pytest.mark.parametrize("method", ["plain", ("independent", "uniform"), ("maximal", "uniform-onehot"),
                                    ("gumbel", "uniform")], ids=str)
def test_cfg_forced_tokens_and_warpers(method):
    """CFG inside the session (2 branches), forced tokens as delta p/q, temperature + top-k + top-p."""
    target = ToyTableTarget(vocab=4, grid=(2, 3), seed=1, forced={2: 3, 4: 0})
    sampling = {"temperature": 0.8, "top_k": 3, "top_p": 0.95}
    stats = SpecStats()
    tokens = run(target, method, [0] * M, guidance_scale=2.5, sampling=sampling, window=3, stats=stats)
    assert bool((tokens[:, 2] == 3).all()) and bool((tokens[:, 4] == 0).all())
    law = target.joint(0, guidance_scale=2.5, **sampling)
    assert chi2_fit(sequence_codes(tokens, 4), law)[2] > 1e-3
    assert stats.target_evals == 2 * stats.target_calls
    # the same law without CFG or warpers is far away: the test has power
    assert chi2_fit(sequence_codes(tokens, 4), target.joint(0, guidance_scale=1.0))[2] < 1e-8


@pytest.mark.parametrize("coupling", ["independent", "maximal", "gumbel"])
@pytest.mark.parametrize("init", ["uniform", "uniform-onehot", "repeat"])
def test_greedy_is_identical_to_plain(coupling, init):
    target = ToyTableTarget(vocab=5, grid=(4, 6), seed=2, scale=1.0, forced={7: 1})
    labels = [0, 1, 1, 0, 1, 0, 0, 1]
    ref = run(target, "plain", labels, guidance_scale=1.7, sampling={"temperature": 0.0})
    for window in (1, 3, 8, 40):
        out = run(target, (coupling, init), labels, guidance_scale=1.7, sampling={"temperature": 0.0}, window=window)
        assert torch.equal(out, ref)


def test_row_result_does_not_depend_on_the_batch():
    target = ToyTableTarget(vocab=4, grid=(3, 5), seed=3)
    for coupling in ("independent", "maximal", "gumbel"):
        both = jacobi_sample(target.start(class_labels=[0, 1]), target.num_tokens, 4, coupling, "uniform", FREE,
                             [gen(5), gen(6)])
        alone = jacobi_sample(target.start(class_labels=[1]), target.num_tokens, 4, coupling, "uniform", FREE,
                              [gen(6)])
        assert torch.equal(both[1], alone[0])


def test_step_compression_sjd_and_mc_sjd():
    target = ToyTableTarget(vocab=4, grid=(4, 8), seed=0, scale=2.0)
    per_image = {}
    for coupling in ("independent", "maximal", "gumbel"):
        stats = SpecStats()
        run(target, (coupling, "uniform"), [0] * 512, stats=stats)
        per_image[coupling] = stats.extra["tokens_per_call"]
        assert stats.target_calls == stats.extra["iterations"] + 1
        assert stats.extra["step_compression"] == target.num_tokens / stats.target_calls > 1
        assert 0 < stats.accepted < stats.proposed
    assert per_image["independent"] > 1.3
    assert per_image["maximal"] > per_image["independent"] + 0.15
    assert per_image["gumbel"] > per_image["independent"] + 0.1
    plain = SpecStats()
    run(target, "plain", [0] * 4, stats=plain)
    assert plain.target_calls == target.num_tokens and plain.extra["step_compression"] == 1.0
