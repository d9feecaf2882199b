"""The shipped shape classifiers: conditional accuracy and a "reference FID" on their features.

Three reference classifiers ship, one per data variant (``REFERENCE_CLASSIFIERS``): ``"shapes"``
(plain backgrounds, the default ``render_shapes`` output), ``"shapes-tex"`` (textured
backgrounds, ``tiny-ar-tex``'s data) and ``"shapes-noisy"`` (the textured images with strong
pixel noise, ``tiny-ar-noisy``'s data), each with the feature statistics of its own real images.

Example:
    >>> from diffspec.data import render_shapes
    >>> images, labels = render_shapes(64, seed=123)
    >>> class_accuracy(images, labels) > 0.9  # doctest: +SKIP
    True
    >>> tex, tex_labels = render_shapes(64, seed=123, background="textured", texture_strength=0.7, noise=0.05)
    >>> class_accuracy(tex, tex_labels, classifier="shapes-tex") > 0.8  # doctest: +SKIP
    True
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ..metrics import feature_stats, frechet_distance

_WEIGHTS = Path(__file__).resolve().parent.parent / "weights"
REFERENCE_CLASSIFIERS: dict[str, Path] = {
    "shapes": _WEIGHTS / "shapes-classifier",  # render_shapes default (plain backgrounds)
    "shapes-tex": _WEIGHTS / "shapes-tex-classifier",  # background="textured", texture_strength=0.7, noise=0.05
    "shapes-noisy": _WEIGHTS / "shapes-noisy-classifier",  # the same with noise=0.4 (tiny-ar-noisy's data)
}
WEIGHTS_DIR = REFERENCE_CLASSIFIERS["shapes"]


def classifier_dir(classifier: str) -> Path:
    """The folder of a shipped reference classifier by name.

    Raises:
        ValueError: ``classifier`` is not one of ``REFERENCE_CLASSIFIERS``.
    """
    if classifier not in REFERENCE_CLASSIFIERS:
        raise ValueError(f"classifier={classifier!r} is not a shipped reference classifier; "
                         f"choose from {', '.join(REFERENCE_CLASSIFIERS)}")
    return REFERENCE_CLASSIFIERS[classifier]


class ShapeClassifier(nn.Module):
    """A small CNN on 32x32 images in [-1, 1]; ``features`` gives the 128-d penultimate layer."""

    def __init__(self, num_classes: int = 10, width: int = 32, feature_dim: int = 128) -> None:
        super().__init__()
        self.config = {"num_classes": num_classes, "width": width, "feature_dim": feature_dim}

        def block(cin: int, cout: int) -> nn.Sequential:
            return nn.Sequential(
                nn.Conv2d(cin, cout, 3, padding=1), nn.BatchNorm2d(cout), nn.ReLU(),
                nn.Conv2d(cout, cout, 3, padding=1), nn.BatchNorm2d(cout), nn.ReLU(),
            )

        self.body = nn.Sequential(
            block(3, width), nn.MaxPool2d(2), block(width, 2 * width), nn.MaxPool2d(2), block(2 * width, 4 * width)
        )
        self.head = nn.Linear(4 * width, feature_dim)
        self.out = nn.Linear(feature_dim, num_classes)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """Penultimate features, (n, feature_dim)."""
        if x.shape[-2:] != (32, 32):
            x = F.interpolate(x, size=(32, 32), mode="bilinear", align_corners=False)
        h = self.body(x).mean(dim=(2, 3))
        return F.relu(self.head(h))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.features(x))


@lru_cache(maxsize=8)
def load_reference_classifier(device: str = "cpu", classifier: str = "shapes") -> ShapeClassifier:
    """A shipped classifier (eval mode, float32; stored weights may be float16) by name."""
    from safetensors.torch import load_file

    folder = classifier_dir(classifier)
    config = json.loads((folder / "config.json").read_text())
    model = ShapeClassifier(**config)
    model.load_state_dict(load_file(str(folder / "model.safetensors")))  # copies cast to the float32 params
    return model.eval().to(device)


@lru_cache(maxsize=4)
def _reference_stats(classifier: str = "shapes") -> tuple[np.ndarray, np.ndarray]:
    from safetensors.torch import load_file

    stats = load_file(str(classifier_dir(classifier) / "fid_stats.safetensors"))
    return stats["mu"].double().numpy(), stats["sigma"].double().numpy()


@torch.no_grad()
def classifier_features(images: torch.Tensor, batch_size: int = 512, classifier: str = "shapes") -> torch.Tensor:
    """Features of [-1, 1] images with a shipped classifier (float64 on CPU)."""
    model = load_reference_classifier("cpu", classifier)
    images = images.detach().float().cpu()
    return torch.cat([model.features(images[i : i + batch_size]) for i in range(0, len(images), batch_size)]).double()


def reference_fid(images: torch.Tensor, classifier: str = "shapes") -> float:
    """FID of [-1, 1] images against the shipped statistics of ``classifier``'s real images."""
    if len(images) < 2:
        raise ValueError(f"reference_fid needs at least 2 images, got {len(images)}")
    ref_mu, ref_sigma = _reference_stats(classifier)
    mu, sigma = feature_stats(classifier_features(images, classifier=classifier))
    return frechet_distance(mu, sigma, ref_mu, ref_sigma)


@torch.no_grad()
def class_predictions(images: torch.Tensor, classifier: str = "shapes") -> torch.Tensor:
    """Class the shipped ``classifier`` assigns to each [-1, 1] image, ``(n,)`` int64 on CPU."""
    model = load_reference_classifier("cpu", classifier)
    return model.out(classifier_features(images, classifier=classifier).float()).argmax(1)


def class_accuracy(images: torch.Tensor, labels: torch.Tensor, classifier: str = "shapes") -> float:
    """Share of [-1, 1] images the shipped ``classifier`` assigns to ``labels``."""
    return float((class_predictions(images, classifier) == labels.cpu()).float().mean())


def paired_accuracy(images: torch.Tensor, reference: torch.Tensor, labels: torch.Tensor,
                    classifier: str = "shapes") -> dict[str, float]:
    """Accuracy change of ``images`` against same-seed ``reference`` images, with its paired standard error.

    Each seed gives one difference ``correct(image) - correct(reference)`` in {-1, 0, 1}; when an
    arm stays close to the full run most differences are 0, so the paired standard error of the
    mean is far below that of two independent accuracies (what "within 1 point" needs).

    Returns:
        ``accuracy_delta`` (mean difference), ``accuracy_delta_se`` (its standard error) and
        ``class_agreement`` (share of seeds where both images get the same class).

    Example:
        >>> x = torch.rand(4, 3, 32, 32) * 2 - 1
        >>> paired_accuracy(x, x, torch.zeros(4, dtype=torch.long))["class_agreement"]  # doctest: +SKIP
        1.0
    """
    if images.shape != reference.shape or len(images) != len(labels):
        raise ValueError(f"paired_accuracy: images {tuple(images.shape)}, reference {tuple(reference.shape)} and "
                         f"{len(labels)} labels must pair up")
    pred, ref = class_predictions(images, classifier), class_predictions(reference, classifier)
    labels = labels.cpu()
    diff = (pred == labels).double() - (ref == labels).double()
    se = float(diff.std() / len(diff) ** 0.5) if len(diff) > 1 else float("nan")
    return {"accuracy_delta": round(float(diff.mean()), 4), "accuracy_delta_se": round(se, 4),
            "class_agreement": round(float((pred == ref).double().mean()), 4)}
