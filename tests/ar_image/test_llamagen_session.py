"""LlamaGen session: cached logits equal teacher forcing, per-row positions, rollback, CFG, t2i masks."""

from __future__ import annotations

import pytest
import torch
from test_llamagen_model import random_model, tiny_config  # same folder (pytest rootdir import)

from diffspec.ar_image.target import mix_cfg
from diffspec.ar_image.targets.llamagen_session import LlamaGenTarget, prepare_caption

TOL = {"rtol": 1e-4, "atol": 1e-4}


def make_target(seed: int = 0, **kw) -> LlamaGenTarget:
    model = random_model(tiny_config(**{"n_kv_head": 1, **kw}), seed=seed)
    if model.config.model_type == "t2i":
        with torch.no_grad():
            model.cls_embedding.uncond_embedding.normal_()
    return LlamaGenTarget(model)


def tf_logits(target: LlamaGenTarget, tokens: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Teacher-forcing reference: (B, N, V), row j predicts token j."""
    with torch.no_grad():
        return target.model(tokens, labels)


def test_step_matches_teacher_forcing_token_by_token_and_in_chunks():
    target = make_target()
    labels = torch.tensor([1, 4])
    tokens = torch.randint(0, 24, (2, 16), generator=torch.Generator().manual_seed(1))
    ref = tf_logits(target, tokens, labels)
    session = target.start(class_labels=labels)
    assert session.cfg_branches == 1 and session.batch_size == 2
    torch.testing.assert_close(session.first_logits, ref[:, 0], **TOL)
    rows = [session.step(tokens[:, i : i + 1], torch.full((2,), i)) for i in range(15)]
    torch.testing.assert_close(torch.cat(rows, 1), ref[:, 1:16], **TOL)
    chunked = target.start(class_labels=labels)
    parts = [chunked.step(tokens[:, s : s + 5], torch.full((2,), s)) for s in (0, 5, 10)]
    torch.testing.assert_close(torch.cat(parts, 1), ref[:, 1:16], **TOL)


def test_ragged_rows_are_independent_and_rollback_reproduces():
    target = make_target(seed=2)
    labels = torch.tensor([0, 3, 2])
    tokens = torch.randint(0, 24, (3, 16), generator=torch.Generator().manual_seed(2))
    ref = tf_logits(target, tokens, labels)
    session = target.start(class_labels=labels)
    session.step(tokens[:, :8], torch.zeros(3, dtype=torch.long))  # everyone has 8 tokens cached
    # pollute: feed junk at positions 8..13 for all rows
    session.step(
        torch.randint(0, 24, (3, 6), generator=torch.Generator().manual_seed(9)), torch.full((3,), 8)
    )
    # ragged rollback: rows restart at 2, 5, 8 (stale junk beyond is masked out, then overwritten)
    start = torch.tensor([2, 5, 8])
    window = torch.stack([tokens[b, s : s + 4] for b, s in enumerate(start.tolist())])
    out = session.step(window, start)
    expect = torch.stack([ref[b, s + 1 : s + 5] for b, s in enumerate(start.tolist())])
    torch.testing.assert_close(out, expect, **TOL)
    # a row alone gives the same logits as inside the ragged batch
    solo = target.start(class_labels=labels[1:2])
    solo.step(tokens[1:2, :5], torch.zeros(1, dtype=torch.long))
    torch.testing.assert_close(solo.step(window[1:2], start[1:2]), out[1:2], **TOL)


def test_window_past_image_end_is_harmless():
    target = make_target(seed=3)
    labels = torch.tensor([1])
    tokens = torch.randint(0, 24, (1, 16), generator=torch.Generator().manual_seed(3))
    ref = tf_logits(target, tokens, labels)
    session = target.start(class_labels=labels)
    session.step(tokens[:, :12], torch.zeros(1, dtype=torch.long))
    over = torch.cat([tokens[:, 12:], torch.tensor([[5, 6, 7]])], 1)  # 4 real + 3 past the end
    out = session.step(over, torch.tensor([12]))
    assert out.shape == (1, 7, 24)
    torch.testing.assert_close(out[:, :3], ref[:, 13:16], **TOL)
    torch.testing.assert_close(session.step(tokens[:, 12:14], torch.tensor([12])), ref[:, 13:15], **TOL)


@pytest.mark.parametrize("scale", [0.0, 3.5])
def test_cfg_mixing_formula(scale):
    target = make_target(seed=4)
    labels = torch.tensor([2, 0])
    tokens = torch.randint(0, 24, (2, 16), generator=torch.Generator().manual_seed(4))
    cond, uncond = tf_logits(target, tokens, labels), tf_logits(target, tokens, torch.full((2,), 5))
    expect = uncond + scale * (cond - uncond)
    session = target.start(class_labels=labels, guidance_scale=scale)
    assert session.cfg_branches == 2
    torch.testing.assert_close(session.first_logits, expect[:, 0], **TOL)
    torch.testing.assert_close(
        session.step(tokens[:, :6], torch.zeros(2, dtype=torch.long)), expect[:, 1:7], **TOL
    )
    torch.testing.assert_close(mix_cfg(torch.stack([cond, uncond]).flatten(0, 1), 2, scale), expect)


def test_non_square_grid():
    target = make_target(seed=5, block_size=12, grid_rows=3, grid_cols=4)
    assert target.grid == (3, 4) and target.num_tokens == 12
    rope = target.model.rope(torch.device("cpu"))
    assert rope.shape == (13, 8, 2)
    # token (r=1, c=2) = index 6 (+1 class slot): row pairs turn by angle 1*f, column pairs by 2*f
    angles = torch.atan2(rope[7, :, 1], rope[7, :, 0])
    torch.testing.assert_close(angles[4:], 2 * angles[:4])
    torch.testing.assert_close(rope[0], torch.zeros(8, 2))  # condition slot: zero table (official)
    labels = torch.tensor([3])
    tokens = torch.randint(0, 24, (1, 12), generator=torch.Generator().manual_seed(5))
    session = target.start(class_labels=labels)
    out = session.step(tokens[:, :11], torch.zeros(1, dtype=torch.long))
    torch.testing.assert_close(out, tf_logits(target, tokens, labels)[:, 1:12], **TOL)


def test_t2i_caption_mask_and_padding():
    target = make_target(seed=6, model_type="t2i", cls_token_num=6, caption_dim=10)
    emb = torch.randn(2, 4, 10, generator=torch.Generator().manual_seed(6))
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]], dtype=torch.bool)
    cond, cmask = prepare_caption(emb, mask, 6)
    assert cmask.tolist() == [[False] * 3 + [True] * 3, [False] * 2 + [True] * 4]
    torch.testing.assert_close(cond[0, 3:], emb[0, :3])
    torch.testing.assert_close(cond[1, 2:], emb[1])
    tokens = torch.randint(0, 24, (2, 16), generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        ref = target.model(tokens, cond, cond_mask=cmask)
        # the padded caption slots are invisible: changing them changes nothing
        junk = torch.where(cmask[..., None], cond, torch.randn_like(cond))
        torch.testing.assert_close(target.model(tokens, junk, cond_mask=cmask), ref, **TOL)
    session = target.start(prompt_embeds=emb, prompt_mask=mask, guidance_scale=1.0)
    torch.testing.assert_close(session.first_logits, ref[:, 0], **TOL)
    torch.testing.assert_close(
        session.step(tokens[:, :9], torch.zeros(2, dtype=torch.long)), ref[:, 1:10], **TOL
    )
    cfg_session = target.start(prompt_embeds=emb, prompt_mask=mask, guidance_scale=2.0)
    assert cfg_session.first_logits.shape == (2, 24)


def test_start_rejects_bad_conditions():
    target = make_target()
    with pytest.raises(ValueError, match="class_labels"):
        target.start(class_labels=[5])
    with pytest.raises(ValueError, match="prompt_embeds"):
        target.start(prompt=["a cat"])
    with pytest.raises(ValueError, match="decoder"):
        target.decode_tokens(torch.zeros(1, 16, dtype=torch.long))
    t2i = make_target(model_type="t2i", cls_token_num=4, caption_dim=8)
    with pytest.raises(ValueError, match="prompt_embeds"):
        t2i.start(class_labels=[1])
    with pytest.raises(ValueError, match="cls_token_num"):
        t2i.start(prompt_embeds=torch.zeros(1, 5, 8))


def test_bfloat16_weights_keep_fp32_rope_and_logits():
    target = make_target(seed=8)
    labels = torch.tensor([1, 2])
    tokens = torch.randint(0, 24, (2, 16), generator=torch.Generator().manual_seed(8))
    ref = tf_logits(target, tokens, labels)
    target.model.to(torch.bfloat16)
    assert target.model.rope(torch.device("cpu")).dtype == torch.float32
    session = target.start(class_labels=labels, guidance_scale=2.0)
    assert session.caches[0][0].dtype == torch.bfloat16
    out = session.step(tokens[:, :8], torch.zeros(2, dtype=torch.long))
    assert out.dtype == torch.float32 and session.first_logits.dtype == torch.float32
    uncond = tf_logits(target, tokens, torch.full((2,), 5))  # bf16 reference for the CFG mix
    cond = tf_logits(target, tokens, labels)
    torch.testing.assert_close(out, (uncond + 2.0 * (cond - uncond))[:, 1:9], rtol=0.05, atol=0.1)
    assert (cond - ref).abs().max() < 0.25 * ref.abs().max()
