"""A toy AR image target with a known joint law, for exactness tests of every AR image method.

The "model" is a random second-order table: token ``n`` depends on tokens ``n-2`` and ``n-1``
(a begin symbol stands in before the image) and on the class label; an unconditional table
serves classifier-free guidance (``l = l_u + s (l_c - l_u)``, 2 branches per call). The session
keeps a per-row token cache standing in for the KV cache, with the protocol's semantics: feeding
tokens overwrites the cache at their positions and a row only sees positions before it. With
the default ``V = 3``, ``N = 6`` the joint law has 729 cells (:meth:`ToyTableTarget.joint`),
so a full-joint chi-square test of 1e5 batched samples runs in seconds.

Example:
    >>> target = ToyTableTarget(seed=0)
    >>> law = target.joint(class_label=1)
    >>> law.shape, round(float(law.sum()), 4)
    (torch.Size([729]), 1.0)
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from ...speculation.sampling import force, warp
from ..target import ARImageTarget, ARSession


class ToyTableTarget(ARImageTarget):
    """Class-conditional second-order token table on a ``grid`` of ``vocab``-valued tokens.

    Args:
        vocab: codebook size V.
        grid: ``(rows, cols)``; N = rows * cols tokens.
        num_classes: class tables (labels ``0 .. num_classes - 1``).
        seed: seed of the random tables.
        scale: standard deviation of the random logits (larger = more peaked).
        forced: ``{position: token}`` forced at those image positions (like end-of-row tokens).
    """

    def __init__(self, vocab: int = 3, grid: tuple[int, int] = (2, 3), num_classes: int = 2, seed: int = 0,
                 scale: float = 1.5, forced: Mapping[int, int] | None = None) -> None:
        self.codebook_size, self.grid, self.num_classes = vocab, tuple(grid), num_classes
        gen = torch.Generator().manual_seed(seed)
        self.cond = torch.randn(num_classes, vocab + 1, vocab + 1, vocab, generator=gen) * scale
        self.uncond = torch.randn(vocab + 1, vocab + 1, vocab, generator=gen) * scale
        self._forced = None
        if forced:
            self._forced = torch.full((self.num_tokens,), -1, dtype=torch.long)
            for pos, tok in forced.items():
                self._forced[pos] = tok

    def start(self, *, guidance_scale: float = 1.0, class_labels: Any = None, **conditions: Any) -> ToySession:
        """Open a session for ``class_labels`` (a list or tensor of ints)."""
        if conditions:
            raise ValueError(f"ToyTableTarget takes class_labels only; got {', '.join(conditions)}")
        if class_labels is None:
            raise ValueError("ToyTableTarget needs class_labels=[...]")
        labels = torch.as_tensor(class_labels, dtype=torch.long).reshape(-1)
        return ToySession(self, labels, float(guidance_scale))

    def mixed_logits(self, labels: torch.Tensor, prev2: torch.Tensor, prev1: torch.Tensor,
                     guidance_scale: float) -> torch.Tensor:
        """CFG-mixed logits for contexts ``(prev2, prev1)`` (``vocab`` = begin symbol), any shape."""
        cond = self.cond[labels, prev2, prev1]
        if guidance_scale == 1.0:
            return cond
        uncond = self.uncond[prev2, prev1]
        return uncond + guidance_scale * (cond - uncond)

    def forced_tokens(self) -> torch.Tensor | None:
        """The ``forced`` tokens as a ``(N,)`` tensor (-1 = free), or None."""
        return self._forced

    def decode_tokens(self, tokens: torch.Tensor) -> torch.Tensor:
        """Gray levels: token ``k`` → ``2 k / (V - 1) - 1``, one pixel per token, 3 channels."""
        level = tokens.float() * (2.0 / max(self.codebook_size - 1, 1)) - 1.0
        return level.reshape(-1, 1, *self.grid).expand(-1, 3, -1, -1)

    def joint(self, class_label: int, guidance_scale: float = 1.0, temperature: float = 1.0, top_k: int = 0,
              top_p: float = 1.0) -> torch.Tensor:
        """Exact law of the whole token sequence, ``(V ** N,)`` indexed by the base-V code of the sequence.

        Computed by enumerating every sequence and multiplying its conditionals read straight off
        the tables (no session involved). :func:`sequence_codes` maps samples to the same index.
        """
        v, n = self.codebook_size, self.num_tokens
        seqs = torch.cartesian_prod(*[torch.arange(v)] * n).reshape(-1, n)
        begin = torch.full((seqs.shape[0], 2), v)
        padded = torch.cat([begin, seqs], 1)
        labels = torch.full((seqs.shape[0], n), class_label)
        logits = self.mixed_logits(labels, padded[:, :n], padded[:, 1:n + 1], guidance_scale)
        probs = warp(logits.double(), temperature, top_k, top_p).double()
        if self._forced is not None:
            probs = force(probs, self._forced.expand(seqs.shape[0], -1))
        return probs.gather(-1, seqs.unsqueeze(-1)).squeeze(-1).prod(-1)


def sequence_codes(tokens: torch.Tensor, vocab: int) -> torch.Tensor:
    """Base-``vocab`` code of each row of ``tokens`` ``(B, N)`` (first token most significant)."""
    weights = vocab ** torch.arange(tokens.shape[1] - 1, -1, -1, device=tokens.device)
    return (tokens * weights).sum(-1)


class ToySession(ARSession):
    """A batch of toy generations: a ``(B, N)`` token cache in place of a KV cache."""

    def __init__(self, target: ToyTableTarget, labels: torch.Tensor, guidance_scale: float) -> None:
        self.target, self.labels, self.guidance_scale = target, labels, guidance_scale
        self.batch_size = labels.numel()
        self.cfg_branches = 1 if guidance_scale == 1.0 else 2
        v = target.codebook_size
        self.cache = torch.full((self.batch_size, target.num_tokens), v, dtype=torch.long)
        begin = torch.full((self.batch_size,), v)
        self.first_logits = target.mixed_logits(labels, begin, begin, guidance_scale).float()

    def step(self, tokens: torch.Tensor, start: torch.Tensor) -> torch.Tensor:
        """Write ``tokens`` at ``start + i``, return the logits of ``start + i + 1`` (batched lookups)."""
        n, v = self.target.num_tokens, self.target.codebook_size
        pos = start.unsqueeze(1) + torch.arange(tokens.shape[1])
        inside = pos < n
        rows = torch.arange(self.batch_size).unsqueeze(1).expand_as(pos)
        self.cache[rows[inside], pos[inside]] = tokens[inside]
        padded = torch.cat([torch.full((self.batch_size, 2), v), self.cache], 1)  # position j at column j + 2
        prev1 = padded.gather(1, (pos + 2).clamp(max=n + 1))
        prev2 = padded.gather(1, (pos + 1).clamp(max=n + 1))
        labels = self.labels.unsqueeze(1).expand_as(pos)
        return self.target.mixed_logits(labels, prev2, prev1, self.guidance_scale).float()

    def forced_tokens(self) -> torch.Tensor | None:
        """The target's forced tokens."""
        return self.target.forced_tokens()

    def step_tree(self, last: torch.Tensor, start: torch.Tensor, nodes: torch.Tensor, depth: torch.Tensor,
                  ancestors: torch.Tensor) -> torch.Tensor:
        """Verify a token tree in one call, with :meth:`LlamaGenSession.step_tree
        <diffspec.ar_image.targets.llamagen_session.LlamaGenSession.step_tree>`'s semantics: ``last`` ``(B,)``
        is written at ``start``; node ``j`` is image token ``start + depth[j]`` whose context is its
        ancestors (parent = the ancestor one level up). Returns ``(B, 1 + M, V)`` logits (row 0:
        token ``start + 1``; row ``1 + j``: node ``j``'s child position)."""
        n, v = self.target.num_tokens, self.target.codebook_size
        rows = torch.arange(self.batch_size)
        inside = start < n
        self.cache[rows[inside], start[inside]] = last[inside]
        up = ancestors & (depth.unsqueeze(0) == depth.unsqueeze(1) - 1)  # up[j, i]: i is j's parent
        parent = torch.where(up.any(1), up.float().argmax(1), -1)
        ext = torch.cat([last.unsqueeze(1), nodes], 1)  # column 0: `last`, column 1 + j: node j
        prev2_0 = torch.cat([torch.full((self.batch_size, 2), v), self.cache], 1).gather(
            1, (start + 1).clamp(max=n + 1).unsqueeze(1))  # token at start - 1 (begin symbol before 0)
        prev2 = torch.cat([prev2_0, ext[:, 1 + parent]], 1)
        labels = self.labels.unsqueeze(1).expand_as(ext)
        self._tree_nodes = nodes
        return self.target.mixed_logits(labels, prev2, ext, self.guidance_scale).float()

    def commit_tree(self, start: torch.Tensor, path: torch.Tensor) -> None:
        """Write the last tree's nodes ``path`` ``(B, D)`` at image positions ``start + 1 .. start + D``."""
        n = self.target.num_tokens
        pos = start.unsqueeze(1) + 1 + torch.arange(path.shape[1])
        inside = pos < n
        rows = torch.arange(self.batch_size).unsqueeze(1).expand_as(pos)
        self.cache[rows[inside], pos[inside]] = self._tree_nodes.gather(1, path)[inside]
