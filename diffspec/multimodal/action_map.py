"""OpenVLA-style action tokens: the last ``n_bins`` vocabulary ids are uniform bins of each DoF.

A VLA (a VLM or causal LM whose output vocabulary ends with action bins) emits one token per
degree of freedom, ``n_dof`` (7: xyz, rotation, gripper) per action step. Bin ``b`` of DoF ``j``
covers ``[low_j + b * w_j, low_j + (b + 1) * w_j)`` with ``w_j = (high_j - low_j) / n_bins`` and
decodes to its centre. With ``reverse=True`` (OpenVLA's order) a higher id is a smaller value:
``id = vocab_size - 1 - bin``; otherwise ``id = vocab_size - n_bins + bin``. ``vocab_size`` is the
id after the last action token (OpenVLA: the vocabulary before its padding slots, 32000).

Every conversion is a tensor op over ``(..., n_dof)`` tensors (no loops over tokens or rows).

Example:
    >>> import torch
    >>> amap = ActionTokenMap(vocab_size=512, n_bins=256, n_dof=2)
    >>> ids = amap.actions_to_tokens(torch.tensor([[-1.0, 0.999]]))
    >>> ids.tolist(), amap.tokens_to_bins(ids).tolist()
    ([[511, 256]], [[0, 255]])
    >>> [round(v, 4) for v in amap.tokens_to_actions(ids)[0].tolist()]
    [-0.9961, 0.9961]
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from ..config import check_int

ACTION_MAP_FILE = "action_map.json"
"""The file a VLA folder carries its action map in (:meth:`ActionTokenMap.save_pretrained`)."""


def _bounds(name: str, value: float | tuple[float, ...], n_dof: int) -> tuple[float, ...]:
    values = (float(value),) * n_dof if isinstance(value, (int, float)) else tuple(float(v) for v in value)
    if len(values) != n_dof:
        raise ValueError(f"{name}={value!r} must be a number or {n_dof} numbers (one per DoF, n_dof={n_dof})")
    return values


@dataclass(frozen=True)
class ActionTokenMap:
    """Token <-> bin <-> continuous action conversion for one VLA vocabulary.

    Args:
        vocab_size: one past the last action id (the action ids are ``[vocab_size - n_bins, vocab_size)``).
        n_bins: bins per DoF (OpenVLA: 256).
        n_dof: tokens per action step (OpenVLA: 7).
        low, high: the normalised action range, one number for every DoF or one per DoF.
        reverse: OpenVLA's order (higher id = smaller value).

    Example:
        >>> ActionTokenMap(vocab_size=300, n_bins=10, n_dof=1, low=0.0, high=1.0).bin_width.tolist()
        [0.10000000149011612]
    """

    vocab_size: int
    n_bins: int = 256
    n_dof: int = 7
    low: float | tuple[float, ...] = -1.0
    high: float | tuple[float, ...] = 1.0
    reverse: bool = True

    def __post_init__(self) -> None:
        check_int("n_bins", self.n_bins, 2, 65536)
        check_int("n_dof", self.n_dof, 1, 64)
        check_int("vocab_size", self.vocab_size, 2)
        if self.n_bins > self.vocab_size:
            raise ValueError(f"n_bins={self.n_bins} is out of range for vocab_size={self.vocab_size}: the action "
                             f"bins are the last n_bins ids, allowed [2, {self.vocab_size}]")
        low, high = _bounds("low", self.low, self.n_dof), _bounds("high", self.high, self.n_dof)
        bad = [j for j in range(self.n_dof) if not high[j] > low[j]]
        if bad:
            raise ValueError(f"high must exceed low for every DoF; DoF {bad} have low={low} high={high}")
        object.__setattr__(self, "low", low)
        object.__setattr__(self, "high", high)

    # ------------------------------------------------------------------ geometry
    @property
    def first_id(self) -> int:
        """The smallest action id."""
        return self.vocab_size - self.n_bins

    @property
    def bin_width(self) -> torch.Tensor:
        """(n_dof,) width of one bin per DoF."""
        return (torch.tensor(self.high) - torch.tensor(self.low)) / self.n_bins

    def tolerance_bound(self, r: int) -> float:
        """Worst-case |action error| per token of a draft accepted within ``r`` bins: ``r * max bin width``."""
        return float(r * self.bin_width.max())

    def _lh(self, ref: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return (torch.tensor(self.low, device=ref.device, dtype=torch.float32),
                torch.tensor(self.high, device=ref.device, dtype=torch.float32))

    # ------------------------------------------------------------------ conversions
    def is_action(self, ids: torch.Tensor) -> torch.Tensor:
        """Bool mask of the ids that are action tokens."""
        return (ids >= self.first_id) & (ids < self.vocab_size)

    def tokens_to_bins(self, ids: torch.Tensor) -> torch.Tensor:
        """Bins of action ids; non-action ids are clipped into ``[0, n_bins - 1]`` (as OpenVLA decodes)."""
        bins = self.vocab_size - 1 - ids if self.reverse else ids - self.first_id
        return bins.clamp(0, self.n_bins - 1)

    def bins_to_tokens(self, bins: torch.Tensor) -> torch.Tensor:
        """Action ids of bins (clipped into range)."""
        bins = bins.long().clamp(0, self.n_bins - 1)
        return self.vocab_size - 1 - bins if self.reverse else bins + self.first_id

    def bins_to_actions(self, bins: torch.Tensor) -> torch.Tensor:
        """(..., n_dof) bin centres as continuous actions (float32)."""
        low, high = self._lh(bins)
        return low + (bins.float() + 0.5) * (high - low) / self.n_bins

    def actions_to_bins(self, actions: torch.Tensor) -> torch.Tensor:
        """(..., n_dof) continuous actions -> bins (values outside ``[low, high]`` are clipped)."""
        low, high = self._lh(actions)
        bins = torch.floor((actions.float() - low) / (high - low) * self.n_bins)
        return bins.long().clamp(0, self.n_bins - 1)

    def tokens_to_actions(self, ids: torch.Tensor) -> torch.Tensor:
        """(..., n_dof) action ids -> continuous actions."""
        return self.bins_to_actions(self.tokens_to_bins(ids))

    def actions_to_tokens(self, actions: torch.Tensor) -> torch.Tensor:
        """(..., n_dof) continuous actions -> action ids."""
        return self.bins_to_tokens(self.actions_to_bins(actions))

    # ------------------------------------------------------------------ persistence
    def save_pretrained(self, folder: str | Path) -> Path:
        """Write :data:`ACTION_MAP_FILE` into ``folder`` (next to the model's ``config.json``)."""
        path = Path(folder) / ACTION_MAP_FILE
        path.parent.mkdir(parents=True, exist_ok=True)
        fields = {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()}
        path.write_text(json.dumps(fields, indent=1) + "\n")
        return path

    @classmethod
    def from_pretrained(cls, folder: str | Path) -> ActionTokenMap | None:
        """The map a VLA folder declares, or None when it declares none.

        Read from :data:`ACTION_MAP_FILE` (all fields), else from an OpenVLA-style ``config.json``
        carrying ``n_action_bins`` (the last ``n_action_bins`` ids of the text vocabulary, 7 DoF).

        Example:
            >>> import tempfile
            >>> with tempfile.TemporaryDirectory() as d:
            ...     _ = ActionTokenMap(vocab_size=300, n_bins=16, n_dof=3).save_pretrained(d)
            ...     ActionTokenMap.from_pretrained(d).n_bins
            16
        """
        folder = Path(folder)
        path = folder / ACTION_MAP_FILE
        if path.is_file():
            fields = json.loads(path.read_text())
            unknown = set(fields) - set(cls.__dataclass_fields__)
            if unknown:
                raise ValueError(f"{path}: unknown field(s) {sorted(unknown)}; allowed {sorted(cls.__dataclass_fields__)}")
            return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in fields.items()})
        config = folder / "config.json"
        if config.is_file():
            cfg = json.loads(config.read_text())
            bins = cfg.get("n_action_bins")
            vocab = (cfg.get("text_config") or {}).get("vocab_size", cfg.get("vocab_size"))
            if isinstance(bins, int) and isinstance(vocab, int):
                return cls(vocab_size=vocab, n_bins=bins)
        return None

    # ------------------------------------------------------------------ model check
    @classmethod
    def for_model(cls, model: Any, **kwargs: Any) -> ActionTokenMap:
        """The map over a model's output vocabulary (``vocab_size`` from its config unless given)."""
        if "vocab_size" not in kwargs:
            kwargs["vocab_size"] = output_vocab(model)
        amap = cls(**kwargs)
        amap.check_model(model)
        return amap

    def check_model(self, model: Any) -> None:
        """Raise ``ValueError`` if the model's output vocabulary cannot hold this map's action ids."""
        vocab = output_vocab(model)
        if self.vocab_size > vocab:
            raise ValueError(f"action map vocab_size={self.vocab_size} exceeds the model's output vocabulary "
                             f"({vocab} ids, {type(model).__name__}): its action ids [{self.first_id}, "
                             f"{self.vocab_size}) would never be emitted; use vocab_size <= {vocab}")


def output_vocab(model: Any) -> int:
    """Output vocabulary size of a transformers model (its text config for VLMs)."""
    cfg = model.config
    for c in (cfg, getattr(cfg, "text_config", None)):
        size = getattr(c, "vocab_size", None) if c is not None else None
        if isinstance(size, int):
            return size
    raise ValueError(f"{type(model).__name__}: no vocab_size on its config; pass ActionTokenMap(vocab_size=...)")
