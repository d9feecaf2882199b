"""Which process am I, and which items are mine: launcher-agnostic static sharding.

The same command runs under ``accelerate launch``, ``torchrun`` (both set ``RANK``/``WORLD_SIZE``/
``LOCAL_RANK``), SLURM ``srun`` (``SLURM_PROCID``/``SLURM_NTASKS``/``SLURM_LOCALID``) or by hand
(``--rank``/``--world-size``). No process group is created: ranks share nothing but the output
folder. Items are sorted by key and dealt round-robin, so the assignment depends only on the item
list and the number of processes, and the union of all ranks' outputs is the same for any count.

Example:
    >>> World.detect(env={"SLURM_PROCID": "1", "SLURM_NTASKS": "4"})
    World(rank=1, size=4, local_rank=0, launcher='slurm')
    >>> shard(["c", "a", "b", "d"], rank=0, size=2)
    [0, 1]
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class World:
    """This process's rank among ``size`` processes, its node-local rank, and who said so."""

    rank: int = 0
    size: int = 1
    local_rank: int = 0
    launcher: str = "single"

    @classmethod
    def detect(cls, rank: int | None = None, size: int | None = None,
               env: Mapping[str, str] | None = None) -> World:
        """From explicit values, else ``RANK``/``WORLD_SIZE`` (torchrun, accelerate), else SLURM.

        Raises:
            ValueError: only one of rank and size given, a non-integer variable, or rank outside [0, size).
        """
        env = os.environ if env is None else env
        if (rank is None) != (size is None):
            raise ValueError("give both --rank and --world-size, or neither")
        if rank is not None and size is not None:
            world = cls(rank, size, rank, "flags")
        elif "RANK" in env and "WORLD_SIZE" in env:
            world = cls(_env_int(env, "RANK"), _env_int(env, "WORLD_SIZE"),
                        _env_int(env, "LOCAL_RANK", default=0), "torchrun")
        elif "SLURM_PROCID" in env and "SLURM_NTASKS" in env:
            world = cls(_env_int(env, "SLURM_PROCID"), _env_int(env, "SLURM_NTASKS"),
                        _env_int(env, "SLURM_LOCALID", default=0), "slurm")
        else:
            world = cls()
        if world.size < 1 or not 0 <= world.rank < world.size:
            raise ValueError(f"rank {world.rank} is out of range for {world.size} processes ({world.launcher}); "
                             "need 0 <= rank < world size")
        return world

    def device(self, requested: str | None, cuda_available: bool, cuda_count: int) -> str:
        """The device of this rank: ``cuda`` (or None with CUDA) → ``cuda:<local_rank>``; others unchanged."""
        if requested is None:
            requested = "cuda" if cuda_available else "cpu"
        if requested == "cuda" and (self.size > 1 or self.local_rank > 0) and cuda_count > 0:
            return f"cuda:{self.local_rank % cuda_count}"
        return requested


def _env_int(env: Mapping[str, str], name: str, default: int | None = None) -> int:
    raw = env.get(name)
    if raw is None and default is not None:
        return default
    try:
        return int(raw)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise ValueError(f"environment variable {name}={raw!r} is not an integer") from None


def shard(keys: Sequence[str], rank: int, size: int) -> list[int]:
    """Indices (into ``keys``) of this rank's items: keys sorted, then dealt round-robin."""
    order = sorted(range(len(keys)), key=lambda i: (keys[i], i))
    return sorted(order[rank::size])
