"""Calibrating *where* the full steps go: a local search of a fixed schedule against the full run.

A gate (``speca``'s verifier) only decides which steps run in full. On a given model the best fixed
placement of ``n`` full steps can be searched for directly: :func:`refine_schedule` moves one full
step at a time by a step or two and keeps a move when it raises the PSNR of the calibration samples
against their full-compute output. :func:`search_schedules` runs it from two starts, the even grid
``taylor`` uses (:func:`even_schedule`) and the calibrated gate's own placement
(:func:`~diffspec.forecast.calibrate.replay_schedule` of its ``full_rate``), and keeps the better one.
The result is replayed without a verifier (``SpecaConfig(replay_steps=...)``), so its full steps are
its only compute; :func:`~diffspec.forecast.calibrate.calibrated_replay` reads it back from a
calibration record as that config.

Each candidate costs one generation of the calibration samples, and a search tries about
``4 * n`` candidates per sweep; the held-out check that this does not over-fit is
``scripts/speca_schedule_holdout.py``.

Example:
    >>> even_schedule(6, 20)
    (0, 1, 5, 10, 15, 19)
    >>> score = lambda s: -abs(s[2] - 7)  # a toy objective: the third full step wants step 7
    >>> refine_schedule(score, (0, 1, 5, 10, 15, 19), min_gain=0.0)[0]
    (0, 1, 7, 10, 15, 19)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from ..config import check_choice, check_float, check_int
from ..progress import progress

GRANULARITIES = ("block", "module")
"""Granularities a schedule can be searched at (the replay's forecast; ``"auto"`` is not a fixed one)."""

MOVES = (-2, -1, 1, 2)
"""How far one full step may move in one try."""

Score = Callable[[tuple[int, ...]], float]
"""``score(schedule)``: the quality of replaying ``schedule`` (higher is better), e.g. mean PSNR vs the full run."""


def even_schedule(n_full: int, num_steps: int, warmup: int = 2) -> tuple[int, ...]:
    """``n_full`` full steps: the first ``warmup``, the last, and the rest evenly spaced in between.

    Raises:
        ValueError: ``n_full`` outside ``[warmup + 1, num_steps]``.
    """
    check_int("num_steps", num_steps, 2)
    check_int("warmup", warmup, 1, num_steps - 1)
    check_int("n_full", n_full, warmup + 1, num_steps)
    inner = n_full - warmup - 1
    span = num_steps - warmup  # gaps from the last warmup step to the last step
    steps = {*range(warmup), num_steps - 1}
    steps |= {warmup - 1 + round(span * (k + 1) / (inner + 1)) for k in range(inner)}
    for k in range(warmup, num_steps):  # rounding collided (dense schedules): fill the first free steps
        if len(steps) >= n_full:
            break
        steps.add(k)
    return tuple(sorted(steps))


def refine_schedule(score: Score, start: Sequence[int], *, sweeps: int = 4, min_gain: float = 0.05,
                    show_progress: bool = False) -> tuple[tuple[int, ...], float, int]:
    """Hill-climb ``start`` one move at a time: each full step but the first and last tries the
    :data:`MOVES` (keeping the order of the steps); a move is kept when it raises ``score`` by more than
    ``min_gain``. Stops after ``sweeps`` sweeps or a sweep with no kept move.

    Returns:
        ``(schedule, its score, candidates scored)``.
    """
    check_int("sweeps", sweeps, 1)
    check_float("min_gain", min_gain, 0.0, 1e9)
    cur = tuple(sorted(start))
    best, tried = score(cur), 1
    for _ in progress(range(sweeps), desc="schedule search", disable=not show_progress):
        improved = False
        for i in range(1, len(cur) - 1):
            for d in MOVES:
                s = cur[i] + d
                if not cur[i - 1] < s < cur[i + 1]:
                    continue
                cand = (*cur[:i], s, *cur[i + 1:])
                value = score(cand)
                tried += 1
                if value > best + min_gain:
                    cur, best, improved = cand, value, True
        if not improved:
            break
    return cur, best, tried


def search_schedules(score_for: Callable[[str], Score], sizes: Sequence[int], num_steps: int,
                     granularities: Sequence[str] = ("block",), full_rate: Sequence[float] | None = None,
                     order: int = 2, sweeps: int = 4, show_progress: bool = True) -> list[dict[str, Any]]:
    """For each size and granularity, :func:`refine_schedule` from the even grid and (with ``full_rate``) from
    the gate's placement; keeps the better result.

    Args:
        score_for: ``score_for(granularity)`` gives the :data:`Score` of replays at that granularity.
        sizes: numbers of full steps.
        full_rate: the calibrated gate's per-step full rate (a calibration record's ``full_rate``).

    Returns:
        One entry per size and granularity: ``full_steps``, ``granularity``, ``order``, ``schedule``,
        ``psnr`` (its score), ``start`` (which start it came from), ``starts`` (every start's score before
        and after the search) and ``tried``.
    """
    from .calibrate import replay_schedule

    out = []
    for n_full in sizes:
        for granularity in granularities:
            check_choice("granularity", granularity, GRANULARITIES)
            score = _memo(score_for(granularity))
            starts = {"even grid": even_schedule(n_full, num_steps)}
            if full_rate is not None:
                starts["gate's placement"] = replay_schedule(full_rate, n_full)
            runs = {}
            for name, start in starts.items():
                schedule, value, tried = refine_schedule(score, start, sweeps=sweeps, show_progress=show_progress)
                runs[name] = {"start": list(start), "start_psnr": round(score(start), 3), "schedule": list(schedule),
                              "psnr": round(value, 3), "tried": tried}
            name = max(runs, key=lambda k: runs[k]["psnr"])
            out.append({"full_steps": n_full, "granularity": granularity, "order": order,
                        "schedule": runs[name]["schedule"], "psnr": runs[name]["psnr"], "start": name,
                        "starts": runs, "tried": sum(r["tried"] for r in runs.values())})
    return out


def _memo(score: Score) -> Score:
    """``score`` with its values remembered (a start is scored by the search and again for the record)."""
    seen: dict[tuple[int, ...], float] = {}

    def cached(schedule: tuple[int, ...]) -> float:
        key = tuple(schedule)
        if key not in seen:
            seen[key] = score(key)
        return seen[key]

    return cached
