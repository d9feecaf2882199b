import torch

from diffspec.data import SHAPE_CLASSES, make_grid_png, render_shapes, to_uint8


def test_deterministic_range_and_shapes():
    a, la = render_shapes(64, seed=3)
    b, lb = render_shapes(64, seed=3)
    assert torch.equal(a, b) and torch.equal(la, lb)
    assert a.shape == (64, 3, 32, 32) and a.dtype == torch.float32 and la.dtype == torch.int64
    assert a.min() >= -1 and a.max() <= 1
    c, _ = render_shapes(64, seed=4)
    assert not torch.equal(a, c)


def test_classes_are_balanced_and_forced_labels_respected():
    _, labels = render_shapes(2000, seed=0)
    counts = labels.bincount(minlength=len(SHAPE_CLASSES))
    assert len(counts) == len(SHAPE_CLASSES) and counts.min() > 150
    forced = torch.arange(20) % len(SHAPE_CLASSES)
    _, got = render_shapes(20, seed=1, classes=forced)
    assert torch.equal(got, forced)


def test_images_vary_and_shapes_cover_area():
    images, _ = render_shapes(200, seed=5)
    # distinct backgrounds and foregrounds: per-image colour spread is substantial
    assert images.std(dim=(2, 3)).mean() > 0.1
    assert images.mean(dim=(1, 2, 3)).std() > 0.2


def test_grid_png(tmp_path):
    images, _ = render_shapes(12, seed=0, size=16)
    make_grid_png(images, tmp_path / "g.png", nrow=4)
    from PIL import Image

    assert Image.open(tmp_path / "g.png").size == (4 * 17 + 1, 3 * 17 + 1)
    assert to_uint8(images).dtype == torch.uint8


def test_textured_background_keeps_shapes_labels_and_colours_of_the_same_seed():
    plain, la = render_shapes(64, seed=3)
    assert torch.equal(render_shapes(64, seed=3, background="plain")[0], plain)
    tex, lb = render_shapes(64, seed=3, background="textured")
    again, _ = render_shapes(64, seed=3, background="textured")
    assert torch.equal(la, lb) and torch.equal(tex, again)
    assert tex.shape == plain.shape and tex.min() >= -1 and tex.max() <= 1
    # no texture and no extra noise: the plain image exactly
    flat, _ = render_shapes(64, seed=3, background="textured", texture_strength=0.0, noise=0.0)
    assert torch.equal(flat, plain)


def test_textured_backgrounds_are_busier_than_plain_ones():
    plain, _ = render_shapes(200, seed=5)
    tex, _ = render_shapes(200, seed=5, background="textured")

    def busyness(x: torch.Tensor) -> torch.Tensor:  # mean absolute difference of neighbouring pixels in the border
        border = torch.cat([x[..., :4, :], x[..., -4:, :]], dim=-2)
        return (border[..., 1:] - border[..., :-1]).abs().mean(dim=(1, 2, 3))

    assert float(busyness(tex).median()) > 1.3 * float(busyness(plain).median())
    border_std = lambda x: torch.cat([x[..., :4, :], x[..., -4:, :]], -2).std(dim=(2, 3)).mean()  # noqa: E731
    assert border_std(tex) > 1.5 * border_std(plain)


def test_textured_shapes_stay_recognisable_by_the_shipped_classifier():
    from diffspec.models import class_accuracy

    images, labels = render_shapes(300, seed=11, background="textured")
    assert class_accuracy(images, labels) > 0.85


def test_render_options_are_validated():
    import pytest

    with pytest.raises(ValueError, match="background='wood'"):
        render_shapes(2, seed=0, background="wood")
    with pytest.raises(ValueError, match=r"texture_strength=1.5 must be in \[0, 1\]"):
        render_shapes(2, seed=0, background="textured", texture_strength=1.5)
    with pytest.raises(ValueError, match="noise=-0.1"):
        render_shapes(2, seed=0, background="textured", noise=-0.1)
