"""The profile table: one row per tested transformer class, each with a tiny fixture; refused classes refused with
the row's reason; ``docs/supported-models.md`` generated from it."""

import re
from pathlib import Path

import pytest
import torch
from torch import nn

import diffspec.forecast.profiles as profiles_module
from diffspec.config import ForecastConfig, SpecaConfig
from diffspec.forecast.blocks import find_block_lists
from diffspec.forecast.hooks import ForecastHooks
from diffspec.forecast.profiles import PROFILES, BlockProfile, ModelProfile, markdown, register, supported
from diffspec.stats import SpecStats
from diffspec.testing.random_transformers import FAMILY_CLASSES, SPECS, TINY_MODELS

REFUSED_FIXTURES = {  # class -> (tiny config, the block lists a user might name)
    "DreamLiteUNetModel": (dict(sample_size=8, block_out_channels=(16, 32, 32), layers_per_block=1,
                                norm_num_groups=4, cross_attention_dim=16, attention_head_dim=8), ("up_blocks",)),
    "DreamLiteTransformer2DModel": (dict(num_attention_heads=2, attention_head_dim=8, in_channels=16, num_layers=2,
                                         norm_num_groups=4, cross_attention_dim=8), ("transformer_blocks",)),
    "LatteTransformer3DModel": (dict(num_attention_heads=2, attention_head_dim=16, in_channels=4, out_channels=8,
                                     num_layers=2, cross_attention_dim=32, sample_size=8, patch_size=2,
                                     num_embeds_ada_norm=1000, norm_type="ada_norm_single", caption_channels=24,
                                     video_length=2), ("transformer_blocks",)),
    "Cosmos3OmniTransformer": (dict(head_dim=16, hidden_size=32, intermediate_size=64, num_attention_heads=2,
                                    num_hidden_layers=2, num_key_value_heads=1, vocab_size=64, latent_channel=4,
                                    patch_latent_dim=16, rope_axes_dim=(4, 2, 2)), ("layers",)),
    "WanAnimate2Transformer3DModel": (dict(in_dim=12, dim=32, ffn_dim=64, freq_dim=32, text_dim=24, out_dim=4,
                                           num_heads=2, num_layers=2, text_len=8), ("blocks",)),
    "AnyFlowFARTransformer3DModel": (dict(num_attention_heads=2, attention_head_dim=16, in_channels=4, out_channels=4,
                                          text_dim=24, freq_dim=32, ffn_dim=64, num_layers=2, rope_max_seq_len=32),
                                     ("blocks",)),
    "SanaWMLTX2RefinerTransformer3DModel": (dict(in_channels=4, out_channels=4, num_attention_heads=2,
                                                 attention_head_dim=16, cross_attention_dim=32, audio_in_channels=4,
                                                 audio_out_channels=4, audio_num_attention_heads=2,
                                                 audio_attention_head_dim=8, audio_cross_attention_dim=16,
                                                 num_layers=2, caption_channels=24), ("transformer_blocks",)),
}
"""Tiny random-weight configs of the refused classes (they are never run, only attached to)."""


def test_every_supported_row_has_a_tiny_fixture_and_every_fixture_a_row():
    fixtures = {FAMILY_CLASSES[SPECS[name].family] for name in TINY_MODELS}
    assert sorted(set(supported()) - fixtures) == [], "rows without a tiny fixture (diffspec.testing)"
    assert sorted(fixtures - set(supported())) == [], "tiny fixtures without a row (diffspec.forecast.profiles)"


def test_every_refused_row_has_a_tiny_fixture():
    assert sorted(REFUSED_FIXTURES) == sorted(p.name for p in PROFILES.values() if p.refused)


@pytest.mark.parametrize("cls", sorted(REFUSED_FIXTURES))
def test_refused_transformers_are_refused_with_the_reason(cls):
    import diffusers

    config, names = REFUSED_FIXTURES[cls]
    torch.manual_seed(0)
    model = getattr(diffusers, cls)(**config)
    match = re.escape(f"{cls} is not supported by block forecasting: it is {PROFILES[cls].refused}")
    for blocks in (None, names):  # naming its blocks does not help
        with pytest.raises(ValueError, match=match):
            find_block_lists(model, blocks)
    for config in (ForecastConfig(), SpecaConfig()):
        with pytest.raises(ValueError, match=match):
            ForecastHooks(model, config, SpecStats())
    assert not any("forward" in m.__dict__ for m in model.modules())  # the model itself is untouched


def test_a_block_class_has_one_profile():
    seen: dict[str, BlockProfile] = {}
    for profile in PROFILES.values():
        for block in profile.blocks:
            assert seen.setdefault(block.name, block) == block, block.name


def test_the_supported_models_page_is_generated_from_the_table():
    page = Path(__file__).resolve().parents[2] / "docs" / "supported-models.md"
    assert page.read_text() == markdown(), (
        "docs/supported-models.md differs from the profile table: python -m diffspec.forecast.profiles --markdown "
        "> docs/supported-models.md")


class _ReversedBlock(nn.Module):
    """Returns ``(encoder, hidden)``, as FLUX's blocks do, in a class diffusers' registry does not know."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(8, 8)

    def forward(self, hidden_states, encoder_hidden_states):
        return encoder_hidden_states, hidden_states + self.proj(hidden_states)


class _Toy(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(_ReversedBlock() for _ in range(2))

    def forward(self, hidden_states, encoder_hidden_states, timestep):
        for block in self.blocks:
            encoder_hidden_states, hidden_states = block(hidden_states, encoder_hidden_states)
        return hidden_states * timestep


def test_an_unknown_layout_says_how_to_register_it_and_registering_works(monkeypatch):
    monkeypatch.setattr(profiles_module, "PROFILES", dict(PROFILES))
    monkeypatch.setattr(profiles_module, "BLOCKS", dict(profiles_module.BLOCKS))
    model = _Toy()
    x, text = torch.randn(2, 3, 8), torch.randn(2, 2, 8)
    ForecastHooks(model, ForecastConfig(), SpecStats()).attach()
    with pytest.raises(ValueError, match=r"register\(ModelProfile\(.*BlockProfile\('_ReversedBlock', layout="):
        model(x, text, torch.tensor(1.0))
    register(ModelProfile("_Toy", (BlockProfile("_ReversedBlock", layout=(1, 0)),)))
    model = _Toy()
    stats = SpecStats()
    ForecastHooks(model, ForecastConfig(warmup=2, interval=3), stats, num_steps_fn=lambda: 8).attach()
    with torch.no_grad():
        for t in torch.linspace(1.0, 0.1, 8):
            model(x, text, t)
    assert stats.forecast_steps > 0
