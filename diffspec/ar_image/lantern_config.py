"""Configs of the relaxed AR image methods ``lantern`` and ``lantern++`` (drafter + latent neighbourhoods).

Example:
    >>> LanternConfig(delta=0.2).k
    1000
    >>> LanternPPConfig().lam
    2.0
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ..config import check_choice, check_float, check_int
from .config import ARSamplingConfig
from .relaxed import ACCEPTANCE


@dataclass(frozen=True)
class LanternConfig(ARSamplingConfig):
    """LANTERN (Jang et al., ICLR 2025): EAGLE drafter chains verified with relaxed acceptance, not exact.

    A draft ``x`` is accepted with ``min(1, p~(x)/q(x))`` where ``p~(x)`` adds the target mass of
    ``x``'s nearest codes (in the VQ codebook) while their running total is ``<= delta``: a
    per-token TV budget. ``delta = 0`` is exact speculative sampling.

    Args:
        draft_length: drafts per round (one drafter call each, one target call per round).
        k: neighbourhood size (capped at ``codebook_size - 1``).
        delta: additive TV budget per token, in ``[0, 1]``.
        acceptance: ``"certain"`` (default; LANTERN's official rule): drafts are the drafter's top
            tokens, treated as certain, accepted with ``p~(x)``; a rejection zeroes ``x`` and the
            neighbours moved onto it before resampling, so the *emitted* token's law is within
            ``delta`` of ``p`` (TV) whatever the drafter. ``"residual"``: drafts sampled from ``q``,
            accepted with ``min(1, p~(x)/q(x))``, residual ``(p - q)_+``; more acceptance, but
            only the per-draft budget is ``<= delta``: the emitted law can be up to ``TV(p, q)``
            from ``p`` (tiny-ar at ``k=1000, delta=0.1``: FID 511). Default ``"certain"`` because
            only it keeps the documented budget.
        drafter: folder of an :class:`~diffspec.ar_image.drafter.EagleDrafter`; ``""`` = the target's
            shipped ``drafter/`` (``tiny-ar``).
        temperature, top_k, top_p: see :class:`~diffspec.ar_image.config.ARSamplingConfig`.
    """

    method: ClassVar[str] = "lantern"
    exact: ClassVar[bool] = False
    lam: ClassVar[float | None] = None

    draft_length: int = 4
    k: int = 1000
    delta: float = 0.1
    drafter: str = ""
    acceptance: str = "certain"

    def __post_init__(self) -> None:
        super().__post_init__()
        check_choice("acceptance", self.acceptance, ACCEPTANCE)
        check_int("draft_length", self.draft_length, 1, 64)
        check_int("k", self.k, 1)
        check_float("delta", self.delta, 0.0, 1.0)


@dataclass(frozen=True)
class LanternPPConfig(LanternConfig):
    """LANTERN++ (method ``lantern++``): static-tree drafts, multiplicative cap, not exact.

    The neighbour mass added to ``p(x)`` is capped at ``(lam - 1) p(x)`` (and at ``delta``), so a
    draft's relaxed probability is at most ``lam`` times its own. Drafts form a static tree
    (:mod:`~diffspec.ar_image.lantern_tree`) verified in one target call; the walk follows the
    first accepted child at each depth.

    Args:
        tree: per-depth branching factors (``(4, 2, 2, 1, 1)``: 60 nodes, depth 5); ``()`` drafts a
            chain of ``draft_length`` (all ones is the same chain, draw for draw). When set, its
            length is the draft depth and ``draft_length`` is not used.
        lam: multiplicative cap, ``>= 1`` (1 = exact).
        delta: additive cap as in :class:`LanternConfig` (1 = none).
        draft_length, k, drafter, acceptance, temperature, top_k, top_p: see :class:`LanternConfig`.

    Example:
        >>> LanternPPConfig(tree=[3, 2, 1]).tree
        (3, 2, 1)
    """

    method: ClassVar[str] = "lantern++"

    delta: float = 1.0
    lam: float = 2.0  # type: ignore[misc]
    tree: tuple[int, ...] = (4, 2, 2, 1, 1)

    def __post_init__(self) -> None:
        super().__post_init__()
        check_float("lam", self.lam, 1.0, 1000.0)
        if not isinstance(self.tree, (tuple, list)) or len(self.tree) > 32:
            raise ValueError(f"tree={self.tree!r} must be a tuple of at most 32 branching factors (() = chain)")
        for b in self.tree:
            check_int("tree[i]", b, 1, 64)
        object.__setattr__(self, "tree", tuple(self.tree))
        nodes, level = 0, 1
        for b in self.tree:
            level *= b
            nodes += level
        if nodes > 1024:
            raise ValueError(f"tree={self.tree!r} has {nodes} nodes; allowed at most 1024 (one target call verifies all)")
