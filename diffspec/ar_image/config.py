"""Configs of the exact AR image methods: ``sjd`` and ``mc-sjd`` (speculative Jacobi decoding).

Both methods draft a window of future image tokens, verify the whole window with one target call
and keep a prefix by modified rejection sampling, so the output law is the target's. They differ
in how the tokens left in the window are re-drafted from the new logits (``coupling``).

The sampling settings (``temperature``, ``top_k``, ``top_p``) define the target law itself; a
pipeline call may pass the same names to override them for that call
(``spec(class_labels=..., temperature=0)``), like the target's own plain call.

Example:
    >>> from diffspec.ar_image.config import MCSJDConfig
    >>> MCSJDConfig(window=32).coupling
    'maximal'
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ..config import MethodConfig, check_choice, check_float, check_int

INITS = ("uniform", "uniform-onehot", "repeat")
"""How a position entering the window is first drafted (see :class:`SJDConfig`)."""

COUPLINGS = ("independent", "maximal", "gumbel")
"""How the tokens left in the window are re-drafted after a verification."""


@dataclass(frozen=True)
class ARSamplingConfig(MethodConfig):
    """Sampling settings shared by the AR image methods (the law being sampled).

    Args:
        temperature: logits divided by it after CFG mixing; 0 = greedy (argmax).
        top_k: keep the ``top_k`` most likely tokens; 0 = whole codebook (LlamaGen's FID setting).
        top_p: nucleus mass kept; 1 = all.
    """

    family: ClassVar[str] = "ar_image"
    exact: ClassVar[bool] = True

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0

    def __post_init__(self) -> None:
        check_float("temperature", self.temperature, 0.0, 100.0)
        check_int("top_k", self.top_k, 0)
        check_float("top_p", self.top_p, 0.0, 1.0, lo_open=True)

    @property
    def sampling(self) -> dict[str, float]:
        """``{"temperature", "top_k", "top_p"}`` as keyword arguments of :func:`~diffspec.ar_image.sampling.warp`."""
        return {"temperature": self.temperature, "top_k": self.top_k, "top_p": self.top_p}


@dataclass(frozen=True)
class SJDConfig(ARSamplingConfig):
    """Speculative Jacobi decoding (method ``sjd``, Teng et al. 2025), exact.

    Every round verifies a window of ``window`` drafts with one target call, keeps the accepted
    prefix plus one corrected (or bonus) token, and re-drafts every remaining position by an
    independent draw from its new (stale-context) distribution.

    Args:
        window: drafts verified per call (the paper's L = 16).
        init: first draft of a position entering the window: ``"uniform"`` (a uniform random
            token whose law, uniform, is used as its q: exact and accepts more), ``"uniform-onehot"``
            (a uniform random token with q one-hot on it, as the official code) or ``"repeat"``
            (the left neighbour's token, q one-hot; the official LlamaGen option).
        temperature, top_k, top_p: see :class:`ARSamplingConfig`.

    Example:
        >>> SJDConfig(window=16, init="repeat").window
        16
    """

    method: ClassVar[str] = "sjd"
    coupling: ClassVar[str] = "independent"

    window: int = 16
    init: str = "uniform"

    def __post_init__(self) -> None:
        super().__post_init__()
        check_int("window", self.window, 1, 4096)
        check_choice("init", self.init, INITS)


@dataclass(frozen=True)
class MCSJDConfig(ARSamplingConfig):
    """SJD with coupled re-drafts (method ``mc-sjd``, So et al. 2025: MC-SJD / SCD), exact.

    As :class:`SJDConfig`, but a position left in the window keeps its draft as often as the
    change of its distribution allows: ``coupling="maximal"`` re-drafts by modified rejection
    sampling of the old draft (kept with probability ``1 - TV``, the maximum); ``"gumbel"``
    re-drafts ``argmax(log p + g)`` with one fixed Gumbel vector per image position. Either way
    the new draft's law, recorded as its q, is the new distribution, kept or not.

    Args:
        window: drafts verified per call (the paper's L = 64 for images).
        coupling: ``"maximal"`` or ``"gumbel"``.
        init, temperature, top_k, top_p: see :class:`SJDConfig`.

    Example:
        >>> MCSJDConfig(coupling="gumbel").window
        64
    """

    method: ClassVar[str] = "mc-sjd"

    window: int = 64
    coupling: str = "maximal"
    init: str = "uniform"

    def __post_init__(self) -> None:
        super().__post_init__()
        check_int("window", self.window, 1, 4096)
        check_choice("coupling", self.coupling, COUPLINGS[1:])
        check_choice("init", self.init, INITS)
