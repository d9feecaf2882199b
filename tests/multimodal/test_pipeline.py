"""SpeculativePipeline.from_pipe for the multimodal family: registry, draft= drafter, processor inputs, errors."""

from __future__ import annotations

import pytest
import torch
from mm_tiny import SPECIAL, llama, noisy, qwen2_vl, qwen_inputs, text_prompts

from diffspec import SpeculativePipeline, methods
from diffspec.multimodal.config import DraftConfig, TextDraftConfig
from diffspec.pipelines.multimodal import MultimodalOutput, MultimodalPipeline


def test_registry_entries_available():
    info = {m.name: m for m in methods("multimodal", available_only=True)}
    assert info["draft"].config_class is DraftConfig and info["draft"].exact
    assert info["text-draft"].config_class is TextDraftConfig


def test_config_validation_names_field_value_range():
    with pytest.raises(ValueError, match=r"num_draft_tokens=0 is out of range: allowed \[1, 64\]"):
        DraftConfig(num_draft_tokens=0)
    with pytest.raises(ValueError, match="schedule='dynamic'"):
        DraftConfig(schedule="dynamic")
    with pytest.raises(ValueError, match="max_draft_tokens=2"):
        DraftConfig(num_draft_tokens=4, max_draft_tokens=2)


def test_from_pipe_with_drafter_matches_plain_and_round_trips(tmp_path):
    """The target is saved and reloaded locally (no hub); spec call == plain call, stats filled."""
    from transformers import AutoModelForCausalLM

    llama(seed=0).save_pretrained(tmp_path / "target")
    target = AutoModelForCausalLM.from_pretrained(tmp_path / "target").eval()
    spec = SpeculativePipeline.from_pipe(target, method="draft", draft=noisy(target, 0.3), num_draft_tokens=4,
                                         schedule="heuristic")
    assert isinstance(spec, MultimodalPipeline) and spec.config.schedule == "heuristic"
    inputs = text_prompts(3, seed=4)
    out = spec(**inputs, max_new_tokens=12, do_sample=False)
    assert isinstance(out, MultimodalOutput) and out.text is None
    assert torch.equal(out.sequences, target.generate(**inputs, max_new_tokens=12, do_sample=False))
    s = spec.stats
    assert out.spec_stats is s
    assert s.target_calls >= 2 and s.draft_calls > s.target_calls - 1 and 0 < s.accepted <= s.proposed
    assert s.extra["accepted_per_round"] > 0 and s.wall_s > 0
    assert torch.equal(spec.plain(**inputs, max_new_tokens=12, do_sample=False).sequences, out.sequences)
    assert spec.stats.target_calls == 0  # a plain call counts nothing


class _FakeProcessor:
    """Stands in for a Qwen2-VL processor: text + images -> tensors, and batch_decode."""

    def __call__(self, text, images=None, return_tensors="pt", padding=True):
        assert images is not None and len(text) == len(images)
        return qwen_inputs(len(text), seed=9)

    def batch_decode(self, ids, skip_special_tokens=True):
        return [" ".join(str(i) for i in row.tolist()) for row in ids]


def test_text_draft_on_qwen2_vl_with_processor_inputs():
    target = qwen2_vl()
    spec = SpeculativePipeline.from_pipe((target, _FakeProcessor()), method="text-draft",
                                         draft=llama(layers=1, hidden=32, seed=2))
    out = spec(text=["a", "b"], images=[None, None], max_new_tokens=8, do_sample=False, suppress_tokens=SPECIAL)
    ref = target.generate(**qwen_inputs(2, seed=9), max_new_tokens=8, do_sample=False, suppress_tokens=SPECIAL)
    assert torch.equal(out.sequences, ref)
    assert len(out.text) == 2 and out.new_tokens.shape[1] == 8
    spec.disable()
    assert torch.equal(spec(text=["a", "b"], images=[0, 0], max_new_tokens=8, do_sample=False,
                            suppress_tokens=SPECIAL).sequences, ref)


def test_errors_are_clear(tiny_dit_pipe):
    target = llama()
    with pytest.raises(ValueError, match="needs draft="):
        SpeculativePipeline.from_pipe(target, method="draft")
    from transformers import BertConfig, BertModel

    bert = BertModel(BertConfig(vocab_size=32, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                intermediate_size=32))
    with pytest.raises(ValueError, match="not supported; supported: transformers generative models"):
        SpeculativePipeline.from_pipe(bert, method="draft", draft=target)
    with pytest.raises(ValueError, match="unsupported target"):
        SpeculativePipeline.from_pipe(object(), method="draft", draft=target)
    with pytest.raises(ValueError, match="methods for it: draft, text-draft"):
        SpeculativePipeline.from_pipe(target, method="taylor")
    with pytest.raises(ValueError, match="draft"):  # not a taylor field (only multimodal methods take a drafter)
        SpeculativePipeline.from_pipe(tiny_dit_pipe, method="taylor", draft=target)
