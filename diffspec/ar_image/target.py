"""What every ``ar_image`` method drives: an AR image generator seen as a token-logits oracle.

A target (:class:`ARImageTarget`) knows its image-token grid and codebook, opens a
:class:`ARSession` for a batch of conditions (class labels or prompts) with classifier-free
guidance folded in, and decodes finished token grids to pixels. A session owns a static KV cache
per batch row: feeding tokens at per-row image positions overwrites the cache there, and
attention only sees cache positions before the query, so rolling a row back is just feeding it
again from an earlier position (no crop call, ragged rows for free).

Row alignment (the one rule every method relies on): ``session.step(tokens, start)`` feeds
``tokens[:, i]`` as image token ``start + i`` and returns the logits that predict image token
``start + i + 1``; ``session.first_logits`` predicts image token 0.

Example:
    >>> session = target.start(class_labels=[3, 7], guidance_scale=2.0)  # doctest: +SKIP
    >>> tok0 = session.first_logits.argmax(-1)                           # doctest: +SKIP
    >>> logits = session.step(tok0[:, None], torch.zeros(2, dtype=torch.long))  # doctest: +SKIP
    >>> images = target.decode_tokens(tokens)  # (B, 3, H, W) in [-1, 1]  # doctest: +SKIP
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

import torch


class ARSession(ABC):
    """One batch of generations in progress (its KV cache, conditions and CFG setting).

    Attributes:
        batch_size: images generated together (CFG branches are internal: not counted here).
        first_logits: ``(batch_size, codebook_size)`` fp32 logits of image token 0, after CFG mixing.
        cfg_branches: model rows per image per call (2 with guidance, else 1); benchmarks
            count ``target_evals = target_calls * cfg_branches``.
        last_hidden: optional, for feature drafters (LANTERN's EAGLE head): the last call's
            ``(cfg_branches * batch_size, T, dim)`` final hidden states (conditional rows first);
            after the prefill ``last_hidden[:, -1]`` is the feature predicting image token 0.
            ``None`` (the default) for targets that do not expose them.
        graph_safe: ``step`` can be captured in a CUDA graph and replayed: fixed-size state written in
            place (a static KV cache), no host syncs, no host-to-device copies. ``False`` by default: a
            growing cache (transformers' ``DynamicCache``) would be replayed against the state it had at
            capture, silently.
    """

    batch_size: int
    first_logits: torch.Tensor
    cfg_branches: int = 1
    last_hidden: torch.Tensor | None = None
    graph_safe: bool = False

    @abstractmethod
    def step(self, tokens: torch.Tensor, start: torch.Tensor) -> torch.Tensor:
        """Feed ``tokens`` ``(B, T)`` at image positions ``start[b] + i``; one model call.

        Returns:
            ``(B, T, codebook_size)`` fp32 logits after CFG mixing (before temperature/top-k);
            row ``i`` predicts image token ``start + i + 1``. Rows past the last image token
            (``start + i + 1 >= num_tokens``) are returned but meaningless.
        """

    def forced_tokens(self) -> torch.Tensor | None:
        """``(num_tokens,)`` token forced at each image position or -1 (e.g. end-of-row tokens).

        ``None`` (the default) means nothing is forced.
        """
        return None


class ARImageTarget(ABC):
    """An AR image generator diffspec can accelerate (LlamaGen-style, Janus, Emu3 adapters).

    Attributes:
        codebook_size: number of image tokens (the vocabulary of ``session.step`` logits).
        grid: ``(rows, cols)`` of the image-token grid; ``num_tokens = rows * cols``.
    """

    codebook_size: int
    grid: tuple[int, int]
    default_guidance_scale: float = 1.0

    @property
    def num_tokens(self) -> int:
        """Image tokens per image."""
        return self.grid[0] * self.grid[1]

    @property
    def device(self) -> torch.device:
        """Where the target computes (sessions return tensors there)."""
        return torch.device("cpu")

    def token_embeddings(self) -> torch.Tensor | None:
        """``(codebook_size, dim)`` input embeddings of the image tokens (``gsd``'s distance filter), or None.

        The default None means unknown: relaxed rules then use rank/probability filters only.
        """
        return None

    @abstractmethod
    def start(self, *, guidance_scale: float = 1.0, **conditions: Any) -> ARSession:
        """Open a session for a batch of conditions (``class_labels=[...]`` or ``prompt=[...]``).

        Raises:
            ValueError: a condition the target does not take, or a bad value (named).
        """

    @abstractmethod
    def decode_tokens(self, tokens: torch.Tensor) -> torch.Tensor:
        """``(B, num_tokens)`` image tokens → ``(B, 3, H, W)`` images in ``[-1, 1]``."""

    def generate(self, class_labels: Any = None, prompt: Any = None, guidance_scale: float | None = None,
                 generator: torch.Generator | list[torch.Generator] | None = None, temperature: float = 1.0,
                 top_k: int = 0, top_p: float = 1.0, **conditions: Any) -> torch.Tensor:
        """Plain AR sampling (one model call per token): ``(B, num_tokens)`` image tokens.

        ``guidance_scale=None`` uses ``default_guidance_scale``; ``generator`` may be a list with one
        generator per image (diffusers convention). Temperature 0 is greedy decoding.

        Example:
            >>> tokens = target.generate(class_labels=[1, 2], generator=torch.Generator().manual_seed(0))  # doctest: +SKIP
        """
        from .plain import generate_plain

        return generate_plain(self, class_labels, prompt, guidance_scale, generator, temperature, top_k, top_p,
                              **conditions)

    def __call__(self, class_labels: Any = None, prompt: Any = None, guidance_scale: float | None = None,
                 generator: torch.Generator | list[torch.Generator] | None = None, output_type: str = "pil",
                 return_dict: bool = True, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0,
                 **conditions: Any) -> Any:
        """Plain generation as a pipeline call: an ``ARImageOutput`` with ``images`` and ``tokens``.

        Same arguments as :meth:`generate` plus ``output_type`` (``"pil"``, ``"np"``, ``"pt"``,
        ``"tokens"``) and ``return_dict`` (False: ``(images, tokens)``).

        Example:
            >>> out = target(class_labels=[3], generator=torch.Generator().manual_seed(0))  # doctest: +SKIP
            >>> out.images[0].size, out.tokens.shape  # doctest: +SKIP
        """
        from ..stats import SpecStats
        from .plain import finish, generate_plain

        stats = SpecStats(method="plain")
        tokens = generate_plain(self, class_labels, prompt, guidance_scale, generator, temperature, top_k, top_p,
                                stats=stats, **conditions)
        return finish(self, tokens, output_type, return_dict, stats)


CFG_SPACES = ("logits", "logprobs")


def mix_cfg(logits: torch.Tensor, batch_size: int, guidance_scale: float, space: str = "logits") -> torch.Tensor:
    """Classifier-free guidance on stacked ``[cond; uncond]`` rows: ``u + s (c - u)`` in fp32.

    ``space="logits"`` mixes raw logits (Janus, LlamaGen); ``"logprobs"`` mixes log-softmaxes
    (transformers' ``UnbatchedClassifierFreeGuidanceLogitsProcessor``, used by Emu3). With one
    branch (``batch_size`` rows) the rows are returned (log-softmaxed for ``"logprobs"``).
    """
    logits = logits.float()
    if space == "logprobs":
        logits = logits.log_softmax(-1)
    if logits.shape[0] == batch_size:
        return logits
    cond, uncond = logits[:batch_size], logits[batch_size:]
    return uncond + guidance_scale * (cond - uncond)
