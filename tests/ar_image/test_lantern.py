"""LANTERN / LANTERN++: neighbourhoods, relaxed acceptance, drafter, loop law, pipeline, training."""

from __future__ import annotations

import itertools

import pytest
import torch
from ar_checks import chi2_fit

from diffspec import SpeculativePipeline
from diffspec.ar_image.drafter import EagleDrafter, FeatureDrafter
from diffspec.ar_image.drafter_train import train_drafter
from diffspec.ar_image.lantern import lantern_sample
from diffspec.ar_image.lantern_config import LanternConfig, LanternPPConfig
from diffspec.ar_image.neighbours import latent_neighbours
from diffspec.ar_image.relaxed import neighbour_budget, relaxed_mrs
from diffspec.ar_image.targets.llamagen import LlamaGenConfig, LlamaGenTransformer
from diffspec.ar_image.targets.llamagen_session import LlamaGenTarget
from diffspec.speculation.sampling import warp

VOCAB, GUIDANCE = 4, 2.0


class _Codes:
    """A decoder stand-in carrying only a codebook."""

    def __init__(self, vocab: int) -> None:
        self.codebook = torch.randn(vocab, 3, generator=torch.Generator().manual_seed(5))


def _randomise(module: torch.nn.Module, seed: int, scale: float = 0.7) -> torch.nn.Module:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * scale)
    return module.eval()


@pytest.fixture(scope="module")
def small() -> tuple[LlamaGenTarget, EagleDrafter]:
    """A 2x2-token, 4-code random LlamaGen (non-flat logits) and a random drafter."""
    cfg = LlamaGenConfig(dim=16, n_layer=1, n_head=2, vocab_size=VOCAB, num_classes=3, block_size=4)
    model = _randomise(LlamaGenTransformer(cfg), 0)
    return LlamaGenTarget(model, _Codes(VOCAB), default_guidance_scale=GUIDANCE), _randomise(EagleDrafter(cfg), 1)


def _exact_law(target: LlamaGenTarget, label: int) -> torch.Tensor:
    """Plain law of every token sequence (row-major index in base VOCAB), by teacher forcing."""
    seqs = torch.tensor(list(itertools.product(range(VOCAB), repeat=target.num_tokens)))
    session = target.start(class_labels=[label] * len(seqs), guidance_scale=GUIDANCE)
    logits = torch.cat([session.first_logits[:, None], session.step(seqs[:, :-1], torch.zeros(len(seqs),
                                                                                             dtype=torch.long))], 1)
    p = warp(logits).gather(-1, seqs[..., None]).squeeze(-1)
    return p.prod(1).double()


def _index(tokens: torch.Tensor) -> torch.Tensor:
    return (tokens * VOCAB ** torch.arange(tokens.shape[1] - 1, -1, -1)).sum(1)


# ----------------------------------------------------------------------------------------- neighbours
@pytest.mark.parametrize("normalize", [False, True])
def test_neighbours_match_brute_force(normalize: bool) -> None:
    codes = torch.randn(50, 3, generator=torch.Generator().manual_seed(0))
    got = latent_neighbours(codes, 7, normalize=normalize, chunk=8)  # several chunks
    ref_codes = torch.nn.functional.normalize(codes, dim=-1) if normalize else codes
    dist = ((ref_codes[:, None] - ref_codes[None]) ** 2).sum(-1)
    dist.fill_diagonal_(float("inf"))
    assert torch.equal(got, dist.argsort(-1)[:, :7])
    assert not (got == torch.arange(50)[:, None]).any()


def test_neighbours_k_range() -> None:
    with pytest.raises(ValueError, match=r"k=4 .*\[1, 3\]"):
        latent_neighbours(torch.randn(4, 2), 4)


# ------------------------------------------------------------------------------------ relaxed acceptance
def _budget_loop(p: torch.Tensor, x: int, nb: torch.Tensor, cap: float) -> float:
    total = 0.0
    for y in nb[x].tolist():
        if total + float(p[y]) > cap + 1e-7:
            break
        total += float(p[y])
    return total


@pytest.mark.parametrize("delta,lam", [(0.0, None), (0.1, None), (0.3, None), (1.0, 2.0), (0.2, 1.5)])
def test_budget_is_the_neighbour_walk_and_within_cap(delta: float, lam: float | None) -> None:
    g = torch.Generator().manual_seed(1)
    p = torch.softmax(torch.randn(40, 12, generator=g) * 2, -1)
    nb = latent_neighbours(torch.randn(12, 2, generator=g), 6)
    x = torch.randint(0, 12, (40,), generator=g)
    got = neighbour_budget(p, x, nb, delta, lam)
    caps = [min(delta, (lam - 1) * float(p[i, x[i]])) if lam else delta for i in range(40)]
    ref = torch.tensor([_budget_loop(p[i], int(x[i]), nb, caps[i]) for i in range(40)])
    assert torch.allclose(got, ref, atol=1e-6)
    assert (got <= torch.tensor(caps) + 1e-6).all()  # per-token TV(p, p~) <= cap
    if delta > 0 and lam is None:
        assert (got > 0).any()  # the relaxation does something


def _one_step_law(p: torch.Tensor, q: torch.Tensor, budget: torch.Tensor) -> torch.Tensor:
    """Law of relaxed_mrs' output for draft ~ q, ``budget[x]`` the neighbour mass of draft x."""
    keep = torch.minimum(q, p + budget)
    residual = (p - q).clamp_min(0)
    residual = residual / residual.sum() if residual.sum() > 0 else p
    return keep + (1 - keep.sum()) * residual


@pytest.mark.parametrize("delta", [0.0, 0.25])
def test_relaxed_mrs_output_law(delta: float) -> None:
    g = torch.Generator().manual_seed(2)
    vocab, n = 6, 40_000
    p = torch.softmax(torch.randn(vocab, generator=g) * 1.5, -1)
    q = torch.softmax(torch.randn(vocab, generator=g) * 1.5, -1)
    nb = latent_neighbours(torch.randn(vocab, 2, generator=g), 3)
    budget = neighbour_budget(p.expand(vocab, -1), torch.arange(vocab), nb, delta)
    law = _one_step_law(p, q, budget)
    draft = torch.multinomial(q, n, replacement=True, generator=g)
    res = relaxed_mrs(p.expand(n, -1), q.expand(n, -1), draft, nb, delta, None, g, "residual")
    assert chi2_fit(res.tokens, law)[2] > 1e-3
    if delta == 0:
        assert torch.allclose(law, p.double().float(), atol=1e-6)  # exact speculative sampling
    else:
        tv = 0.5 * (law - p).abs().sum()
        assert 0 < tv <= budget[q >= p].sum() + 1e-6  # the relaxation moves mass, bounded as derived


# ------------------------------------------------------------------------------------------------ drafter
def test_drafter_save_load_roundtrip(small, tmp_path) -> None:
    target, drafter = small
    drafter.save_pretrained(tmp_path)
    again = EagleDrafter.from_pretrained(tmp_path)
    tok, feats = torch.randint(0, VOCAB, (2, 4)), torch.randn(2, 4, 16)
    a = FeatureDrafter(drafter, target.model).features(tok, feats)
    b = FeatureDrafter(again, target.model).features(tok, feats)
    assert torch.equal(a, b)


def test_drafter_is_causal(small) -> None:
    target, drafter = small
    head = FeatureDrafter(drafter, target.model)
    tok, feats = torch.randint(0, VOCAB, (1, 4)), torch.randn(1, 4, 16)
    a = head.features(tok, feats)
    tok2, feats2 = tok.clone(), feats.clone()
    tok2[:, 3], feats2[:, 3] = (tok[:, 3] + 1) % VOCAB, 0
    assert torch.allclose(a[:, :3], head.features(tok2, feats2)[:, :3], atol=1e-6)


def test_drafter_cache_matches_full_pass(small) -> None:
    target, drafter = small
    head = FeatureDrafter(drafter, target.model)
    tok, feats = torch.randint(0, VOCAB, (2, 4)), torch.randn(2, 4, 16)
    full = head.features(tok, feats)
    cache = head.new_cache(2, 6)
    head.features(torch.zeros(2, 3, dtype=torch.long), torch.randn(2, 3, 16), torch.tensor([[1, 2, 3]] * 2), cache)
    parts = [head.features(tok[:, :2], feats[:, :2], torch.tensor([[0, 1]] * 2), cache),  # stale slots overwritten
             head.features(tok[:, 2:3], feats[:, 2:3], torch.tensor([[2]] * 2), cache),
             head.features(tok[:, 3:], feats[:, 3:], torch.tensor([[3]] * 2), cache)]
    assert torch.allclose(torch.cat(parts, 1), full, rtol=1e-4, atol=1e-4)


# ----------------------------------------------------------------------------------------------- the loop
def _lantern_tokens(target, drafter, delta, lam, n, seed, length=2):
    session = target.start(class_labels=[1] * n, guidance_scale=GUIDANCE)
    nb = latent_neighbours(target.codebook, 2)
    return lantern_sample(session, target.num_tokens, FeatureDrafter(drafter, target.model), nb, length, delta,
                          lam, {"temperature": 1.0}, torch.Generator().manual_seed(seed))


def test_delta_zero_is_exact_and_relaxation_is_detected(small) -> None:
    target, drafter = small
    with torch.no_grad():
        law = _exact_law(target, 1)
        exact = _lantern_tokens(target, drafter, 0.0, None, 3000, 0)
        relaxed = _lantern_tokens(target, drafter, 0.6, None, 3000, 1)
    assert chi2_fit(_index(exact), law)[2] > 1e-3
    assert chi2_fit(_index(relaxed), law)[2] < 1e-6  # a large relaxation is a different law: the test can fail


def test_lam_one_is_exact_budget(small) -> None:
    target, drafter = small
    session = target.start(class_labels=[0, 2], guidance_scale=GUIDANCE)
    from diffspec.stats import SpecStats

    stats = SpecStats(method="lantern++")
    lantern_sample(session, target.num_tokens, FeatureDrafter(drafter, target.model),
                   latent_neighbours(target.codebook, 3), 3, 1.0, 1.0, {"temperature": 1.0},
                   torch.Generator().manual_seed(0), stats)
    assert stats.extra["tv_budget_mean"] == 0.0
    assert stats.target_calls >= 2 and stats.draft_calls == 3 * (stats.target_calls - 1)


# ------------------------------------------------------------------------------------------ pipeline/config
def test_registry_pipeline_and_stats(small, tmp_path) -> None:
    target, drafter = small
    drafter.save_pretrained(tmp_path / "d")
    spec = SpeculativePipeline.from_pipe(target, method="lantern", drafter=str(tmp_path / "d"), k=5,
                                         draft_length=3)
    spec.set_progress_bar_config(disable=True)
    gens = [torch.Generator().manual_seed(i) for i in range(3)]
    out = spec(class_labels=[0, 1, 2], output_type="tokens", generator=gens)
    assert out.tokens.shape == (3, 4) and spec.neighbours.shape == (VOCAB, VOCAB - 1)  # k capped at V - 1
    s = spec.stats
    assert s.proposed > 0 and 0 <= s.accepted <= s.proposed and s.draft_calls > 0
    assert s.extra["step_compression"] == pytest.approx(4 / s.target_calls)
    assert 0.0 <= s.extra["tv_budget_mean"] <= 0.1
    pp = SpeculativePipeline.from_pipe(target, method="lantern++", drafter=str(tmp_path / "d"))
    assert type(pp.config) is LanternPPConfig and not pp.config.exact


def test_config_validation() -> None:
    with pytest.raises(ValueError, match="delta"):
        LanternConfig(delta=1.5)
    with pytest.raises(ValueError, match="lam"):
        LanternPPConfig(lam=0.5)
    with pytest.raises(ValueError, match="draft_length"):
        LanternConfig(draft_length=0)


def test_no_drafter_is_a_clear_error(small) -> None:
    target, _ = small
    with pytest.raises(ValueError, match="train-drafter"):
        SpeculativePipeline.from_pipe(target, method="lantern")


# --------------------------------------------------------------------------------------------- training
def test_train_drafter_runs_and_loads(small, tmp_path) -> None:
    target, _ = small
    record = train_drafter(target, tmp_path, samples=24, epochs=3, batch=8, show_progress=False)
    assert (tmp_path / "model.safetensors").is_file() and (tmp_path / "training.json").is_file()
    assert record["history"][-1]["loss"] < record["history"][0]["loss"]
    EagleDrafter.from_pretrained(tmp_path)


def test_cli_train_drafter_parser() -> None:
    from diffspec.cli import build_parser

    args = build_parser().parse_args(["train-drafter", "--model", "tiny-ar", "--out", "x", "--epochs", "2"])
    assert args.epochs == 2 and args.func.__name__ == "cmd_train_drafter"
