"""``method="auto"`` on multimodal targets: the draft method and draft length that run fastest on the user's device.

Candidates (:func:`mm_candidates`), each run on the call's first rows (``AutoConfig.samples`` of them, one at a
time) with the call's ``generate`` options; all are exact, so every quality preset considers them all:

- ``draft`` (when ``draft=`` gives a drafter model) at draft lengths 2, 3, 4, 5, 6, 8, 10 and 12;
- ``self-draft`` (the target drafts with its first half or first quarter of layers, and its sparse visual KV) at
  draft lengths 2, 4 and 6.

A longer draft feeds ``k + 1`` tokens per target call and more drafter calls per round, so the length is chosen on
the device's own cost (:mod:`~diffspec.pipelines.auto_wall`): the target's decode call at 1 to 13 tokens fed and the
drafter's one-token call are timed (a ``self-draft`` draft call is estimated as the target's one-token call times
the share of layers it runs), and each candidate's predicted seconds are its target calls at its feed plus its
drafter calls, plus its method's measured bookkeeping per round.

Example:
    >>> spec = SpeculativePipeline.from_pipe((model, processor), method="auto", draft=drafter)  # doctest: +SKIP
    >>> out = spec(text=prompts, images=images, max_new_tokens=32)  # doctest: +SKIP
    >>> spec.config.num_draft_tokens, spec.stats.extra["auto"]["measured_speedup"]  # doctest: +SKIP
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import torch

from ..config import AutoConfig, MethodConfig
from ..multimodal.config import DraftConfig
from ..multimodal.self_config import SelfDraftConfig
from .auto import AutoPipeline
from .auto_ar import REPORTED
from .auto_cache import AutoCache, digest, weights_digest
from .auto_cost import CostCurve, lm_call_cost
from .auto_search import CALIBRATION_SEED
from .auto_wall import WallTuner
from .multimodal import MultimodalPipeline, check_generative, split_target

DRAFT_LENGTHS = (2, 3, 4, 5, 6, 8, 10, 12)
SELF_DRAFT_LENGTHS = (2, 4, 6)
INPUTS = ("text", "images", "videos", "audio", "sampling_rate")
"""Call arguments that are inputs (the rest are ``generate`` options)."""


def num_layers(model: Any) -> int:
    """Decoder layers of a transformers model (its text config's for a VLM)."""
    config = getattr(model.config, "text_config", None) or model.config
    return int(config.num_hidden_layers)


def mm_candidates(layers: int, has_drafter: bool) -> list[MethodConfig]:
    """The candidates for a ``layers``-layer target (``draft`` ones only with a drafter).

    Example:
        >>> [(c.method, c.num_draft_tokens) for c in mm_candidates(8, False)][:2]
        [('self-draft', 2), ('self-draft', 4)]
    """
    configs: list[MethodConfig] = [DraftConfig(num_draft_tokens=k) for k in DRAFT_LENGTHS] if has_drafter else []
    for share in (2, 4):
        if layers // share >= 1:
            configs += [SelfDraftConfig(num_draft_tokens=k, draft_layers=tuple(range(layers // share)))
                        for k in SELF_DRAFT_LENGTHS]
    return list(dict.fromkeys(configs))


def rows(inputs: dict[str, Any], count: int) -> list[dict[str, Any]]:
    """``count`` one-row input dicts taken in turn from a batch (the whole batch as one item when a tensor is not
    batch-major, such as flattened image patches).

    Example:
        >>> [r["input_ids"].tolist() for r in rows({"input_ids": torch.tensor([[1], [2]])}, 3)]
        [[[1]], [[2]], [[1]]]
    """
    batch = inputs["input_ids"].shape[0] if "input_ids" in inputs else 1
    tensors = [v for v in inputs.values() if isinstance(v, torch.Tensor)]
    if batch == 1 or any(v.shape[0] != batch for v in tensors):
        return [inputs] * count
    return [{k: v[i % batch: i % batch + 1] if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}
            for i in range(count)]


class MultimodalTuner(WallTuner):
    """:class:`~diffspec.pipelines.auto_wall.WallTuner` over a transformers target's calibration rows.

    Args:
        model, processor, drafter: the target, its processor and the drafter model (or None).
        items: one-row input dicts (tensors); ``options``: the call's ``generate`` options.
    """

    def __init__(self, model: Any, processor: Any, drafter: Any, items: list[dict[str, Any]],
                 options: dict[str, Any], cache: AutoCache, show_progress: bool = True) -> None:
        super().__init__(cache, show_progress)
        self.model, self.processor, self.drafter, self.items, self.options = model, processor, drafter, items, options

    def measure_cost(self, configs: list[MethodConfig]) -> dict[str, CostCurve]:
        feeds = sorted({1, *(c.num_draft_tokens + 1 for c in configs)})  # type: ignore[attr-defined]
        sizes = sorted({1, feeds[len(feeds) // 2], feeds[-1], 3})
        curves = {"target": lm_call_cost(self.model, self.items[0], sizes)}
        if self.drafter is not None:
            same_inputs = type(self.drafter) is type(self.model)
            item = self.items[0] if same_inputs else {k: self.items[0][k] for k in ("input_ids", "attention_mask")
                                                       if k in self.items[0]}
            curves["drafter"] = lm_call_cost(self.drafter, item, [1])
        return curves

    def _spec(self, config: MethodConfig | None) -> MultimodalPipeline:
        from ..api import SpeculativePipeline

        config = config or mm_candidates(num_layers(self.model), False)[0]
        draft = {"draft": self.drafter} if config.method != "self-draft" else {}
        return SpeculativePipeline.from_pipe((self.model, self.processor), method=config, **draft)  # type: ignore

    def _generate(self, spec: MultimodalPipeline, plain: bool) -> tuple[float, float]:
        calls, drafts = 0, 0
        for i, item in enumerate(self.items):
            seed = torch.Generator(self.model.device).manual_seed(CALIBRATION_SEED + i)
            out = (spec.plain if plain else spec)(**item, **self.options, generator=seed)
            calls += out.new_tokens.shape[1] if plain else spec.stats.target_calls
            drafts += 0 if plain else spec.stats.draft_calls
        return calls / len(self.items), drafts / len(self.items)

    def run(self, config: MethodConfig | None) -> dict[str, Any]:
        spec = self._spec(config)
        start = time.perf_counter()
        with torch.inference_mode():
            calls, drafts = self._generate(spec, plain=config is None)
        wall = (time.perf_counter() - start) / len(self.items)
        fed = 1 if config is None else config.num_draft_tokens + 1  # type: ignore[attr-defined]
        return {"calls_per_item": round(calls, 3), "draft_calls_per_item": round(drafts, 3), "tokens_fed": fed,
                "wall_s": round(wall, 6), "samples": len(self.items)}

    def explained(self, counts: dict[str, Any], cost: dict[str, CostCurve]) -> float:
        seconds = counts["calls_per_item"] * cost["target"](counts["tokens_fed"])
        if counts["method"] == "self-draft":
            share = len(counts["config"]["draft_layers"]) / num_layers(self.model)
            return seconds + counts["draft_calls_per_item"] * cost["target"](1) * share
        if counts["method"] == "plain":
            return seconds
        return seconds + counts["draft_calls_per_item"] * cost["drafter"](1)

    def runners(self, config: MethodConfig) -> tuple[Callable[[], Any], Callable[[], Any]]:
        spec = self._spec(config)
        return (lambda: self._generate(spec, True)), (lambda: self._generate(spec, False))


class MultimodalAutoPipeline(AutoPipeline):
    """``method="auto"`` on a transformers target (see the module docs); called like ``method="draft"``.

    ``spec.stats.extra["auto"]`` holds the same keys as on AR image targets (:class:`~diffspec.pipelines.auto_ar.
    ARAutoPipeline`); ``speedup`` and ``measured_speedup`` are against plain ``generate``.
    """

    family = "multimodal"
    reported = REPORTED

    def __init__(self, target: Any, config: AutoConfig, draft: Any = None) -> None:
        model, processor = split_target(target)
        check_generative(model, "target", "auto")
        if draft is not None:
            check_generative(draft, "drafter", "auto")
        super().__init__(model, config)
        self.processor, self.drafter = processor, draft
        self.plain_runner = MultimodalPipeline(model, mm_candidates(num_layers(model), False)[0], None, processor)
        self.plain_runner.disable()

    def _split(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
        """The call's one-row-able inputs (tensors) and its ``generate`` options."""
        given = dict(zip(INPUTS, args)) | {k: v for k, v in kwargs.items() if k in INPUTS}
        rest = {k: v for k, v in kwargs.items() if k not in INPUTS and k != "generator"}
        options = {k: v for k, v in rest.items() if not isinstance(v, torch.Tensor)}
        tensors = {k: v for k, v in rest.items() if isinstance(v, torch.Tensor)}
        inputs = self.plain_runner._inputs(given.get("text"), given.get("images"), given.get("videos"), tensors,
                                           given.get("audio"), given.get("sampling_rate"))
        return {k: v.to(self.pipe.device) if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}, options

    def settings(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
        inputs, options = self._split(args, kwargs)
        device = self.pipe.device
        return {"family": "multimodal", "options": json.loads(json.dumps(options, sort_keys=True, default=str)),
                "prompt_tokens": int(inputs["input_ids"].shape[1]) if "input_ids" in inputs else None,
                "device": device.type, "threads": torch.get_num_threads() if device.type == "cpu" else None}

    def tune_call(self, args: tuple[Any, ...], kwargs: dict[str, Any], show_progress: bool) -> dict[str, Any]:
        inputs, options = self._split(args, kwargs)
        model = {"target": type(self.pipe).__name__, "config": digest(self.pipe.config.to_dict()),
                 "weights": weights_digest(self.pipe), "drafter": weights_digest(self.drafter)}
        cache = AutoCache.for_settings(model, self.settings(args, kwargs))
        items = rows(inputs, self.auto_config.sample_count("multimodal"))
        tuner = MultimodalTuner(self.pipe, self.processor, self.drafter, items, options, cache, show_progress)
        choice = tuner.choose(mm_candidates(num_layers(self.pipe), self.drafter is not None))
        return {**choice, "quality": self.auto_config.quality, "floor": self.auto_config.floor}

    def build(self, config: MethodConfig) -> Any:
        return MultimodalPipeline(self.pipe, config, None if config.method == "self-draft" else self.drafter,
                                  self.processor)

    def run_unchanged(self, *args: Any, **kwargs: Any) -> Any:
        return self.plain_runner(*args, **kwargs)

    def show_progress(self) -> bool:
        return True
