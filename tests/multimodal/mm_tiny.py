"""Tiny random-weight targets and drafters for the multimodal tests (no hub, built from configs).

``initializer_range`` 0.3 keeps greedy output from looping trivially; the VLM placeholder ids
are suppressed in every run (a random VLM emits them and its next pass would crash), which also
puts a logits processor on the path the loop must reproduce.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "ar_image"))
from ar_checks import chi2_fit, chi2_two_sample  # noqa: E402,F401  (shared statistics helpers)

VOCAB = 96
IMAGE_ID, VIDEO_ID, VSTART, VEND = 90, 91, 92, 93
SPECIAL = [IMAGE_ID, VIDEO_ID, VSTART, VEND]


def _text(vocab: int, hidden: int, layers: int) -> dict:
    return dict(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512, initializer_range=0.3,
                pad_token_id=0, bos_token_id=1, eos_token_id=2)


def llama(layers: int = 2, hidden: int = 64, seed: int = 0, vocab: int = VOCAB):
    """A Llama-style causal LM (target or text-only drafter)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    return LlamaForCausalLM(LlamaConfig(**_text(vocab, hidden, layers))).eval()


def llava(layers: int = 2, hidden: int = 64, seed: int = 0):
    """A LLaVA with a 2-layer CLIP tower on 16x16 images (4x4 patches: 16 image tokens)."""
    from transformers import CLIPVisionConfig, LlamaConfig, LlavaConfig, LlavaForConditionalGeneration

    torch.manual_seed(seed)
    vision = CLIPVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                              image_size=16, patch_size=4, projection_dim=32)
    cfg = LlavaConfig(vision_config=vision, text_config=LlamaConfig(**_text(VOCAB, hidden, layers)),
                      image_token_index=IMAGE_ID, vision_feature_layer=-1, vision_feature_select_strategy="default",
                      initializer_range=0.3)
    model = LlavaForConditionalGeneration(cfg).eval()
    model.generation_config.pad_token_id = 0
    model.generation_config.eos_token_id = 2
    return model


def qwen2_vl(layers: int = 2, hidden: int = 64, seed: int = 0):
    """A Qwen2-VL (M-RoPE) with a 1-block vision tower, patch 4, merge 2."""
    from transformers import Qwen2VLConfig, Qwen2VLForConditionalGeneration

    torch.manual_seed(seed)
    text = dict(_text(VOCAB, hidden, layers), rope_parameters={"rope_type": "default", "mrope_section": [2, 3, 3]})
    vision = dict(depth=1, embed_dim=32, hidden_size=hidden, num_heads=4, patch_size=4, spatial_merge_size=2,
                  temporal_patch_size=2, in_channels=3)
    cfg = Qwen2VLConfig(text_config=text, vision_config=vision, image_token_id=IMAGE_ID, video_token_id=VIDEO_ID,
                        vision_start_token_id=VSTART, vision_end_token_id=VEND)
    model = Qwen2VLForConditionalGeneration(cfg).eval()
    model.generation_config.pad_token_id = 0
    model.generation_config.eos_token_id = 2
    return model


def _pad_left(rows: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(r) for r in rows)
    ids = torch.zeros(len(rows), width, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, r in enumerate(rows):
        ids[i, width - len(r):] = r
        mask[i, width - len(r):] = 1
    return ids, mask


def text_prompts(batch: int, seed: int, lo: int = 3, hi: int = 9) -> dict:
    """Left-padded random prompts of different lengths (ids avoid the special ids)."""
    g = torch.Generator().manual_seed(seed)
    lens = torch.randint(lo, hi + 1, (batch,), generator=g).tolist()
    ids, mask = _pad_left([torch.randint(3, IMAGE_ID, (n,), generator=g) for n in lens])
    return {"input_ids": ids, "attention_mask": mask}


def llava_inputs(batch: int, seed: int) -> dict:
    """One 16x16 image per row (16 ``<image>`` tokens) between random text, left padded."""
    g = torch.Generator().manual_seed(seed)
    rows = []
    for _ in range(batch):
        pre, post = (torch.randint(3, IMAGE_ID, (int(n),), generator=g) for n in torch.randint(1, 5, (2,), generator=g))
        rows.append(torch.cat([pre, torch.full((16,), IMAGE_ID), post]))
    ids, mask = _pad_left(rows)
    return {"input_ids": ids, "attention_mask": mask, "pixel_values": torch.randn(batch, 3, 16, 16, generator=g)}


def qwen_inputs(batch: int, seed: int, video: bool = False) -> dict:
    """Qwen2-VL inputs: an 8x16 image (grid 1x2x4: 2 merged tokens) or a 4-frame video (grid 2x2x4 after temporal patches of 2)."""
    g = torch.Generator().manual_seed(seed)
    t = 2 if video else 1
    grid = torch.tensor([[t, 2, 4]] * batch)
    n_tok = t * 2 * 4 // 4
    token = VIDEO_ID if video else IMAGE_ID
    rows = []
    for _ in range(batch):
        pre, post = (torch.randint(3, IMAGE_ID, (int(n),), generator=g) for n in torch.randint(1, 5, (2,), generator=g))
        row = torch.cat([pre, torch.tensor([VSTART]), torch.full((n_tok,), token), torch.tensor([VEND]), post])
        rows.append(row)
    ids, mask = _pad_left(rows)
    mm = torch.where(ids == token, 2 if video else 1, 0)
    patches = torch.randn(batch * t * 2 * 4, 3 * 2 * 4 * 4, generator=g)
    key = "video" if video else "image"
    return {"input_ids": ids, "attention_mask": mask, "mm_token_type_ids": mm,
            f"pixel_values{'_videos' if video else ''}": patches, f"{key}_grid_thw": grid}


def noisy(model, scale: float, seed: int = 0):
    """A drafter from the target's own weights: ``scale`` 0 = the target itself (full acceptance);
    > 0 adds seeded Gaussian noise (``scale`` x the logits' std) to its logits (partial); ``inf`` rolls the logits by one id, so
    its argmax is never the target's (acceptance 0 without logits processors)."""
    import copy
    import functools

    base = type(model)
    g = torch.Generator().manual_seed(seed)

    @functools.wraps(base.forward)  # keeps the signature (pixel_values, ...) that callers inspect
    def forward(self, *args, **kwargs):
        out = base.forward(self, *args, **kwargs)
        if scale == float("inf"):
            out.logits = out.logits.roll(1, dims=-1)
        elif scale > 0:
            std = out.logits.std(-1, keepdim=True)
            out.logits = out.logits + scale * std * torch.randn(out.logits.shape, generator=g)
        return out

    drafter = copy.deepcopy(model)
    drafter.__class__ = type(f"Noisy{base.__name__}", (base,), {"forward": forward})
    return drafter


def accept_without_residual(drafts, p_logits, q, generator=None, *, draft_logits=False):
    """A planted bias in place of :func:`~diffspec.speculation.chain.sampling_accept` (same signature and draws):
    the correction after a rejection is drawn from ``p`` itself instead of the residual ``(p - q)_+``."""
    from diffspec import kernels

    B, k = drafts.shape
    u = torch.rand((B, k), generator=generator, device=drafts.device)
    u_res = torch.rand((B, k + 1), generator=generator, device=drafts.device)
    q = torch.softmax(q.float(), dim=-1) if draft_logits else q
    p = torch.softmax(p_logits.float(), dim=-1)
    p_d = p[:, :k].gather(2, drafts[..., None])[..., 0]
    q_d = q.float().gather(2, drafts[..., None])[..., 0]
    m = (u * q_d < p_d).long().cumprod(1).sum(1)
    p_m = p.gather(1, m[:, None, None].expand(B, 1, p.shape[-1]))[:, 0]
    correction = kernels.inverse_cdf(p_m, u_res.gather(1, m[:, None])[:, 0])
    tokens = torch.cat([drafts, correction[:, None]], dim=1).scatter(1, m[:, None], correction[:, None])
    return m, tokens
