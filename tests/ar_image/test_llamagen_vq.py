"""LlamaGen VQ: official key layout, shapes, encode/decode consistency, presets."""

from __future__ import annotations

import pytest
import torch

from diffspec.ar_image.targets.llamagen_vq import VQConfig, VQModel


def tiny_vq(seed: int = 0, **kw) -> VQModel:
    base = dict(
        codebook_size=40,
        codebook_embed_dim=4,
        ch=32,
        encoder_ch_mult=(1, 2),
        decoder_ch_mult=(1, 2),
        z_channels=32,
        num_res_blocks=1,
    )
    base.update(kw)
    torch.manual_seed(seed)
    return VQModel(VQConfig(**base)).eval()


def test_official_key_names():
    keys = set(tiny_vq().state_dict())
    # written from the official vq_model.py module tree (2 levels, 1 res block; decoder gets 2 per level)
    for key in [
        "encoder.conv_in.weight",
        "encoder.conv_blocks.0.res.0.norm1.weight",
        "encoder.conv_blocks.0.res.0.conv2.bias",
        "encoder.conv_blocks.0.downsample.conv.weight",
        "encoder.conv_blocks.1.res.0.nin_shortcut.weight",
        "encoder.conv_blocks.1.attn.0.q.weight",
        "encoder.mid.0.conv1.weight",
        "encoder.mid.1.proj_out.bias",
        "encoder.mid.2.norm2.weight",
        "encoder.norm_out.weight",
        "encoder.conv_out.weight",
        "decoder.conv_in.weight",
        "decoder.mid.1.k.weight",
        "decoder.conv_blocks.0.res.1.conv1.weight",
        "decoder.conv_blocks.0.attn.1.v.weight",
        "decoder.conv_blocks.0.upsample.conv.weight",
        "decoder.conv_blocks.1.res.0.nin_shortcut.weight",
        "decoder.norm_out.bias",
        "decoder.conv_out.weight",
        "quantize.embedding.weight",
        "quantize.codebook_used",
        "quant_conv.weight",
        "post_quant_conv.bias",
    ]:
        assert key in keys, key
    assert not any(k.startswith("decoder.conv_blocks.1.attn") or "conv_blocks.1.upsample" in k for k in keys)
    assert not any("encoder.conv_blocks.1.downsample" in k for k in keys)


def test_vq16_preset_size_and_downsampling():
    with torch.device("meta"):
        vq = VQModel(VQConfig.from_preset("VQ-16"))
    params = sum(p.numel() for p in vq.parameters())
    assert 70e6 < params < 74e6, params  # the paper's 72M tokenizer
    assert vq.config.downsample == 16 and VQConfig.from_preset("VQ-8").downsample == 8


def test_decode_shapes_codebook_and_roundtrip():
    vq = tiny_vq()
    assert torch.allclose(vq.codebook.norm(dim=-1), torch.ones(40))  # l2-normalised codes
    tokens = torch.randint(0, 40, (2, 12), generator=torch.Generator().manual_seed(1))
    images = vq.decode_code(tokens, (3, 4))
    assert images.shape == (2, 3, 6, 8)
    # decode_code is the post-quant path on the looked-up codes, laid out row-major
    z = vq.codebook[tokens].reshape(2, 3, 4, 4).permute(0, 3, 1, 2)
    torch.testing.assert_close(images, vq.decoder(vq.post_quant_conv(z)))
    # encoder output quantised to its nearest code: feeding codes back through quantize returns them
    quant = vq.quant_conv(vq.encoder(torch.rand(2, 3, 6, 8) * 2 - 1))
    ids = vq.quantize.indices(quant)
    assert ids.shape == (2, 12)
    torch.testing.assert_close(vq.quantize.indices(vq.quantize.lookup(ids, (3, 4))), ids)


def test_save_load_roundtrip(tmp_path):
    vq = tiny_vq(seed=2, codebook_l2_norm=False, codebook_show_usage=False)
    vq.save_pretrained(tmp_path / "vq")
    loaded = VQModel.from_pretrained(tmp_path / "vq")
    assert loaded.config == vq.config
    tokens = torch.randint(0, 40, (1, 4), generator=torch.Generator().manual_seed(3))
    torch.testing.assert_close(
        loaded.decode_code(tokens, (2, 2)), vq.decode_code(tokens, (2, 2)), rtol=0, atol=0
    )


@pytest.mark.parametrize(("field", "value"), [("ch", 48), ("decoder_ch_mult", (1,)), ("codebook_size", 0)])
def test_config_validation_names_field(field, value):
    with pytest.raises(ValueError, match=field):
        VQConfig(
            **{"ch": 32, "encoder_ch_mult": (1, 2), "decoder_ch_mult": (1, 2), "z_channels": 32, field: value}
        )
