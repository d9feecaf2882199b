"""SpeculativePipeline.from_pretrained for transformers folders: Whisper + processor + drafter folder, errors."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from speech_tiny import TIMESTAMPS, whisper, whisper_causal_drafter, whisper_processor

from diffspec import SpeculativePipeline
from diffspec.multimodal.loading import load_model, register_loader
from diffspec.pipelines.multimodal import MultimodalPipeline


@pytest.fixture(scope="module")
def whisper_folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("speech")
    target = whisper()
    target.save_pretrained(root / "target")
    whisper_processor(root / "target")
    whisper(decoder_layers=1, d_model=32, seed=3).save_pretrained(root / "small")
    whisper_causal_drafter(target).save_pretrained(root / "causal")
    return root


def _audio(n):
    g = np.random.default_rng(0)
    return [g.standard_normal(16000 * (i + 1) // n).astype(np.float32) for i in range(n)]


@pytest.mark.parametrize("drafter", ["small", "causal"])
def test_whisper_from_pretrained_with_drafter_folder(whisper_folders, drafter):
    spec = SpeculativePipeline.from_pretrained(whisper_folders / "target", method="draft",
                                               draft=str(whisper_folders / drafter), num_draft_tokens=3)
    assert isinstance(spec, MultimodalPipeline) and spec.processor is not None
    assert type(spec.drafter).__name__ == {"small": "WhisperForConditionalGeneration",
                                           "causal": "WhisperForCausalLM"}[drafter]
    kw = dict(audio=_audio(4), sampling_rate=16000, language="en", max_new_tokens=10, suppress_tokens=TIMESTAMPS)
    out = spec(**kw)
    assert out.spec_stats.target_calls >= 2 and out.spec_stats.proposed > 0
    ref = spec.plain(**kw)
    assert torch.equal(out.sequences, ref.sequences) and out.text == ref.text
    assert len(out.text) == 4 and all(isinstance(t, str) for t in out.text)
    feats = spec.processor(audio=_audio(2), sampling_rate=16000, return_tensors="pt").input_features
    tensors = spec(input_features=feats, language="en", max_new_tokens=6, suppress_tokens=TIMESTAMPS)
    assert torch.equal(tensors.sequences, spec.pipe.generate(feats, language="en", max_new_tokens=6,
                                                             suppress_tokens=TIMESTAMPS))


def test_unsupported_whisper_options_are_clear(whisper_folders):
    spec = SpeculativePipeline.from_pretrained(whisper_folders / "target", method="draft",
                                               draft=str(whisper_folders / "causal"))
    for bad in ({"return_token_timestamps": True}, {"logprob_threshold": -1.0}, {"num_beams": 2},
                {"temperature": (0.0, 0.2)}):
        with pytest.raises(ValueError, match="does not support"):
            spec(audio=_audio(1), sampling_rate=16000, max_new_tokens=4, **bad)


def test_from_pretrained_causal_lm_vlm_and_unsupported_model(tmp_path):
    from mm_tiny import SPECIAL, llama, llava, llava_inputs, text_prompts
    from transformers import BertConfig, BertModel

    llama(seed=0).save_pretrained(tmp_path / "lm")
    llama(layers=1, hidden=32, seed=1).save_pretrained(tmp_path / "lm-small")
    spec = SpeculativePipeline.from_pretrained(tmp_path / "lm", method="draft", draft=tmp_path / "lm-small")
    inputs = text_prompts(2, seed=1)
    assert torch.equal(spec(**inputs, max_new_tokens=8, do_sample=False).sequences,
                       spec.plain(**inputs, max_new_tokens=8, do_sample=False).sequences)
    llava().save_pretrained(tmp_path / "vlm")
    spec = SpeculativePipeline.from_pretrained(tmp_path / "vlm", method="text-draft", draft=tmp_path / "lm-small")
    assert type(spec.pipe).__name__ == "LlavaForConditionalGeneration"
    kw = dict(llava_inputs(2, seed=2), max_new_tokens=8, do_sample=False, suppress_tokens=SPECIAL)
    assert torch.equal(spec(**kw).sequences, spec.plain(**kw).sequences)
    BertModel(BertConfig(vocab_size=32, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                         intermediate_size=32)).save_pretrained(tmp_path / "bert")
    with pytest.raises(ValueError, match=r"BertModel .*not supported.*speech seq2seq.*register_loader"):
        SpeculativePipeline.from_pretrained(tmp_path / "bert", method="draft", draft=tmp_path / "lm-small")
    with pytest.raises(ValueError, match="not a transformers model folder"):
        load_model(tmp_path)
    register_loader("bert", lambda path, dtype=None, device=None: llama(seed=0))
    try:
        assert type(load_model(tmp_path / "bert")).__name__ == "LlamaForCausalLM"
    finally:
        from diffspec.multimodal import loading

        loading._LOADERS.pop("bert")
