from dataclasses import replace

import pytest
import torch

from diffspec.forecast.hooks import ForecastHooks
from diffspec.forecast.profiles import PROFILES


@pytest.fixture
def override_profile(monkeypatch):
    """``override_profile(model, between_block_args=())``: for this test, the row of ``model``'s class with those
    fields changed (hooks made afterwards read it)."""

    def override(model, **changes):
        name = type(model).__name__
        monkeypatch.setitem(PROFILES, name, replace(PROFILES[name], **changes))

    return override


@pytest.fixture
def scale_row_errors(monkeypatch):
    """``scale_row_errors([1.0, 1e12])``: every later verifier decision sees each row's error times its factor (row 1's
    checks then always fail); ``scale_row_errors(None)``: the errors as measured."""
    decide = ForecastHooks._decide

    def set_scale(scale):
        def scaled_decide(self, recompute, label):
            errors = self.call.errors
            if errors is not None and scale is not None:
                self.call.errors = errors * torch.tensor(scale, device=errors.device)
            return decide(self, recompute, label)

        monkeypatch.setattr(ForecastHooks, "_decide", scaled_decide)

    return set_scale
