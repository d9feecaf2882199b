"""Emu3 (transformers, unmodified) as an AR image target: row structure, log-prob CFG, greedy parity."""

from __future__ import annotations

import pytest
import torch
from ar_stepping import greedy_by_steps

from diffspec.ar_image.targets.emu3 import Emu3Target

pytest.importorskip("transformers")

K, VIS0 = 32, 20
EOL, WRAP = VIS0 + K, VIS0 + K + 1
EOF_, EOI, EOS, PAD = WRAP + 1, WRAP + 2, 2, 0
H, W = 3, 4


def tiny_emu3(seed: int = 0):
    from transformers import Emu3Config, Emu3ForConditionalGeneration

    vocab = {f"<|visual token {i:06d}|>": VIS0 + i for i in range(K)}
    vocab.update({"<|extra_200|>": EOL, "<image>": 3})
    config = Emu3Config(
        vq_config=dict(codebook_size=K, embed_dim=4, latent_channels=4, base_channels=32, channel_multiplier=[1, 2],
                       num_res_blocks=1, attn_resolutions=[], hidden_size=64, num_attention_heads=1,
                       temporal_downsample_factor=4),
        text_config=dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                         pad_token_id=PAD, bos_token_id=1, eos_token_id=EOS, attention_dropout=0.0),
        vocabulary_map=vocab,
    )
    torch.manual_seed(seed)
    return Emu3ForConditionalGeneration(config).eval()


def allowed_tokens(model):
    """transformers' documented Emu3 image-generation constraint (rows of W visual tokens + EOL)."""
    visual = model.vocabulary_mapping.image_tokens

    def allowed(batch_id, ids):
        offset = ids.shape[0] - torch.nonzero(ids == WRAP, as_tuple=True)[0][0]
        if offset % (W + 1) == 0:
            return (EOL,)
        for k, token in enumerate((EOF_, EOI, EOS), start=1):
            if offset == (W + 1) * H + k:
                return (token,)
        return (PAD,) if offset > (W + 1) * H + 3 else visual

    return allowed


PROMPT = torch.tensor([[1, 5, 6, 7, WRAP]])
NEGATIVE = torch.tensor([[1, WRAP]])


def test_greedy_matches_transformers_generate_with_negative_prompt():
    model = tiny_emu3()
    target = Emu3Target(model, height=H, width=W)
    assert target.grid == (H, W + 1) and target.codebook_size == K + 1
    with torch.no_grad():
        ref = model.generate(PROMPT, attention_mask=torch.ones_like(PROMPT), max_new_tokens=(W + 1) * H + 3,
                             prefix_allowed_tokens_fn=allowed_tokens(model), do_sample=False, guidance_scale=3.0,
                             negative_prompt_ids=NEGATIVE, negative_prompt_attention_mask=torch.ones_like(NEGATIVE))
        session = target.start(input_ids=PROMPT, negative_input_ids=NEGATIVE, guidance_scale=3.0)
        ours = greedy_by_steps(session, target.num_tokens, chunk=2)
    expected = ref[:, PROMPT.shape[1]: PROMPT.shape[1] + target.num_tokens]
    assert torch.equal(target.vocab_ids[ours], expected)
    forced = session.forced_tokens()
    assert torch.equal(forced >= 0, torch.arange(target.num_tokens) % (W + 1) == W)
    assert (ours[:, forced >= 0] == K).all()
    images = target.decode_tokens(ours)
    reference = model.decode_image_tokens(image_tokens=ref[:, PROMPT.shape[1]:], height=H, width=W)
    torch.testing.assert_close(images, reference.float().clamp(-1, 1))


def test_row_structure_is_applied_to_every_predicted_position():
    target = Emu3Target(tiny_emu3(1), height=H, width=W)
    with torch.no_grad():
        session = target.start(input_ids=PROMPT.repeat(2, 1), negative_input_ids=NEGATIVE, guidance_scale=2.0)
        logits = session.step(torch.randint(0, K, (2, 8), generator=torch.Generator().manual_seed(0)),
                              torch.tensor([0, 3]))
    predicted = torch.tensor([0, 3])[:, None] + torch.arange(1, 9)
    eol = predicted % (W + 1) == W
    finite = logits.isfinite()
    assert (finite[..., -1] == eol).all() and (finite[..., :-1].all(-1) == ~eol).all()


def test_errors_name_what_to_pass():
    target = Emu3Target(tiny_emu3(), height=H, width=W)
    with pytest.raises(ValueError, match="negative_input_ids"):
        target.start(input_ids=PROMPT, guidance_scale=3.0)
    with pytest.raises(ValueError, match="input_ids="):
        target.start(prompt=["a fox"])
    with pytest.raises(ValueError, match="height"):
        Emu3Target(tiny_emu3(), height=0, width=W)
    with pytest.raises(ValueError, match="Emu3ForConditionalGeneration"):
        Emu3Target(torch.nn.Linear(2, 2), height=H, width=W)


@pytest.mark.parametrize("method", ["sjd", "mc-sjd"])
def test_speculative_greedy_equals_generate(method):
    """Through diffspec's engine, forced end-of-row slots included: greedy tokens equal generate's."""
    from diffspec import SpeculativePipeline

    model = tiny_emu3(2)
    target = Emu3Target(model, height=H, width=W)
    with torch.no_grad():
        ref = model.generate(PROMPT, attention_mask=torch.ones_like(PROMPT), max_new_tokens=(W + 1) * H + 3,
                             prefix_allowed_tokens_fn=allowed_tokens(model), do_sample=False, guidance_scale=3.0,
                             negative_prompt_ids=NEGATIVE, negative_prompt_attention_mask=torch.ones_like(NEGATIVE))
    spec = SpeculativePipeline.from_pipe(target, method=method, window=5, temperature=0.0)
    out = spec(input_ids=PROMPT, negative_input_ids=NEGATIVE, output_type="tokens")
    assert torch.equal(target.vocab_ids[out.tokens], ref[:, PROMPT.shape[1]: PROMPT.shape[1] + target.num_tokens])
    sampled = spec(input_ids=PROMPT.repeat(3, 1), negative_input_ids=NEGATIVE, output_type="tokens",
                   temperature=1.0, generator=torch.Generator().manual_seed(0)).tokens
    assert (sampled[:, W:: W + 1] == K).all() and (sampled.reshape(3, H, W + 1)[..., :W] < K).all()
