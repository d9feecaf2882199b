"""Loading LlamaGen weights: official ``.pt`` checkpoints and diffspec ``save_pretrained`` folders.

Official checkpoints (https://github.com/FoundationVision/LlamaGen) are ``torch.save`` dicts with
the state dict under ``"model"`` (GPT checkpoints may use ``"module"`` or ``"state_dict"``, FSDP
exports are the bare state dict). Loading is strict: every parameter of the module must be present
with the right shape and every checkpoint entry must be consumed, except entries the official code
keeps outside its modules' state (rotary tables, KV caches, causal masks).

Example:
    >>> target = load_llamagen("c2i_B_256.pt", "vq_ds16_c2i.pt", gpt_config="GPT-B")  # doctest: +SKIP
    >>> session = target.start(class_labels=[207], guidance_scale=2.0)                # doctest: +SKIP
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import torch
from torch import nn

from diffspec.ar_image.targets.llamagen_config import config_from_dict

if TYPE_CHECKING:
    from diffspec.ar_image.targets.llamagen_session import LlamaGenTarget

M = TypeVar("M", bound=nn.Module)

# Checkpoint entries that are derived state in the official code, never weights.
_DERIVED = re.compile(r"(^|\.)(freqs_cis|causal_mask|kv_cache\.[kv]_cache)$")


def unwrap_checkpoint(obj: object, what: str = "checkpoint") -> dict[str, torch.Tensor]:
    """The state dict inside an official checkpoint object (``model``/``module``/``state_dict`` or bare).

    Raises:
        ValueError: no tensor state dict found (the top-level keys are named).
    """
    if isinstance(obj, Mapping):
        for key in ("model", "module", "state_dict"):
            if isinstance(obj.get(key), Mapping):
                obj = obj[key]
                break
        if obj and all(isinstance(v, torch.Tensor) for v in obj.values()):
            return {k.removeprefix("module.").removeprefix("_orig_mod."): v for k, v in obj.items()}
        keys = sorted(obj)[:10] if isinstance(obj, Mapping) else []
        raise ValueError(f"{what}: no state dict of tensors found (top-level keys {keys})")
    raise ValueError(f"{what}: expected a dict checkpoint, got {type(obj).__name__}")


def read_checkpoint(path: str | Path) -> dict[str, torch.Tensor]:
    """Read an official ``.pt``/``.pth`` (``weights_only=True``) or a ``.safetensors`` file."""
    path = Path(path)
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        return load_file(str(path))
    return unwrap_checkpoint(torch.load(path, map_location="cpu", weights_only=True), what=str(path))


def _listing(keys: list[str], limit: int = 12) -> str:
    more = f" ... (+{len(keys) - limit} more)" if len(keys) > limit else ""
    return ", ".join(keys[:limit]) + more


def load_state_strict(module: nn.Module, state: Mapping[str, torch.Tensor], what: str = "checkpoint") -> None:
    """Load ``state`` into ``module`` (meta-device modules included), every key accounted for.

    Raises:
        ValueError: missing keys, unexpected keys or shape mismatches, each listed by name.
    """
    expected = module.state_dict()
    state = {k: v for k, v in state.items() if not _DERIVED.search(k)}
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    shapes = sorted(
        f"{k}: checkpoint {tuple(state[k].shape)} vs model {tuple(expected[k].shape)}"
        for k in set(expected) & set(state)
        if tuple(state[k].shape) != tuple(expected[k].shape)
    )
    if missing or unexpected or shapes:
        parts = [f"{what} does not match the {type(module).__name__} config:"]
        if missing:
            parts.append(f"missing keys [{_listing(missing)}]")
        if unexpected:
            parts.append(f"unexpected keys [{_listing(unexpected)}]")
        if shapes:
            parts.append(f"shape mismatches [{_listing(shapes)}]")
        parts.append("check the preset / image_size / codebook arguments against the checkpoint")
        raise ValueError(" ".join(parts))
    dtypes = {k: v.dtype for k, v in expected.items()}
    module.load_state_dict({k: v.to(dtypes[k]) for k, v in state.items()}, strict=True, assign=True)


def save_folder(module: nn.Module, config: dict[str, Any], directory: str | Path) -> None:
    """``config.json`` + ``model.safetensors`` (the module's state dict, CPU, contiguous)."""
    from safetensors.torch import save_file

    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(config, indent=2))
    state = {k: v.detach().contiguous().cpu() for k, v in module.state_dict().items()}
    save_file(state, str(out / "model.safetensors"))


def load_folder(
    cls: type[M],
    config_cls: type,
    directory: str | Path,
    *,
    device: str | torch.device = "cpu",
    dtype: torch.dtype | None = None,
) -> M:
    """Inverse of :func:`save_folder`: build ``cls(config)`` on the meta device, load strictly, ``eval()``."""
    path = Path(directory)
    if not (path / "config.json").is_file():
        raise ValueError(f"{path} is not a save_pretrained folder (no config.json)")
    config = config_from_dict(config_cls, json.loads((path / "config.json").read_text()))
    return build_and_load(cls, config, read_checkpoint(path / "model.safetensors"), str(path), device, dtype)


def build_and_load(
    cls: type[M],
    config: Any,
    state: Mapping[str, torch.Tensor],
    what: str,
    device: str | torch.device = "cpu",
    dtype: torch.dtype | None = None,
) -> M:
    """``cls(config)`` built without allocating (meta device), filled from ``state``, moved, ``eval()``."""
    with torch.device("meta"):
        module = cls(config)
    load_state_strict(module, state, what=what)
    return module.to(device=device, dtype=dtype).eval()


def load_llamagen(
    gpt_checkpoint: str | Path,
    vq_checkpoint: str | Path | None = None,
    *,
    gpt_config: str = "GPT-B",
    image_size: int = 256,
    vq_config: str = "VQ-16",
    model_type: str = "c2i",
    codebook_size: int = 16384,
    codebook_embed_dim: int = 8,
    device: str | torch.device = "cpu",
    dtype: torch.dtype | None = None,
    vq_overrides: dict[str, Any] | None = None,
    **gpt_overrides: Any,
) -> LlamaGenTarget:
    """A :class:`LlamaGenTarget` from official LlamaGen checkpoints or diffspec folders.

    Args:
        gpt_checkpoint: official GPT ``.pt`` (``c2i_B_256.pt``, ``t2i_XL_stage1_256.pt``, ...) or a
            :meth:`LlamaGenTransformer.save_pretrained` folder (then the preset arguments are unused).
        vq_checkpoint: official ``vq_ds16_c2i.pt``-style file, a :meth:`VQModel.save_pretrained`
            folder, or ``None`` (no pixel decoding).
        gpt_config: official preset name (``GPT-B``, ``GPT-L``, ``GPT-XL``, ``GPT-XXL``, ``GPT-3B``, ...).
        image_size: pixels per side; the token grid is ``image_size / downsample`` per side.
        vq_config: ``VQ-16`` or ``VQ-8`` (sets the downsampling).
        model_type: ``c2i`` (1 class token) or ``t2i`` (120 caption tokens, flan-t5-xl width).
        codebook_size, codebook_embed_dim: the VQ codebook (and GPT vocabulary).
        device, dtype: where and how the weights end up.
        vq_overrides: other :class:`VQConfig` fields (e.g. ``ch`` for a non-official tokenizer).
        **gpt_overrides: other :class:`LlamaGenConfig` fields (e.g. ``num_classes``).

    Raises:
        ValueError: a checkpoint that does not match the config (missing/unexpected keys listed), or
            GPT and VQ that disagree on the codebook size.

    Example:
        >>> target = load_llamagen("c2i_L_384.pt", "vq_ds16_c2i.pt", gpt_config="GPT-L", image_size=384)  # doctest: +SKIP
        >>> target.grid  # doctest: +SKIP
        (24, 24)
    """
    from diffspec.ar_image.targets.llamagen import LlamaGenConfig, LlamaGenTransformer
    from diffspec.ar_image.targets.llamagen_session import LlamaGenTarget
    from diffspec.ar_image.targets.llamagen_vq import VQConfig, VQModel

    vq = None
    if vq_checkpoint is not None and Path(vq_checkpoint).is_dir():
        vq = VQModel.from_pretrained(vq_checkpoint, device=device, dtype=dtype)
    elif vq_checkpoint is not None:
        vq_settings = {"codebook_size": codebook_size, "codebook_embed_dim": codebook_embed_dim}
        vcfg = VQConfig.from_preset(vq_config, **{**vq_settings, **(vq_overrides or {})})
        vq = build_and_load(VQModel, vcfg, read_checkpoint(vq_checkpoint), str(vq_checkpoint), device, dtype)
    if Path(gpt_checkpoint).is_dir():
        gpt = LlamaGenTransformer.from_pretrained(gpt_checkpoint, device=device, dtype=dtype)
    else:
        down = vq.config.downsample if vq is not None else VQConfig.from_preset(vq_config).downsample
        if image_size <= 0 or image_size % down:
            raise ValueError(
                f"image_size={image_size} must be a positive multiple of the VQ downsampling {down}"
            )
        settings: dict[str, Any] = {
            "vocab_size": codebook_size,
            "block_size": (image_size // down) ** 2,
            "model_type": model_type,
            "cls_token_num": 120 if model_type == "t2i" else 1,
        }
        gcfg = LlamaGenConfig.from_preset(gpt_config, **{**settings, **gpt_overrides})
        gpt = build_and_load(
            LlamaGenTransformer, gcfg, read_checkpoint(gpt_checkpoint), str(gpt_checkpoint), device, dtype
        )
    if vq is not None and vq.config.codebook_size != gpt.config.vocab_size:
        raise ValueError(
            f"VQ codebook_size={vq.config.codebook_size} differs from the GPT vocab_size={gpt.config.vocab_size}"
        )
    return LlamaGenTarget(gpt, vq)
