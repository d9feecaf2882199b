"""LTX-2: each block transforms two streams, video and audio; both are forecast on a draft step."""

import torch

from diffspec.config import ForecastConfig, SpecaConfig
from diffspec.forecast.blocks import BlockIO, find_block_lists
from diffspec.forecast.gate import Schedule
from diffspec.forecast.hooks import ForecastHooks
from diffspec.stats import SpecStats
from diffspec.testing.random_transformers import build_transformer, make_call, timesteps_for

NAME = "tiny-ltx2"
STEPS = 12


def _audio_outputs(model):
    """The transformer's audio predictions, one per call (hooked after any forecast hooks)."""
    outs = []
    model.register_forward_hook(lambda _m, _a, out: outs.append(out[1].detach().clone()))
    return outs


def test_block_reads_audio_as_its_second_stream():
    block = find_block_lists(build_transformer(NAME))[0][1][0]
    io = BlockIO.for_block(block, block.forward)
    video, audio, text = torch.zeros(1), torch.ones(1), torch.full((1,), 2.0)
    kwargs = dict(hidden_states=video, audio_hidden_states=audio, encoder_hidden_states=text)
    assert io.arg("hidden_states", (), kwargs) is video and io.arg("encoder_hidden_states", (), kwargs) is audio
    _, replaced = io.with_inputs((), kwargs, encoder_hidden_states=text)
    assert replaced["audio_hidden_states"] is text and replaced["encoder_hidden_states"] is text


def test_forecast_steps_forecast_the_audio_prediction_too():
    model, reference = build_transformer(NAME), build_transformer(NAME)  # same seed: same weights
    x0, call = make_call(NAME, batch=2)
    hooks = ForecastHooks(model, ForecastConfig(), SpecStats(), num_steps_fn=lambda: STEPS)
    hooks.attach()
    audio, audio_ref = _audio_outputs(model), _audio_outputs(reference)
    x = x0.clone()
    with torch.no_grad():
        for t in timesteps_for(NAME, STEPS):
            pred = call(model, x, t)
            call(reference, x, t)  # the full transformer on the same input
            x = x - 0.05 * pred
    branch = hooks.branches[0]
    assert {"list:hidden", "list:encoder"} <= set(branch.lists[0].forecasters)  # video and audio residuals
    full = Schedule.of(ForecastConfig()).without_rejections(STEPS)
    assert not all(full)
    rels = [((a - r).norm() / r.norm()).item() for a, r in zip(audio, audio_ref)]
    assert all(rel == 0.0 for rel, f in zip(rels, full) if f), rels  # full steps: the full prediction
    drafted = [rel for rel, f in zip(rels, full) if not f]
    # forecast steps: close to the full prediction, not a copy of it (random weights, up to 4 steps past the
    # last anchor: about 0.05 to 0.33, mean 0.14; the video prediction's mean is 0.11)
    assert all(0 < rel < 0.5 for rel in drafted) and sum(drafted) / len(drafted) < 0.2, rels
    hooks.detach()


def test_speca_rejected_rows_recompute_both_streams():
    """Strict speca with tau = 0 rejects every draft: video and audio predictions equal the full model's."""
    model, reference = build_transformer(NAME), build_transformer(NAME)
    x0, call = make_call(NAME, batch=2)
    hooks = ForecastHooks(model, SpecaConfig(tau0=0.0, beta=1.0, tau_min=0.0, k_min=0), SpecStats(),
                          num_steps_fn=lambda: STEPS)
    hooks.attach()
    audio, audio_ref = _audio_outputs(model), _audio_outputs(reference)
    x = x0.clone()
    with torch.no_grad():
        for t in timesteps_for(NAME, STEPS):
            pred = call(model, x, t)
            assert torch.equal(pred, call(reference, x, t))
            x = x - 0.05 * pred
    assert all(torch.equal(a, b) for a, b in zip(audio, audio_ref))
    assert hooks.stats.extra["rejections"] > 0
    hooks.detach()
