"""``compressed-draft`` and ``self-draft``: exact greedy output, pruning really applied, prefill scores,
sampling law, configs and the pipeline path."""

from __future__ import annotations

import pytest
import torch
from mm_tiny import SPECIAL, chi2_fit, llama, noisy, qwen2_vl, qwen_inputs
from mm_tiny_next import (
    llava_next,
    llava_next_inputs,
    llava_next_processor,
    llava_next_video,
    llava_next_video_inputs,
    qwen2_5_vl,
    qwen2_5_vl_inputs,
)
from test_exact_greedy_families import check_exact
from test_mm_sampling import TEMP, N, V, _exact_pair_law

from diffspec import SpeculativePipeline, methods
from diffspec.multimodal.compressed_config import CompressedDraftConfig
from diffspec.multimodal.loop import speculative_generate
from diffspec.multimodal.self_config import SelfDraftConfig
from diffspec.multimodal.strategies import CompressedDraft, SelfDraft, strategy_for
from diffspec.multimodal.visual import AttentionProbe, visual_mask
from diffspec.stats import SpecStats

FAMILIES = {
    "llava-next": (llava_next, lambda b, s: llava_next_inputs(b, s)),
    "llava-next-video": (llava_next_video, lambda b, s: llava_next_video_inputs(b, s, frames=4)),
    "qwen2.5-vl-image": (qwen2_5_vl, lambda b, s: qwen2_5_vl_inputs(b, s)),
    "qwen2.5-vl-video": (qwen2_5_vl, lambda b, s: qwen2_5_vl_inputs(b, s, video=True, frames=4, side=24)),
    "qwen2-vl-video": (qwen2_vl, lambda b, s: qwen_inputs(b, s, video=True)),
}
_models: dict = {}


def _target(name):
    build = FAMILIES[name][0]
    if build not in _models:
        _models[build] = build(layers=3)
    return _models[build]


def _run(target, drafter, inputs, cfg, k=3):
    return check_exact(target, drafter, inputs, k=k, draft_strategy=strategy_for(cfg))


COMPRESSED = {
    "uniform": CompressedDraftConfig(image_keep=0.5, video_keep=0.25),
    "attention": CompressedDraftConfig(image_keep=0.3, video_keep=0.2, image_selection="attention",
                                       video_selection="attention"),
    "mixed": CompressedDraftConfig(image_keep=0.5, video_keep=0.3, image_selection="mixed"),
}
SELF = {
    "sparse": SelfDraftConfig(visual_top_k=3, visual_ratio=0.1),
    "skip": SelfDraftConfig(visual_top_k=0, visual_ratio=0.0, draft_layers=(0, 2)),
    "both": SelfDraftConfig(visual_top_k=2, visual_ratio=0.0, draft_layers=(1,)),
}


@pytest.mark.parametrize("name", list(FAMILIES))
@pytest.mark.parametrize("batch", [1, 3, 8])
def test_compressed_draft_greedy_identical(name, batch):
    target = _target(name)
    small = FAMILIES[name][0](layers=1, hidden=64, seed=5)
    for i, cfg in enumerate(COMPRESSED.values()):
        inputs = FAMILIES[name][1](batch, 10 * batch + i)
        _run(target, small, inputs, cfg)
        _run(target, noisy(target, 0.5, i), inputs, cfg)


@pytest.mark.parametrize("name", list(FAMILIES))
@pytest.mark.parametrize("batch", [1, 3, 8])
def test_self_draft_greedy_identical(name, batch):
    target = _target(name)
    for i, cfg in enumerate(SELF.values()):
        _run(target, None, FAMILIES[name][1](batch, 20 * batch + i), cfg, k=2 + i)


@pytest.mark.parametrize("name", ["llava-next-video", "qwen2.5-vl-video"])
def test_full_context_drafts_are_fully_accepted(name):
    """Keeping every visual token (compressed, drafter = target copy) and every KV entry with all
    layers (self) reproduces the target: acceptance 1, so pruned positions and the cache view are right."""
    target = _target(name)
    inputs = FAMILIES[name][1](3, 1)
    keep_all = CompressedDraftConfig(image_keep=1.0, video_keep=1.0, video_selection="attention")
    assert _run(target, noisy(target, 0.0), inputs, keep_all).acceptance_rate == 1.0
    assert _run(target, None, inputs, SelfDraftConfig(visual_top_k=10**6)).acceptance_rate == 1.0
    stats = _run(target, None, inputs, SelfDraftConfig(visual_top_k=2, visual_ratio=0.0))
    assert stats.acceptance_rate < 1.0  # 2 of 16+ visual entries: the draft pass really is sparse


class _Spy(CompressedDraft):
    def prepare(self, *args, **kwargs):
        self.state = super().prepare(*args, **kwargs)
        self.width = self.state.mask.shape[1]
        return self.state


def test_compressed_drafter_cache_holds_text_plus_kept_visual():
    target = _target("llava-next-video")
    inputs = llava_next_video_inputs(3, 2, frames=5)  # 20 video tokens per row
    cfg = CompressedDraftConfig(video_keep=0.25, video_selection="attention")
    spy = _Spy(cfg)
    drafter = llava_next_video(layers=1, seed=6)
    target.generate(**inputs, max_new_tokens=3, do_sample=False, suppress_tokens=SPECIAL,
                    custom_generate=speculative_generate, drafter=drafter, drafter_inputs=inputs, draft_strategy=spy)
    mask = inputs["attention_mask"]
    text = (mask.bool() & ~visual_mask(target, inputs["input_ids"], mask, {})).sum(1)
    assert spy.width == int((text + 5).max())  # 5 = ceil(0.25 * 20) video tokens kept per row


@pytest.mark.parametrize("name", ["qwen2.5-vl-image", "llava-next-video"])
def test_attention_probe_matches_eager_attention(name):
    """The prefill score equals the eager attention of the last rows, averaged over heads and probed layers."""
    target = FAMILIES[name][0](layers=4, seed=3)
    target.set_attn_implementation("eager")
    inputs = FAMILIES[name][1](3, 4)
    with torch.no_grad(), AttentionProbe(target, inputs["attention_mask"], rows=4) as probe:
        out = target(**inputs, output_attentions=True)
    assert probe.layer_ids == [1, 2, 3]
    ref = torch.stack([out.attentions[i][:, :, -4:].mean(dim=(1, 2)) for i in probe.layer_ids]).mean(0)
    torch.testing.assert_close(probe.scores, ref, atol=1e-5, rtol=1e-4)
    assert torch.allclose(probe.scores.sum(1), torch.ones(3), atol=1e-5)


def test_self_draft_sampling_law_matches_target():
    """Layer-skip self drafting with sampling: the law of tokens 2-3 is the target's (chi-square)."""
    target = llama(layers=2, hidden=32, seed=0, vocab=V)
    prompt = torch.tensor([[1, 5, 9, 3]])
    g = torch.Generator().manual_seed(0)
    stats = SpecStats()
    out = target.generate(input_ids=prompt.expand(N, -1), attention_mask=torch.ones(N, 4, dtype=torch.long),
                          max_new_tokens=3, do_sample=True, temperature=TEMP, top_k=0, eos_token_id=None,
                          custom_generate=speculative_generate, num_draft_tokens=2, generator=g, spec_stats=stats,
                          draft_strategy=SelfDraft(SelfDraftConfig(visual_top_k=0, visual_ratio=0.0, draft_layers=(1,))))
    new = out[:, 4:]
    assert 0.1 < stats.acceptance_rate < 0.95
    assert chi2_fit(new[:, 1] * V + new[:, 2], _exact_pair_law(target, prompt))[2] > 1e-3


def test_configs_validate_and_register():
    info = {m.name: m for m in methods("multimodal", available_only=True)}
    assert info["compressed-draft"].config_class is CompressedDraftConfig and info["compressed-draft"].exact
    assert info["self-draft"].config_class is SelfDraftConfig and info["self-draft"].exact
    with pytest.raises(ValueError, match=r"video_keep=0 is out of range"):
        CompressedDraftConfig(video_keep=0)
    with pytest.raises(ValueError, match="image_selection='pool'"):
        CompressedDraftConfig(image_selection="pool")
    with pytest.raises(ValueError, match=r"draft_layers=\(1, 1\)"):
        SelfDraftConfig(draft_layers=(1, 1))
    with pytest.raises(ValueError, match="drafts with the full target"):
        SelfDraftConfig(visual_top_k=0, visual_ratio=0.0)
    assert SelfDraftConfig(draft_layers=[3, 0]).draft_layers == (0, 3)


def test_pipeline_self_and_compressed_draft_with_processor():
    model = llava_next(layers=3, seed=2)
    processor = llava_next_processor()
    images = [(torch.rand(h, w, 3, generator=torch.Generator().manual_seed(h)) * 255).to(torch.uint8).numpy()
              for h, w in ((16, 28), (24, 24))]
    call = dict(text=["w4 <image> w9 w10", "<image> w5"], images=images, max_new_tokens=8, do_sample=False,
                suppress_tokens=SPECIAL)
    ref = SpeculativePipeline.from_pipe((model, processor), method="self-draft", visual_top_k=4).plain(**call)
    spec = SpeculativePipeline.from_pipe((model, processor), method="self-draft", visual_top_k=4, draft_layers=(0, 1))
    assert torch.equal(spec(**call).sequences, ref.sequences) and spec.stats.draft_calls > 0
    spec = SpeculativePipeline.from_pipe((model, processor), method="compressed-draft", draft=llava_next(layers=1),
                                         image_keep=0.5)
    assert torch.equal(spec(**call).sequences, ref.sequences) and spec.stats.proposed > 0
    with pytest.raises(ValueError, match="drafts with the target itself"):
        SpeculativePipeline.from_pipe(model, method="self-draft", draft=model)
    with pytest.raises(ValueError, match=r"draft_layers=\(0, 7\) is out of range.*\[0, 2\]"):
        SpeculativePipeline.from_pipe((model, processor), method="self-draft", draft_layers=(0, 7))(**call)
