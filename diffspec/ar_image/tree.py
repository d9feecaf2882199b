"""Static token trees: per-depth branching factors, their flat node layout and tree attention mask.

A static tree is given by per-depth branching factors ``(b_1, .., b_D)``: every node at depth
``d - 1`` has ``b_d`` children, so level ``d`` holds ``b_1 * .. * b_d`` nodes (flat index: level by
level, parent-major). LANTERN++ drafts such trees (:mod:`~diffspec.ar_image.lantern_tree`), ``sjd-pac``
hangs its alternatives on one (:mod:`~diffspec.ar_image.pac`).

Example:
    >>> StaticTree((2, 2, 1)).level_sizes
    [2, 4, 4]
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class StaticTree:
    """A static draft tree: ``branching[d - 1]`` children per node at depth ``d - 1`` (the root is depth 0).

    Example:
        >>> tree = StaticTree((2, 1))
        >>> tree.size, tree.offsets, tree.layout("cpu")[1].tolist()
        (4, [0, 2], [-1, -1, 0, 1])
    """

    branching: tuple[int, ...]

    def __post_init__(self) -> None:
        if not self.branching or any(int(b) < 1 for b in self.branching):
            raise ValueError(f"tree={self.branching!r} must be a non-empty tuple of branching factors >= 1")

    @property
    def depth(self) -> int:
        """Draft depth ``D`` (tokens on a full path)."""
        return len(self.branching)

    @property
    def level_sizes(self) -> list[int]:
        """Nodes per depth ``1..D``."""
        sizes, n = [], 1
        for b in self.branching:
            n *= int(b)
            sizes.append(n)
        return sizes

    @property
    def offsets(self) -> list[int]:
        """Flat index of each level's first node."""
        return [sum(self.level_sizes[:d]) for d in range(self.depth)]

    @property
    def size(self) -> int:
        """Total nodes ``M``."""
        return sum(self.level_sizes)

    def layout(self, device: torch.device | str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(depth (M,), parent (M,) flat index or -1, ancestors (M, M) bool, self included)``."""
        depth = torch.cat([torch.full((n,), d + 1) for d, n in enumerate(self.level_sizes)])
        parent = torch.full((self.size,), -1)
        anc = torch.eye(self.size, dtype=torch.bool)
        for d in range(1, self.depth):  # a level at a time: its parents' rows are complete
            lo, n, b = self.offsets[d], self.level_sizes[d], int(self.branching[d])
            parent[lo: lo + n] = self.offsets[d - 1] + torch.arange(n) // b
            anc[lo: lo + n] |= anc[parent[lo: lo + n]]
        return depth.to(device), parent.to(device), anc.to(device)
