"""Ideogram 4 (``Ideogram4Transformer2DModel``, called as ``Ideogram4Pipeline`` calls its conditional ``transformer``;
the pipeline's separate ``unconditional_transformer`` is another model, which ``from_pipe`` hooks on its own)."""

from __future__ import annotations

import torch
from torch import nn

from ..transformer_spec import Call, Family, Rand, TransformerSpec

IMAGE_POSITION_OFFSET = 65536  # image position ids start here, clear of the text positions
PAD, IMAGE, TEXT = -1, 2, 3  # segment id of padding; indicator values of image and text tokens (0: padding)


def _call(spec: TransformerSpec, batch: int, rand: Rand, device: str | torch.device,
          dtype: torch.dtype) -> tuple[torch.Tensor, Call]:
    cfg, hw, tokens = spec.config, spec.latent_hw, spec.text_tokens
    image_tokens = hw * hw
    latents = rand(batch, image_tokens, cfg["in_channels"])  # packed (B, h*w, 4C) noise, 2x2 patches
    # encode_prompt: prompts left-padded to max_sequence_length (here of T - 1 and T - 2 tokens), their tapped
    # features zeroed on padding, then zero features on the image positions
    lengths = [tokens - 1 - b % 2 for b in range(batch)]
    features = rand(batch, tokens + image_tokens, cfg["llm_features_dim"])
    position_ids = torch.zeros(batch, tokens + image_tokens, 3, dtype=torch.long)
    segment_ids = torch.full((batch, tokens + image_tokens), PAD, dtype=torch.long)
    indicator = torch.zeros(batch, tokens + image_tokens, dtype=torch.long)
    grid = torch.cartesian_prod(torch.arange(1), torch.arange(hw), torch.arange(hw)) + IMAGE_POSITION_OFFSET
    for b, n in enumerate(lengths):  # _prepare_ids: [left pad][text (p, p, p)][image (0, h, w) + offset]
        position_ids[b, tokens - n:tokens] = torch.arange(n)[:, None].expand(n, 3)
        position_ids[b, tokens:] = grid
        indicator[b, tokens - n:tokens], indicator[b, tokens:] = TEXT, IMAGE
        segment_ids[b, tokens - n:] = 1
    features = features * (indicator == TEXT).to(device)[..., None].to(dtype)
    position_ids, segment_ids, indicator = position_ids.to(device), segment_ids.to(device), indicator.to(device)
    text_pad = torch.zeros(batch, tokens, cfg["in_channels"], device=device, dtype=dtype)

    def call(model: nn.Module, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        # model time 1 - sigma (0 = noise, 1 = data: it grows over sampling); the latents follow zero text slots in
        # the packed sequence, and the scheduler steps on the negated image-token output
        out = model(hidden_states=torch.cat([text_pad, x], dim=1),
                    timestep=(1.0 - t.float()).expand(x.shape[0]).to(x.dtype), encoder_hidden_states=features,
                    position_ids=position_ids, segment_ids=segment_ids, indicator=indicator, return_dict=False)[0]
        return -out[:, tokens:]

    return latents, call


FAMILIES = {"ideogram4": Family(cls="Ideogram4Transformer2DModel", make_call=_call, timesteps="sigma")}

SPECS = {
    # one block list over the packed [text, image] sequence; interleaved MRoPE over head_dim / 2 = 8 frequencies
    # (h and w take every third one from 1 and 2); in_channels = 4 x 2x2 patch
    "tiny-ideogram4": TransformerSpec(
        "tiny-ideogram4", "ideogram4",
        dict(in_channels=16, num_layers=3, attention_head_dim=16, num_attention_heads=2, intermediate_size=64,
             adaln_dim=16, llm_features_dim=24, mrope_section=(2, 2, 2)),
        4, 6,
    ),
}
