"""Configs of the AR image methods: ``sjd``, ``mc-sjd`` (exact speculative Jacobi decoding) and ``gsd`` (relaxed).

The exact methods draft a window of future image tokens, verify the whole window with one target call
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

from ..config import MethodConfig, check_bool, check_choice, check_float, check_int

INITS = ("uniform", "uniform-onehot", "repeat")
"""How a position entering the window is first drafted (see :class:`SJDConfig`)."""

COUPLINGS = ("independent", "maximal", "gumbel")
"""How the tokens left in the window are re-drafted after a verification."""

CLUSTER_RULES = ("lumped", "min-tv")
"""Emitted laws of ``gsd``'s cluster test, both exact at the cluster level with the same acceptance."""


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
        """``{"temperature", "top_k", "top_p"}`` as keyword arguments of :func:`~diffspec.speculation.sampling.warp`."""
        return {"temperature": self.temperature, "top_k": self.top_k, "top_p": self.top_p}


@dataclass(frozen=True)
class SJDConfig(ARSamplingConfig):
    """Speculative Jacobi decoding (method ``sjd``, Teng et al. 2025), exact.

    Every round verifies a window of ``window`` drafts with one target call, keeps the accepted
    prefix plus one corrected (or bonus) token, and re-drafts every remaining position by an
    independent draw from its new (stale-context) distribution.

    Args:
        window: drafts verified per call (the paper's L = 16).
        init: first draft of a position entering the window: ``"repeat"`` (default: the token
            left of it, q one-hot on it), ``"uniform"`` (a uniform random token whose law, uniform,
            is used as its q) or ``"uniform-onehot"`` (a uniform random token with q one-hot on
            it, as the official code). All three are exact. With a window covering the image only
            the first round's drafts are inits, and a flat first context (``"repeat"``) settles in
            far fewer calls than a noise image on the shipped models (docs/benchmarks/ar-image.md).
        temperature, top_k, top_p: see :class:`ARSamplingConfig`.
        cuda_graphs: after one eager round, replay every round (target call, acceptance, re-drafts) from one
            CUDA graph (:func:`~diffspec.ar_image.jacobi.jacobi_sample`); needs a CUDA target and CUDA generators
            (``torch.Generator("cuda")``) or none. Experimental: its GPU tests exist, its speed is not measured yet.

    Example:
        >>> SJDConfig(window=16, init="repeat").window
        16
    """

    method: ClassVar[str] = "sjd"
    coupling: ClassVar[str] = "independent"

    window: int = 16
    init: str = "repeat"
    cuda_graphs: bool = False

    def __post_init__(self) -> None:
        super().__post_init__()
        check_int("window", self.window, 1, 4096)
        check_choice("init", self.init, INITS)
        check_bool("cuda_graphs", self.cuda_graphs)


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
        init, temperature, top_k, top_p, cuda_graphs: see :class:`SJDConfig` (``cuda_graphs`` needs ``"maximal"``).

    Example:
        >>> MCSJDConfig(coupling="gumbel").window
        64
    """

    method: ClassVar[str] = "mc-sjd"

    window: int = 64
    coupling: str = "maximal"
    init: str = "repeat"
    cuda_graphs: bool = False

    def __post_init__(self) -> None:
        super().__post_init__()
        check_int("window", self.window, 1, 4096)
        check_choice("coupling", self.coupling, COUPLINGS[1:])
        check_choice("init", self.init, INITS)
        check_bool("cuda_graphs", self.cuda_graphs)
        if self.cuda_graphs and self.coupling == "gumbel":
            raise ValueError("cuda_graphs=True does not support coupling='gumbel'; use coupling='maximal'")


@dataclass(frozen=True)
class SJDPACConfig(ARSamplingConfig):
    """MC-SJD plus proactive alternatives at the window start (method ``sjd-pac``, SJD-PAC style), exact.

    Every round also verifies, in the same target call, a tree of ``width`` alternatives per node
    and ``depth`` levels hung on the window's first positions (where the last round's first
    rejection left the window): the main chain is sibling 0, the other siblings are drawn without
    replacement from the stale row of that position (the law of the main draft). The tree is
    walked by recursive rejection sampling over siblings (residual updated after every rejected
    sibling), so the output law is the target's; past the tree the chain is verified as in mc-sjd.

    Args:
        window: drafts of the main chain verified per call (as :class:`MCSJDConfig`).
        width: siblings per tree node (1 = no alternatives: mc-sjd's law and acceptance).
        depth: tree levels (clipped to ``window``).
        coupling: re-drafting of the chain: ``"maximal"`` (mc-sjd's maximal coupling).
        init, temperature, top_k, top_p: see :class:`SJDConfig`.

    Example:
        >>> SJDPACConfig(window=32).width, SJDPACConfig().depth
        (4, 3)
    """

    method: ClassVar[str] = "sjd-pac"

    window: int = 64
    width: int = 4
    depth: int = 3
    coupling: str = "maximal"
    init: str = "repeat"

    def __post_init__(self) -> None:
        super().__post_init__()
        check_int("window", self.window, 1, 4096)
        check_int("width", self.width, 1, 16)
        check_int("depth", self.depth, 1, 8)
        check_choice("coupling", self.coupling, COUPLINGS[1:2])
        check_choice("init", self.init, INITS)


@dataclass(frozen=True)
class MCSJDRAConfig(ARSamplingConfig):
    """MC-SJD plus residual alternatives (method ``mc-sjd-ra``), exact.

    A round ends at its first rejected draft, and the token drawn there in its place makes every later draft
    stale. Each round therefore also feeds, in the same target call, ``width`` siblings for each of the
    window's first ``depth`` drafts (the tokens ranking highest on ``log q + g`` for a fresh Gumbel vector
    ``g``), each followed by copies of the chain's next ``follow`` drafts. A rejected draft's replacement is
    drawn as ``argmax(log (p - q)_+ + g)``, which is exactly the residual law; when it is one of
    the siblings, the sibling's rows give the exact laws of the next tokens, and the round also commits
    those (the chain's copies kept where modified rejection sampling accepts them). See
    :mod:`diffspec.ar_image.residual`.

    Args:
        window: drafts of the main chain verified per call (as :class:`MCSJDConfig`).
        width: siblings per draft (must be below the codebook size).
        depth: window offsets that get siblings (clipped to ``window - 1``).
        follow: chain drafts copied under each sibling (0: the sibling alone, one extra token on a hit).
        init, temperature, top_k, top_p: see :class:`SJDConfig`.

    The tokens fed per call are ``window + depth * width * (1 + follow)`` (192 at the defaults).

    Example:
        >>> MCSJDRAConfig().width, MCSJDRAConfig().depth, MCSJDRAConfig().follow
        (4, 8, 3)
    """

    method: ClassVar[str] = "mc-sjd-ra"

    window: int = 64
    width: int = 4
    depth: int = 8
    follow: int = 3
    init: str = "repeat"

    def __post_init__(self) -> None:
        super().__post_init__()
        check_int("window", self.window, 1, 4096)
        check_int("width", self.width, 1, 64)
        check_int("depth", self.depth, 1, 4096)
        check_int("follow", self.follow, 0, 64)
        check_choice("init", self.init, INITS)


@dataclass(frozen=True)
class GSDConfig(ARSamplingConfig):
    """Grouped speculative decoding (method ``gsd``, So et al. ICCV 2025), relaxed (not exact).

    The Jacobi loop of :class:`MCSJDConfig` with the group test of
    :class:`~diffspec.ar_image.group.GroupAcceptance`: a draft ``x`` is accepted with
    ``min(1, p(C)/q(C))`` where ``C`` is the set of tokens ranked within ``group_size`` of ``x`` in
    the target row whose probability is within ``delta_p`` of ``p(x)`` and whose token embedding
    (when the target has :meth:`~diffspec.ar_image.target.ARImageTarget.token_embeddings`) is
    within squared L2 distance ``embed_dist``. Rejections resample the plain residual
    ``(p - q)_+``. ``group_size=1`` (or ``delta_p=0``, ``embed_dist=0``) is ``mc-sjd`` exactly.
    Drafts whose ``q`` is one-hot (first drafts under ``init="repeat"``) take the exact test unless
    ``group_onehot=True``. The official ``embed_dist = 0.5`` is a distance in Lumina-mGPT's embedding
    space; ``embed_quantile`` states it scale-free instead (the fraction of token pairs closer than
    the threshold), for any target.

    Args:
        window: drafts verified per call.
        group_size: rank window around the draft, the draft included (the paper: 25 for COCO, 50 for Parti).
        delta_p: probability-gap filter (strict).
        embed_dist: squared-L2 embedding-distance filter (strict; the official code's 0.5).
        embed_source: vectors of the distance filter: ``"embeddings"`` (the target's input
            embeddings, as the paper) or ``"codebook"`` (the VQ decoder's code vectors: decoded-patch
            similarity).
        embed_quantile: when set, in ``(0, 1]``, replaces ``embed_dist`` by this quantile of the
            squared distances between the source's vectors (e.g. 0.05: the nearest 5% of pairs).
        group_onehot: group-test (or, with ``clusters``, cluster-test) one-hot drafts too (the
            paper's rule: against ``q(C) = 1`` the draft is accepted with ``p(C)``). False (default):
            they take the exact test.
        max_tv: when set, in ``[0, 1]``, a hard per-token budget: the group acceptance is clamped to
            within ``max_tv`` of the exact test's, so each token's law is at most ``max_tv`` from
            the target's in total variation (0 = ``mc-sjd``). None (default): the paper's rule.
        min_run: when set, ``>= 0``: a draft only the group test accepts is kept only where the exact
            test accepts the next ``min_run`` drafts of the window, so the relaxation is spent where it
            buys a run of tokens (0: wherever the group test accepts; drafts the exact test accepts are
            always kept; the window is then re-drafted by fresh draws, since the look-ahead leaves its
            drafts unfit for the coupling). None (default): the paper's rule.
        clusters: when set, in ``[1, codebook_size]``, replaces the group test by
            :class:`~diffspec.ar_image.cluster.ClusterAcceptance`: a fixed k-means partition of the
            ``embed_source`` vectors into ``clusters`` groups, tested and resampled at the cluster
            level, so each token's cluster, given the tokens before it, follows the target's law
            exactly and only the choice inside a cluster is relaxed (``group_size``, ``delta_p`` and the
            distance filter are then unused). None (default): the paper's rule.
        cluster_rule: with ``clusters``: ``"min-tv"`` (default: the emitted law closest to the
            target's in TV that the cluster test's acceptance allows,
            :func:`~diffspec.ar_image.cluster.min_tv_law`) or ``"lumped"`` (the same acceptance
            and cluster law; inside a cluster the emitted law mixes the draft's and the target's).
        coupling: re-drafting of the window: ``"maximal"`` (MC-SJD, default), ``"gumbel"`` or
            ``"independent"`` (the paper's SJD loop).
        width: with ``clusters`` and ``cluster_rule="min-tv"``: siblings per draft for residual alternatives
            (the loop of :class:`MCSJDRAConfig`, every test and residual draw against the cluster rule's
            emitted law); 0 (default): none, the Jacobi loop.
        depth, follow: residual alternatives' offsets with siblings and chain drafts copied under each
            (see :class:`MCSJDRAConfig`); used when ``width > 0``. ``depth`` defaults to 16, twice ``mc-sjd-ra``'s:
            rounds run longer under the relaxed test, and on ``tiny-ar-tex`` 16 gained 1.05x over the Jacobi
            loop's compression against 1.03x for 8 (docs/benchmarks/ar-image.md).
        init, temperature, top_k, top_p: see :class:`SJDConfig`.

    Example:
        >>> GSDConfig(group_size=50).delta_p
        0.15
        >>> GSDConfig(clusters=26, width=4).follow  # cluster test + residual alternatives
        3
    """

    method: ClassVar[str] = "gsd"
    exact: ClassVar[bool] = False

    window: int = 64
    group_size: int = 25
    delta_p: float = 0.15
    embed_dist: float = 0.5
    embed_source: str = "embeddings"
    embed_quantile: float | None = None
    group_onehot: bool = False
    max_tv: float | None = None
    min_run: int | None = None
    clusters: int | None = None
    cluster_rule: str = "min-tv"
    coupling: str = "maximal"
    init: str = "repeat"
    width: int = 0
    depth: int = 16
    follow: int = 3

    def __post_init__(self) -> None:
        super().__post_init__()
        check_int("window", self.window, 1, 4096)
        check_int("group_size", self.group_size, 1, 65536)
        check_float("delta_p", self.delta_p, 0.0, 1.0)
        check_float("embed_dist", self.embed_dist, 0.0)
        check_choice("embed_source", self.embed_source, ("embeddings", "codebook"))
        if self.embed_quantile is not None:
            check_float("embed_quantile", self.embed_quantile, 0.0, 1.0, lo_open=True)
        check_bool("group_onehot", self.group_onehot)
        if self.max_tv is not None:
            check_float("max_tv", self.max_tv, 0.0, 1.0)
        if self.min_run is not None:
            check_int("min_run", self.min_run, 0, 4096)
        if self.clusters is not None:
            check_int("clusters", self.clusters, 1)
            if self.max_tv is not None or self.min_run is not None:
                raise ValueError(f"clusters={self.clusters!r} replaces the group test; max_tv and min_run "
                                 "apply to the group test only: leave them None")
        check_choice("cluster_rule", self.cluster_rule, CLUSTER_RULES)
        check_choice("coupling", self.coupling, COUPLINGS)
        check_choice("init", self.init, INITS)
        check_int("width", self.width, 0, 64)
        check_int("depth", self.depth, 1, 4096)
        check_int("follow", self.follow, 0, 64)
        if self.width and (self.clusters is None or self.cluster_rule != "min-tv" or self.coupling != "maximal"):
            raise ValueError(f"width={self.width} (residual alternatives) needs clusters set, cluster_rule='min-tv' "
                             f"and coupling='maximal'; got clusters={self.clusters!r}, "
                             f"cluster_rule={self.cluster_rule!r}, coupling={self.coupling!r}")

    @property
    def alternatives(self) -> bool:
        """Residual alternatives are on (``width > 0``)."""
        return self.width > 0


def tokens_fed_per_call(config: ARSamplingConfig, num_tokens: int) -> int:
    """Tokens one verification call feeds per image (and CFG branch) for ``config`` on ``num_tokens``-token images:
    the last committed token plus the window's drafts, plus the tree nodes of ``sjd-pac`` / ``mc-sjd-ra`` (and ``gsd``
    with ``width > 0``).

    Example:
        >>> tokens_fed_per_call(MCSJDConfig(), 256), tokens_fed_per_call(MCSJDRAConfig(), 256)
        (65, 193)
    """
    window = getattr(config, "window", None)
    if window is None:
        raise ValueError(f"{config.method}: no verification window (a Jacobi-family method is needed)")
    length = min(window, num_tokens - 1)
    if isinstance(config, MCSJDRAConfig) or (isinstance(config, GSDConfig) and config.alternatives):
        return 1 + length + min(config.depth, max(length - 1, 0)) * config.width * (1 + config.follow)
    if isinstance(config, SJDPACConfig):
        depth = min(config.depth, max(length, 1))
        return 1 + sum(config.width ** d for d in range(1, depth + 1)) + max(length - depth, 0)
    return 1 + length
