"""``relaxed-action`` behind :class:`~diffspec.api.SpeculativePipeline`: a VLA decoded one action per call.

Example:
    >>> from diffspec import SpeculativePipeline
    >>> from diffspec.models.tiny_vla import load_tiny_vla, encode_observation, sample_episodes
    >>> vla, amap = load_tiny_vla()  # doctest: +SKIP
    >>> spec = SpeculativePipeline.from_pipe((vla, None), method="relaxed-action", action_map=amap,  # doctest: +SKIP
    ...                                      tolerance=3, draft_source="kalman")
    >>> states, _ = sample_episodes(1, 20)  # doctest: +SKIP
    >>> for t in range(20):  # one episode, one action per call  # doctest: +SKIP
    ...     out = spec(input_ids=encode_observation(states[:, t]))
    ...     out.actions, spec.stats.target_calls  # (1, 7) actions, passes for this action
    >>> spec.reset_episode()  # doctest: +SKIP
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from ..config import MethodConfig
from ..multimodal.action_config import RelaxedActionConfig
from ..multimodal.action_draft import kalman_draft, previous_draft
from ..multimodal.action_loop import relaxed_action_generate
from ..multimodal.action_map import ActionTokenMap
from ..stats import SpecStats
from .multimodal import MultimodalPipeline, check_generative, split_target


@dataclass
class ActionOutput:
    """One action step per row: ``actions`` (B, n_dof) continuous (bin centres), ``tokens`` (B, n_dof)
    ids (padded after an EOS), ``bins`` (B, n_dof), ``sequences`` (prompt + tokens) and ``spec_stats``."""

    actions: torch.Tensor
    tokens: torch.Tensor
    bins: torch.Tensor
    sequences: torch.Tensor
    spec_stats: SpecStats | None = None


class ActionPipeline(MultimodalPipeline):
    """A VLA (``model`` or ``(model, processor)``) decoded with ``relaxed-action``; one call = one action step.

    Built by ``SpeculativePipeline.from_pipe(target, method="relaxed-action", action_map=amap,
    tolerance=r, draft_source="previous" | "kalman" | "model", draft=<drafter for "model">)``.
    Without ``action_map`` the map is the last ``n_bins`` ids of the model's vocabulary, 7 DoF over
    [-1, 1] (OpenVLA's layout); a given map sets the config's ``n_dof``/``n_bins``.

    The pipeline keeps the episode's emitted actions (per row) as the draft history: call
    :meth:`reset_episode` between episodes (a change of batch size without it is an error).
    Calls take the processor's inputs (``text=``, ``images=``) or tensors (``input_ids=``, ...),
    greedy only. ``spec.stats``: ``target_calls`` (passes for this action; plain decoding takes
    ``n_dof``), ``accepted``/``proposed``, ``draft_calls`` (drafter forwards, ``"model"`` only),
    ``extra``: ``passes_per_action``, ``error_bound`` (``r * bin_width``: the largest deviation of an
    accepted token from the target's greedy value given the same prefix), ``relaxed_tokens``
    (accepted tokens that differ from that greedy token). :meth:`disable` uses plain ``generate``.

    Example:
        >>> spec = SpeculativePipeline.from_pipe(vla, method="relaxed-action", tolerance=0)  # doctest: +SKIP
        >>> spec(input_ids=prompt).tokens  # identical to plain greedy generate at r=0  # doctest: +SKIP
    """

    object_kwargs = ("draft", "action_map")

    def __init__(self, pipe: Any, config: RelaxedActionConfig, action_map: ActionTokenMap, drafter: Any = None,
                 processor: Any = None) -> None:
        super().__init__(pipe, config, drafter, processor)
        self.action_map = action_map
        self.history: torch.Tensor | None = None

    @classmethod
    def wrap(cls, target: Any, config: MethodConfig, draft: Any = None,
             action_map: ActionTokenMap | None = None) -> ActionPipeline:
        if not isinstance(config, RelaxedActionConfig):
            raise ValueError(f"{type(config).__name__} is not a RelaxedActionConfig")
        model, processor = split_target(target)
        check_generative(model, "target", config.method)
        if action_map is None:
            action_map = ActionTokenMap.for_model(model, n_bins=config.n_bins, n_dof=config.n_dof)
        elif not isinstance(action_map, ActionTokenMap):
            raise ValueError(f"action_map={type(action_map).__name__} must be a diffspec ActionTokenMap")
        action_map.check_model(model)
        config = config.replace(n_dof=action_map.n_dof, n_bins=action_map.n_bins)
        if config.draft_source == "model":
            if draft is None:
                raise ValueError("draft_source='model' needs draft=<drafter model> with the target's action ids")
            check_generative(draft, "drafter", config.method)
        return cls(model, config, action_map, draft, processor)

    def reset_episode(self) -> None:
        """Forget the action history (start of a new episode)."""
        self.history = None

    # ------------------------------------------------------------------ drafts
    def _history(self, batch: int, device: torch.device) -> torch.Tensor:
        if self.history is None:
            return torch.zeros(batch, 0, self.action_map.n_dof, device=device)
        if self.history.shape[0] != batch:
            raise ValueError(f"batch size changed from {self.history.shape[0]} to {batch} within an episode; "
                             "call spec.reset_episode() first")
        return self.history

    def _draft(self, inputs: dict[str, Any], batch: int, gen: dict[str, Any]) -> torch.Tensor:
        cfg = self.config
        if cfg.draft_source == "model":
            seqs = self.drafter.generate(**inputs, **gen)
            new = seqs[:, inputs["input_ids"].shape[1]:]
            self.stats.draft_calls += new.shape[1]
            mid = torch.full((batch, cfg.n_dof), self.action_map.n_bins // 2, device=new.device)
            fill = self.action_map.bins_to_tokens(mid)
            fill[:, : new.shape[1]] = new
            return fill
        hist = self._history(batch, self.pipe.device)
        if cfg.draft_source == "previous":
            act = previous_draft(hist)
        else:
            act = kalman_draft(hist, process_noise=cfg.process_noise, measurement_noise=cfg.measurement_noise,
                               context=cfg.kalman_context)
        return self.action_map.actions_to_tokens(act)

    def _push(self, actions: torch.Tensor) -> None:
        hist = self._history(actions.shape[0], actions.device)
        self.history = torch.cat([hist, actions[:, None]], dim=1)[:, -self.config.kalman_context:]

    # ------------------------------------------------------------------ call
    def _run(self, text: Any = None, images: Any = None, videos: Any = None,
             generator: torch.Generator | None = None, **kwargs: Any) -> ActionOutput:
        if kwargs.get("do_sample"):
            raise ValueError("relaxed-action decodes greedily: do_sample=True is not supported")
        inputs = self._inputs(text, images, videos, kwargs)
        inputs = {k: v.to(self.pipe.device) if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}
        amap, cfg = self.action_map, self.config
        B, T0 = inputs["input_ids"].shape
        gen = {"do_sample": False, **kwargs, "max_new_tokens": amap.n_dof}
        if self.speculative:
            drafts = self._draft(inputs, B, gen)
            seqs = self.pipe.generate(**inputs, **gen, custom_generate=relaxed_action_generate, action_map=amap,
                                      drafts=drafts, tolerance=cfg.tolerance, spec_stats=self.stats)
            self.stats.extra["error_bound"] = amap.tolerance_bound(cfg.tolerance)
        else:  # plain greedy: one forward per generated token
            seqs = self.pipe.generate(**inputs, **gen)
            self.stats.target_calls = seqs.shape[1] - T0
            self.stats.target_evals = B * self.stats.target_calls
        self.stats.extra["passes_per_action"] = self.stats.target_calls
        pad = self.pipe.generation_config.pad_token_id
        tokens = torch.nn.functional.pad(seqs[:, T0:], (0, T0 + amap.n_dof - seqs.shape[1]), value=pad or 0)
        actions = amap.tokens_to_actions(tokens)
        self._push(actions)
        return ActionOutput(actions, tokens, amap.tokens_to_bins(tokens), seqs)
