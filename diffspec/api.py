"""The one entry point: ``SpeculativePipeline`` and the method registry."""

from __future__ import annotations

import importlib
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import torch

from .ar_image.config import GSDConfig, MCSJDConfig, MCSJDRAConfig, SJDConfig, SJDPACConfig
from .ar_image.lantern_config import LanternConfig, LanternPPConfig
from .ar_image.target import ARImageTarget
from .checks import check_finite_arguments, named_arguments
from .config import AutoConfig, AutospecConfig, CouplingConfig, ForecastConfig, MethodConfig, SpecaConfig
from .forecast.claims import check_unclaimed
from .multimodal.action_config import RelaxedActionConfig
from .multimodal.codec_config import RelaxedCodecConfig
from .multimodal.compressed_config import CompressedDraftConfig
from .multimodal.config import DraftConfig, TextDraftConfig
from .multimodal.self_config import SelfDraftConfig
from .stats import SpecStats

FAMILIES = ("diffusion", "ar_image", "multimodal")
_AR_WRAP_HINT = ("; wrap AR image generators first: diffspec.ar_image.targets.janus.JanusTarget(model, processor), "
                 "diffspec.ar_image.targets.emu3.Emu3Target(model, height=..., width=...) or a LlamaGenTarget")


@dataclass(frozen=True)
class MethodInfo:
    """One registry entry (see :func:`methods`)."""

    name: str
    family: str
    exact: bool
    config_class: type[MethodConfig] | None
    status: str  # "available" or "planned"
    pipeline: str | None  # "module:Class" implementing it, once available
    description: str


def _info(cfg: type[MethodConfig], pipeline: str, description: str) -> MethodInfo:
    return MethodInfo(cfg.method, cfg.family, cfg.exact, cfg, "available", pipeline, description)


def _planned(name: str, family: str, exact: bool, description: str) -> MethodInfo:
    return MethodInfo(name, family, exact, None, "planned", None, description)


_REGISTRY: dict[str, MethodInfo] = {
    m.name: m
    for m in (
        _info(ForecastConfig, "diffspec.pipelines.forecast:ForecastPipeline", "fixed-interval Taylor forecasting"),
        _info(SpecaConfig, "diffspec.pipelines.forecast:ForecastPipeline",
              "Taylor forecasting gated by a last-block verifier (SpecA)"),
        _info(CouplingConfig, "diffspec.pipelines.coupling:CouplingPipeline",
              "exact multi-step speculative sampling, reflection maximal coupling"),
        _info(AutospecConfig, "diffspec.pipelines.coupling:CouplingPipeline",
              "exchangeability autospeculation (ASD) for DDPM samplers"),
        _info(SJDConfig, "diffspec.pipelines.ar_image:ARImagePipeline", "speculative Jacobi decoding"),
        _info(MCSJDConfig, "diffspec.pipelines.ar_image:ARImagePipeline",
              "SJD with maximal coupling of successive draws"),
        _info(SJDPACConfig, "diffspec.pipelines.ar_image:ARImagePipeline",
              "MC-SJD plus a tree of alternatives at the window start (SJD-PAC style, recursive rejection)"),
        _info(MCSJDRAConfig, "diffspec.pipelines.ar_image:ARImagePipeline",
              "MC-SJD plus residual alternatives: Gumbel-ranked siblings whose rows serve the first rejection"),
        _info(GSDConfig, "diffspec.pipelines.ar_image:ARImagePipeline",
              "grouped speculative decoding (relaxed group acceptance in the MC-SJD loop)"),
        _info(LanternConfig, "diffspec.pipelines.lantern:LanternPipeline",
              "drafter + latent-neighbourhood relaxed acceptance"),
        _info(LanternPPConfig, "diffspec.pipelines.lantern:LanternPipeline",
              "LANTERN with the multiplicative cap (chain drafts; static trees not yet)"),
        _info(DraftConfig, "diffspec.pipelines.multimodal:MultimodalPipeline",
              "classic speculative decoding with a draft model"),
        _info(TextDraftConfig, "diffspec.pipelines.multimodal:MultimodalPipeline", "VLM drafter without vision"),
        _info(CompressedDraftConfig, "diffspec.pipelines.multimodal:MultimodalPipeline",
              "smaller VLM drafter on pruned visual tokens (video: by target attention)"),
        _info(SelfDraftConfig, "diffspec.pipelines.multimodal:MultimodalPipeline",
              "the target drafts for itself: sparse top-K visual KV and/or layer skip (STD)"),
        _info(RelaxedActionConfig, "diffspec.pipelines.action:ActionPipeline",
              "VLA action drafts (previous / Kalman) verified in one pass, bin-tolerance acceptance"),
        _info(RelaxedCodecConfig, "diffspec.pipelines.codec:CodecPipeline",
              "codec LM (MusicGen) frame drafts, exact on codebook 0, beta tolerance on the others"),
    )
}


AUTO = MethodInfo("auto", "diffusion", False, AutoConfig, "available", "diffspec.pipelines.auto:AutoPipeline",
                  "the fastest method of the target's family that meets a quality target, tuned on the call's own "
                  "prompts or labels")
"""``method="auto"`` (:class:`~diffspec.config.AutoConfig`): it picks one of the registered methods of any family,
so :func:`methods` does not list it."""


def _entry(name: str) -> MethodInfo | None:
    return AUTO if name == AUTO.name else _REGISTRY.get(name)


def methods(family: str | None = None, *, available_only: bool = False) -> list[MethodInfo]:
    """The registered methods (name, family, exact/relaxed, config class, status).

    Example:
        >>> [m.name for m in methods("diffusion", available_only=True)]
        ['taylor', 'speca']
    """
    if family is not None and family not in FAMILIES:
        raise ValueError(f"family={family!r} is not supported: choose one of {', '.join(FAMILIES)}")
    return [
        m
        for m in _REGISTRY.values()
        if (family is None or m.family == family) and (not available_only or m.status == "available")
    ]


def target_family(target: Any) -> str | None:
    """The method family a target belongs to, or None if diffspec does not know it."""
    if isinstance(target, ARImageTarget):
        return "ar_image"
    if isinstance(target, (tuple, list)) and len(target) == 2:  # (model, processor)
        return "multimodal" if target_family(target[0]) == "multimodal" else None
    try:
        from diffusers import DiffusionPipeline

        if isinstance(target, DiffusionPipeline):
            return "diffusion"
    except ImportError:  # pragma: no cover - diffusers is a hard dependency
        pass
    try:
        from transformers import PreTrainedModel

        if isinstance(target, PreTrainedModel):
            return "multimodal"
    except ImportError:  # pragma: no cover
        pass
    return None


def method_info(method: str | MethodConfig) -> MethodInfo:
    """The registry entry of a method name or config.

    Raises:
        ValueError: an unknown name (listing the available methods).
    """
    if isinstance(method, MethodConfig):
        return _entry(type(method).method)  # type: ignore[return-value]
    if not isinstance(method, str) or _entry(method) is None:
        names = ", ".join(m.name for m in methods(available_only=True))
        raise ValueError(f"unknown method {method!r}; available methods: {names} (see diffspec.methods()), or "
                         "'auto'")
    return _entry(method)  # type: ignore[return-value]


def resolve_config(method: str | MethodConfig, overrides: dict[str, Any]) -> tuple[MethodInfo, MethodConfig]:
    """Turn a method name or config (plus overrides) into its registry entry and a validated config."""
    info = method_info(method)
    if isinstance(method, MethodConfig):
        return info, method.replace(**overrides) if overrides else method
    if info.config_class is None:
        raise ValueError(
            f"method {method!r} ({info.family}) is planned but not implemented yet; available: "
            f"{', '.join(m.name for m in methods(available_only=True))}"
        )
    return info, info.config_class().replace(**overrides)


def _check_family(method: str | MethodConfig, family: str, target: str, wrap_hint: bool = False) -> MethodInfo:
    """The registry entry of ``method``.

    Raises:
        ValueError: an unknown method, or one of another family than ``family``; ``target`` says what the target
            is (``wrap_hint``: how to wrap AR image generators, for objects given to ``from_pipe``).
    """
    info = method_info(method)
    if info is AUTO:
        return info
    if info.family != family:
        raise ValueError(
            f"method {info.name!r} is a {info.family} method but {target}; methods for it: "
            f"{', '.join(m.name for m in methods(family, available_only=True)) or 'none yet'}"
            + (_AR_WRAP_HINT if wrap_hint and info.family == "ar_image" else "")
        )
    return info


class SpeculativePipeline:
    """Wraps a pipeline with a diffspec method; call it exactly like the wrapped pipeline.

    It is a composition wrapper: ``spec.pipe`` is the original pipeline and any attribute not
    defined here is forwarded to it. ``spec.stats`` holds the :class:`SpecStats` of the last
    call (also attached to the output as ``.spec_stats``).

    Example:
        >>> from diffusers import DiffusionPipeline  # doctest: +SKIP
        >>> pipe = DiffusionPipeline.from_pretrained("diffspec/weights/tiny-dit")  # doctest: +SKIP
        >>> spec = SpeculativePipeline.from_pipe(pipe, method="taylor", interval=4)  # doctest: +SKIP
        >>> images = spec(class_labels=[0, 1], num_inference_steps=50).images  # doctest: +SKIP
        >>> spec.stats.full_steps, spec.stats.forecast_steps  # doctest: +SKIP
        >>> spec.disable()  # the pipe behaves exactly as before  # doctest: +SKIP
    """

    family: ClassVar[str] = ""

    def __init__(self, pipe: Any, config: MethodConfig) -> None:
        self.pipe = pipe
        self.config = config
        self.stats = SpecStats(method=config.method)
        self.enabled = False

    # ------------------------------------------------------------------ factories
    @classmethod
    def from_pipe(cls, target: Any, method: str | MethodConfig = "taylor", **overrides: Any) -> SpeculativePipeline:
        """Wrap an existing pipeline/model with ``method`` (a registry name or a config).

        A pipeline takes one method at a time: wrapping one whose modules already carry diffspec
        hooks (from a ``SpeculativePipeline`` not disabled yet) raises; call ``spec.disable()`` first.

        Raises:
            ValueError: unknown method, a method of another family than the target, a method
                not implemented yet, an unsupported target, a target already wrapped, or a bad
                config value.
        """
        family = target_family(target)
        if family is None:
            raise ValueError(
                f"unsupported target {type(target).__name__}: diffspec wraps diffusers DiffusionPipeline "
                "objects with a transformer (DiT, PixArt, SD3, Flux) for the diffusion methods "
                f"({', '.join(m.name for m in methods('diffusion', available_only=True))}) and AR image targets "
                "(diffspec.ar_image: LlamaGenTarget, JanusTarget, Emu3Target) for "
                f"{', '.join(m.name for m in methods('ar_image', available_only=True))} and transformers "
                "generative models (LMs, LLaVA, Qwen2-VL), optionally as (model, processor), for "
                f"{', '.join(m.name for m in methods('multimodal', available_only=True))}"
            )
        info = _check_family(method, family, f"the target is a {family} target ({type(target).__name__})",
                             wrap_hint=True)
        if family == "diffusion":
            check_unclaimed(target)
        # multimodal methods take draft= as the drafter model; elsewhere it is a config field (coupling's draft)
        drafter = (info.family == "multimodal" or info is AUTO) and "draft" in overrides
        extra = {"draft": overrides.pop("draft")} if drafter else {}
        if info.pipeline is not None:  # other objects an implementation takes (action_map=)
            module, _, cls_name = info.pipeline.partition(":")
            names = getattr(getattr(importlib.import_module(module), cls_name), "object_kwargs", ())
            extra.update({k: overrides.pop(k) for k in names if k != "draft" and k in overrides})
        info, config = resolve_config(method, overrides)
        module, _, cls_name = info.pipeline.partition(":")  # type: ignore[union-attr]
        impl = getattr(importlib.import_module(module), cls_name)
        return impl.wrap(target, config, **extra)

    @classmethod
    def from_pretrained(
        cls,
        path: str | Path,
        method: str | MethodConfig = "taylor",
        *,
        dtype: torch.dtype | None = None,
        device: str | torch.device | None = None,
        **overrides: Any,
    ) -> SpeculativePipeline:
        """Load a diffusers pipeline folder, an AR image model folder (``gpt/`` + ``tokenizer/``), a
        transformers model folder (LM, VLM, Whisper, MusicGen decoder; with its processor, and for
        multimodal methods ``draft=`` a drafter folder or model; a VLA folder's ``action_map.json``
        is read for ``relaxed-action``) or a shipped name (``"tiny-dit"``, ``"tiny-ar"``,
        ``"tiny-vla"``) and wrap it.

        Raises:
            ValueError: as :meth:`from_pipe`; an unknown method, or one of another family than the folder's model
                (read from its JSON files), before any weight is loaded.

        Example:
            >>> spec = SpeculativePipeline.from_pretrained("tiny-dit", method="taylor")  # doctest: +SKIP
            >>> spec = SpeculativePipeline.from_pretrained("tiny-ar", method="mc-sjd")  # doctest: +SKIP
            >>> spec = SpeculativePipeline.from_pretrained("ckpt/whisper", method="draft", draft="ckpt/small")  # doctest: +SKIP
            >>> spec = SpeculativePipeline.from_pretrained("tiny-vla", method="relaxed-action", tolerance=5)  # doctest: +SKIP
        """
        from .models import (
            is_ar_model_folder,
            load_ar_target,
            load_pipeline,
            model_family,
            resolve_model_path,
        )

        folder = resolve_model_path(path)
        family = model_family(folder)  # from the folder's JSON files: a method of another family loads nothing
        if family is not None:
            _check_family(method, family, f"{str(path)!r} holds a {family} model")
        else:
            method_info(method)  # an unknown method, before loading
        if is_ar_model_folder(folder):
            return cls.from_pipe(load_ar_target(path, dtype=dtype, device=device), method, **overrides)
        from .multimodal.loading import is_transformers_folder, load_model, load_target

        if is_transformers_folder(folder):
            name = method if isinstance(method, str) else getattr(method, "method", None)
            if name == "relaxed-action" and overrides.get("action_map") is None:
                from .multimodal.action_map import ActionTokenMap

                overrides["action_map"] = ActionTokenMap.from_pretrained(folder)  # None: the default map
            if isinstance(overrides.get("draft"), (str, Path)):
                overrides["draft"] = load_model(overrides["draft"], dtype=dtype, device=device)
            return cls.from_pipe(load_target(folder, dtype=dtype, device=device), method, **overrides)
        return cls.from_pipe(load_pipeline(path, dtype=dtype, device=device), method, **overrides)

    @classmethod
    def wrap(cls, target: Any, config: MethodConfig) -> SpeculativePipeline:
        """Build the family implementation (overridden by each implementation)."""
        raise NotImplementedError

    # ------------------------------------------------------------------ behaviour
    def enable(self) -> None:
        """Re-attach the method after :meth:`disable`."""
        self.enabled = True

    def disable(self) -> None:
        """Detach the method: the wrapped pipeline behaves bit for bit as if never wrapped."""
        self.enabled = False

    def _run(self, *args: Any, **kwargs: Any) -> Any:
        return self.pipe(*args, **kwargs)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Run the wrapped pipeline with the method applied; same signature as the pipeline.

        Raises:
            ValueError: an argument is or holds a NaN or an infinity (``guidance_scale=nan``, ``latents`` with a
                NaN...), named in the message (:func:`~diffspec.checks.check_finite_arguments`).
        """
        check_finite_arguments(named_arguments((self._run, self.pipe), args, kwargs))
        self.stats.reset()
        start = time.perf_counter()
        out = self._run(*args, **kwargs) if self.enabled else self.pipe(*args, **kwargs)
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            torch.cuda.synchronize()
        self.stats.wall_s = time.perf_counter() - start
        try:
            out.spec_stats = self.stats
        except AttributeError:  # tuples (return_dict=False) cannot carry it
            pass
        return out

    def __getattr__(self, name: str) -> Any:
        if name == "pipe":  # not set yet (during unpickling / init)
            raise AttributeError(name)
        return getattr(self.pipe, name)

    def __repr__(self) -> str:
        state = "enabled" if self.enabled else "disabled"
        return f"SpeculativePipeline({type(self.pipe).__name__}, {self.config!r}, {state})"
