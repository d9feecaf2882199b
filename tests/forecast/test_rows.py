"""Row subsets of a transformer call (rows.py): what is sliced, what is left whole, and merging back."""

import torch

import diffspec.forecast.hooks as hooks_module
from diffspec.bench.models import build_transformer, make_call, timesteps_for
from diffspec.config import SpecaConfig
from diffspec.forecast.hooks import ForecastHooks
from diffspec.forecast.rows import merge_rows, take_call_rows, take_rows
from diffspec.stats import SpecStats


def test_listed_per_row_lists_are_sliced_and_others_left_whole():
    index = torch.tensor([0, 2])
    shapes = [[(1, 4, 4), (1, 2, 4)], [(1, 4, 4)], [(1, 2, 2)]]
    assert take_rows(shapes, index, 3, "img_shapes") == [shapes[0], shapes[2]]
    assert take_rows(tuple(shapes), index, 3, "img_shapes") == (shapes[0], shapes[2])
    assert take_rows(shapes[:2], index, 3, "img_shapes") == shapes[:2]  # not the batch's length
    axes = (4, 6, 6)  # an unlisted list that has the batch's length by chance
    assert take_rows(axes, index, 3, "axes_dims_rope") is axes
    assert take_rows(list(axes), index, 3, None) == [4, 6, 6]


def test_stacked_temb_is_sliced_per_copy():
    batch, index = 3, torch.tensor([0, 2])
    temb = torch.arange(2 * batch)[:, None].float()  # the real timestep's rows, then the zero timestep's
    assert take_rows(temb, index, batch, "temb").flatten().tolist() == [0, 2, 3, 5]
    assert take_rows(temb[:batch], index, batch, "temb").flatten().tolist() == [0, 2]  # one copy: plain rows
    assert take_rows(temb, index, batch, "other") is temb  # unlisted: left whole
    odd = torch.arange(batch + 1)[:, None]  # not a multiple of the batch
    assert take_rows(odd, index, batch, "temb") is odd


def test_take_call_rows_names_positional_arguments_and_merge_restores_the_rows():
    batch, index = 2, torch.tensor([1])
    hidden, temb = torch.randn(batch, 5, 3), torch.randn(2 * batch, 3)
    args, kwargs = take_call_rows((hidden, temb), {"img_shapes": [[(1, 1, 5)]] * batch},
                                  ["hidden_states", "temb"], index, batch)
    assert torch.equal(args[0], hidden[1:]) and torch.equal(args[1], temb[[1, 3]])
    assert kwargs["img_shapes"] == [[(1, 1, 5)]]
    whole = torch.zeros_like(hidden)
    merged = merge_rows(index, (args[0],), (whole,))
    assert torch.equal(merged[0][1], hidden[1]) and torch.equal(merged[0][0], whole[0])


def test_qwenimage_edit_verifier_on_a_row_subset_keeps_rows_independent(monkeypatch):
    """zero_cond_t (Qwen-Image-Edit): img_shapes at the model call and the 2B-row temb at the blocks
    are sliced with the rows; the tolerance is chosen so that rows are checked and recomputed apart."""
    name, steps = "tiny-qwenimage-edit", 16
    model = build_transformer(name)
    x, call = make_call(name, batch=2, seed=3)
    cfg = SpecaConfig(tau0=0.02, beta=0.5, tau_min=0.005, k_min=0, k_max=6)
    subsets = []
    real = hooks_module.take_call_rows

    def spy(args, kwargs, names, index, batch, *rest, **options):
        subsets.append(index.tolist())
        return real(args, kwargs, names, index, batch, *rest, **options)

    monkeypatch.setattr(hooks_module, "take_call_rows", spy)

    def run(x):
        hooks = ForecastHooks(model, cfg, SpecStats(), num_steps_fn=lambda: steps)
        hooks.attach()
        with torch.no_grad():
            for t in timesteps_for(name, steps):
                x = x - 0.05 * call(model, x, t)
        hooks.detach()
        return x

    mixed = run(torch.cat([x[:1], 4 * x[1:]]))
    assert subsets  # the sub-batch path really ran
    torch.testing.assert_close(mixed[0], run(x)[0], rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(mixed[1], run(4 * x)[1], rtol=1e-4, atol=1e-5)
