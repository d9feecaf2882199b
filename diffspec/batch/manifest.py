"""Per-rank append-only manifests, resume, and ``diffspec merge``.

Each rank appends one JSON line per finished item to ``out/manifest-rank<r>.jsonl`` (fsynced after
each line; a line that cannot be written whole, on a full disk, is cut back off): ``key``, ``id``,
``index``, ``status`` (``ok``/``failed``), ``path`` (relative to ``out``), ``size``, ``sha256``,
``seconds``, ``batch``, the call's figures (``full_steps``, ``forecast_steps``, ``branches``,
``target_calls``, ``target_evals``, ``acceptance``, ``step_speedup``: :class:`~diffspec.stats.SpecStats`'s,
defined there and in ``docs/stats.md``; with ``batch`` > 1 they are the shared call's) and the item's fields. A rerun skips every key
that some manifest lists as ``ok`` and whose file has the listed size and sha256;
:func:`merge_manifests` writes ``out/manifest.jsonl`` with one line per key (the latest ``ok``
line if any, else the latest failure; an ``ok`` line whose file is gone becomes ``missing``, one
whose file does not match ``damaged``), in item order.

Example:
    >>> summary = merge_manifests("out/")  # doctest: +SKIP
    >>> summary.ok, summary.failed  # doctest: +SKIP
    (98, 2)
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .media import sha256_file, write_atomic

MERGED = "manifest.jsonl"
RANK_GLOB = "manifest-rank*.jsonl"


def rank_manifest(out: str | Path, rank: int) -> Path:
    """``out/manifest-rank<rank>.jsonl``."""
    return Path(out) / f"manifest-rank{rank}.jsonl"


def _write_all(fd: int, data: bytes) -> None:
    """``os.write`` until all of ``data`` is written (a write may take part of it)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


class ManifestWriter:
    """Appends records to one rank's manifest; each line is on disk before :meth:`write` returns.

    A line cut short by a killed process is closed with a newline first, so later lines stay whole
    (readers skip the cut line). A line that cannot be written (a full disk) is cut back off before
    the error is raised, so the file holds whole lines only.
    """

    def __init__(self, out: str | Path, rank: int) -> None:
        self.path = rank_manifest(out, rank)
        flags = os.O_RDWR | os.O_APPEND | os.O_CREAT | getattr(os, "O_BINARY", 0)
        self._fd = os.open(self.path, flags, 0o666)  # closed in close()
        try:
            if os.lseek(self._fd, 0, os.SEEK_END) > 0:
                os.lseek(self._fd, -1, os.SEEK_END)
                if os.read(self._fd, 1) != b"\n":
                    _write_all(self._fd, b"\n")
        except BaseException:
            os.close(self._fd)
            raise

    def write(self, record: dict[str, Any]) -> None:
        """Append one record as a JSON line and sync it.

        Raises:
            OSError: the line could not be written whole (it is then removed again).
        """
        start = os.fstat(self._fd).st_size
        try:
            _write_all(self._fd, (json.dumps(record, default=str) + "\n").encode("utf-8"))
            os.fsync(self._fd)
        except OSError:
            try:
                os.ftruncate(self._fd, start)
            except OSError:  # then the next writer closes the cut line, and readers skip it
                pass
            raise

    def close(self) -> None:
        """Close the file."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __enter__(self) -> ManifestWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def read_records(out: str | Path) -> tuple[list[dict[str, Any]], int]:
    """Every record of every rank manifest in ``out`` (oldest first), and the number of unreadable lines."""
    records: list[dict[str, Any]] = []
    bad = 0
    for path in sorted(Path(out).glob(RANK_GLOB)):
        for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                bad += 1  # a line cut by a kill
                continue
            if isinstance(rec, dict) and "key" in rec:
                records.append(rec)
            else:
                bad += 1
    records.sort(key=lambda r: r.get("finished", 0.0))
    return records, bad


def output_state(out: str | Path, record: dict[str, Any], *, verify: bool = False) -> str:
    """``"ok"``, ``"missing"`` or ``"damaged"``: whether an ``ok`` record's file is there with the recorded size
    (and, with ``verify``, sha256). Records written before sizes were recorded are checked by their sha256."""
    path = Path(out) / str(record.get("path"))
    if not record.get("path") or not path.is_file():
        return "missing"
    size = record.get("size")
    if size is not None and path.stat().st_size != size:
        return "damaged"
    if (verify or size is None) and record.get("sha256") and sha256_file(path) != record["sha256"]:
        return "damaged"
    return "ok"


def latest_ok(records: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """key → the latest ``ok`` record of each key listed ``ok`` (whatever state its file is in)."""
    return {rec["key"]: rec for rec in records if rec.get("status") == "ok"}


def completed(out: str | Path, records: list[dict[str, Any]] | None = None, *, keys: set[str] | None = None,
              verify: bool = False) -> dict[str, dict[str, Any]]:
    """key → latest ``ok`` record whose file is there with its size (with ``verify``, its sha256 too): what a rerun
    skips. ``keys``: only these keys (the others are not looked at)."""
    if records is None:
        records, _ = read_records(out)
    listed = latest_ok(records)
    return {key: rec for key, rec in listed.items()
            if (keys is None or key in keys) and output_state(out, rec, verify=verify) == "ok"}


@dataclass
class MergeSummary:
    """What :func:`merge_manifests` found: counts and the merged file."""

    path: Path
    ok: int = 0
    failed: int = 0
    missing: int = 0  # listed ok, but the file is gone
    damaged: int = 0  # listed ok, but the file does not match its size (with verify, its sha256)
    unreadable_lines: int = 0
    mean_seconds: float | None = None
    mean_step_speedup: float | None = None
    failures: list[str] = field(default_factory=list)  # "id: error" of the failed items
    lost: list[str] = field(default_factory=list)  # "id: missing|damaged path" of the outputs listed ok

    def line(self) -> str:
        """One-line human summary."""
        parts = [f"{self.ok} ok", f"{self.failed} failed"]
        if self.missing:
            parts.append(f"{self.missing} missing")
        if self.damaged:
            parts.append(f"{self.damaged} damaged")
        text = f"{self.path}: {', '.join(parts)}"
        if self.mean_seconds is not None:
            text += f"; {self.mean_seconds:.3g} s/item"
        if self.mean_step_speedup is not None:
            text += f"; mean speedup {self.mean_step_speedup:.2f}x (steps / sequential target calls)"
        return text


def merge_manifests(out: str | Path, *, verify: bool = False) -> MergeSummary:
    """Combine ``out/manifest-rank*.jsonl`` into ``out/manifest.jsonl`` (atomically), one line per key.

    Args:
        out: the output folder of ``diffspec generate``.
        verify: re-hash every file and count a mismatch as damaged (without it, only a size that differs from
            the recorded one is).

    Raises:
        ValueError: ``out`` holds no rank manifest.
    """
    out = Path(out)
    records, bad = read_records(out)
    if not records and not any(out.glob(RANK_GLOB)):
        raise ValueError(f"{out} holds no {RANK_GLOB} (is it the --out folder of `diffspec generate`?)")
    best: dict[str, dict[str, Any]] = {}
    summary = MergeSummary(out / MERGED, unreadable_lines=bad)
    for rec in records:
        state = output_state(out, rec, verify=verify) if rec.get("status") == "ok" else None
        if state == "ok":
            best[rec["key"]] = rec
        elif rec["key"] not in best or best[rec["key"]].get("status") != "ok":
            best[rec["key"]] = rec if state is None else {**rec, "status": state}
    merged = sorted(best.values(), key=lambda r: (r.get("index", 0), r["key"]))
    seconds, speedups = [], []
    for rec in merged:
        status = rec.get("status")
        if status == "ok":
            summary.ok += 1
            seconds.append(float(rec.get("seconds") or 0.0))
            if rec.get("step_speedup") is not None:
                speedups.append(float(rec["step_speedup"]))
        elif status in ("missing", "damaged"):
            setattr(summary, status, getattr(summary, status) + 1)
            summary.lost.append(f"{rec.get('id')}: {status} {rec.get('path')}")
        else:
            summary.failed += 1
            summary.failures.append(f"{rec.get('id')}: {rec.get('error')}")
    summary.mean_seconds = sum(seconds) / len(seconds) if seconds else None
    summary.mean_step_speedup = sum(speedups) / len(speedups) if speedups else None
    text = "".join(json.dumps(r, default=str) + "\n" for r in merged)
    write_atomic(summary.path, lambda tmp: tmp.write_text(text, encoding="utf-8"))
    return summary
