"""Emu3 (transformers ``Emu3ForConditionalGeneration``, unmodified) as an AR image target.

Emu3 writes an image as ``height`` rows of ``width`` visual tokens, each row closed by an
end-of-line token, inside its ordinary text vocabulary; transformers' recipe generates it with
``generate(prefix_allowed_tokens_fn=...)`` (visual tokens, EOL at row ends), a negative prompt
for classifier-free guidance (log-softmax mixing, ``UnbatchedClassifierFreeGuidanceLogitsProcessor``)
and top-k 2048. :class:`Emu3Target` exposes the same law to diffspec: image positions are the
``height x (width + 1)`` slots, the codebook is the visual tokens plus EOL (last index), and
guidance is mixed over the full vocabulary before the row structure is applied, as ``generate``
orders its processors. EOL slots are forced tokens (``session.forced_tokens()``).

Example:
    >>> target = Emu3Target(model, height=32, width=32)                     # doctest: +SKIP
    >>> spec = SpeculativePipeline.from_pipe(target, method="mc-sjd")        # doctest: +SKIP
    >>> images = spec(input_ids=ids, negative_input_ids=neg, guidance_scale=3.0).images  # doctest: +SKIP
"""

from __future__ import annotations

from typing import Any

import torch

from ..target import ARImageTarget
from .hf_session import HFImageSession


def _left_pad(rows: list[tuple[torch.Tensor, torch.Tensor]], pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Stack ``(ids, mask)`` pairs of different lengths, left-padded to the longest."""
    width = max(ids.shape[1] for ids, _ in rows)
    out_ids, out_mask = [], []
    for ids, mask in rows:
        extra = width - ids.shape[1]
        out_ids.append(torch.nn.functional.pad(ids, (extra, 0), value=pad))
        out_mask.append(torch.nn.functional.pad(mask, (extra, 0), value=0))
    return torch.cat(out_ids), torch.cat(out_mask)


class _Emu3Session(HFImageSession):
    def forced_tokens(self) -> torch.Tensor:
        return self._forced


class Emu3Target(ARImageTarget):
    """A transformers Emu3 model generating ``height x width``-token images.

    Args:
        model: an ``Emu3ForConditionalGeneration`` in ``eval()`` mode.
        height, width: the visual-token grid (Emu3's processor derives it from ``ratio`` and
            ``image_area``; pass the same values).
        pad_token_id: padding id for batched prompts (default: the text config's).

    Raises:
        ValueError: not an Emu3 model, or a vocabulary map without visual / EOL tokens.
    """

    default_guidance_scale = 3.0

    def __init__(self, model: Any, *, height: int, width: int, pad_token_id: int | None = None) -> None:
        mapping = getattr(model, "vocabulary_mapping", None)
        if mapping is None or not hasattr(model, "lm_head"):
            raise ValueError(f"Emu3Target needs a transformers Emu3ForConditionalGeneration; got {type(model).__name__}")
        from ...config import check_int

        check_int("height", height, 1)
        check_int("width", width, 1)
        visual = [mapping.img2bpe[k] for k in range(len(mapping.image_tokens))]
        if not visual or mapping.eol_token_id is None:
            raise ValueError("the model's vocabulary_map has no '<|visual token ...|>' or '<|extra_200|>' (EOL) entries")
        self.model, self.height, self.width = model, height, width
        self.grid = (height, width + 1)
        self.codebook_size = len(visual) + 1
        self.vocab_ids = torch.tensor([*visual, mapping.eol_token_id], device=self.device)
        self.pad_token_id = model.config.text_config.pad_token_id if pad_token_id is None else pad_token_id

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def _eol(self, positions: torch.Tensor) -> torch.Tensor:
        return positions % (self.width + 1) == self.width

    def _constrain(self, logits: torch.Tensor, predicted: torch.Tensor) -> torch.Tensor:
        """Full-vocabulary guided logits → visual tokens + EOL, with the row structure applied."""
        out = logits[..., self.vocab_ids]
        eol = self._eol(predicted)[..., None]
        is_eol_col = torch.zeros_like(out, dtype=torch.bool)
        is_eol_col[..., -1] = True
        return out.masked_fill(eol != is_eol_col, float("-inf"))

    @torch.no_grad()
    def start(self, *, guidance_scale: float = 3.0, input_ids: Any = None, attention_mask: Any = None,
              negative_input_ids: Any = None, negative_attention_mask: Any = None, **conditions: Any) -> HFImageSession:
        """Open a session for prompts already in Emu3's image-generation format (the processor's
        ``return_for_image_generation=True`` output) and, for CFG, negative prompt ids."""
        if conditions or input_ids is None:
            extra = f"; got {', '.join(conditions)}" if conditions else ""
            raise ValueError("Emu3Target takes input_ids= (processor(..., return_for_image_generation=True)), "
                             f"attention_mask=, negative_input_ids=, negative_attention_mask={extra}")
        ids = torch.as_tensor(input_ids, device=self.device)
        mask = torch.ones_like(ids) if attention_mask is None else torch.as_tensor(attention_mask, device=self.device)
        batch = ids.shape[0]
        rows = [(ids, mask)]
        if guidance_scale != 1:
            if negative_input_ids is None:
                raise ValueError("guidance_scale != 1 needs negative_input_ids (Emu3's unconditional prompt)")
            neg = torch.as_tensor(negative_input_ids, device=self.device)
            neg = neg.expand(batch, -1) if neg.shape[0] == 1 else neg
            neg_mask = (torch.ones_like(neg) if negative_attention_mask is None
                        else torch.as_tensor(negative_attention_mask, device=self.device).expand_as(neg))
            rows.append((neg, neg_mask))
        ids, mask = _left_pad(rows, self.pad_token_id)
        embed_tokens = self.model.get_input_embeddings()
        session = _Emu3Session(
            self.model.model.text_model, lambda t: embed_tokens(self.vocab_ids[t]), self.model.lm_head,
            embed_tokens(ids), mask, batch_size=batch, guidance_scale=guidance_scale, num_tokens=self.num_tokens,
            cfg_space="logprobs", constrain=self._constrain)
        positions = torch.arange(self.num_tokens, device=self.device)
        session._forced = torch.where(self._eol(positions), self.codebook_size - 1, -1)
        return session

    @torch.no_grad()
    def token_embeddings(self) -> torch.Tensor:
        """Input embeddings of the visual tokens and EOL (the codebook order), ``(codebook_size, dim)``."""
        return self.model.get_input_embeddings()(self.vocab_ids).float()

    @torch.no_grad()
    def decode_tokens(self, tokens: torch.Tensor) -> torch.Tensor:
        """``(B, height * (width + 1))`` codebook indices → ``(B, 3, H, W)`` in ``[-1, 1]``."""
        grid = tokens.to(self.device).view(-1, self.height, self.width + 1)[..., : self.width]
        images = self.model.model.vqmodel.decode(grid.clamp(max=self.codebook_size - 2))
        return images.float().clamp(-1, 1)
