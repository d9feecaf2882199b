"""One table over several ``ar-image`` runs of the same arms on different seed sets (or settings).

A page block names file patterns, ``<!-- report:PATTERN,PATTERN -->`` (``*`` matches the set's label, e.g.
``ar-image-tiny-ar-tex-cpu-mc-sjd-seeds*``). Each file is its own run with its own baseline on the same seeds,
so every ratio is read inside one file: an arm's step compression, its reference-FID rise and its accuracy
change are against the baseline of its file. Only then are they averaged over files (mean, with the standard
deviation of the compression and the standard error of the rise).

Example:
    >>> print(sets_block("x-seeds*", Path("benchmarks/results")))  # doctest: +SKIP
"""

from __future__ import annotations

import fnmatch
import json
import re
import statistics
from pathlib import Path
from typing import Any

from .report_readers import table


def _files(patterns: str, results: Path) -> list[tuple[str, dict[str, Any]]]:
    found = []
    for pattern in patterns.split(","):
        paths = sorted((p for p in results.glob(f"{pattern}.json") if fnmatch.fnmatch(p.stem, pattern)),
                       key=lambda p: [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", p.stem)])
        if not paths:
            raise FileNotFoundError(f"no benchmark JSON in {results} matches {pattern}.json")
        head, _, tail = pattern.partition("*")
        found += [(p.stem[len(head):len(p.stem) - len(tail)], json.loads(p.read_text())) for p in paths]
    return found


def _arm_rows(files: list[tuple[str, dict[str, Any]]]) -> dict[str, list[dict[str, Any]]]:
    """Per arm, one entry per file: the arm's figures next to its own file's baseline."""
    arms: dict[str, list[dict[str, Any]]] = {}
    for label, doc in files:
        base = next(r for r in doc["runs"] if r["method"] == "baseline")["quality"]
        for run in doc["runs"]:
            if run["method"] == "baseline":
                continue
            q = run["quality"]
            test = q.get("token_two_sample") or {}
            arms.setdefault(run["method"], []).append({
                "label": label, "images": doc["workload"].get("quality_samples"),
                "compression": q["step_compression_per_image"], "fid": q["fid"], "base_fid": base["fid"],
                "rise": 100 * (q["fid"] / base["fid"] - 1), "acc_change": 100 * (q["accuracy"] - base["accuracy"]),
                "passed": test.get("passed"), "tv": q.get("relaxed_tv", q.get("tv_budget_mean")),
                "exact": q.get("exact", True)})
    return arms


def _spread(values: list[float], spec: str, error: bool = False) -> str:
    if len(values) < 2:
        return format(values[0], spec)
    sd = statistics.stdev(values)
    return f"{statistics.mean(values):{spec}} ± {(sd / len(values) ** 0.5 if error else sd):{spec.lstrip('+')}}"


def sets_table(files: list[tuple[str, dict[str, Any]]]) -> str:
    """One row per arm: its figures per file (``/``-separated) and their mean ± spread over files."""
    rows = [{"arm": arm, "sets": sets} for arm, sets in _arm_rows(files).items()]

    def each(key: str, spec: str):
        return lambda r: " / ".join(format(s[key], spec) for s in r["sets"])

    def tests(r: dict[str, Any]) -> str:
        passed = [s["passed"] for s in r["sets"] if s["passed"] is not None]
        return f"{sum(passed)}/{len(passed)} pass" if passed else "-"

    return table(rows, [
        ("arm", "---", lambda r: f"`{r['arm']}`" + ("" if r["sets"][0]["exact"] else " (relaxed)")),
        ("sets", "---", each("label", "")),
        ("images / arm", "---:", lambda r: "/".join(sorted({str(s["images"]) for s in r["sets"]}))),
        ("step compression per image", "---", each("compression", ".2f")),
        ("mean ± s.d.", "---:", lambda r: _spread([s["compression"] for s in r["sets"]], ".2f") + "x"),
        ("ref. FID (its baseline)", "---", lambda r: " / ".join(f"{s['fid']:.2f} ({s['base_fid']:.2f})" for s in r["sets"])),
        ("FID rise %, mean ± s.e.", "---:", lambda r: _spread([s["rise"] for s in r["sets"]], "+.1f", error=True)),
        ("accuracy change, points, mean", "---:", lambda r: f"{statistics.mean(s['acc_change'] for s in r['sets']):+.1f}"),
        ("token test", "---", tests),
        ("TV / token", "---:", lambda r: "-" if r["sets"][0]["tv"] is None else
         f"{statistics.mean(s['tv'] for s in r['sets']):.3f}"),
    ])


def sets_block(patterns: str, results: Path) -> str:
    """Sources, machines and weights of the files, then their table."""
    files = _files(patterns, results)
    machines = sorted({doc["machine"]["device"] for _, doc in files})
    models = sorted({f"{doc['model']['name']} ({doc['model'].get('weights', 'weights not recorded')})" for _, doc in files})
    names = ", ".join(f"`benchmarks/results/{p}.json`" for p in patterns.split(","))
    return (f"Sources: {names} ({len(files)} files); {', '.join(models)} on {', '.join(machines)}. "
            "Each ratio is against the baseline of its own file (same seeds); the means are over files.\n\n"
            + sets_table(files))
