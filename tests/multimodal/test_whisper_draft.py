"""Whisper ASR with a draft decoder: ``generate(custom_generate=speculative_generate)`` == plain ``generate``.

Batches of 1, 4 and 8 rows accept different lengths; drafters: the target itself (full accept),
noisy copies (partial), logits rolled by one id (zero), a smaller Whisper with its own encoder,
one sharing the target's encoder, and a decoder-only ``WhisperForCausalLM``. Whisper's own
prompt logic (language given or detected, translate, timestamps, long-form, prompt ids) runs
unchanged around the loop.
"""

from __future__ import annotations

import pytest
import torch
from mm_tiny import accept_without_residual, chi2_fit, noisy
from speech_tiny import TIMESTAMPS, features, whisper, whisper_causal_drafter, whisper_shared_encoder

import diffspec.multimodal.loop as loop
from diffspec.multimodal.loop import speculative_generate
from diffspec.multimodal.seq2seq import record_encoder_inputs
from diffspec.stats import SpecStats


@pytest.fixture(scope="module")
def target():
    return whisper()


def _check(target, drafter, feats, *, k=3, new=12, **kw):
    kw = dict(max_new_tokens=new, **kw)
    if not kw.get("return_timestamps"):
        kw["suppress_tokens"] = TIMESTAMPS  # one decoding call per batch (no random timestamp seeks)
    ref = target.generate(feats, **kw)
    stats = SpecStats(method="draft")
    with record_encoder_inputs(target) as seen:
        out = target.generate(feats, **kw, custom_generate=speculative_generate, drafter=drafter,
                              num_draft_tokens=k, drafter_inputs=seen, spec_stats=stats)
    assert out.shape == ref.shape
    assert torch.equal(out, ref), (ref, out)
    assert stats.proposed > 0
    return stats


@pytest.mark.parametrize("batch", [1, 4, 8])
@pytest.mark.parametrize("regime", ["zero", "partial", "full"])
def test_greedy_identical_forced_accept_rates(target, batch, regime):
    scale = {"zero": float("inf"), "partial": 0.5, "full": 0.0}[regime]
    for seed in (0, 1):
        stats = _check(target, noisy(target, scale, seed), features(batch, seed), language="en")
        rate = stats.acceptance_rate
        if regime == "full":
            assert rate == 1.0
        elif regime == "zero":
            assert rate < 0.1
        else:
            assert 0.0 < rate < 1.0


@pytest.mark.parametrize("kind", ["own-encoder", "shared-encoder", "causal-lm"])
def test_small_drafters(target, kind):
    drafter = {"own-encoder": lambda: whisper(decoder_layers=1, d_model=32, seed=3),
               "shared-encoder": lambda: whisper_shared_encoder(target),
               "causal-lm": lambda: whisper_causal_drafter(target)}[kind]()
    for batch, seed in ((1, 4), (4, 5)):
        _check(target, drafter, features(batch, seed), language="en", k=4)


@pytest.mark.parametrize("options", [{}, {"task": "translate", "language": "fr"},
                                     {"language": "en", "return_timestamps": True}])
def test_whisper_prompt_logic(target, options):
    """Language detection (no language given), translate, timestamps: Whisper's own logic around the loop."""
    _check(target, noisy(target, 0.2, 7), features(4, 7), **options)


def test_long_form_and_prompt_conditioning(target):
    """Long-form audio (several decoding calls on shifted, shrinking batches; own-encoder drafter fed
    the recorded segment features) and prompt ids."""
    feats = features(3, 8, frames=260)
    mask = torch.ones(3, 260, dtype=torch.long)
    mask[1, 200:] = 0
    mask[2, 130:] = 0
    small = whisper(decoder_layers=1, d_model=32, seed=3)
    for drafter in (noisy(target, 0.2, 8), small):
        _check(target, drafter, feats, language="en", return_timestamps=True, attention_mask=mask,
               condition_on_prev_tokens=True)
    _check(target, noisy(target, 0.2, 9), features(3, 9), language="en", prompt_ids=torch.tensor([107, 5, 6, 7]))


def test_own_encoder_without_recorded_inputs_is_a_clear_error(target):
    with pytest.raises(ValueError, match="record_encoder_inputs"):
        target.generate(features(2, 0), language="en", max_new_tokens=4, custom_generate=speculative_generate,
                        drafter=whisper(decoder_layers=1, seed=3))


V, N, TEMP, SOT_SMALL, EOS_SMALL = 16, 3000, 0.8, 14, 15


def _small_vocab_whisper(seed):
    from speech_tiny import _config
    from transformers import WhisperForConditionalGeneration

    torch.manual_seed(seed)
    cfg = _config(1, 32, vocab=V)
    cfg.pad_token_id = cfg.eos_token_id = cfg.bos_token_id = EOS_SMALL
    cfg.decoder_start_token_id = SOT_SMALL
    model = WhisperForConditionalGeneration(cfg).eval()
    gc = model.generation_config
    gc.decoder_start_token_id, gc.pad_token_id, gc.eos_token_id = SOT_SMALL, EOS_SMALL, EOS_SMALL
    return model


def _exact_pair_law(target, feats):
    """Law of the 2nd and 3rd generated tokens (EOS and start suppressed) from the target itself."""
    banned = torch.tensor([SOT_SMALL, EOS_SMALL])
    enc = target.get_encoder()(feats)

    def probs(ids):
        e = enc.last_hidden_state.expand(ids.shape[0], -1, -1)
        logits = target(encoder_outputs=(e,), decoder_input_ids=ids).logits[:, -1] / TEMP
        return torch.softmax(logits.index_fill(-1, banned, float("-inf")), -1)

    with torch.no_grad():
        start = torch.tensor([[SOT_SMALL]])
        p1 = probs(start)[0]
        p2 = probs(torch.cat([start.expand(V, 1), torch.arange(V)[:, None]], 1))
        x12 = torch.cartesian_prod(torch.arange(V), torch.arange(V))
        p3 = probs(torch.cat([start.expand(V * V, 1), x12], 1)).reshape(V, V, V)
    return (p1[:, None, None] * p2[:, :, None] * p3).sum(0).reshape(-1)


@pytest.fixture(scope="module")
def sampling_pair():
    return _small_vocab_whisper(0), _small_vocab_whisper(5), features(1, 3)


def _sample(target, drafter, feats):
    stats = SpecStats()
    out = target.generate(feats.expand(N, -1, -1), max_new_tokens=3, temperature=TEMP, top_k=0,
                          suppress_tokens=[SOT_SMALL, EOS_SMALL], custom_generate=loop.speculative_generate,
                          drafter=drafter, drafter_inputs={"input_features": feats.expand(N, -1, -1)},
                          num_draft_tokens=2, generator=torch.Generator().manual_seed(0), spec_stats=stats)
    assert out.shape == (N, 3)
    return out[:, 1] * V + out[:, 2], stats


def test_sampling_law_matches_target(sampling_pair):
    """Sampled Whisper transcripts (temperature 0.8, rejections and residual draws both exercised):
    the (2nd, 3rd) token law equals the target's exact law (chi-square)."""
    target, drafter, feats = sampling_pair
    cells, stats = _sample(target, drafter, feats)
    assert 0.1 < stats.acceptance_rate < 0.95
    assert chi2_fit(cells, _exact_pair_law(target, feats))[2] > 1e-3


def test_sampling_planted_bias_is_detected(sampling_pair, monkeypatch):
    target, drafter, feats = sampling_pair
    monkeypatch.setattr(loop, "sampling_accept", accept_without_residual)
    cells, _ = _sample(target, drafter, feats)
    assert chi2_fit(cells, _exact_pair_law(target, feats))[2] < 1e-4
