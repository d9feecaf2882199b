"""Loading official-layout LlamaGen checkpoints (.pt) and diffspec folders, strictly."""

from __future__ import annotations

import pytest
import torch

from diffspec.ar_image.targets.llamagen import LlamaGenConfig, LlamaGenTransformer
from diffspec.ar_image.targets.llamagen_load import (
    load_llamagen,
    load_state_strict,
    read_checkpoint,
    unwrap_checkpoint,
)
from diffspec.ar_image.targets.llamagen_vq import VQConfig, VQModel

GPT = dict(dim=32, n_layer=1, n_head=2, multiple_of=16)
VQ = dict(ch=32, encoder_ch_mult=(1, 2), decoder_ch_mult=(1, 2), z_channels=32, num_res_blocks=1)


def official_keys(model_type: str) -> set[str]:
    """The state-dict keys of the official 1-layer Transformer, written from its gpt.py module tree."""
    cond = (
        {"cls_embedding.embedding_table.weight"}
        if model_type == "c2i"
        else {
            "cls_embedding.cap_proj.fc1.weight",
            "cls_embedding.cap_proj.fc2.weight",
            "cls_embedding.uncond_embedding",
        }
    )
    layer = {
        f"layers.0.{k}.weight"
        for k in (
            "attention.wqkv",
            "attention.wo",
            "feed_forward.w1",
            "feed_forward.w2",
            "feed_forward.w3",
            "attention_norm",
            "ffn_norm",
        )
    }
    return cond | layer | {"tok_embeddings.weight", "norm.weight", "output.weight"}


def random_state(module: torch.nn.Module, seed: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return {k: torch.randn(v.shape, generator=gen) * 0.3 for k, v in module.state_dict().items()}


@pytest.mark.parametrize("model_type", ["c2i", "t2i"])
def test_gpt_key_set_is_official(model_type):
    extra = {"cls_token_num": 120, "caption_dim": 16} if model_type == "t2i" else {}
    model = LlamaGenTransformer(LlamaGenConfig(**GPT, model_type=model_type, **extra))
    assert set(model.state_dict()) == official_keys(model_type)
    shapes = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    assert shapes["layers.0.attention.wqkv.weight"] == (96, 32)
    assert shapes[
        "cls_embedding.embedding_table.weight" if model_type == "c2i" else "cls_embedding.uncond_embedding"
    ] == ((1001, 32) if model_type == "c2i" else (120, 16))


@pytest.mark.parametrize("wrapper", ["model", "module", "state_dict", None])
def test_load_llamagen_from_official_pt(tmp_path, wrapper):
    cfg = LlamaGenConfig(**GPT, vocab_size=40, num_classes=6, block_size=16)
    gpt_state = random_state(LlamaGenTransformer(cfg), seed=1)
    gpt_state["freqs_cis"] = torch.zeros(17, 8, 2)  # derived entries some exports carry: ignored
    vq_ref = VQModel(VQConfig(codebook_size=40, codebook_embed_dim=8, **VQ))
    vq_state = random_state(vq_ref, seed=2)
    wrap = (lambda s: {wrapper: s, "steps": torch.tensor(3)}) if wrapper else (lambda s: s)
    torch.save(wrap(gpt_state), tmp_path / "gpt.pt")
    torch.save({"model": vq_state, "optimizer": {"x": 1}}, tmp_path / "vq.pt")
    target = load_llamagen(
        tmp_path / "gpt.pt",
        tmp_path / "vq.pt",
        image_size=8,
        vq_config="VQ-8",
        codebook_size=40,
        num_classes=6,
        vq_overrides=VQ,
        **GPT,
    )
    assert target.grid == (4, 4) and target.codebook_size == 40
    for key, value in target.model.state_dict().items():  # every weight came from the file
        torch.testing.assert_close(value, gpt_state[key], rtol=0, atol=0)
    reference = LlamaGenTransformer(cfg).eval()
    reference.load_state_dict({k: v for k, v in gpt_state.items() if k != "freqs_cis"})
    tokens = torch.randint(0, 40, (2, 16), generator=torch.Generator().manual_seed(3))
    torch.testing.assert_close(
        target.model(tokens, torch.tensor([0, 5])), reference(tokens, torch.tensor([0, 5]))
    )
    vq_ref.load_state_dict(vq_state)
    images = target.decode_tokens(tokens)
    assert images.shape == (2, 3, 8, 8) and images.abs().max() <= 1
    torch.testing.assert_close(images, vq_ref.eval().decode_code(tokens, (4, 4)).clamp(-1, 1))
    torch.testing.assert_close(
        target.codebook, torch.nn.functional.normalize(vq_state["quantize.embedding.weight"], dim=-1)
    )


def test_load_llamagen_from_folders(tmp_path):
    torch.manual_seed(0)
    gpt = LlamaGenTransformer(LlamaGenConfig(**GPT, vocab_size=40, num_classes=6, block_size=4)).eval()
    vq = VQModel(VQConfig(codebook_size=40, **VQ)).eval()
    gpt.save_pretrained(tmp_path / "gpt")
    vq.save_pretrained(tmp_path / "vq")
    target = load_llamagen(tmp_path / "gpt", tmp_path / "vq")
    assert target.grid == (2, 2)
    tokens = torch.randint(0, 40, (1, 4), generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(target.decode_tokens(tokens), vq.decode_code(tokens, (2, 2)).clamp(-1, 1))
    VQModel(VQConfig(codebook_size=41, **VQ)).save_pretrained(tmp_path / "vq41")
    with pytest.raises(ValueError, match="codebook_size"):
        load_llamagen(tmp_path / "gpt", tmp_path / "vq41")


def test_mismatched_checkpoint_lists_keys(tmp_path):
    model = LlamaGenTransformer(LlamaGenConfig(**{**GPT, "n_layer": 2}))
    state = random_state(model, seed=4)
    state.pop("layers.1.feed_forward.w3.weight")
    state["layers.2.attention.wo.weight"] = torch.zeros(32, 32)
    state["norm.weight"] = torch.zeros(31)
    torch.save({"model": state}, tmp_path / "bad.pt")
    with pytest.raises(ValueError) as err:
        load_state_strict(
            LlamaGenTransformer(LlamaGenConfig(**{**GPT, "n_layer": 2})), read_checkpoint(tmp_path / "bad.pt")
        )
    msg = str(err.value)
    assert "missing keys [layers.1.feed_forward.w3.weight]" in msg
    assert "unexpected keys [layers.2.attention.wo.weight]" in msg
    assert "norm.weight: checkpoint (31,) vs model (32,)" in msg
    with pytest.raises(ValueError, match="missing keys"):  # wrong preset depth through the public loader
        load_llamagen(tmp_path / "bad.pt", None, image_size=64, **{**GPT, "n_layer": 3})
    with pytest.raises(ValueError, match="no state dict"):
        unwrap_checkpoint({"epoch": 3})
