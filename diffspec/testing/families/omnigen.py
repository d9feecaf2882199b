"""OmniGen (``OmniGenTransformer2DModel``, called as ``OmniGenPipeline`` calls it for text-to-image, the conditional
rows)."""

from __future__ import annotations

import torch
from torch import nn

from ..transformer_spec import Call, Family, Rand, TransformerSpec


def _call(spec: TransformerSpec, batch: int, rand: Rand, device: str | torch.device,
          dtype: torch.dtype) -> tuple[torch.Tensor, Call]:
    from diffusers.pipelines.omnigen.processor_omnigen import OmniGenCollator

    cfg, hw = spec.config, spec.latent_hw
    latents = rand(batch, cfg["in_channels"], hw, hw)  # (B, C, H, W), patchified inside the model
    # Phi-3 token ids of the prompt (embedded by the model), all prompts of one length: the model takes row 0's
    # rotary positions for every row, so a left-padded row would depend on its batch
    ids = (rand(batch, spec.text_tokens).abs() * 1e4).long() % (cfg["vocab_size"] - 1)  # seeded, never the pad id
    # the pipeline's collator: a causal mask over text + time token, image tokens attend to everything (B, S, S),
    # and position ids running over text, time token and image tokens
    image_tokens = (hw // cfg["patch_size"]) ** 2
    collator, text_mask = OmniGenCollator(), torch.ones(batch, spec.text_tokens, dtype=torch.long)
    mask = collator.create_mask(text_mask, [image_tokens] * batch)[0].to(device)
    positions = collator.create_position(text_mask, [image_tokens] * batch).to(device)
    ids = ids.to(device)

    def call(model: nn.Module, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        # inverted sigmas (FlowMatchEulerDiscreteScheduler(invert_sigmas=True, num_train_timesteps=1)): the model gets
        # 1 - sigma (0 = noise, 1 = image, it grows over sampling) and predicts image - noise; negated here to the
        # usual noise - image velocity the decreasing-sigma loops step with
        timestep = 1 - t.expand(x.shape[0])
        out = model(hidden_states=x, timestep=timestep, input_ids=ids, input_img_latents=[], input_image_sizes={},
                    attention_mask=mask, position_ids=positions, return_dict=False)[0]
        return -out

    return latents, call


FAMILIES = {"omnigen": Family(cls="OmniGenTransformer2DModel", make_call=_call, timesteps="sigma")}

SPECS = {
    # Phi-3-like layers (RMSNorm, SwiGLU, su-scaled rope: one factor per rotary frequency of the 16-dim heads); one
    # sequence of text, time token and image tokens runs through `layers`
    "tiny-omnigen": TransformerSpec(
        "tiny-omnigen", "omnigen",
        dict(in_channels=4, patch_size=2, hidden_size=32, num_attention_heads=2, num_key_value_heads=2,
             intermediate_size=64, num_layers=3, pad_token_id=63, vocab_size=64,
             rope_scaling={"short_factor": [1.0] * 8, "long_factor": [1.0] * 8}, pos_embed_max_size=16,
             time_step_dim=32),
        8, 6,
    ),
}
