"""An :class:`~diffspec.ar_image.target.ARSession` over an unmodified transformers decoder.

transformers' ``DynamicCache`` grows the same length for every batch row, while the protocol
lets each row sit at its own image position. :class:`HFImageSession` bridges the two: it keeps
the image tokens last fed at every position (``history``), and a ``step`` crops the cache to the
smallest start in the batch and feeds every row from there, each row its own tokens (committed
tokens re-fed where a row is ahead). Attention and positions follow each row's real prompt
length (left-padded prompts work). The logits each row asked for are gathered from the result.
One model call per step; the extra width is the spread of the rows' starts.

Example:
    >>> session = HFImageSession(lm, embed, head, prompt_embeds, prompt_mask,  # doctest: +SKIP
    ...                          batch_size=2, guidance_scale=5.0, num_tokens=576)
    >>> logits = session.step(tokens, start)  # (2, T, codebook) after CFG mixing  # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from ..target import CFG_SPACES, ARSession, mix_cfg

Embed = Callable[[torch.Tensor], torch.Tensor]
"""``(R, T)`` image tokens → ``(R, T, hidden)`` input embeddings of the decoder."""
Head = Callable[[torch.Tensor], torch.Tensor]
"""``(R, T, hidden)`` last hidden states → ``(R, T, V)`` logits (image codebook, or the full vocabulary
when a ``constrain`` maps them to the codebook after guidance)."""
Constrain = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
"""``(B, T, V)`` guided logits and ``(B, T)`` predicted image positions → ``(B, T, codebook)`` logits."""
class HFImageSession(ARSession):
    """A batch of image generations on a transformers decoder with a ``DynamicCache``.

    Args:
        lm: the decoder (``LlamaModel``-like: takes ``inputs_embeds``, ``attention_mask``,
            ``position_ids``, ``past_key_values``, ``use_cache``; returns ``last_hidden_state``).
        embed: image tokens → input embeddings.
        head: last hidden states → image-token logits.
        prompt_embeds: ``(R, S, hidden)`` prompt embeddings, ``R = batch_size * branches``
            (conditional rows first, then unconditional ones).
        prompt_mask: ``(R, S)`` 1 for real prompt tokens, 0 for (left) padding.
        batch_size: images in the batch.
        guidance_scale: CFG scale used when there are two branches.
        num_tokens: image tokens per image.
        cfg_space: where guidance mixes, ``"logits"`` or ``"logprobs"`` (see :func:`mix_cfg`).
        constrain: maps guided logits to the codebook per predicted position (e.g. Emu3's
            end-of-row structure); default: the head's logits are the codebook's.
    """

    def __init__(self, lm: torch.nn.Module, embed: Embed, head: Head, prompt_embeds: torch.Tensor,
                 prompt_mask: torch.Tensor, *, batch_size: int, guidance_scale: float, num_tokens: int,
                 cfg_space: str = "logits", constrain: Constrain | None = None) -> None:
        from transformers import DynamicCache

        from ...config import check_choice

        check_choice("cfg_space", cfg_space, CFG_SPACES)
        rows = prompt_embeds.shape[0]
        if rows not in (batch_size, 2 * batch_size):
            raise ValueError(f"prompt_embeds has {rows} rows; expected batch_size={batch_size} or twice that for CFG")
        self.lm, self.embed, self.head = lm, embed, head
        self.batch_size, self.cfg_branches = batch_size, rows // batch_size
        self.guidance_scale, self.num_tokens = guidance_scale, num_tokens
        self.cfg_space, self.constrain = cfg_space, constrain
        self.mask = prompt_mask.long()
        self.prompt_len = self.mask.sum(-1)  # (R,) real prompt tokens per row
        self.padded_len = prompt_mask.shape[1]
        self.cache = DynamicCache()
        self.history = torch.zeros(batch_size, 2 * num_tokens + 1, dtype=torch.long, device=prompt_embeds.device)
        positions = (self.mask.cumsum(-1) - 1).clamp(min=0)
        hidden = self._forward(prompt_embeds, self.mask, positions)
        zero = torch.zeros(batch_size, 1, dtype=torch.long, device=prompt_embeds.device)
        self.first_logits = self._guided(hidden[:, -1:], zero)[:, 0]

    def _guided(self, hidden: torch.Tensor, predicted: torch.Tensor) -> torch.Tensor:
        logits = mix_cfg(self.head(hidden), self.batch_size, self.guidance_scale, self.cfg_space)
        return logits if self.constrain is None else self.constrain(logits, predicted)

    def _forward(self, embeds: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        out = self.lm(inputs_embeds=embeds, attention_mask=mask, position_ids=positions,
                      past_key_values=self.cache, use_cache=True)
        return out.last_hidden_state

    def step(self, tokens: torch.Tensor, start: torch.Tensor) -> torch.Tensor:
        """One decoder call: feed ``tokens`` at image positions ``start + i`` (see the protocol)."""
        width = tokens.shape[1]
        start = start.to(self.history.device)
        cols = start[:, None] + torch.arange(width, device=start.device)
        self.history.scatter_(1, cols, tokens.to(self.history.device))
        lo, hi = torch.stack([start.min(), start.max() + width]).tolist()  # the one host read of the call
        past = self.cache.get_seq_length() - self.padded_len
        if past > lo:
            self.cache.crop(lo - past)
        elif past < lo:
            raise ValueError(f"step(start={lo}) skips image positions {past}..{lo - 1} that were never fed")
        feed = self.history[:, lo:hi].repeat(self.cfg_branches, 1)
        image_pos = torch.arange(lo, hi, device=feed.device)
        mask = torch.cat([self.mask, torch.ones(feed.shape[0], hi, dtype=self.mask.dtype, device=feed.device)], 1)
        hidden = self._forward(self.embed(feed), mask, self.prompt_len[:, None] + image_pos)
        index = (cols - lo)[:, :, None].expand(-1, -1, hidden.shape[-1])
        return self._guided(hidden.gather(1, index.repeat(self.cfg_branches, 1, 1)), cols + 1)
