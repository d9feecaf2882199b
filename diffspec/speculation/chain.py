"""Acceptance of a chain of ``k`` drafts (rules A1, A2), pure tensor functions (no loops over rows).

Inputs: drafts ``d`` (B, k), processed target scores ``p_logits`` (B, k+1, V) and, for sampling,
the processed draft distributions ``q`` (B, k, V). Outputs: the accepted count ``m`` (B,) and
the ``k + 1`` emitted tokens per row (``d[:, :m]`` then the correction/bonus at index ``m``).

Example:
    >>> import torch
    >>> d = torch.tensor([[3, 1]])
    >>> logits = torch.nn.functional.one_hot(torch.tensor([[3, 2, 0]]), 4).float()
    >>> m, tokens = greedy_accept(d, logits)
    >>> m.tolist(), tokens.tolist()
    ([1], [[3, 2, 2]])
"""

from __future__ import annotations

import torch

from .. import kernels


def emit_accepted(drafts: torch.Tensor, m: torch.Tensor, correction: torch.Tensor) -> torch.Tensor:
    """(B, k+1): the drafts with the token at index ``m`` replaced by ``correction``."""
    tokens = torch.cat([drafts, correction[:, None]], dim=1)
    return tokens.scatter(1, m[:, None], correction[:, None])


def greedy_accept(drafts: torch.Tensor, p_logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Longest prefix of drafts equal to the target argmax, plus the target's token after it (A1).

    Args:
        drafts: (B, k) draft ids.
        p_logits: (B, k+1, V) processed target scores at the k+1 verified positions.

    Returns:
        ``(m, tokens)``: accepted counts (B,) and (B, k+1) tokens whose first ``m + 1`` are emitted.
    """
    target = p_logits.argmax(-1)
    m = (drafts == target[:, :-1]).long().cumprod(1).sum(1)
    return m, emit_accepted(drafts, m, target.gather(1, m[:, None])[:, 0])


def sampling_accept(drafts: torch.Tensor, p_logits: torch.Tensor, q: torch.Tensor,
                    generator: torch.Generator | None = None, *, draft_logits: bool = False
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """Speculative rejection sampling (Leviathan et al., Alg. 1), exact in law (A2).

    Draft ``i`` is accepted if ``u_i < p_i(d_i) / q_i(d_i)`` with fresh uniforms; at the first
    rejection the token is drawn from ``normalise(max(0, p - q))``; after a full accept the bonus
    is drawn from ``p_{k+1}``. Runs :func:`diffspec.kernels.speculative_accept` (one fused kernel
    on CUDA); the draws are inverse-CDF at ``(B, k + 1)`` uniforms drawn after the ``(B, k)`` test ones.

    Args:
        drafts: (B, k) draft ids, sampled from ``q``.
        p_logits: (B, k+1, V) processed target scores (``-inf`` where a warper removed a token).
        q: (B, k, V) the draft distributions the drafts were sampled from, or with
            ``draft_logits=True`` the processed draft scores they were sampled from (softmax taken
            in the kernel: the loop passes these, no second ``(B, k, V)`` probability tensor).
        generator: RNG of the uniforms and the correction draw.

    Returns:
        ``(m, tokens)`` as :func:`greedy_accept`.
    """
    B, k = drafts.shape
    u = torch.rand((B, k), generator=generator, device=drafts.device)
    u_res = torch.rand((B, k + 1), generator=generator, device=drafts.device)
    return kernels.speculative_accept(p_logits, drafts, q, u, u_res, draft_logits=draft_logits)
