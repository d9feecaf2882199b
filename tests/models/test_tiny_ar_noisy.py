"""The shipped ``tiny-ar-noisy`` AR model (textured shapes with strong pixel noise: flat next-token laws)."""

from __future__ import annotations

import torch

from diffspec.ar_image.token_stats import per_token_entropy
from diffspec.data import render_shapes
from diffspec.models import (
    REFERENCE_CLASSIFIERS,
    SHIPPED_MODELS,
    class_accuracy,
    load_ar_target,
    reference_fid,
)
from diffspec.models.int8_weights import FILENAME

NOISY = {"background": "textured", "texture_strength": 0.7, "noise": 0.4}  # tiny-ar-noisy's data variant


def test_tiny_ar_noisy_loads_with_its_classifier():
    folder = SHIPPED_MODELS["tiny-ar-noisy"]
    assert (folder / "gpt" / FILENAME).stat().st_size < 3_000_000
    target = load_ar_target("tiny-ar-noisy")
    assert target.grid == (8, 8) and target.codebook_size == 1024 and target.num_tokens == 64
    assert {p.dtype for p in target.model.parameters()} == {torch.float32}
    assert target.default_guidance_scale == 3.0 and target.reference_classifier == "shapes-noisy"


def _mean_entropy(model: str, n: int = 8) -> float:
    """Mean next-token entropy (nats) along plain samples (CFG 3, temperature 1) of ``n`` images."""
    target = load_ar_target(model)
    g = torch.Generator().manual_seed(0)
    session = target.start(class_labels=list(range(n)), guidance_scale=3.0)
    logits, entropies = session.first_logits, []
    for i in range(target.num_tokens):
        entropies.append(per_token_entropy(logits)[0])
        token = torch.multinomial(torch.softmax(logits.float(), -1), 1, generator=g)
        if i + 1 < target.num_tokens:
            logits = session.step(token, torch.full((n,), i))[:, 0]
    return float(torch.stack(entropies).mean())


def test_tiny_ar_noisy_laws_are_flatter_than_tiny_ar_tex():
    noisy, tex = _mean_entropy("tiny-ar-noisy"), _mean_entropy("tiny-ar-tex")
    assert noisy > 4.0 and noisy > tex + 1.0, (noisy, tex)


def test_noisy_classifier_fits_noisy_images():
    images, labels = render_shapes(400, seed=123, **NOISY)
    assert set(REFERENCE_CLASSIFIERS) >= {"shapes", "shapes-tex", "shapes-noisy"}
    assert class_accuracy(images, labels, classifier="shapes-noisy") > 0.75
    # its statistics are of noisy images: real noisy images sit closer to them than the low-noise ones
    fid_noisy = reference_fid(images, classifier="shapes-noisy")
    tex, _ = render_shapes(400, seed=123, background="textured", texture_strength=0.7, noise=0.05)
    assert fid_noisy < reference_fid(tex, classifier="shapes-noisy")
