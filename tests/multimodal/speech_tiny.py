"""Tiny random-weight speech models for the tests (no hub): Whisper (+ processor), its drafters, MusicGen.

Whisper: 16 mel bins, 1 s chunks (100 frames, ``max_source_positions`` 50), 100 text ids, the
special ids 100..109 (``<|endoftext|>``, ``<|startoftranscript|>``, ``<|en|>``, ``<|fr|>``,
tasks, ``<|notimestamps|>``) and 51 timestamp ids, so ``generate`` builds the real decoder prompt
(start, language, task, no-timestamps), detects the language when none is given, and handles
timestamps and long-form audio as for a real checkpoint.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import torch

EOT, SOT, EN, FR, TRANSLATE, TRANSCRIBE, SOLM, SOPREV, NOCAP, NOTS = range(100, 110)
SPECIALS = ["<|endoftext|>", "<|startoftranscript|>", "<|en|>", "<|fr|>", "<|translate|>", "<|transcribe|>",
            "<|startoflm|>", "<|startofprev|>", "<|nocaptions|>", "<|notimestamps|>"]
VOCAB = 110 + 51
TIMESTAMPS = list(range(110, VOCAB))


def _config(decoder_layers: int, d_model: int, vocab: int = VOCAB, **extra):
    from transformers import WhisperConfig

    return WhisperConfig(vocab_size=vocab, num_mel_bins=16, encoder_layers=2, decoder_layers=decoder_layers,
                         d_model=d_model, encoder_attention_heads=4, decoder_attention_heads=4,
                         encoder_ffn_dim=2 * d_model, decoder_ffn_dim=2 * d_model, max_source_positions=50,
                         max_target_positions=64, pad_token_id=EOT, bos_token_id=EOT, eos_token_id=EOT,
                         decoder_start_token_id=SOT, init_std=0.3, suppress_tokens=None,
                         begin_suppress_tokens=None, **extra)


def _whisper_generation_config(model) -> None:
    gc = model.generation_config
    gc.decoder_start_token_id, gc.pad_token_id, gc.eos_token_id, gc.bos_token_id = SOT, EOT, EOT, EOT
    gc.lang_to_id = {"<|en|>": EN, "<|fr|>": FR}
    gc.task_to_id = {"translate": TRANSLATE, "transcribe": TRANSCRIBE}
    gc.is_multilingual, gc.no_timestamps_token_id, gc.prev_sot_token_id = True, NOTS, SOPREV
    gc.max_initial_timestamp_index = 50
    gc.suppress_tokens, gc.begin_suppress_tokens = [], [EOT]
    gc._from_model_config = False  # else from_pretrained rebuilds it from the model config (no lang_to_id)


def whisper(decoder_layers: int = 2, d_model: int = 64, seed: int = 0):
    """A ``WhisperForConditionalGeneration`` target (or a smaller drafter with its own encoder)."""
    from transformers import WhisperForConditionalGeneration

    torch.manual_seed(seed)
    model = WhisperForConditionalGeneration(_config(decoder_layers, d_model)).eval()
    _whisper_generation_config(model)
    return model


def whisper_shared_encoder(target, decoder_layers: int = 1, seed: int = 1):
    """A drafter with a 1-layer decoder whose encoder *is* the target's encoder module."""
    drafter = whisper(decoder_layers=decoder_layers, d_model=target.config.d_model, seed=seed)
    drafter.model.encoder = target.model.encoder
    return drafter


def whisper_causal_drafter(target, decoder_layers: int = 1, seed: int = 2):
    """A decoder-only ``WhisperForCausalLM`` drafter reading the target's encoder states."""
    from transformers import WhisperForCausalLM

    torch.manual_seed(seed)
    cfg = _config(decoder_layers, target.config.d_model, is_encoder_decoder=False)
    return WhisperForCausalLM(cfg).eval()


def features(batch: int, seed: int, frames: int = 100) -> torch.Tensor:
    """Random log-mel features (B, 16, frames); 100 frames is one 1 s chunk (short-form)."""
    return torch.randn(batch, 16, frames, generator=torch.Generator().manual_seed(seed))


def whisper_processor(folder: str | Path):
    """A ``WhisperProcessor`` built locally: a byte-level BPE tokenizer over 100 ids + the special
    ids above, and a 16-bin, 1 s feature extractor. Saved to ``folder`` and returned."""
    from transformers import WhisperFeatureExtractor, WhisperProcessor, WhisperTokenizer

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    chars = [chr(c) for c in range(ord("a"), ord("z") + 1)] + ["\u0120"]  # byte-level space
    vocab = {c: i for i, c in enumerate(chars)}
    for a, b in itertools.product(chars[:26], chars[:26]):
        if len(vocab) >= 100:
            break
        vocab[a + b] = len(vocab)
    (folder / "vocab.json").write_text(json.dumps(vocab))
    merges = [f"{t[0]} {t[1]}" for t in list(vocab)[len(chars):]]
    (folder / "merges.txt").write_text("#version: 0.2\n" + "\n".join(merges) + "\n")
    tok = WhisperTokenizer(str(folder / "vocab.json"), str(folder / "merges.txt"), unk_token=SPECIALS[0],
                           bos_token=SPECIALS[0], eos_token=SPECIALS[0], pad_token=SPECIALS[0])
    tok.add_special_tokens({"additional_special_tokens": SPECIALS[1:]})
    fe = WhisperFeatureExtractor(feature_size=16, sampling_rate=16000, hop_length=160, chunk_length=1, n_fft=400)
    processor = WhisperProcessor(feature_extractor=fe, tokenizer=tok)
    processor.save_pretrained(folder)
    return processor


def musicgen(layers: int = 2, hidden: int = 64, seed: int = 0, codebooks: int = 4, vocab: int = 32):
    """A ``MusicgenForCausalLM`` (codec decoder: ``codebooks`` parallel heads, delay pattern), pad/bos id ``vocab``."""
    from transformers import MusicgenDecoderConfig, MusicgenForCausalLM

    torch.manual_seed(seed)
    cfg = MusicgenDecoderConfig(vocab_size=vocab, num_codebooks=codebooks, hidden_size=hidden, num_hidden_layers=layers,
                                num_attention_heads=4, ffn_dim=2 * hidden, max_position_embeddings=256,
                                pad_token_id=vocab, bos_token_id=vocab, eos_token_id=None,
                                decoder_start_token_id=vocab, initializer_factor=0.3)
    model = MusicgenForCausalLM(cfg).eval()
    gc = model.generation_config
    gc.pad_token_id, gc.bos_token_id, gc.decoder_start_token_id, gc.eos_token_id = vocab, vocab, vocab, None
    return model
