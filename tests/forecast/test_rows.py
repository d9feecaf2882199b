"""Row subsets of a transformer call (rows.py): what is sliced, what is left whole, and merging back."""

import torch

from diffspec.forecast.rows import merge_rows, take_call_rows, take_rows


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


def test_batch_at_dim_one_is_sliced_there():
    batch, index = 2, torch.tensor([1])
    llama = torch.arange(3 * batch)[:, None].reshape(3, batch, 1).float()  # HiDream: (layers, B, L, D)
    assert take_rows(llama[..., None], index, batch, "encoder_hidden_states_llama3").flatten().tolist() == [1, 3, 5]
    square = torch.randn(batch, batch, 1)  # layers == batch: still dim 1
    assert torch.equal(take_rows(square, index, batch, "encoder_hidden_states_llama3"), square[:, 1:])
    other = torch.randn(3, batch + 1, 1)  # dim 1 is not the batch: left whole
    assert take_rows(other, index, batch, "encoder_hidden_states_llama3") is other


def test_trailing_shared_modulation_row_is_kept():
    batch, index = 3, torch.tensor([0, 2])
    modulation = torch.arange(batch + 1)[:, None].float()  # one row per sample, then the shared t = 0 row
    assert take_rows(modulation, index, batch, "modulation").flatten().tolist() == [0, 2, 3]
    assert take_rows(modulation[:batch], index, batch, "modulation").flatten().tolist() == [0, 2]  # plain rows
    assert take_rows(modulation, index, batch, "other") is modulation  # unlisted: left whole


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


def test_merge_takes_the_rows_of_a_whole_batch_part():
    """A whole-batch recompute (a ``batch_coupled`` profile) merges just the recomputed rows."""
    index, whole, full = torch.tensor([2, 0]), torch.zeros(3, 2), torch.arange(6.0).reshape(3, 2)
    merged = merge_rows(index, (full,), (whole,))[0]
    assert torch.equal(merged, torch.tensor([[0.0, 1.0], [0.0, 0.0], [4.0, 5.0]]))
    assert torch.equal(merge_rows(index, full[[2, 0]], whole), merged)  # the rows alone, in index order


def test_position_tables_with_the_batchs_length_are_left_whole():
    """Stable Audio's (cos, sin) rotary tables and Kandinsky 6 SR's sliding-tile prior (inside ``sparse_params``) have
    no batch dimension, even when their first dim happens to equal the batch."""
    batch, index = 2, torch.tensor([1])
    rotary = (torch.randn(batch, 8), torch.randn(batch, 8))
    assert all(a is b for a, b in zip(take_rows(rotary, index, batch, "rotary_embedding"), rotary))
    params = {"sta_mask": torch.eye(batch, dtype=torch.bool), "threshold": 0.8}
    assert take_rows(params, index, batch, "sparse_params")["sta_mask"] is params["sta_mask"]
