"""The shipped scene judge reads prompted scenes cell by cell; wrong prompts and noise score low."""

import pytest
import torch

from diffspec.data import render_prompted_scenes
from diffspec.models.scene_judge import judge_cells, prompt_correct, prompt_scores, scene_fid


def test_real_scenes_follow_their_prompts():
    images, prompts = render_prompted_scenes(300, seed=424242)
    scores = prompt_scores(images, prompts)
    assert scores["prompt_accuracy"] > 0.95
    assert min(scores.values()) >= scores["prompt_accuracy"]  # every attribute at least as often right


def test_a_changed_colour_or_cell_fails_the_prompt():
    images, prompts = render_prompted_scenes(200, seed=31)
    recoloured = [p.replace("red", "PLACEHOLDER").replace("blue", "red").replace("PLACEHOLDER", "blue") for p in prompts]
    changed = torch.tensor([a != b for a, b in zip(prompts, recoloured)])
    ok = prompt_correct(images, recoloured)
    assert changed.sum() > 50 and ok["prompt"][changed].float().mean() < 0.05
    assert ok["colours"][changed].float().mean() < 0.05 and ok["shapes"][changed].float().mean() > 0.9
    moved = [p.replace("top", "TMP").replace("bottom", "top").replace("TMP", "bottom") for p in prompts]
    assert prompt_correct(images, moved)["positions"].float().mean() < 0.3


def test_noise_is_judged_neither_faithful_nor_close():
    images, prompts = render_prompted_scenes(300, seed=77)
    noise = torch.rand_like(images) * 2 - 1
    assert prompt_scores(noise, prompts)["prompt_accuracy"] < 0.05
    assert scene_fid(images) < 0.1 * scene_fid(noise)


def test_cells_in_reading_order():
    images, _ = render_prompted_scenes(1, seed=0)
    shapes, colours = judge_cells(images)
    assert shapes.shape == colours.shape == (1, 4)
    with pytest.raises(ValueError, match="32x32"):
        judge_cells(torch.zeros(1, 3, 64, 64))
    with pytest.raises(ValueError, match="2 images but 1 prompts"):
        prompt_correct(torch.zeros(2, 3, 32, 32), ["a red star at the top left ."])
