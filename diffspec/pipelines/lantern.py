"""``lantern`` / ``lantern++`` on LlamaGen-style AR image targets: drafter chains or static trees, relaxed acceptance.

Same call as the target and as ``sjd`` (:class:`~diffspec.pipelines.ar_image.ARImagePipeline`);
the method is relaxed (``exact=False``): each token may move up to ``delta`` of total variation.

Example:
    >>> spec = SpeculativePipeline.from_pretrained("tiny-ar", method="lantern", delta=0.1)  # doctest: +SKIP
    >>> out = spec(class_labels=[1, 7], generator=torch.Generator().manual_seed(0))  # doctest: +SKIP
    >>> spec.stats.extra["step_compression"], spec.stats.extra["tv_budget_mean"]  # doctest: +SKIP
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from ..ar_image.drafter import EagleDrafter, FeatureDrafter
from ..ar_image.lantern import lantern_sample
from ..ar_image.lantern_config import LanternConfig
from ..ar_image.lantern_tree import lantern_tree_sample
from ..ar_image.neighbours import target_neighbours
from ..ar_image.target import ARImageTarget
from ..ar_image.tree import StaticTree
from ..config import MethodConfig
from ..speculation.sampling import Generators
from .ar_image import ARImagePipeline


def default_drafter_path(target: Any) -> Path:
    """The shipped drafter folder of a target loaded by :func:`~diffspec.models.load_ar_target`."""
    folder = getattr(target, "name_or_path", None)
    if folder is None or not (Path(folder) / "drafter" / "config.json").is_file():
        raise ValueError("no drafter for this target: pass drafter=<folder> (train one with "
                         "`diffspec train-drafter --model ... --out DIR`) or a drafter= module to LanternPipeline")
    return Path(folder) / "drafter"


class LanternPipeline(ARImagePipeline):
    """An AR image target sampled by LANTERN / LANTERN++ (relaxed; see :class:`LanternConfig`).

    ``spec.stats``: ``target_calls`` (prefill = 1), ``draft_calls`` (drafter calls), ``accepted`` /
    ``proposed``, ``extra``: ``step_compression``, ``tokens_per_call``, ``tv_budget_mean`` (mean
    neighbour mass moved per verified draft: the per-token TV spent); ``tree_nodes`` for static trees
    (``lantern++`` with a ``tree`` that branches: :func:`~diffspec.ar_image.lantern_tree.lantern_tree_sample`).

    Args:
        pipe: a LlamaGen-style target (its sessions expose ``last_hidden``; it has a codebook).
        config: :class:`LanternConfig` or :class:`LanternPPConfig`.
        drafter: a trained :class:`EagleDrafter`; ``None`` loads ``config.drafter`` or the target's
            shipped one.
    """

    def __init__(self, pipe: ARImageTarget, config: LanternConfig, drafter: EagleDrafter | None = None) -> None:
        super().__init__(pipe, config)  # type: ignore[arg-type]
        if drafter is None:
            path = Path(config.drafter) if config.drafter else default_drafter_path(pipe)
            drafter = EagleDrafter.from_pretrained(path, device=pipe.device)
        self.head = FeatureDrafter(drafter, pipe.model)  # type: ignore[attr-defined]
        self.neighbours = target_neighbours(pipe, config.k)

    @classmethod
    def wrap(cls, target: Any, config: MethodConfig) -> LanternPipeline:
        if not isinstance(target, ARImageTarget) or not hasattr(target, "model"):
            raise ValueError(f"method {config.method!r} needs a LlamaGen-style ARImageTarget (its GPT's hidden "
                             f"states feed the drafter); got {type(target).__name__}")
        if not isinstance(config, LanternConfig):
            raise ValueError(f"{type(config).__name__} is not a LANTERN config (LanternConfig, LanternPPConfig)")
        return cls(target, config)

    def _sample(self, session: Any, config: Any, generator: Generators, bar: Any) -> torch.Tensor:
        tree = tuple(getattr(config, "tree", ()))
        if any(b > 1 for b in tree):
            return lantern_tree_sample(session, self.pipe.num_tokens, self.head, self.neighbours, StaticTree(tree),
                                       config.delta, config.lam, config.sampling, generator, self.stats, bar,
                                       acceptance=config.acceptance)
        if tree:  # all ones: the chain (the tree engine gives the same tokens, tested)
            config = config.replace(draft_length=len(tree))
        return lantern_sample(session, self.pipe.num_tokens, self.head, self.neighbours, config.draft_length,
                              config.delta, getattr(config, "lam", None), config.sampling, generator, self.stats,
                              bar, acceptance=config.acceptance)
