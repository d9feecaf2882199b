"""The ``diffspec generate`` and ``diffspec merge`` commands (argument parsing lives in ``diffspec.cli``).

Input errors (a malformed line, an unknown field or method, a missing model folder, an output
folder that cannot be written, another unranked run on the same folder) raise ``ValueError`` naming
the line or flag, before anything is generated or the output folder is made; ``diffspec.cli``
prints them as one line and exits 2. Items that fail while running are recorded in the manifest and
the exit code is 1 (0 under a launcher, so that it does not stop the other ranks; the merged summary
counts the failures). A folder that cannot be written any more (a full disk) stops the run: one
line, exit 1, and the same command resumes once there is space.

Example:
    $ diffspec generate --model tiny-dit --prompt-file examples/items.jsonl --out out/
    $ torchrun --nproc_per_node 4 -m diffspec generate --model /models/wan --prompt-file v.jsonl --out out/
    $ diffspec merge out/
"""

from __future__ import annotations

import argparse
import errno
import os
import signal
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import Any

from .items import GenItem, ItemDefaults, ItemError, items_from_prompts, model_identity, read_items


class Terminated(BaseException):
    """SIGTERM arrived: unwinds like KeyboardInterrupt, so temporary files are removed."""


@contextmanager
def sigterm_unwinds() -> Iterator[None]:
    """Turn SIGTERM (SLURM preemption, ``kill``) into :class:`Terminated` while the block runs."""
    def handler(signum: int, frame: FrameType | None) -> None:
        raise Terminated()

    try:
        previous = signal.signal(signal.SIGTERM, handler)
    except ValueError:  # not the main thread
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def check_writable(out: Path) -> None:
    """Check that ``out`` can be written, or made where it is missing, without making it.

    Raises:
        ValueError: naming the folder and the reason.
    """
    folder = out.absolute()
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    try:
        if not folder.is_dir():
            raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR))
        if folder != out.absolute() and not os.access(folder, os.W_OK | os.X_OK):
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES))
        if folder == out.absolute():
            fd, name = tempfile.mkstemp(prefix=".tmp-check-", dir=out)
            os.close(fd)
            os.unlink(name)
    except OSError as exc:
        raise ValueError(f"--out {str(out)!r} is not a writable folder ({exc.strerror or exc})") from None


def check_method(name: str, overrides: dict[str, Any]) -> None:
    """``name`` is an available diffusion method and ``overrides`` are valid for it.

    Raises:
        ValueError: an unknown, planned or non-diffusion method (``generate`` runs diffusers
            pipelines), or a bad config value.
    """
    from ..api import methods, resolve_config

    info, _ = resolve_config(name, overrides)
    if info.family != "diffusion":
        names = ", ".join(m.name for m in methods("diffusion", available_only=True))
        raise ValueError(f"method {name!r} is an {info.family} method; diffspec generate runs diffusers pipelines "
                         f"(methods: {names})")


def check_methods(items: list[GenItem]) -> None:
    """Every item names a diffusion method that exists (its config values are checked per item, at run time).

    Raises:
        ItemError: naming the line of the first unknown method.
    """
    checked: set[str] = {"none"}
    for item in items:
        if item.method in checked:
            continue
        try:
            check_method(item.method, {})
        except ValueError as exc:
            raise ItemError(f"{item.where}: field 'method': {exc}") from None
        checked.add(item.method)


def scheduler_class(name: str) -> type:
    """The diffusers scheduler class named ``name`` (``--scheduler``).

    Raises:
        ValueError: ``name`` is not a scheduler class of diffusers, naming a few that are.
    """
    import diffusers

    cls = getattr(diffusers, name, None)
    if not (isinstance(cls, type) and issubclass(cls, diffusers.SchedulerMixin)):
        raise ValueError(f"--scheduler {name[:80]!r} is not a diffusers scheduler class; e.g. DDPMScheduler, "
                         "DDIMScheduler, DPMSolverMultistepScheduler, EulerAncestralDiscreteScheduler")
    return cls


def load_items(args: argparse.Namespace, overrides: dict[str, Any]) -> list[GenItem]:
    """Items from ``--prompt-file`` (text or ``.jsonl``) or ``--class-labels``, with the flags as defaults."""
    defaults = ItemDefaults(steps=args.steps, seed=args.seed, method=args.method, overrides=overrides,
                            negative_prompt=args.negative_prompt, height=args.height, width=args.width,
                            num_frames=args.num_frames, fps=args.fps, guidance_scale=args.guidance_scale)
    if (args.prompt_file is None) == (args.class_labels is None):
        raise ValueError("give exactly one of --prompt-file FILE or --class-labels A,B,...")
    if args.prompt_file is not None:
        return read_items(args.prompt_file, defaults, copies=args.num_images_per_prompt)
    labels = [c.strip() for c in args.class_labels.split(",") if c.strip()]
    return items_from_prompts(labels, defaults, copies=args.num_images_per_prompt)


def run_generate(args: argparse.Namespace, overrides: dict[str, Any], device: str) -> int:
    """``diffspec generate``: returns the exit code (0; 1 when items failed in a single-process run)."""
    import torch

    from ..models import SHIPPED_MODELS, load_pipeline, resolve_model_path
    from ..pipelines.auto import describe_choice
    from .auto import resolve_auto
    from .lock import check_free
    from .manifest import merge_manifests
    from .media import check_video_format
    from .runner import OutputStopped, all_recorded, generate_batch
    from .shard import World

    if args.method == "none" and overrides:
        raise ValueError("--set needs a --method other than 'none'")
    if args.quality is not None:
        if args.method != "auto":
            raise ValueError(f"--quality applies to --method auto, not {args.method!r}")
        overrides = {**overrides, "quality": args.quality}
    if args.method != "none":
        check_method(args.method, overrides)  # bad --method or --set value: fail before anything else
    items = load_items(args, overrides)
    check_methods(items)
    if args.video_format is not None:
        check_video_format(args.video_format)
    scheduler = scheduler_class(args.scheduler) if args.scheduler else None
    world = World.detect(args.rank, args.world_size)
    folder = resolve_model_path(args.model)
    check_writable(args.out)
    check_free(args.out, world)  # before the model loads: a second unranked run on --out is refused at once
    model = model_identity(folder, name=str(args.model) if str(args.model) in SHIPPED_MODELS else folder.name)
    device = world.device(device, torch.cuda.is_available(), torch.cuda.device_count())
    pipe = load_pipeline(folder, dtype=getattr(torch, args.dtype), device=device)
    pipe.set_progress_bar_config(disable=True)
    if scheduler is not None:  # outputs of another scheduler key apart
        pipe.scheduler = scheduler.from_config(pipe.scheduler.config)
        model = {**model, "scheduler": scheduler.__name__}
    items, choices = resolve_auto(pipe, items)  # before the items are keyed: their keys name the chosen method
    for choice in choices:
        print(f"auto (quality {choice['quality']!r}): {describe_choice(choice)}; cached in {choice['cache']}")
    try:
        with sigterm_unwinds():
            summary = generate_batch(pipe, items, args.out, model=model, dtype=args.dtype, device=device,
                                     world=world, batch_size=args.batch_size, video_format=args.video_format)
    except OutputStopped as exc:
        print(exc.summary.line())
        print(f"diffspec: error: {exc}; stopped, keeping the {exc.summary.generated} items generated; free space and "
              "rerun the same command to resume", file=sys.stderr)
        return 1
    print(summary.line())
    for failure in summary.failures[:10]:
        print(f"diffspec: item failed: {failure}", file=sys.stderr)
    if len(summary.failures) > 10:
        print(f"diffspec: ... and {len(summary.failures) - 10} more failures (see the manifest)", file=sys.stderr)
    if all_recorded(args.out, summary.keys):
        print(f"merged {merge_manifests(args.out).line()}")
    else:
        print(f"other ranks are still running: `diffspec merge {args.out}` once all have finished")
    # under a launcher a non-zero exit would make torchrun / accelerate stop the ranks still working
    return 1 if summary.failed and world.size == 1 else 0


def run_merge(args: argparse.Namespace) -> int:
    """``diffspec merge``: writes ``OUT/manifest.jsonl`` and prints its summary; returns 1 when an output listed ok
    is missing or damaged (else 0: failed items are in the summary)."""
    from .manifest import merge_manifests

    if not Path(args.out).is_dir():
        raise ValueError(f"{str(args.out)!r} is not a folder (the --out folder of `diffspec generate`)")
    summary = merge_manifests(args.out, verify=args.verify)
    print(summary.line())
    for failure in summary.failures[:10]:
        print(f"  failed {failure}")
    for lost in summary.lost[:10]:
        print(f"  {lost}")
    if summary.unreadable_lines:
        print(f"  skipped {summary.unreadable_lines} unreadable manifest line(s) (cut by a killed run)")
    if summary.missing or summary.damaged:
        print(f"diffspec: {summary.missing} output(s) missing and {summary.damaged} damaged: rerun the same "
              "`diffspec generate` command to make them again", file=sys.stderr)
        return 1
    return 0
