"""LlamaGen GPT: teacher-forcing forward, causality, config validation, save/load, presets."""

from __future__ import annotations

import pytest
import torch

from diffspec.ar_image.targets.llamagen import LLAMAGEN_PRESETS, LlamaGenConfig, LlamaGenTransformer


def tiny_config(**kw) -> LlamaGenConfig:
    base = dict(
        dim=32,
        n_layer=2,
        n_head=2,
        vocab_size=24,
        num_classes=5,
        block_size=16,
        multiple_of=16,
        token_dropout_p=0.0,
        resid_dropout_p=0.0,
        ffn_dropout_p=0.0,
    )
    base.update(kw)
    return LlamaGenConfig(**base)


def random_model(config: LlamaGenConfig, seed: int = 0) -> LlamaGenTransformer:
    torch.manual_seed(seed)
    model = LlamaGenTransformer(config).eval()
    with torch.no_grad():  # the official init zeroes the output head: give it weights
        model.output.weight.normal_(std=0.5)
    return model


def test_forward_shape_and_causality():
    model = random_model(tiny_config())
    torch.manual_seed(1)
    idx = torch.randint(0, 24, (3, 16))
    cond = torch.tensor([0, 2, 4])
    logits = model(idx, cond)
    assert logits.shape == (3, 16, 24) and logits.dtype == torch.float32
    # row j sees only tokens < j: changing token 9 leaves rows 0..9 unchanged, changes row 10
    idx2 = idx.clone()
    idx2[:, 9] = (idx2[:, 9] + 1) % 24
    logits2 = model(idx2, cond)
    torch.testing.assert_close(logits2[:, :10], logits[:, :10])
    assert (logits2[:, 10] - logits[:, 10]).abs().max() > 1e-4
    # the condition matters
    assert (model(idx, torch.tensor([1, 2, 4]))[0] - logits[0]).abs().max() > 1e-4


def test_prefix_forward_matches_full():
    model = random_model(tiny_config())
    idx = torch.randint(0, 24, (2, 16), generator=torch.Generator().manual_seed(3))
    cond = torch.tensor([1, 3])
    torch.testing.assert_close(model(idx[:, :7], cond), model(idx, cond)[:, :7])


def test_class_dropout_uses_null_label():
    model = random_model(tiny_config())
    idx = torch.randint(0, 24, (2, 16), generator=torch.Generator().manual_seed(4))
    dropped = model(idx, torch.tensor([1, 3]), drop_condition=torch.tensor([True, False]))
    null = model(idx, torch.full((2,), 5))
    torch.testing.assert_close(dropped[0], null[0])
    torch.testing.assert_close(dropped[1], model(idx, torch.tensor([1, 3]))[1])


def test_save_load_roundtrip(tmp_path):
    config = tiny_config(grid_rows=2, grid_cols=8)
    model = random_model(config)
    model.save_pretrained(tmp_path / "m")
    loaded = LlamaGenTransformer.from_pretrained(tmp_path / "m")
    assert loaded.config == config and not loaded.training
    idx = torch.randint(0, 24, (2, 16), generator=torch.Generator().manual_seed(5))
    cond = torch.tensor([0, 4])
    torch.testing.assert_close(loaded(idx, cond), model(idx, cond), rtol=0, atol=0)


@pytest.mark.parametrize(
    ("field", "value"),
    [("dim", 30), ("n_kv_head", 3), ("model_type", "x2i"), ("block_size", 15), ("class_dropout_prob", 1.0)],
)
def test_config_validation_names_field(field, value):
    with pytest.raises(ValueError, match=field):
        tiny_config(**{field: value})


@pytest.mark.parametrize(("name", "millions"), [("GPT-B", 111), ("GPT-L", 343), ("GPT-XL", 775)])
def test_preset_parameter_counts(name, millions):
    # the official README's sizes (c2i, 256px): counts on the meta device, no memory used
    with torch.device("meta"):
        model = LlamaGenTransformer(LlamaGenConfig.from_preset(name, block_size=256))
    params = sum(p.numel() for p in model.parameters())
    assert abs(params / 1e6 - millions) / millions < 0.02, params
    assert set(LLAMAGEN_PRESETS) >= {"GPT-B", "GPT-L", "GPT-XL", "GPT-XXL", "GPT-3B"}


def test_grouped_kv_heads_equal_duplicated_full_heads():
    gqa = random_model(tiny_config(dim=64, n_head=4, n_kv_head=2), seed=6)
    mha = LlamaGenTransformer(tiny_config(dim=64, n_head=4)).eval()
    state = gqa.state_dict()
    for i in range(2):
        w = state[f"layers.{i}.attention.wqkv.weight"]
        q, k, v = w.split([64, 32, 32])
        dup = [t.reshape(2, 16, 64).repeat_interleave(2, dim=0).reshape(64, 64) for t in (k, v)]
        state[f"layers.{i}.attention.wqkv.weight"] = torch.cat([q, *dup])
    mha.load_state_dict(state)
    idx = torch.randint(0, 24, (2, 16), generator=torch.Generator().manual_seed(7))
    torch.testing.assert_close(gqa(idx, torch.tensor([0, 1])), mha(idx, torch.tensor([0, 1])))
