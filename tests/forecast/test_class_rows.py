"""Per-class unbatched arguments (a profile's ``unbatched_args``): never sliced, whatever their length."""

import torch

from diffspec.forecast.profiles import profile_of
from diffspec.forecast.rows import take_call_rows


def test_minimax_layout_arguments_are_never_sliced_even_at_the_batch_length():
    """MiniMax-H3's ``timestep`` holds the layout's distinct timesteps (here two, as many as the batch rows): sliced
    as a batch, one noise level would vanish. Latents are still sliced."""
    unbatched = profile_of("MiniMaxH3Transformer3DModel").unbatched_args
    latents, timestep, temb = torch.randn(2, 8, 16), torch.tensor([0.2, 0.6]), torch.randn(2, 32)
    args, kwargs = take_call_rows((latents,), {"timestep": timestep, "temb": temb}, ["hidden_states"],
                                  torch.tensor([1]), 2, unbatched=unbatched)
    assert torch.equal(args[0], latents[1:]) and kwargs["timestep"] is timestep and kwargs["temb"] is temb
    _, kwargs = take_call_rows((latents,), {"timestep": timestep}, ["hidden_states"], torch.tensor([1]), 2)
    assert torch.equal(kwargs["timestep"], timestep[1:])  # other classes: a per-row timestep
