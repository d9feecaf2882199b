"""``calibrate_auto`` (``diffspec calibrate --method auto``): the call it calibrates on."""

from __future__ import annotations

from typing import Any

import pytest

from diffspec.api import SpeculativePipeline
from diffspec.bench.calibrate import calibrate_auto
from diffspec.config import AUTO_SAMPLES, AutoConfig


@pytest.fixture
def calls(monkeypatch) -> list[dict[str, Any]]:
    """Every ``calibrate`` call's arguments and the wrapper's ``samples``, instead of measuring."""
    seen: list[dict[str, Any]] = []

    class Recorder:
        def __init__(self, samples: int) -> None:
            self.samples = samples

        def calibrate(self, **kwargs: Any) -> dict[str, Any]:
            seen.append({**kwargs, "samples": self.samples})
            return {}

        def disable(self) -> None:
            pass

    monkeypatch.setattr(SpeculativePipeline, "from_pipe",
                        classmethod(lambda cls, target, method, quality, samples: Recorder(samples)))
    return seen


@pytest.mark.parametrize("model", ["tiny-dit", "tiny-ar"])
def test_more_samples_than_classes_cycle_the_classes(calls, model):
    calibrate_auto(model, samples=16, steps=4, device="cpu")
    assert calls[0]["class_labels"] == [i % 10 for i in range(16)] and calls[0]["samples"] == 16


@pytest.mark.parametrize(("model", "family"), [("tiny-dit", "diffusion"), ("tiny-ar", "ar_image")])
def test_the_default_is_auto_configs_samples_for_the_family(calls, model, family):
    calibrate_auto(model, steps=4, device="cpu")
    count = AutoConfig().sample_count(family)
    assert calls[0]["samples"] is None and len(calls[0]["class_labels"]) == count == AUTO_SAMPLES[family]
