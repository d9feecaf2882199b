"""Prompted scenes (tiny-flux's data): prompts name what is drawn, and parse back to it."""

import pytest
import torch

from diffspec.data import parse_prompt, render_prompted_scenes, render_scenes
from diffspec.data.prompted import prompt_of


def test_prompts_parse_back_to_their_attributes():
    g = torch.Generator().manual_seed(0)
    present = torch.rand(200, 4, generator=g) < 0.5
    present[:, 0] |= ~present.any(1)  # at least one object
    shape, colour = torch.randint(0, 6, (200, 4), generator=g), torch.randint(0, 6, (200, 4), generator=g)
    for i, prompt in enumerate(prompt_of(present, shape, colour)):
        p, s, c = parse_prompt(prompt)
        assert torch.equal(p, present[i])
        assert torch.equal(s[p], shape[i][p]) and torch.equal(c[p], colour[i][p])


def test_scenes_hold_one_or_two_objects_and_are_reproducible():
    images, prompts = render_prompted_scenes(300, seed=5)
    again, same = render_prompted_scenes(300, seed=5)
    assert torch.equal(images, again) and prompts == same
    counts = torch.tensor([int(parse_prompt(p)[0].sum()) for p in prompts])
    assert set(counts.tolist()) == {1, 2} and 0.4 < float((counts == 1).float().mean()) < 0.6
    assert images.shape == (300, 3, 32, 32) and images.min() >= -1 and images.max() <= 1


def test_an_asked_cell_differs_from_an_empty_one():
    images, prompts = render_prompted_scenes(64, seed=9, noise=0.0)
    cells = images.reshape(64, 3, 2, 16, 2, 16).permute(0, 2, 4, 1, 3, 5).reshape(64, 4, -1)
    spread = cells.std(-1)  # an empty cell is flat background
    present = torch.stack([parse_prompt(p)[0] for p in prompts])
    assert spread[present].min() > 0.1 > spread[~present].max()


@pytest.mark.parametrize("prompt, match", [
    ("a pink star at the top left .", "colour in"),
    ("a red star at the middle .", "not 'a <colour> <shape> at the <cell>'"),
    ("a red star at the top left , a blue ring at the top left .", "two objects at the top left"),
])
def test_malformed_prompts_are_refused_naming_the_part(prompt, match):
    with pytest.raises(ValueError, match=match):
        parse_prompt(prompt)


def test_the_captioned_scenes_did_not_change():
    """render_scenes shares its drawing with the prompted scenes; tiny-vlm was trained on its exact output."""
    images, captions = render_scenes(4, seed=0)
    assert captions[0].split()[:2] == ["a", "large"]
    assert round(float(images.sum()), 2) == pytest.approx(-7793.31, abs=0.05)
