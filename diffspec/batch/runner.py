"""Generate this rank's share of a batch into an output folder, resumably (what ``diffspec generate`` runs).

Outputs go to ``out/<key[:2]>/<key>.png|mp4|webp|gif`` (written atomically), one manifest line
per item to ``out/manifest-rank<r>.jsonl``. Items already listed ``ok`` whose file has the listed
size and sha256 are skipped (a missing or damaged file is generated again). An item that fails (a
bad config value, an error inside the pipeline, an output with NaN/Inf or one value everywhere) is
recorded as ``failed`` with its error, and the batch goes on; when the folder cannot be written (a
full disk, a quota, a read-only file system) the run stops with :class:`OutputStopped`. A single
process holds the folder's lock (:mod:`~diffspec.batch.lock`) while it runs.

Example:
    >>> from diffspec.batch import World, generate_batch, items_from_prompts
    >>> summary = generate_batch(pipe, items_from_prompts(["circle", "star"]), "out/",
    ...                          model={"name": "tiny-dit", "fingerprint": "..."})  # doctest: +SKIP
    >>> print(summary.line())  # doctest: +SKIP
    rank 0/1: 2 items: 2 generated, 0 already done, 0 failed in 1.2 s ...
"""

from __future__ import annotations

import errno
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

from ..progress import progress
from .adapter import PipelineAdapter
from .items import GenItem, cut, item_key
from .lock import single_writer
from .manifest import ManifestWriter, completed, latest_ok, read_records
from .media import clean_temporaries, default_video_format, output_problem, write_image, write_video
from .shard import World, shard

DEFAULT_FPS = 16
STORAGE_ERRNOS = frozenset({errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC), errno.EROFS, errno.EIO})
"""Write errors that every later item would meet too: the run stops on them instead of failing item after item."""


@dataclass
class RunSummary:
    """What one rank did."""

    rank: int = 0
    world_size: int = 1
    assigned: int = 0
    skipped: int = 0
    generated: int = 0
    failed: int = 0
    seconds: float = 0.0
    speedups: list[float] = field(default_factory=list)
    remade: int = 0  # listed ok, but the file was missing or damaged: generated again
    failures: list[str] = field(default_factory=list)  # "line N (id): error"
    keys: list[str] = field(default_factory=list)  # every item's key (all ranks'), in item order

    @property
    def mean_speedup(self) -> float | None:
        """Mean over generated items of their ``step_speedup`` (:attr:`~diffspec.stats.SpecStats.speedup`)."""
        return sum(self.speedups) / len(self.speedups) if self.speedups else None

    def line(self) -> str:
        """One-line human summary."""
        text = (f"rank {self.rank}/{self.world_size}: {self.assigned} items: {self.generated} generated, "
                f"{self.skipped} already done, {self.failed} failed in {self.seconds:.1f} s")
        if self.generated:
            text += f" ({self.seconds / self.generated:.3g} s/item)"
        if self.mean_speedup is not None:
            text += f"; mean speedup {self.mean_speedup:.2f}x (steps / sequential target calls)"
        if self.remade:
            text += f"; {self.remade} listed output{'s' if self.remade > 1 else ''} missing or damaged, generated again"
        return text


class OutputStopped(RuntimeError):
    """The output folder cannot be written (a full disk, a quota): the run stopped. ``summary``: what it did."""

    def __init__(self, message: str, summary: RunSummary) -> None:
        super().__init__(message)
        self.summary = summary


@dataclass
class _Group:
    """Items sharing one method config (one wrapper)."""

    method: str
    config: Any  # MethodConfig | None
    error: str | None
    items: list[GenItem]


def resolve_item_config(item: GenItem) -> tuple[Any, str | None]:
    """``(config or None, error or None)`` of an item's method and overrides."""
    from ..api import resolve_config

    if item.method == "none":
        if item.overrides:
            return None, f"config overrides {sorted(item.overrides)} need a method other than 'none'"
        return None, None
    try:
        return resolve_config(item.method, item.overrides)[1], None
    except (ValueError, TypeError) as exc:
        return None, str(exc)


def _stats_fields(stats: Any, method: str) -> dict[str, Any]:
    """An item's manifest figures from its call's :class:`~diffspec.stats.SpecStats` (defined there and in
    ``docs/stats.md``); ``step_speedup`` is :attr:`~diffspec.stats.SpecStats.speedup` (1.0 for method ``none``)."""
    if stats is None:
        return {"full_steps": None, "forecast_steps": None, "branches": None, "target_calls": None,
                "target_evals": None, "acceptance": None, "step_speedup": 1.0 if method == "none" else None}
    fields = {"full_steps": round(stats.full_steps, 4), "forecast_steps": round(stats.forecast_steps, 4),
              "branches": stats.branches, "target_calls": stats.target_calls,
              "target_evals": round(stats.target_evals, 4),
              "acceptance": round(stats.acceptance_rate, 4) if stats.proposed else None,
              "step_speedup": stats.speedup}
    if "controlnet_full" in stats.extra:  # the pipeline's ControlNet, run in full only where the transformer was
        fields["controlnet_calls"] = stats.extra["controlnet_full"]
    return fields


class _Run:
    """State of one rank's run: the manifest, the progress bar and the summary."""

    def __init__(self, pipe: Any, out: Path, adapter: PipelineAdapter, keys: dict[int, str], fmt: str,
                 manifest: ManifestWriter, bar: Any, summary: RunSummary, base: dict[str, Any]) -> None:
        self.pipe, self.out, self.adapter, self.keys, self.fmt = pipe, out, adapter, keys, fmt
        self.manifest, self.bar, self.summary, self.base = manifest, bar, summary, base
        self.prefix = f".tmp-r{summary.rank}-"

    def record(self, item: GenItem, status: str, config: dict[str, Any] | None, **extra: Any) -> None:
        fields = {k: v for k, v in item.fields().items() if k not in ("id", "overrides")}
        rec = {"key": self.keys[item.index], "id": item.id, "index": item.index, "line": item.line,
               "status": status, **extra, **fields, "config": config if config is not None else item.overrides or None,
               **self.base, "finished": time.time()}
        try:
            self.manifest.write(rec)
        except OSError as exc:
            raise OutputStopped(f"cannot write {self.manifest.path}: {exc.strerror or exc}", self.summary) from None
        self.bar.update(1)

    def fail(self, item: GenItem, error: str, config: dict[str, Any] | None = None) -> None:
        error = error.strip().splitlines()[0] if error.strip() else "error"
        self.summary.failed += 1
        self.summary.failures.append(f"{item.where} ({cut(item.id)}): {error}")
        self.record(item, "failed", config, error=error, path=None)
        self.bar.set_postfix(failed=self.summary.failed)

    def stop(self, item: GenItem, error: str, config: dict[str, Any] | None) -> NoReturn:
        """Record ``item`` as failed if the manifest can still be written, then stop the run."""
        try:
            self.fail(item, error, config)
        except OutputStopped:
            pass
        raise OutputStopped(error, self.summary)

    def run_group(self, group: _Group, batch_size: int) -> None:
        from ..api import SpeculativePipeline

        if group.error is not None:
            for item in group.items:
                self.fail(item, group.error)
            return
        runner, config_dict = self.pipe, None
        if group.config is not None:
            try:
                runner = SpeculativePipeline.from_pipe(self.pipe, method=group.config)
            except Exception as exc:  # e.g. a transformer the method does not support: these items fail
                for item in group.items:
                    self.fail(item, str(exc), group.config.to_dict())
                return
            config_dict = runner.config.to_dict()  # speca: with its resolved thresholds
        try:
            for batch in _batches(group.items, batch_size):
                self.run_batch(runner, batch, config_dict)
        finally:
            if runner is not self.pipe:
                runner.disable()

    def run_batch(self, runner: Any, batch: list[GenItem], config: dict[str, Any] | None) -> None:
        start = time.perf_counter()
        try:
            result = runner(**self.adapter.kwargs(batch))
            arrays = self.adapter.outputs(result)
        except Exception as exc:  # one bad item must not stop the batch
            if len(batch) > 1:  # find the culprit: run the items one by one
                for item in batch:
                    self.run_batch(runner, [item], config)
                return
            self.fail(batch[0], f"{type(exc).__name__}: {exc}", config)
            return
        seconds = (time.perf_counter() - start) / len(batch)
        stats = _stats_fields(getattr(result, "spec_stats", None), batch[0].method)
        for item, array in zip(batch, arrays):
            problem = output_problem(array)
            if problem is not None:
                self.fail(item, problem, config)
                continue
            written = self.write(item, array, config)
            if written is None:
                continue
            self.record(item, "ok", config, **written, seconds=round(seconds, 4), batch=len(batch), **stats)
            self.summary.generated += 1  # once its line is on disk: a rerun keeps it
            if stats["step_speedup"] is not None:
                self.summary.speedups.append(stats["step_speedup"])

    def write(self, item: GenItem, array: Any, config: dict[str, Any] | None) -> dict[str, Any] | None:
        """Write an item's output: its ``path``, ``size`` and ``sha256``, or None when it failed (recorded)."""
        key = self.keys[item.index]
        rel = f"{key[:2]}/{key}.{self.fmt}"
        try:
            if self.adapter.video:
                sha = write_video(self.out / rel, array, fps=item.fps or DEFAULT_FPS, fmt=self.fmt, prefix=self.prefix)
            else:
                sha = write_image(self.out / rel, array, prefix=self.prefix)
            size = (self.out / rel).stat().st_size
        except OSError as exc:
            if exc.errno in STORAGE_ERRNOS:
                self.stop(item, f"writing {rel} in {self.out}: {exc.strerror}", config)
            self.fail(item, f"writing {rel}: {exc}", config)
            return None
        except (ValueError, RuntimeError) as exc:
            self.fail(item, f"writing {rel}: {exc}", config)
            return None
        return {"path": rel, "size": size, "sha256": sha}


def _batches(items: list[GenItem], batch_size: int) -> list[list[GenItem]]:
    groups: dict[tuple[Any, ...], list[GenItem]] = {}
    for item in items:
        groups.setdefault(PipelineAdapter.batch_key(item), []).append(item)
    return [g[i : i + batch_size] for g in groups.values() for i in range(0, len(g), batch_size)]


def _groups(items: Sequence[GenItem]) -> list[_Group]:
    groups: dict[str, _Group] = {}
    for item in items:
        config, error = resolve_item_config(item)
        sig = json.dumps([item.method, config.to_dict() if config is not None else None, error, item.overrides],
                         sort_keys=True, default=str)
        groups.setdefault(sig, _Group(item.method, config, error, [])).items.append(item)
    return list(groups.values())


def plan(pipe: Any, items: Sequence[GenItem], *, model: dict[str, str], dtype: str,
         video_format: str | None = None) -> tuple[PipelineAdapter, str, list[str]]:
    """Check every item against the pipeline, pick the output format, and key every item.

    Raises:
        ItemError: an item sets a field the pipeline does not take, or an unknown class.
    """
    from .. import __version__

    adapter = PipelineAdapter(pipe)
    for item in items:
        adapter.check(item)
    fmt = (video_format or default_video_format()) if adapter.video else "png"
    keys = []
    for item in items:
        config, _ = resolve_item_config(item)
        keys.append(item_key(item, model, dtype=dtype, version=__version__,
                             config=config.to_dict() if config is not None else None, fmt=fmt))
    return adapter, fmt, keys


def generate_batch(pipe: Any, items: Sequence[GenItem], out: str | Path, *, model: dict[str, str],
                   dtype: str = "float32", device: str = "cpu", world: World | None = None, batch_size: int = 1,
                   video_format: str | None = None, show_progress: bool = True) -> RunSummary:
    """Generate this rank's items that are not done yet; returns what it did.

    Raises:
        ItemError: an item the pipeline cannot take (before anything is written).
        FolderBusy: a single process, and another one holds ``out``.
        OutputStopped: ``out`` cannot be written any more (a full disk); what is done is kept.

    Args:
        pipe: a loaded diffusers pipeline (wrapped per method config here).
        items: every item of the batch (all ranks'): sharding happens here, by key.
        out: the output folder (created once the items are checked).
        model: :func:`~diffspec.batch.items.model_identity` of the pipeline's folder (part of each key).
        dtype, device: recorded in the manifest (``dtype`` is part of each key too).
        world: this process's rank and the number of processes (default: detected).
        batch_size: items per pipeline call, among items with the same settings. Outputs of
            batched items may differ from unbatched ones by rounding.
        video_format: ``mp4``, ``webp`` or ``gif`` for video pipelines (default: mp4 if available).
    """
    from .. import __version__

    world = world or World.detect()
    out = Path(out)
    adapter, fmt, keys = plan(pipe, items, model=model, dtype=dtype, video_format=video_format)
    out.mkdir(parents=True, exist_ok=True)
    base = {"model": model["name"], "model_fingerprint": model["fingerprint"], "dtype": dtype, "device": device,
            "rank": world.rank, "world_size": world.size, "diffspec": __version__}
    with single_writer(out, world):
        todo, summary = _todo(out, items, keys, world)
        clean_temporaries(out, f".tmp-r{world.rank}-")
        start = time.perf_counter()
        desc = f"rank {world.rank}" if world.size > 1 else "generate"
        with ManifestWriter(out, world.rank) as manifest, \
                progress(total=len(todo), desc=desc, unit="item", position=world.rank, disable=not show_progress,
                         dynamic_ncols=True) as bar:
            run = _Run(pipe, out, adapter, {it.index: keys[i] for i, it in enumerate(items)}, fmt, manifest, bar,
                       summary, base)
            try:
                for group in _groups(todo):
                    run.run_group(group, batch_size)
            except BaseException:  # interrupted (SIGTERM, Ctrl-C), stopped: also catch a temporary file a signal
                clean_temporaries(out, f".tmp-r{world.rank}-")  # orphaned between mkstemp and write_atomic's try
                summary.seconds = time.perf_counter() - start
                raise
    summary.seconds = time.perf_counter() - start
    return summary


def _todo(out: Path, items: Sequence[GenItem], keys: list[str], world: World) -> tuple[list[GenItem], RunSummary]:
    """This rank's items not done yet (their outputs' sizes and sha256 checked), and a summary to fill."""
    mine = shard(keys, world.rank, world.size)
    own = {keys[i] for i in mine}
    records, _ = read_records(out)
    done = completed(out, records, keys=own, verify=True)
    todo = [items[i] for i in mine if keys[i] not in done]
    remade = len((set(latest_ok(records)) & own) - set(done))
    return todo, RunSummary(world.rank, world.size, assigned=len(mine), skipped=len(mine) - len(todo), keys=keys,
                            remade=remade)


def all_recorded(out: str | Path, keys: Sequence[str]) -> bool:
    """True when every key has a manifest line (ok with its file at its size, or failed): time to merge."""
    records, _ = read_records(out)
    seen = {r["key"] for r in records if r.get("status") == "failed"} | set(completed(out, records))
    return set(keys) <= seen
