"""Block lists cut in two (a profile's ``split_list``): Motif-Video's DDT decoder is forecast as a list of its own."""

import torch

from diffspec.config import ForecastConfig
from diffspec.forecast.blocks import find_block_lists
from diffspec.forecast.hooks import ForecastHooks
from diffspec.stats import SpecStats
from diffspec.testing.random_transformers import build_transformer, make_call


def test_motif_decoder_blocks_are_their_own_list_and_constant_residuals_are_forecast_exactly():
    """The decoder restarts from the patch embeddings: forecast as part of the single blocks, a draft would return the
    patch embeddings. As its own list, residuals that do not change (same latents, near-equal timesteps) are
    reproduced on every draft step."""
    name = "tiny-motifvideo"
    model = build_transformer(name)
    assert [(n, len(b)) for n, b in find_block_lists(model)] == [
        ("transformer_blocks", 2), ("single_transformer_blocks[:-2]", 2), ("single_transformer_blocks[-2:]", 2)]
    assert [n for n, _ in find_block_lists(model, ("single_transformer_blocks",))] == [
        "single_transformer_blocks[:-2]", "single_transformer_blocks[-2:]"]
    x, call = make_call(name, batch=2)
    ts = 500.0 - torch.arange(12.0) * 1e-3
    with torch.no_grad():
        full = [call(model, x, t) for t in ts]
        stats = SpecStats()
        ForecastHooks(model, ForecastConfig(interval=4, warmup=2), stats, num_steps_fn=lambda: 12).attach()
        drafted = [call(model, x, t) for t in ts]
    assert stats.forecast_steps > 0
    for a, b in zip(drafted, full):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
