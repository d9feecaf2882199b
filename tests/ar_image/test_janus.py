"""Janus (transformers, unmodified) as an AR image target: conditioning, session semantics, greedy parity."""

from __future__ import annotations

import pytest
import torch
from ar_stepping import greedy_by_steps

from diffspec.ar_image.targets.janus import JanusTarget

transformers = pytest.importorskip("transformers")


def tiny_janus(seed: int = 0):
    from transformers import GenerationConfig, JanusConfig, JanusForConditionalGeneration

    torch.manual_seed(seed)
    config = JanusConfig(
        text_config=dict(model_type="llama", hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, vocab_size=100, max_position_embeddings=256,
                         pad_token_id=0, bos_token_id=1),
        vision_config=dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=4, image_size=64, patch_size=16,
                           projection_dim=32, num_image_tokens=16, depth=1),
        vq_config=dict(embed_dim=8, num_embeddings=64, latent_channels=32, base_channels=32,
                       channel_multiplier=[1, 1, 2], num_res_blocks=1, num_patches=4, projection_dim=32,
                       image_token_embed_dim=32, num_hidden_layers=1),
        image_token_id=99,
    )
    model = JanusForConditionalGeneration(config).eval()
    model.generation_config = GenerationConfig(bos_token_id=1, pad_token_id=0, eos_token_id=2,
                                               generation_kwargs={"boi_token_id": 98})
    return model


PROMPTS = torch.tensor([[1, 5, 6, 7, 8, 98], [0, 0, 1, 9, 10, 98]])  # second row left-padded
MASK = (PROMPTS != 0).long()


@pytest.mark.parametrize("rows,chunk", [(1, 1), (2, 3)])
def test_greedy_matches_transformers_generate(rows, chunk):
    """Token for token, including a left-padded row and windows re-fed from earlier positions."""
    model = tiny_janus()
    target = JanusTarget(model)
    assert target.grid == (4, 4) and target.codebook_size == 64
    with torch.no_grad():
        ref = model.generate(PROMPTS[:rows], attention_mask=MASK[:rows], generation_mode="image", do_sample=False,
                             guidance_scale=3.0, max_length=64)
        session = target.start(input_ids=PROMPTS[:rows], attention_mask=MASK[:rows], guidance_scale=3.0)
        ours = greedy_by_steps(session, 16, chunk)
    assert torch.equal(ours, ref)


def test_rollback_and_ragged_rows_match_a_fresh_session():
    target = JanusTarget(tiny_janus(1))
    torch.manual_seed(0)
    tokens = torch.randint(0, 64, (2, 16))
    with torch.no_grad():
        fresh = target.start(input_ids=PROMPTS, attention_mask=MASK, guidance_scale=2.0)
        full = fresh.step(tokens[:, :12], torch.zeros(2, dtype=torch.long))  # predicts 1..12
        s = target.start(input_ids=PROMPTS, attention_mask=MASK, guidance_scale=2.0)
        s.step(torch.randint(0, 64, (2, 10)), torch.zeros(2, dtype=torch.long))  # junk drafts, then roll back
        s.step(tokens[:, :6], torch.zeros(2, dtype=torch.long))
        ragged = s.step(torch.stack([tokens[0, 6:9], tokens[1, 3:6]]), torch.tensor([6, 3]))
    torch.testing.assert_close(ragged[0], full[0, 6:9], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(ragged[1], full[1, 3:6], atol=1e-4, rtol=1e-4)


def test_row_does_not_depend_on_its_batch():
    target = JanusTarget(tiny_janus(2))
    tokens = torch.randint(0, 64, (2, 8), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        both = target.start(input_ids=PROMPTS, attention_mask=MASK, guidance_scale=2.0)
        pair = both.step(tokens, torch.zeros(2, dtype=torch.long))
        alone = target.start(input_ids=PROMPTS[1:], attention_mask=MASK[1:], guidance_scale=2.0)
        single = alone.step(tokens[1:], torch.zeros(1, dtype=torch.long))
    torch.testing.assert_close(both.first_logits[1:], alone.first_logits, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(pair[1:], single, atol=1e-4, rtol=1e-4)


def test_decode_and_errors():
    model = tiny_janus()
    target = JanusTarget(model)
    images = target.decode_tokens(torch.randint(0, 64, (2, 16)))
    assert images.shape == (2, 3, 16, 16) and images.abs().max() <= 1
    with pytest.raises(ValueError, match="processor"):
        target.start(prompt=["a fox"])
    with pytest.raises(ValueError, match="class_labels"):
        target.start(class_labels=[1])
    with pytest.raises(ValueError, match="JanusForConditionalGeneration"):
        JanusTarget(torch.nn.Linear(2, 2))
    from diffspec import SpeculativePipeline

    with pytest.raises(ValueError, match=r"JanusTarget\(model, processor\)"):
        SpeculativePipeline.from_pipe(model, method="sjd")  # the raw transformers model: say how to wrap it


@pytest.mark.parametrize("method", ["sjd", "mc-sjd"])
def test_speculative_greedy_equals_generate(method):
    """Through diffspec's engine (windows, ragged rows): greedy tokens equal transformers' own loop."""
    from diffspec import SpeculativePipeline

    model = tiny_janus(3)
    with torch.no_grad():
        ref = model.generate(PROMPTS, attention_mask=MASK, generation_mode="image", do_sample=False,
                             guidance_scale=5.0, max_length=64)
    spec = SpeculativePipeline.from_pipe(JanusTarget(model), method=method, window=4, temperature=0.0)
    out = spec(input_ids=PROMPTS, attention_mask=MASK, output_type="pt")
    assert torch.equal(out.tokens, ref) and out.images.shape == (2, 3, 16, 16)
    assert spec.stats.target_calls <= 16 and spec.stats.target_evals == 2 * spec.stats.target_calls
