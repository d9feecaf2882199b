"""Calibration never keeps thresholds whose verifier rejects every check (a fixed interval plus waste)."""

import torch

from diffspec.config import SpecaConfig
from diffspec.forecast.calibrate import all_rejected, calibrate_speca
from diffspec.stats import SpecStats

REFERENCE = torch.zeros(2, 3, 4, 4)
SMALLEST_ERROR = 0.1


def _generate(all_degenerate: bool = False):
    """A fake ``generate``: thresholds under the smallest probe error reject every check and are cheap
    by the counter (10 evals, as the all-reject schedule of a short ``k_min``), the others cost 12."""

    def generate(config: SpecaConfig | None):
        if config is None:
            return REFERENCE, None
        if config.tau0 >= 1e29:  # the probe run: every check accepted, errors logged
            return REFERENCE, SpecStats(extra={"checks": 2, "rejections": 0,
                                               "checked_errors": [[3, SMALLEST_ERROR, 1e30], [6, 0.4, 1e30]]})
        if all_degenerate or config.tau(0.0) < SMALLEST_ERROR:
            return REFERENCE + 0.001, SpecStats(target_evals=10.0, extra={"checks": 4, "rejections": 4})
        return REFERENCE + 0.01, SpecStats(target_evals=12.0, extra={"checks": 4, "rejections": 1})

    return generate


def test_all_rejected_reads_the_verifier_counts():
    assert all_rejected(SpecStats(extra={"checks": 3, "rejections": 3}))
    assert not all_rejected(SpecStats(extra={"checks": 3, "rejections": 2}))
    assert not all_rejected(SpecStats()) and not all_rejected(None)  # no check: nothing wasted


def test_calibration_skips_thresholds_that_reject_every_check():
    record = calibrate_speca(_generate(), target_psnr=30.0, data_range=1.0, betas=(0.5, 1.0), tau_points=6,
                             show_progress=False)
    degenerate = [g for g in record["grid"] if g["all_rejected"]]
    assert degenerate and min(g["full_steps"] for g in degenerate) < record["full_steps"]  # cheaper, yet skipped
    assert record["tau0"] >= SMALLEST_ERROR and record["reached"] and record["full_steps"] == 12.0


def test_calibration_keeps_a_degenerate_grid_rather_than_nothing():
    record = calibrate_speca(_generate(all_degenerate=True), target_psnr=30.0, data_range=1.0, betas=(1.0,),
                             tau_points=3, show_progress=False)
    assert all(g["all_rejected"] for g in record["grid"]) and record["reached"] and record["full_steps"] == 10.0
