"""Janus / Janus-Pro (transformers ``JanusForConditionalGeneration``, unmodified) as an AR image target.

transformers' Janus image generation is its own per-token loop (``generate(...,
generation_mode="image")``): the prompt batch is doubled for classifier-free guidance (the
unconditional half keeps only BOS and the begin-of-image token, the rest becomes padding), image
logits come from ``generation_head`` and the next input from ``generation_embeddings`` +
``generation_aligner``. :class:`JanusTarget` reproduces that loop's conditioning exactly and hands
it to diffspec's methods through :class:`~diffspec.ar_image.targets.hf_session.HFImageSession`, so greedy
decoding matches ``model.generate(..., do_sample=False)`` token for token.

Example:
    >>> from transformers import JanusForConditionalGeneration, JanusProcessor  # doctest: +SKIP
    >>> model = JanusForConditionalGeneration.from_pretrained(path).eval()       # doctest: +SKIP
    >>> target = JanusTarget(model, JanusProcessor.from_pretrained(path))       # doctest: +SKIP
    >>> spec = SpeculativePipeline.from_pipe(target, method="mc-sjd")            # doctest: +SKIP
    >>> images = spec(prompt=["a red fox"], guidance_scale=5.0).images          # doctest: +SKIP
"""

from __future__ import annotations

import math
from typing import Any

import torch

from ..target import ARImageTarget
from .hf_session import HFImageSession


class JanusTarget(ARImageTarget):
    """A transformers Janus model (with its processor for text prompts) as an ``ARImageTarget``.

    ``default_guidance_scale`` is 5, transformers' default for Janus image generation.

    Args:
        model: a ``JanusForConditionalGeneration`` (put it in ``eval()`` mode).
        processor: its ``JanusProcessor``; needed for ``prompt=`` strings (``input_ids=`` works without).
        boi_token_id, bos_token_id, pad_token_id: special tokens (default: the model's generation
            config, as ``generate`` reads them).

    Raises:
        ValueError: not a Janus model, or special tokens that cannot be found.
    """

    default_guidance_scale = 5.0

    def __init__(self, model: Any, processor: Any = None, *, boi_token_id: int | None = None,
                 bos_token_id: int | None = None, pad_token_id: int | None = None) -> None:
        if not hasattr(model, "prepare_embeddings_for_image_generation") or not hasattr(model, "model"):
            raise ValueError(f"JanusTarget needs a transformers JanusForConditionalGeneration; got {type(model).__name__}")
        self.model, self.processor = model, processor
        gen = model.generation_config
        self.boi_token_id = boi_token_id if boi_token_id is not None else (gen.generation_kwargs or {}).get("boi_token_id")
        self.bos_token_id = bos_token_id if bos_token_id is not None else gen.bos_token_id
        self.pad_token_id = pad_token_id if pad_token_id is not None else gen.pad_token_id
        for name in ("boi_token_id", "bos_token_id", "pad_token_id"):
            if getattr(self, name) is None:
                raise ValueError(f"{name} is not set in the model's generation_config: pass JanusTarget(..., {name}=...)")
        num_tokens = model.model.vision_model.config.num_image_tokens
        side = math.isqrt(num_tokens)
        if side * side != num_tokens:
            raise ValueError(f"num_image_tokens={num_tokens} is not a square grid")
        self.grid = (side, side)
        self.codebook_size = model.model.vqmodel.config.num_embeddings

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def _prompt_ids(self, prompt: Any, input_ids: Any, attention_mask: Any) -> tuple[torch.Tensor, torch.Tensor]:
        if input_ids is None:
            if prompt is None:
                raise ValueError("JanusTarget.start needs prompt=[...] (with a processor) or input_ids=...")
            if self.processor is None:
                raise ValueError("prompt strings need JanusTarget(model, processor); or pass input_ids=...")
            prompt = [prompt] if isinstance(prompt, str) else list(prompt)
            enc = self.processor(text=prompt, generation_mode="image", padding=True, return_tensors="pt")
            input_ids, attention_mask = enc["input_ids"], enc["attention_mask"]
        input_ids = torch.as_tensor(input_ids, device=self.device)
        if input_ids.ndim != 2:
            raise ValueError(f"input_ids must be (batch, length); got shape {tuple(input_ids.shape)}")
        mask = torch.ones_like(input_ids) if attention_mask is None else torch.as_tensor(attention_mask, device=self.device)
        return input_ids, mask

    @torch.no_grad()
    def start(self, *, guidance_scale: float = 5.0, prompt: Any = None, input_ids: Any = None,
              attention_mask: Any = None, **conditions: Any) -> HFImageSession:
        """Open a session for text prompts (or ready ``input_ids``) with CFG at ``guidance_scale``."""
        if conditions:
            raise ValueError(f"JanusTarget takes prompt=, input_ids=, attention_mask=; got {', '.join(conditions)}")
        ids, mask = self._prompt_ids(prompt, input_ids, attention_mask)
        batch = ids.shape[0]
        if guidance_scale != 1:
            uncond = ids.clone()
            keep = (uncond == self.bos_token_id) | (uncond == self.boi_token_id)
            uncond.masked_fill_(~keep, self.pad_token_id)
            ids, mask = torch.cat([ids, uncond]), torch.cat([mask, mask])
        embeds = self.model.get_input_embeddings()(ids)
        return HFImageSession(self.model.model.language_model, self.model.prepare_embeddings_for_image_generation,
                              self.model.model.generation_head, embeds, mask, batch_size=batch,
                              guidance_scale=guidance_scale, num_tokens=self.num_tokens)

    @torch.no_grad()
    def token_embeddings(self) -> torch.Tensor:
        """Decoder input embeddings of every image token (``generation_embeddings`` + aligner)."""
        ids = torch.arange(self.codebook_size, device=self.device)
        return self.model.prepare_embeddings_for_image_generation(ids).float()

    @torch.no_grad()
    def decode_tokens(self, tokens: torch.Tensor) -> torch.Tensor:
        """Image tokens → ``(B, 3, H, W)`` in ``[-1, 1]`` through Janus' VQ decoder."""
        images = self.model.decode_image_tokens(tokens.to(self.device))  # (B, H, W, 3)
        return images.permute(0, 3, 1, 2).float().clamp(-1, 1)
