"""Test-side helpers that drive an ARSession directly (no diffspec engine)."""

from __future__ import annotations

import torch


def greedy_by_steps(session, num_tokens: int, chunk: int = 1) -> torch.Tensor:
    """Greedy loop through session.step, ``chunk`` tokens fed per call (re-fed from the start)."""
    tokens = session.first_logits.argmax(-1)[:, None]
    while tokens.shape[1] < num_tokens:
        n = tokens.shape[1]
        lo = max(0, n - chunk)
        logits = session.step(tokens[:, lo:], torch.full((tokens.shape[0],), lo))
        tokens = torch.cat([tokens, logits[:, -1].argmax(-1, keepdim=True)], 1)
    return tokens


