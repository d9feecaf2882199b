"""SpecStats: the derived figures, and the AR image pipelines' ``steps`` (definitions: ``docs/stats.md``)."""

import pytest
import torch

from diffspec import SpecStats, SpeculativePipeline


def test_speedup_counts_the_plain_loops_sequential_target_calls():
    assert SpecStats(steps=50, target_calls=34).speedup == 50 / 34  # coupling: 34 sequential calls for 50 steps
    assert SpecStats(steps=50, branches=2, target_calls=40).speedup == 100 / 40  # one call per CFG branch
    assert SpecStats(steps=0, target_calls=3).speedup is None and SpecStats(steps=5).speedup is None
    stats = SpecStats(method="taylor", steps=10, full_steps=4.5, forecast_steps=5.5, target_calls=5,
                      accepted=11, proposed=12)
    d = stats.to_dict()
    assert (d["speedup"], d["acceptance_rate"], d["forecast_fraction"]) == (2.0, 11 / 12, 0.55)
    stats.reset()
    assert (stats.method, stats.steps, stats.branches, stats.full_steps, stats.speedup) == ("taylor", 0, 1, 0, None)


def test_ar_image_steps_are_its_tokens_and_the_speedup_its_step_compression():
    spec = SpeculativePipeline.from_pretrained("tiny-ar", method="mc-sjd")
    spec.set_progress_bar_config(disable=True)
    spec(class_labels=[3], output_type="tokens", generator=torch.Generator().manual_seed(0))
    stats = spec.stats
    assert stats.steps == spec.pipe.num_tokens and stats.target_calls < stats.steps
    assert stats.speedup == pytest.approx(stats.extra["step_compression"])
    spec.plain(class_labels=[3], output_type="tokens", generator=torch.Generator().manual_seed(0))
    assert stats.target_calls == stats.steps and stats.speedup == 1.0
