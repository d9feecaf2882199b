"""Int8 storage for shipped reference weights (keeps a checkpoint a few MB).

Large 2-D tensors (linear weights, embeddings) are stored as symmetric per-row int8 with one fp16
scale per row; every other tensor is stored as fp16. Loading dequantizes to float: the model a user
gets *is* the dequantized one (benchmarks and tests run on exactly these weights).

Example:
    >>> import torch
    >>> lin = torch.nn.Linear(256, 64)
    >>> sd = dequantize(quantize(lin.state_dict()))
    >>> bool((sd["weight"] - lin.weight).abs().max() < 1e-2 * lin.weight.abs().max())
    True
"""

from __future__ import annotations

from pathlib import Path

import torch

SCALE_SUFFIX = ".int8_scale"
MIN_NUMEL = 4096
"""2-D tensors with at least this many entries are stored as int8; smaller ones as fp16."""
FILENAME = "model.int8.safetensors"


def quantize(state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Float state dict → storage dict (int8 rows + ``<name>.int8_scale``, or fp16)."""
    out: dict[str, torch.Tensor] = {}
    for name, t in state_dict.items():
        t = t.detach().float().cpu()
        if t.dim() == 2 and t.numel() >= MIN_NUMEL:
            scale = t.abs().amax(dim=1, keepdim=True).clamp_min(1e-8) / 127.0
            scale = scale.half()  # round the scale first so dequantize sees the stored one
            out[name] = torch.round(t / scale.float()).clamp(-127, 127).to(torch.int8).contiguous()
            out[name + SCALE_SUFFIX] = scale.contiguous()
        else:
            out[name] = t.half().contiguous()
    return out


def dequantize(stored: dict[str, torch.Tensor], dtype: torch.dtype = torch.float32) -> dict[str, torch.Tensor]:
    """Storage dict → float state dict in ``dtype``."""
    out = {}
    for name, t in stored.items():
        if name.endswith(SCALE_SUFFIX):
            continue
        scale = stored.get(name + SCALE_SUFFIX)
        out[name] = (t.float() * scale.float() if scale is not None else t.float()).to(dtype)
    return out


def save_int8_state(state_dict: dict[str, torch.Tensor], folder: str | Path) -> Path:
    """Write :func:`quantize` of ``state_dict`` to ``folder``/:data:`FILENAME` (the folder is made if missing)."""
    from safetensors.torch import save_file

    path = Path(folder) / FILENAME
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file(quantize(state_dict), str(path))
    return path


def load_int8_state(folder: str | Path, dtype: torch.dtype = torch.float32) -> dict[str, torch.Tensor]:
    """The dequantized state dict of ``folder``/:data:`FILENAME`, in ``dtype``.

    Raises:
        ValueError: ``folder`` has no :data:`FILENAME`.
    """
    from safetensors.torch import load_file

    path = Path(folder) / FILENAME
    if not path.is_file():
        raise ValueError(f"{folder} has no {FILENAME} (write it with diffspec.models.int8_weights.save_int8)")
    return dequantize(load_file(str(path)), dtype)


def save_int8(model: torch.nn.Module, folder: str | Path) -> Path:
    """Write ``model``'s config (a transformers or diffusers model; no weights) and :data:`FILENAME`."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    if hasattr(model, "save_config"):  # a diffusers model
        model.save_config(folder)
    else:
        model.config.save_pretrained(folder)
    if getattr(model, "generation_config", None) is not None:
        model.generation_config.save_pretrained(folder)
    return save_int8_state(model.state_dict(), folder)


def load_int8(model_cls: type, folder: str | Path, *, dtype: torch.dtype = torch.float32) -> torch.nn.Module:
    """Build ``model_cls`` (a transformers or diffusers model class) from ``folder``'s config and load the
    dequantized :data:`FILENAME` (strict).

    Raises:
        ValueError: ``folder`` has no :data:`FILENAME`.
    """
    from transformers import AutoConfig, GenerationConfig

    folder = Path(folder)
    state = load_int8_state(folder, dtype)
    if hasattr(model_cls, "load_config"):  # a diffusers model
        model = model_cls.from_config(model_cls.load_config(folder))
    else:
        model = model_cls(AutoConfig.from_pretrained(folder))
    tied = set(getattr(model, "_tied_weights_keys", None) or ())
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [k for k in missing if k not in tied]
    if missing or unexpected:
        raise ValueError(f"{folder / FILENAME} does not match {model_cls.__name__}: missing {missing[:4]}, unexpected {unexpected[:4]}")
    if (folder / "generation_config.json").is_file():
        model.generation_config = GenerationConfig.from_pretrained(folder)
    return model.to(dtype).eval()
