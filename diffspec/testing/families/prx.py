"""PRX (``PRXTransformer2DModel``, called as ``PRXPipeline`` calls it without classifier-free guidance)."""

from __future__ import annotations

import torch
from torch import nn

from ..transformer_spec import Call, Family, Rand, TransformerSpec, text_mask


def _call(spec: TransformerSpec, batch: int, rand: Rand, device: str | torch.device,
          dtype: torch.dtype) -> tuple[torch.Tensor, Call]:
    cfg, hw = spec.config, spec.latent_hw
    latents = rand(batch, cfg["in_channels"], hw, hw)  # (B, C, H, W), patchified inside the model
    # T5Gemma last hidden states of prompts padded to the tokenizer's max length (pad positions not zeroed), with the
    # tokenizer's boolean mask
    text = rand(batch, spec.text_tokens, cfg["context_in_dim"])
    mask = text_mask(batch, spec.text_tokens, device).bool()

    def call(model: nn.Module, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        # one timestep for the whole batch: the scheduler's t / 1000 of shape (1,); the prediction is the flow velocity
        timestep = t.float().view(1)
        return model(hidden_states=x, timestep=timestep, encoder_hidden_states=text, attention_mask=mask,
                     return_dict=False)[0]

    return latents, call


def _init(model: nn.Module) -> None:
    """Random values for the blocks' adaLN modulations, which the class initialises to zero (every block would be the
    identity)."""
    for module in model.modules():
        if type(module).__name__ == "Modulation":
            module.lin.reset_parameters()


FAMILIES = {"prx": Family(cls="PRXTransformer2DModel", make_call=_call, timesteps="sigma", init=_init)}

SPECS = {
    # rope axes (row, column) sum to the head dim (32 / 2 heads); the output has in_channels x 2x2 patch channels,
    # unpatchified to (B, C, H, W)
    "tiny-prx": TransformerSpec(
        "tiny-prx", "prx",
        dict(in_channels=4, patch_size=2, context_in_dim=24, hidden_size=32, mlp_ratio=2.0, num_heads=2, depth=3,
             axes_dim=[8, 8]),
        8, 6,
    ),
}
