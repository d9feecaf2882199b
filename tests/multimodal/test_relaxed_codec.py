"""``relaxed-codec`` on a MusicGen decoder: beta=1 equals plain greedy ``generate``; beta<1 relaxes codebooks >= 1 only."""

from __future__ import annotations

import pytest
import torch
from mm_tiny import noisy
from speech_tiny import musicgen

from diffspec import SpeculativePipeline, methods
from diffspec.multimodal.codec import codec_generate
from diffspec.multimodal.codec_config import RelaxedCodecConfig
from diffspec.pipelines.codec import CodecOutput, CodecPipeline, token_disagreement
from diffspec.stats import SpecStats

K, PAD, NEW = 4, 32, 16


@pytest.fixture(scope="module")
def target():
    return musicgen()


def _prompt(batch, seed, length=3):
    g = torch.Generator().manual_seed(seed)
    return torch.cat([torch.full((batch * K, 1), PAD), torch.randint(0, PAD, (batch * K, length - 1), generator=g)], 1)


def _plain(target, ids):
    return target.generate(input_ids=ids, max_new_tokens=NEW, do_sample=False, num_return_sequences=1)


@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("regime", ["zero", "partial", "full", "small"])
def test_exact_limit_equals_plain_greedy(target, batch, regime):
    drafter = musicgen(layers=1, hidden=32, seed=3) if regime == "small" else \
        noisy(target, {"zero": float("inf"), "partial": 0.1, "full": 0.0}[regime], batch)
    for seed, length in ((0, 1), (1, 3)):
        ids = _prompt(batch, seed, length)
        stats = SpecStats()
        out = codec_generate(target, drafter, ids, max_new_tokens=NEW, num_draft_tokens=3, beta=1.0, spec_stats=stats)
        assert torch.equal(out, _plain(target, ids))
        assert stats.extra["relaxed_tokens"] == 0
        if regime == "full":
            assert stats.acceptance_rate == 1.0 and stats.target_calls < NEW / 2
        elif regime == "zero":
            assert stats.acceptance_rate == 0.0 and stats.target_calls == NEW


def test_partial_regime_accepts_some(target):
    stats = SpecStats()
    codec_generate(target, noisy(target, 0.1, 1), _prompt(1, 0), max_new_tokens=NEW, beta=1.0, spec_stats=stats)
    assert 0.0 < stats.acceptance_rate < 1.0


def test_relaxed_accepts_more_and_keeps_codebook0_rule(target, monkeypatch):
    """beta < 1: more drafted steps accepted, codebook 0 still exact: a drafter that is right on
    codebook 0 and wrong elsewhere is accepted only through the tolerance."""
    drafter = noisy(target, 0.3, 5)
    ids = _prompt(2, 4)
    ref = _plain(target, ids)
    rates, disagreement = [], []
    for beta in (1.0, 0.3, 0.05):
        stats = SpecStats()
        out = codec_generate(target, drafter, ids, max_new_tokens=NEW, num_draft_tokens=3, beta=beta, spec_stats=stats)
        rates.append(stats.acceptance_rate)
        disagreement.append(token_disagreement(out, ref)["overall"])
        assert out.shape == ref.shape
    assert rates[0] < rates[1] <= rates[2] and disagreement[0] == 0.0 and disagreement[2] > 0.0
    # exact_codebooks=K: every codebook exact, so any beta reproduces plain greedy
    out = codec_generate(target, drafter, ids, max_new_tokens=NEW, beta=0.05, exact_codebooks=K)
    assert torch.equal(out, ref)


def test_pipeline_registry_and_errors(target):
    info = {m.name: m for m in methods("multimodal", available_only=True)}["relaxed-codec"]
    assert info.config_class is RelaxedCodecConfig and not info.exact
    spec = SpeculativePipeline.from_pipe(target, method="relaxed-codec", draft=noisy(target, 0.1, 2), beta=1.0,
                                         num_draft_tokens=2)
    assert isinstance(spec, CodecPipeline)
    out = spec(batch_size=2, max_new_tokens=NEW)
    assert isinstance(out, CodecOutput) and out.spec_stats.target_calls > 1
    assert torch.equal(out.audio_codes, spec.plain(batch_size=2, max_new_tokens=NEW).audio_codes)
    with pytest.raises(ValueError, match="does not support do_sample=True"):
        spec(max_new_tokens=4, do_sample=True)
    with pytest.raises(ValueError, match=r"beta=0 is out of range: allowed \(0.0, 1.0\]"):
        RelaxedCodecConfig(beta=0)
    with pytest.raises(ValueError, match="needs draft="):
        SpeculativePipeline.from_pipe(target, method="relaxed-codec", draft=musicgen(codebooks=2))
    from mm_tiny import llama

    with pytest.raises(ValueError, match="not supported; supported: MusicgenForCausalLM"):
        SpeculativePipeline.from_pipe(llama(), method="relaxed-codec", draft=target)


def test_from_pretrained_codec_folders(target, tmp_path):
    target.save_pretrained(tmp_path / "decoder")
    musicgen(layers=1, hidden=32, seed=3).save_pretrained(tmp_path / "small")
    spec = SpeculativePipeline.from_pretrained(tmp_path / "decoder", method="relaxed-codec", draft=tmp_path / "small",
                                               beta=1.0)
    ids = _prompt(1, 7)
    assert torch.equal(spec(ids, max_new_tokens=NEW).audio_codes, _plain(target, ids))


def _no_cache_greedy(model, ids, new, encoder_hidden_states):
    """Greedy decoding recomputing the whole sequence each step (no cache), MusicGen's delay pattern and
    prompt mask: the reference for cross-attention conditioning (transformers 5.23's MusicgenForCausalLM.generate
    shares one DynamicCache between self- and cross-attention there, so it is not one)."""
    seqs, pattern = model.build_delay_pattern_mask(ids, pad_token_id=PAD, max_length=ids.shape[1] + new)
    with torch.no_grad():
        while seqs.shape[1] < ids.shape[1] + new:
            mask = torch.cat([(ids != PAD).long(), torch.ones_like(seqs[:, ids.shape[1]:])], 1)
            logits = model(input_ids=model.apply_delay_pattern_mask(seqs, pattern), attention_mask=mask,
                           encoder_hidden_states=encoder_hidden_states, use_cache=False).logits[:, -1]
            seqs = torch.cat([seqs, logits.argmax(-1, keepdim=True)], 1)
    out = model.apply_delay_pattern_mask(seqs, pattern)
    return out[out != PAD].reshape(ids.shape[0] // K, K, -1)


def test_cross_attention_conditioning_matches_no_cache_reference(target):
    enc = torch.randn(2, 5, 64, generator=torch.Generator().manual_seed(0))
    ids = _prompt(2, 0, length=1)
    assert torch.equal(_no_cache_greedy(target, ids, NEW, None), _plain(target, ids))  # the reference is faithful
    ref = _no_cache_greedy(target, ids, NEW, enc)
    for drafter in (noisy(target, 0.0), noisy(target, 0.1, 3)):
        stats = SpecStats()
        out = codec_generate(target, drafter, ids, max_new_tokens=NEW, beta=1.0, encoder_hidden_states=enc,
                             spec_stats=stats)
        assert torch.equal(out, ref) and stats.accepted > 0
