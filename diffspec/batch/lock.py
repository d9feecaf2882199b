"""One unranked ``diffspec generate`` per output folder at a time (a lock file, through ``filelock``).

Two unranked processes on one ``--out`` would both generate every item. The first holds
``out/.diffspec-generate.lock`` (an OS file lock, released when the process ends however it ends);
a second is refused with one line saying how to split the work instead. Ranked processes (``--rank``,
torchrun, accelerate, SLURM) take no lock: each works on its own share and its own manifest.

Example:
    >>> with single_writer("out/", World()):  # doctest: +SKIP
    ...     ...  # generate
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from filelock import FileLock, Timeout

from .shard import World

LOCK_NAME = ".diffspec-generate.lock"


class FolderBusy(ValueError):
    """Another unranked process is generating into the same folder."""


def busy_message(out: str | Path) -> str:
    """What to do when ``out`` is taken."""
    return (f"another unranked `diffspec generate` is writing to {out} (it holds {Path(out) / LOCK_NAME}); to "
            "split one batch between processes give each --rank R --world-size N, or start them with torchrun or "
            "accelerate launch; else wait for it to finish")


@contextmanager
def single_writer(out: str | Path, world: World) -> Iterator[None]:
    """Hold ``out``'s lock while the block runs when ``world`` is a single process; ranked processes pass through.

    Raises:
        FolderBusy: another process holds the lock.
    """
    if world.size > 1:
        yield
        return
    lock = FileLock(str(Path(out) / LOCK_NAME), timeout=0)
    try:
        lock.acquire()
    except Timeout:
        raise FolderBusy(busy_message(out)) from None
    try:
        yield
    finally:
        lock.release()


def check_free(out: str | Path, world: World) -> None:
    """Refuse early (before loading a model) when ``out`` exists and another single process holds it.

    Raises:
        FolderBusy: another process holds the lock.
    """
    if Path(out).is_dir():
        with single_writer(out, world):
            pass
