"""What a random-weight test transformer is: its spec and how it is called."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

Call = Callable[[nn.Module, torch.Tensor, torch.Tensor], torch.Tensor]
"""``call(model, latents, t) -> prediction`` with the conditioning bound."""
Rand = Callable[..., torch.Tensor]
"""``rand(*shape)``: seeded normal noise on the call's device and dtype."""


@dataclass(frozen=True)
class TransformerSpec:
    """How to build one transformer and feed it (latent shape, conditioning)."""

    name: str
    family: str  # a key of diffspec.testing.random_transformers.FAMILY_CLASSES
    config: dict[str, Any]
    latent_hw: int  # latent height = width
    text_tokens: int = 0
    frames: int = 0  # latent frames (video families); 0 for image families


def text_mask(batch: int, tokens: int, device: str | torch.device) -> torch.Tensor:
    """A tokenizer's attention mask for a prompt one token shorter than the padded length."""
    mask = torch.ones(batch, tokens, dtype=torch.long, device=device)
    mask[:, -1] = 0
    return mask


@dataclass(frozen=True)
class Family:
    """A transformer family: its diffusers class, how to call it, its timestep units."""

    cls: str  # diffusers class name
    make_call: Callable[..., tuple[torch.Tensor, Call]]  # (spec, batch, rand, device, dtype) -> (latents, call)
    timesteps: str  # "ddpm" (0..999) | "flow1000" (1000 * sigma) | "sigma" (0..1)
    # re-initialises, in place after construction (seeded), weights a random-weight build would leave degenerate
    # (e.g. zero-initialised adaLN modulations, which make every block the identity)
    init: Callable[[nn.Module], None] | None = None
    audio: bool = False  # 1-D latents (B, C, T): no pixel resolution
