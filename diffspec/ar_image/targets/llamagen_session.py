"""LlamaGen as an :class:`~diffspec.ar_image.target.ARImageTarget`: static per-row KV cache with CFG.

A :class:`LlamaGenSession` holds, per layer, keys and values for every sequence slot of every
model row (``cfg_branches * batch_size`` rows: conditional rows first, then unconditional ones, as
the official sampler orders them). ``step(tokens, start)`` writes each row's keys/values at its own
slots with one scatter and attends with a boolean mask ``key slot <= query slot``; nothing is ever
cropped, so feeding a row again from an earlier position is its rollback and rows may be ragged.
One extra slot past the image end absorbs writes of tokens fed beyond the last image position.

Example:
    >>> from diffspec.ar_image.targets.llamagen import LlamaGenConfig, LlamaGenTransformer
    >>> cfg = LlamaGenConfig(dim=32, n_layer=1, n_head=2, vocab_size=8, num_classes=3, block_size=4)
    >>> target = LlamaGenTarget(LlamaGenTransformer(cfg).eval())
    >>> session = target.start(class_labels=[0, 2], guidance_scale=2.0)
    >>> session.first_logits.shape, session.cfg_branches
    (torch.Size([2, 8]), 2)
    >>> session.step(torch.zeros(2, 3, dtype=torch.long), torch.tensor([0, 1])).shape
    torch.Size([2, 3, 8])
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import torch

from diffspec.ar_image.target import ARImageTarget, ARSession, mix_cfg
from diffspec.ar_image.targets.llamagen import LlamaGenTransformer


class TokenDecoder(Protocol):
    """What :class:`LlamaGenTarget` needs from an image tokenizer (LlamaGen VQ, the tiny k-means one)."""

    codebook: torch.Tensor

    def decode_code(self, tokens: torch.Tensor, grid: tuple[int, int]) -> torch.Tensor:
        """``(B, rows*cols)`` tokens → ``(B, 3, H, W)`` images in about ``[-1, 1]``."""
        ...


class LlamaGenSession(ARSession):
    """A batch of LlamaGen generations in progress (see the module docstring).

    Args:
        model: the GPT (its dtype/device are the cache's).
        cond: conditional input for ``batch`` images: labels ``(B,)`` or captions ``(B, cls, C)``.
        guidance_scale: CFG scale; ``!= 1`` adds the unconditional branch.
        cond_mask: t2i only, ``(B, cls_token_num)`` bool, False for padded caption slots.
    """

    graph_safe = True  # static per-row KV cache written in place; step() neither syncs nor copies from the host

    def __init__(
        self,
        model: LlamaGenTransformer,
        cond: torch.Tensor,
        guidance_scale: float = 1.0,
        cond_mask: torch.Tensor | None = None,
    ) -> None:
        cfg = model.config
        self.model = model
        self.batch_size = int(cond.shape[0])
        self.guidance_scale = float(guidance_scale)
        self.cfg_branches = 2 if self.guidance_scale != 1.0 else 1
        self.cls = cfg.cls_token_num
        self.slots = cfg.cls_token_num + cfg.block_size  # real slots; index `slots` is the spill slot
        param = model.tok_embeddings.weight
        device, dtype = param.device, param.dtype
        cond = cond.to(device, dtype if cond.is_floating_point() else torch.long)
        if self.cfg_branches == 2:
            null = model.null_condition(self.batch_size, device).to(cond.dtype)
            cond = torch.cat([cond, null[:, : cond.shape[1]] if cond.dim() == 3 else null])
        rows = int(cond.shape[0])
        shape = (rows, cfg.kv_heads, self.slots + 1, cfg.head_dim)
        self.caches = [
            (torch.zeros(shape, dtype=dtype, device=device), torch.zeros(shape, dtype=dtype, device=device))
            for _ in range(cfg.n_layer)
        ]
        self.key_ok = torch.ones(rows, self.slots + 1, dtype=torch.bool, device=device)
        self.key_ok[:, -1] = False
        if cond_mask is not None:
            self.key_ok[:, : self.cls] = cond_mask.to(device, torch.bool).repeat(self.cfg_branches, 1)
        self.slot_index = torch.arange(self.slots + 1, device=device)
        with torch.no_grad():
            h = model.embed_condition(cond).to(dtype)
            pos = torch.arange(self.cls, device=device).expand(rows, -1)
            self.first_logits = self._run(h, pos)[:, -1]

    def _run(self, h: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """One model call over all rows: ``h`` ``(rows, T, dim)`` at sequence slots ``pos`` ``(rows, T)``."""
        last = self.slots - 1
        query = pos.clamp(max=last)
        write = torch.where(pos > last, self.slots, pos)
        rope = self.model.rope(h.device)[query]
        keys = self.slot_index[None, None, :]
        mask = ((keys <= query[..., None]) & self.key_ok[:, None, :]) | (keys == query[..., None])
        logits, self.last_hidden = self.model.run_layers(h, rope, mask=mask[:, None], caches=self.caches,
                                                         write_slots=write, return_hidden=True)
        return mix_cfg(logits, self.batch_size, self.guidance_scale)

    def _scratch(self, nodes: int) -> int:
        """First scratch slot (after the spill slot); grows every cache to hold ``nodes`` scratch slots."""
        extra = self.slots + 1 + nodes - self.caches[0][0].shape[2]
        if extra > 0:  # once per session: tree nodes live past the spill slot until committed
            grow = [k.new_zeros(k.shape[0], k.shape[1], extra, k.shape[3]) for k, _ in self.caches]
            self.caches = [(torch.cat([k, g], 2), torch.cat([v, g.clone()], 2)) for (k, v), g in zip(self.caches, grow)]
            self.key_ok = torch.cat([self.key_ok, self.key_ok.new_zeros(self.key_ok.shape[0], extra)], 1)
            self.slot_index = torch.arange(self.key_ok.shape[1], device=self.slot_index.device)
        return self.slots + 1

    def step_tree(self, last: torch.Tensor, start: torch.Tensor, nodes: torch.Tensor, depth: torch.Tensor,
                  ancestors: torch.Tensor) -> torch.Tensor:
        """Verify a token tree in one model call (LANTERN++ static trees).

        ``last`` ``(B,)`` is fed as image token ``start[b]`` (its real slot); tree node ``j``
        (``nodes[:, j]``) as image token ``start + depth[j]`` in scratch slot ``j``: it attends to
        the real slots up to ``start`` and to the scratch slots of its ``ancestors[j]`` (self
        included), never to its siblings. :meth:`commit_tree` moves an accepted path into place.

        Args:
            last: ``(B,)`` last committed tokens.
            start: ``(B,)`` their image positions.
            nodes: ``(B, M)`` tree tokens.
            depth: ``(M,)`` node depths, ``>= 1``.
            ancestors: ``(M, M)`` bool, ``ancestors[j, i]``: node ``i`` is ``j`` or one of its ancestors.

        Returns:
            ``(B, 1 + M, V)`` mixed logits: row 0 predicts image token ``start + 1``, row ``1 + j``
            the child position of node ``j``. ``last_hidden`` holds the matching hidden states.
        """
        device, m = self.slot_index.device, nodes.shape[1]
        base = self._scratch(m)
        b2 = self.cfg_branches
        tokens = torch.cat([last.to(device)[:, None], nodes.to(device)], 1).repeat(b2, 1)
        first = self.cls + start.to(device).repeat(b2)  # (rows,) real slot of `last`
        pos = first[:, None] + torch.cat([depth.new_zeros(1), depth]).to(device)  # rope positions
        write = torch.cat([first[:, None], base + torch.arange(m, device=device).expand(first.shape[0], -1)], 1)
        keys = self.slot_index[None, None, :]
        real = (keys <= first[:, None, None]) & self.key_ok[:, None, :]  # (rows, 1, S): prefix up to `last`
        tree = torch.zeros(1 + m, keys.shape[-1], dtype=torch.bool, device=device)
        tree[1:, base: base + m] = ancestors.to(device)
        mask = real | tree[None]
        last_q = self.slots - 1
        rope = self.model.rope(device)[pos.clamp(max=last_q)]
        with torch.no_grad():
            h = self.model.tok_embeddings(tokens)
            logits, self.last_hidden = self.model.run_layers(h, rope, mask=mask[:, None], caches=self.caches,
                                                             write_slots=write, return_hidden=True)
        return mix_cfg(logits, self.batch_size, self.guidance_scale)

    def commit_tree(self, start: torch.Tensor, path: torch.Tensor) -> None:
        """Copy the keys/values of tree nodes ``path`` ``(B, D)`` (from the last :meth:`step_tree`) to
        the real slots of image tokens ``start + 1 .. start + D`` (past the image end: the spill slot)."""
        device = self.slot_index.device
        rows = path.shape[0] * self.cfg_branches
        src = (self.slots + 1 + path.to(device)).repeat(self.cfg_branches, 1)
        dst = self.cls + start.to(device).repeat(self.cfg_branches)[:, None] + 1 + torch.arange(path.shape[1],
                                                                                                device=device)
        dst = torch.where(dst >= self.slots, self.slots, dst)
        for k_cache, v_cache in self.caches:  # one gather/scatter per layer and tensor
            heads, dim = k_cache.shape[1], k_cache.shape[3]
            s = src[:, None, :, None].expand(rows, heads, -1, dim)
            d = dst[:, None, :, None].expand(rows, heads, -1, dim)
            k_cache.scatter_(2, d, k_cache.gather(2, s))
            v_cache.scatter_(2, d, v_cache.gather(2, s))

    def step(self, tokens: torch.Tensor, start: torch.Tensor) -> torch.Tensor:
        """Feed ``tokens`` ``(B, T)`` as image tokens ``start[b] + i``; one model call (see protocol).

        ``start`` must be ``>= 0`` (not checked: that would cost a host sync per call).
        """
        if tokens.dim() != 2 or tokens.shape[0] != self.batch_size:
            raise ValueError(f"tokens must be (batch_size={self.batch_size}, T), got {tuple(tokens.shape)}")
        if start.shape != (self.batch_size,):
            raise ValueError(f"start must be ({self.batch_size},), got {tuple(start.shape)}")
        device = self.slot_index.device
        tokens = tokens.to(device).repeat(self.cfg_branches, 1)
        offsets = torch.arange(tokens.shape[1], device=device)
        pos = self.cls + start.to(device).repeat(self.cfg_branches)[:, None] + offsets
        with torch.no_grad():
            h = self.model.tok_embeddings(tokens)
            return self._run(h, pos)


def prepare_caption(
    prompt_embeds: torch.Tensor, prompt_mask: torch.Tensor | None, tokens: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Pad captions to ``tokens`` slots and move valid entries to the end, as LlamaGen's t2i sampler.

    Accepts right-padded (T5 tokenizer style) or already left-padded masks.

    Raises:
        ValueError: too many caption tokens or a mask with holes.
    """
    bsz, length, _ = prompt_embeds.shape
    if length > tokens:
        raise ValueError(
            f"prompt_embeds has {length} tokens; this model takes at most cls_token_num={tokens}"
        )
    mask = (
        torch.ones(bsz, length, dtype=torch.bool, device=prompt_embeds.device)
        if prompt_mask is None
        else prompt_mask.to(prompt_embeds.device, torch.bool)
    )
    embeds = torch.nn.functional.pad(prompt_embeds, (0, 0, 0, tokens - length))
    mask = torch.nn.functional.pad(mask, (0, tokens - length), value=False)
    count = mask.sum(1, keepdim=True)
    ar = torch.arange(tokens, device=mask.device)[None]
    if torch.equal(mask, ar >= tokens - count):
        return embeds, mask
    if not torch.equal(mask, ar < count):
        raise ValueError("prompt_mask must be right- or left-padded (True entries contiguous at one end)")
    index = (ar + count) % tokens  # new[i] = old[(i + valid) % tokens]: valid entries last
    embeds = embeds.gather(1, index[..., None].expand_as(embeds))
    return embeds, mask.flip(1)


class LlamaGenTarget(ARImageTarget):
    """A LlamaGen GPT plus an image-token decoder, as diffspec's AR image target.

    Args:
        model: :class:`LlamaGenTransformer` (``eval()`` mode).
        decoder: anything with ``decode_code(tokens, grid)`` and ``codebook`` (LlamaGen's VQ, the
            tiny k-means tokenizer); ``None`` makes :meth:`decode_tokens` raise.
        default_guidance_scale: CFG scale plain/speculative generation uses when none is given.

    Example:
        >>> target = load_llamagen("c2i_B_256.pt", "vq_ds16_c2i.pt")  # doctest: +SKIP
        >>> session = target.start(class_labels=[207, 360], guidance_scale=4.0)  # doctest: +SKIP
    """

    def __init__(
        self,
        model: LlamaGenTransformer,
        decoder: TokenDecoder | None = None,
        default_guidance_scale: float = 1.0,
    ) -> None:
        self.model = model
        self.decoder = decoder
        self.default_guidance_scale = float(default_guidance_scale)
        self.codebook_size = model.config.vocab_size
        self.grid = model.config.grid

    @property
    def device(self) -> torch.device:
        """The GPT's device."""
        return self.model.tok_embeddings.weight.device

    def token_embeddings(self) -> torch.Tensor:
        """The GPT's ``tok_embeddings`` rows of the image tokens, ``(codebook_size, dim)``."""
        return self.model.tok_embeddings.weight[: self.codebook_size].detach()

    @property
    def codebook(self) -> torch.Tensor:
        """``(codebook_size, dim)`` code vectors of the decoder (LANTERN neighbourhoods)."""
        if self.decoder is None:
            raise ValueError("this LlamaGenTarget has no decoder; pass one (e.g. LlamaGen's VQ)")
        return self.decoder.codebook

    def start(
        self,
        *,
        guidance_scale: float = 1.0,
        class_labels: int | Sequence[int] | torch.Tensor | None = None,
        prompt_embeds: torch.Tensor | None = None,
        prompt_mask: torch.Tensor | None = None,
        **conditions: Any,
    ) -> LlamaGenSession:
        """Open a session: ``class_labels`` (c2i) or ``prompt_embeds`` ``(B, T, caption_dim)`` + mask (t2i).

        Raises:
            ValueError: a missing, foreign or out-of-range condition (named).
        """
        cfg = self.model.config
        if "prompt" in conditions:
            raise ValueError(
                "LlamaGenTarget has no text encoder (flan-t5-xl is not bundled); pass "
                "prompt_embeds=(B, T, caption_dim) and prompt_mask=(B, T) from your T5 encoder"
            )
        if conditions:
            raise ValueError(
                f"unknown conditions {sorted(conditions)}; LlamaGen takes class_labels or prompt_embeds"
            )
        if cfg.model_type == "c2i":
            if class_labels is None or prompt_embeds is not None:
                raise ValueError(
                    "a class-conditional LlamaGen needs class_labels=[...] (and no prompt_embeds)"
                )
            labels = torch.as_tensor(class_labels, dtype=torch.long, device=self.device).reshape(-1)
            if labels.numel() == 0 or int(labels.min()) < 0 or int(labels.max()) >= cfg.num_classes:
                raise ValueError(
                    f"class_labels must be non-empty, in [0, {cfg.num_classes}); got {labels.tolist()}"
                )
            return LlamaGenSession(self.model, labels, guidance_scale)
        if prompt_embeds is None or class_labels is not None:
            raise ValueError(
                "a text-conditional LlamaGen needs prompt_embeds=(B, T, caption_dim) (no class_labels)"
            )
        if prompt_embeds.dim() != 3 or prompt_embeds.shape[-1] != cfg.caption_dim:
            raise ValueError(
                f"prompt_embeds must be (B, T, caption_dim={cfg.caption_dim}), got {tuple(prompt_embeds.shape)}"
            )
        embeds, mask = prepare_caption(prompt_embeds.to(self.device), prompt_mask, cfg.cls_token_num)
        return LlamaGenSession(self.model, embeds, guidance_scale, cond_mask=mask)

    def decode_tokens(self, tokens: torch.Tensor) -> torch.Tensor:
        """``(B, num_tokens)`` → ``(B, 3, H, W)`` in ``[-1, 1]`` through the decoder."""
        if self.decoder is None:
            raise ValueError("this LlamaGenTarget has no decoder; pass one (e.g. LlamaGen's VQ)")
        with torch.no_grad():
            return self.decoder.decode_code(tokens, self.grid).clamp(-1.0, 1.0)
