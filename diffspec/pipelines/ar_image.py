"""``sjd`` / ``mc-sjd`` / ``sjd-pac`` / ``mc-sjd-ra`` (exact) and ``gsd`` (relaxed) on AR image targets: Jacobi decoding, same call as the target.

The wrapper drives an :class:`~diffspec.ar_image.target.ARImageTarget` (LlamaGen-style model,
the toy table target, adapters) through its session protocol; the target's own call is the plain
AR loop (``spec.plain(...)`` too), whose law the speculative call reproduces exactly.

Example:
    >>> spec = SpeculativePipeline.from_pipe(target, method="mc-sjd", window=32)  # doctest: +SKIP
    >>> out = spec(class_labels=[1, 7], guidance_scale=2.0, generator=torch.Generator().manual_seed(0))  # doctest: +SKIP
    >>> out.images, out.tokens.shape, spec.stats.extra["step_compression"]  # doctest: +SKIP
"""

from __future__ import annotations

import time
from typing import Any

import torch

from ..api import SpeculativePipeline
from ..ar_image.cluster import ClusterAcceptance
from ..ar_image.config import GSDConfig, MCSJDConfig, MCSJDRAConfig, SJDConfig, SJDPACConfig
from ..ar_image.group import GroupAcceptance, distance_quantile
from ..ar_image.jacobi import jacobi_sample
from ..ar_image.pac import pac_sample
from ..ar_image.plain import finish, open_session, plain_sample
from ..ar_image.residual import residual_sample
from ..ar_image.target import ARImageTarget
from ..config import MethodConfig
from ..progress import progress
from ..speculation.sampling import Generators


class ARImagePipeline(SpeculativePipeline):
    """An AR image target sampled by speculative Jacobi decoding (``sjd``, ``mc-sjd``, ``sjd-pac``, ``mc-sjd-ra``: exact; ``gsd``: relaxed).

    Call it like the target: ``spec(class_labels=..., prompt=..., guidance_scale=..., generator=...,
    output_type="pil" | "np" | "pt" | "tokens", return_dict=True)``. ``temperature``, ``top_k`` and
    ``top_p`` may be passed too: they override the config's sampling settings for that call only.
    ``spec.stats`` (also ``out.spec_stats``): ``target_calls`` (prefill = 1 call), ``target_evals``
    (x CFG branches), ``accepted``/``proposed`` drafts, ``extra``: ``iterations`` (Jacobi rounds),
    ``step_compression`` (``num_tokens / target_calls`` for the batch) and ``tokens_per_call``
    (mean over images of ``num_tokens`` / that image's calls); ``gsd`` adds ``relaxed_tv`` (mean
    per-token TV budget its group test spent, see :mod:`diffspec.ar_image.group`).
    """

    family = "ar_image"

    def __init__(self, pipe: ARImageTarget, config: SJDConfig | MCSJDConfig | SJDPACConfig | MCSJDRAConfig | GSDConfig) -> None:
        super().__init__(pipe, config)
        self._progress_bar_config: dict[str, Any] = {}
        self._quantiles: dict[tuple[str, float], float] = {}  # gsd embed_quantile -> distance, per source
        self._rules: dict[tuple[Any, ...], GroupAcceptance] = {}  # gsd rules (and their distance tables) by settings
        self.enable()

    def set_progress_bar_config(self, **kwargs: Any) -> None:
        """tqdm options of the per-call bar (diffusers' convention), e.g. ``disable=True``."""
        self._progress_bar_config = dict(kwargs)

    @classmethod
    def wrap(cls, target: Any, config: MethodConfig) -> ARImagePipeline:
        if not isinstance(target, ARImageTarget):
            raise ValueError(f"method {config.method!r} needs an ARImageTarget (diffspec.ar_image); "
                             f"got {type(target).__name__}")
        if not isinstance(config, (SJDConfig, MCSJDConfig, SJDPACConfig, MCSJDRAConfig, GSDConfig)):
            raise ValueError(f"{type(config).__name__} is not an AR image Jacobi config (SJDConfig, MCSJDConfig, "
                             "SJDPACConfig, MCSJDRAConfig, GSDConfig)")
        return cls(target, config)

    def _run(self, class_labels: Any = None, prompt: Any = None, guidance_scale: float | None = None,
             generator: Generators = None, output_type: str = "pil", return_dict: bool = True,
             temperature: float | None = None, top_k: int | None = None, top_p: float | None = None,
             plain: bool = False, **conditions: Any) -> Any:
        given = {"temperature": temperature, "top_k": top_k, "top_p": top_p}
        config = self.config.replace(**{k: v for k, v in given.items() if v is not None})
        target, n = self.pipe, self.pipe.num_tokens
        with torch.no_grad():
            session = open_session(target, class_labels, prompt, guidance_scale, **conditions)
            desc = "plain" if plain else config.method
            with progress(total=session.batch_size * n, **{"desc": desc, **self._progress_bar_config}) as bar:
                if plain:
                    tokens = plain_sample(session, n, config.sampling, generator, self.stats, bar)
                else:
                    tokens = self._sample(session, config, generator, bar)
        self.stats.steps = n  # the plain loop's target calls per image (SpecStats.speedup)
        return finish(target, tokens, output_type, return_dict, self.stats)

    def _sample(self, session: Any, config: Any, generator: Generators, bar: Any) -> torch.Tensor:
        """The method's sampler on an open session (subclasses for other AR image methods override it)."""
        if isinstance(config, SJDPACConfig):
            return pac_sample(session, self.pipe.num_tokens, config.window, config.width, config.depth, config.init,
                              config.sampling, generator, self.stats, bar)
        if isinstance(config, MCSJDRAConfig) or (isinstance(config, GSDConfig) and config.alternatives):
            return residual_sample(session, self.pipe.num_tokens, config.window, config.width, config.depth,
                                   config.follow, config.init, config.sampling, generator, self.stats, bar,
                                   acceptance=self._acceptance(config))  # type: ignore[arg-type]
        return jacobi_sample(session, self.pipe.num_tokens, config.window, config.coupling, config.init,
                             config.sampling, generator, self.stats, bar, acceptance=self._acceptance(config),
                             cuda_graphs=getattr(config, "cuda_graphs", False))

    def _acceptance(self, config: MethodConfig) -> GroupAcceptance | ClusterAcceptance | None:
        """The verification rule of ``config``: None (exact MRS), ``gsd``'s group or cluster test."""
        if not isinstance(config, GSDConfig):
            return None
        if config.embed_source == "codebook":
            vectors = getattr(self.pipe, "codebook", None)
            if vectors is None:
                raise ValueError(f"embed_source='codebook': {type(self.pipe).__name__} exposes no VQ codebook "
                                 "(target.codebook); use embed_source='embeddings'")
        else:
            vectors = self.pipe.token_embeddings()
        if config.clusters is not None:
            key = (config.embed_source, "clusters", config.clusters, config.cluster_rule, config.group_onehot)
            if vectors is None:
                raise ValueError(f"clusters={config.clusters}: {type(self.pipe).__name__} exposes no token vectors "
                                 f"(embed_source={config.embed_source!r}) to cluster")
            if key not in self._rules:  # the k-means partition is fitted once
                self._rules[key] = ClusterAcceptance.fit(vectors, config.clusters, rule=config.cluster_rule,
                                                         group_onehot=config.group_onehot)
            return self._rules[key]
        dist = config.embed_dist
        if config.embed_quantile is not None and vectors is not None:
            key = (config.embed_source, config.embed_quantile)
            if key not in self._quantiles:
                self._quantiles[key] = distance_quantile(vectors, config.embed_quantile)
            dist = self._quantiles[key]
        key = (config.embed_source, dist, config.group_size, config.delta_p, config.group_onehot, config.max_tv,
               config.min_run)
        if key not in self._rules:  # kept across calls: its distance table is built once
            self._rules[key] = GroupAcceptance(config.group_size, config.delta_p, dist, vectors,
                                               group_onehot=config.group_onehot, max_tv=config.max_tv,
                                               min_run=config.min_run)
        return self._rules[key]

    def plain(self, *args: Any, **kwargs: Any) -> Any:
        """The plain AR loop (one target call per token) that ``sjd``/``mc-sjd`` are exact against."""
        self.stats.reset()
        start = time.perf_counter()
        out = self._run(*args, plain=True, **kwargs)
        self.stats.wall_s = time.perf_counter() - start
        return out
