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
