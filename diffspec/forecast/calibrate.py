"""Calibrating ``speca``'s threshold schedule to a target quality, and loading the result.

:func:`calibrate_speca` first runs the full-compute generations, then a probe run that accepts
every draft while logging the verifier's errors, which sets the range of ``tau0`` to search.
Every ``(tau0, beta)`` of the grid is then run for real on the calibration seeds, and the one
with the fewest full steps whose mean PSNR against the full-compute output reaches the target
is kept (ties: higher PSNR). Settings whose verifier rejected every check are never kept while
another exists (:func:`all_rejected`): they are a fixed interval plus the verifier's wasted cost. Full steps count per batch row (``SpecStats.target_evals``: rows
decide on their own and only the rows that need it are recomputed), plus the verifier's blocks in
full-step equivalents. Searching with real runs, rather than fitting a curve to shadow
errors, guarantees the target on the calibration set: the errors depend on the schedule chosen.

The result is saved as ``diffspec_speca.json`` in the model folder, where ``speca`` finds it. It also
records ``full_rate``: per step, how often the kept setting's gate ran the step in full on the
calibration seeds. :func:`replay_schedule` turns it into ``SpecaConfig(replay_steps=...)``, which
replays that schedule without the verifier (no check cost): the run to report next to the gate's own
on models whose weights make the gate's decisions unrepresentative (random-weight speed configs).
With ``schedules``, :func:`~diffspec.bench.calibrate.calibrate_model` (what ``diffspec calibrate`` runs)
also searches a fixed placement of that many full steps against the full run
(:mod:`~diffspec.forecast.schedule_search`), starting from the even grid and from the gate's placement;
:func:`calibrated_replay` turns it into the ``speca`` config that replays it.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from ..config import SpecaConfig, check_float, check_int
from ..metrics import psnr
from ..progress import progress
from ..stats import SpecStats

CALIBRATION_FILE = "diffspec_speca.json"
BETA_GRID = (0.1, 0.3, 1.0, 3.0, 10.0, 30.0)

Generate = Callable[[SpecaConfig | None], tuple[torch.Tensor, SpecStats | None]]
"""``generate(config)``: the calibration samples with ``speca`` at ``config`` (None: full compute)."""


def calibrate_speca(generate: Generate, *, target_psnr: float = 30.0, base: SpecaConfig | None = None,
                    tau_points: int = 10, betas: Sequence[float] = BETA_GRID, data_range: float | None = None,
                    show_progress: bool = True) -> dict[str, Any]:
    """Search ``tau0`` and ``beta`` for the cheapest ``speca`` schedule that keeps ``target_psnr``.

    Args:
        generate: runs the calibration samples (see :data:`Generate`).
        target_psnr: mean PSNR (dB) against the full-compute samples to reach.
        base: the other ``speca`` settings (order, k_min, k_max...); default :class:`SpecaConfig`.
        tau_points: ``tau0`` values, log-spaced over the range of errors seen in the probe run.
        betas: ``beta`` values to try.
        data_range: PSNR data range (1.0 for images in [0, 1]; None: the reference's range).

    Returns:
        The calibration record (``tau0``, ``beta``, ``tau_min``, achieved PSNR, full steps, grid).

    Example:
        >>> record = calibrate_speca(generate, target_psnr=30)  # doctest: +SKIP
        >>> SpecaConfig(**{k: record[k] for k in ("tau0", "beta", "tau_min")})  # doctest: +SKIP
    """
    check_float("target_psnr", target_psnr, 0.0, 100.0, lo_open=True)
    base = base or SpecaConfig()
    reference, _ = generate(None)
    _, probe = generate(probe_config(base))
    errors = [e for _, e, _ in (probe.extra.get("checked_errors", []) if probe else [])]
    if not errors:
        raise ValueError("calibration: the probe run checked no draft; lower k_min or raise k_max "
                         f"(k_min={base.k_min}, k_max={base.k_max})")
    taus = tau_grid(errors, tau_points)
    grid = []
    for tau0, beta in progress([(t, b) for t in taus for b in betas], desc="calibrate", disable=not show_progress):
        cfg = base.replace(tau0=tau0, beta=beta, tau_min=0.0)
        images, stats = generate(cfg)
        grid.append({"tau0": tau0, "beta": beta, "psnr": psnr(images, reference, data_range),
                     "full_steps": round(stats.target_evals + stats.extra.get("verifier_evals", 0.0), 3)
                     if stats else None, "all_rejected": all_rejected(stats)})
        grid[-1]["full_rate"] = step_full_rate(stats)
    useful = [g for g in grid if not g["all_rejected"]] or grid
    ok = [g for g in useful if g["psnr"] >= target_psnr]
    best = min(ok, key=lambda g: (g["full_steps"], -g["psnr"])) if ok else max(useful, key=lambda g: g["psnr"])
    return {"method": "speca", "tau0": best["tau0"], "beta": best["beta"], "tau_min": 0.0,
            "target_psnr": target_psnr, "reached": bool(ok), "psnr": best["psnr"],
            "full_steps": best["full_steps"],  # per sample, verifier included
            "full_rate": best.pop("full_rate"),
            "base": {k: v for k, v in base.to_dict().items() if k not in ("tau0", "beta", "tau_min")},
            "probe_errors": [min(errors), max(errors)],
            "grid": [{k: v for k, v in g.items() if k != "full_rate"} for g in grid]}


def probe_config(base: SpecaConfig) -> SpecaConfig:
    """``base`` with a threshold so high that every check runs and nothing is rejected: the probe run whose
    verifier errors (``SpecStats.extra["checked_errors"]``) set the range of ``tau0`` to search."""
    return base.replace(tau0=1e30, beta=1.0, tau_min=0.0)  # finite: checks run


def tau_grid(errors: Sequence[float], points: int) -> list[float]:
    """``points`` values of ``tau0``, log-spaced from half the smallest to 1.5 times the largest verifier error
    of a probe run (``SpecStats.extra["checked_errors"]``), strictest first.

    Example:
        >>> [round(t, 3) for t in tau_grid([0.1, 0.4], 3)]
        [0.05, 0.173, 0.6]
    """
    lo, hi = max(min(errors), 1e-8) * 0.5, max(errors) * 1.5
    return [lo * (hi / lo) ** (i / max(points - 1, 1)) for i in range(points)]


def step_full_rate(stats: SpecStats | None) -> list[float] | None:
    """Per step, the fraction of batch rows the gate computed in full (averaged over the step's calls).

    Example:
        >>> step_full_rate(SpecStats(extra={"full_by_step": [2.0, 0.5], "calls_by_step": [2, 1]}))
        [1.0, 0.5]
    """
    if stats is None or "full_by_step" not in stats.extra:
        return None
    return [round(f / max(c, 1), 4) for f, c in zip(stats.extra["full_by_step"], stats.extra["calls_by_step"])]


def replay_schedule(full_rate: Sequence[float], n_full: int) -> tuple[int, ...]:
    """``n_full`` steps placed with the density of the gate's full steps (``full_rate``, from a calibration
    record), for ``SpecaConfig(replay_steps=...)``: the ``k``-th step is where the cumulative rate first
    reaches ``(k + 1/2) / n_full`` of its total, so a 0/1 record replayed at its own size gives back its
    own steps and smaller sizes thin it out evenly (a "most frequent steps" rule would bunch them where
    the record starts). Step 0 is always kept (every row needs an anchor); collisions are filled by the
    highest-rate free steps (ties: earlier).

    Raises:
        ValueError: ``n_full`` outside ``[1, len(full_rate)]``.

    Example:
        >>> replay_schedule([1.0, 0.0, 1.0, 0.0, 1.0, 0.0, 1.0], 4)
        (0, 2, 4, 6)
        >>> replay_schedule([1.0, 0.0, 1.0, 0.0, 1.0, 0.0, 1.0], 2)
        (0, 4)
    """
    check_int("n_full", n_full, 1, len(full_rate))
    rate = torch.tensor([max(float(r), 0.0) for r in full_rate], dtype=torch.float64)
    cum = rate.cumsum(0)
    total = float(cum[-1])
    chosen = {0}
    if total > 0:
        targets = (torch.arange(n_full, dtype=torch.float64) + 0.5) / n_full * total
        chosen |= set(torch.searchsorted(cum, targets - 1e-9 * total).clamp_max(len(rate) - 1).tolist())
    rest = sorted((s for s in range(len(rate)) if s not in chosen), key=lambda s: (-float(rate[s]), s))
    while len(chosen) > n_full:  # step 0 added beyond the quantiles: drop the lowest-rate latest pick
        chosen.remove(min(chosen - {0}, key=lambda s: (float(rate[s]), -s)))
    chosen |= set(rest[: n_full - len(chosen)])
    return tuple(sorted(chosen))


def all_rejected(stats: SpecStats | None) -> bool:
    """Whether a run's verifier rejected every draft it checked.

    Such thresholds only add the verifier's cost: the schedule is a fixed interval of ``k_min + 1``
    with a wasted last-block run per interval, which the same interval without checks (``taylor``)
    beats at the same quality. Calibration never keeps them while any other setting exists.

    Example:
        >>> all_rejected(SpecStats(extra={"checks": 4, "rejections": 4}))
        True
    """
    checks = stats.extra.get("checks", 0) if stats is not None else 0
    return bool(checks) and stats.extra.get("rejections", 0) >= checks  # type: ignore[union-attr]


def save_calibration(record: dict[str, Any], folder: str | Path) -> Path:
    """Write ``record`` as :data:`CALIBRATION_FILE` in ``folder``; returns the path."""
    path = Path(folder) / CALIBRATION_FILE
    path.write_text(json.dumps(record, indent=2) + "\n")
    return path


def load_calibration(folder: str | Path | None) -> dict[str, Any] | None:
    """The calibration record saved in a model folder, or None."""
    if folder is None:
        return None
    path = Path(folder) / CALIBRATION_FILE
    if not path.is_file():
        return None
    try:
        record = json.loads(path.read_text())
        return record if all(k in record for k in ("tau0", "beta", "tau_min")) else None
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path} is not valid JSON ({exc}); rerun `diffspec calibrate`") from exc


def resolve_thresholds(config: SpecaConfig, folder: str | Path | None) -> tuple[SpecaConfig, str]:
    """Fill unset thresholds: from the model folder's calibration, else the generic fallback.

    Returns the completed config and where its thresholds came from.
    """
    if config.calibrated:
        return config, "config"
    record = load_calibration(folder)
    if record is not None:
        return config.fill_thresholds(record), str(Path(folder) / CALIBRATION_FILE)  # type: ignore[arg-type]
    return config.with_fallback(), "fallback"


def resolve_replay(config: SpecaConfig, folder: str | Path | None) -> tuple[SpecaConfig, str | None, int | None]:
    """``config`` with ``replay_full_steps`` turned into the model folder's searched schedule
    (:func:`calibrated_replay`); returns the config, where the schedule came from and the number of
    inference steps it was searched for (None, None: nothing to read).

    Raises:
        ValueError: ``replay_full_steps`` is set but the folder has no calibration record with that schedule.
    """
    n = config.replay_full_steps
    if n is None:
        return config, None, None
    record = load_calibration(folder)
    if record is None:
        raise ValueError(f"replay_full_steps={n}: the model ({folder}) has no {CALIBRATION_FILE}; run "
                         f"`diffspec calibrate --model ... --schedules {n}` first, or pass replay_steps")
    replay = calibrated_replay(record, n)
    return config.replace(replay_full_steps=None, replay_steps=replay.replay_steps, granularity=replay.granularity,
                          order=replay.order), str(Path(folder) / CALIBRATION_FILE), record.get("steps")  # type: ignore[arg-type]


def calibrated_replay(record: dict[str, Any], full_steps: int, granularity: str | None = None) -> SpecaConfig:
    """``speca`` replaying the searched placement of ``full_steps`` full steps in a calibration ``record``
    (``calibrate_model(..., schedules=...)``) at the granularity and order it was searched with; with several
    granularities searched, the one with the best calibration PSNR unless ``granularity`` is given.

    Raises:
        ValueError: the record has no schedule of that size (the message lists those it has).

    Example:
        >>> record = {"schedules": [{"full_steps": 3, "granularity": "block", "order": 2, "schedule": [0, 2, 4],
        ...                          "psnr": 30.0}]}
        >>> calibrated_replay(record, 3).replay_steps
        (0, 2, 4)
    """
    entries = [e for e in record.get("schedules", []) if e["full_steps"] == full_steps
               and (granularity is None or e["granularity"] == granularity)]
    if not entries:
        have = sorted({(e["full_steps"], e["granularity"]) for e in record.get("schedules", [])})
        raise ValueError(f"full_steps={full_steps} (granularity={granularity!r}): the calibration record has no such "
                         f"schedule; it has {have or 'none'} (rerun `diffspec calibrate --schedules {full_steps}`)")
    best = max(entries, key=lambda e: e["psnr"])
    return SpecaConfig(replay_steps=tuple(best["schedule"]), granularity=best["granularity"], order=best["order"])
