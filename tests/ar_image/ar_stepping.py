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




def tiny_llamagen_target(seed: int):
    """A random 2-layer LlamaGen (vocabulary 24, 16 image tokens, 5 classes) behind ``LlamaGenTarget``: the real
    static KV cache path (``step_tree``/``commit_tree``) for the tree samplers' greedy tests."""
    from diffspec.ar_image.targets.llamagen import LlamaGenConfig, LlamaGenTransformer
    from diffspec.ar_image.targets.llamagen_session import LlamaGenTarget

    torch.manual_seed(seed)
    cfg = LlamaGenConfig(dim=32, n_layer=2, n_head=2, vocab_size=24, num_classes=5, block_size=16, multiple_of=16,
                         token_dropout_p=0.0, resid_dropout_p=0.0, ffn_dropout_p=0.0)
    model = LlamaGenTransformer(cfg).eval()
    with torch.no_grad():  # the official init zeroes the output head: give it weights
        model.output.weight.normal_(std=0.5)
    return LlamaGenTarget(model)
