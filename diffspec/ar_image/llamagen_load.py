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

import re
from collections.abc import Mapping
from pathlib import Path

import torch
from torch import nn

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
