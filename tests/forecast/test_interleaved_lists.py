"""Transformers whose block lists run interleaved (UNSUPPORTED_TRANSFORMERS) are refused with the reason."""

import pytest
import torch

from diffspec.config import ForecastConfig, SpecaConfig
from diffspec.forecast.blocks import find_block_lists
from diffspec.forecast.hooks import ForecastHooks
from diffspec.stats import SpecStats


def _tiny_latte():
    from diffusers import LatteTransformer3DModel

    torch.manual_seed(0)
    return LatteTransformer3DModel(
        num_attention_heads=2, attention_head_dim=16, in_channels=4, out_channels=8, num_layers=2,
        cross_attention_dim=32, sample_size=8, patch_size=2, num_embeds_ada_norm=1000, norm_type="ada_norm_single",
        caption_channels=24, video_length=2).eval()


def test_latte_spatial_and_temporal_blocks_alternate_so_it_is_refused():
    model = _tiny_latte()
    match = r"LatteTransformer3DModel is not supported by block forecasting: .* spatial \(transformer_blocks\) and temporal"
    with pytest.raises(ValueError, match=match):
        find_block_lists(model)
    with pytest.raises(ValueError, match=match):
        find_block_lists(model, ("transformer_blocks",))
    for config in (ForecastConfig(), SpecaConfig()):
        with pytest.raises(ValueError, match=match):
            ForecastHooks(model, config, SpecStats())
    x = torch.randn(1, 4, 2, 8, 8)
    out = model(x, timestep=torch.tensor([500]), encoder_hidden_states=torch.randn(1, 6, 24), return_dict=False)[0]
    assert out.shape == (1, 8, 2, 8, 8)  # the model itself is untouched
