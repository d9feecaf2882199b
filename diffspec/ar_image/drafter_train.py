"""Self-distillation of an EAGLE drafter (``diffspec train-drafter``).

Data: sequences sampled from the target itself (plain AR sampling with its default CFG) and the
target's final hidden states along them (one teacher-forced call), for the conditional and
unconditional rows. Loss: SmoothL1 between the drafter's predicted and the target's next
features, plus ``0.1 x`` the cross-entropy of the drafter's CFG-mixed logits to the target's
CFG-mixed distribution; AdamW.

Example:
    >>> record = train_drafter(load_ar_target("tiny-ar"), "out/drafter", samples=2000)  # doctest: +SKIP
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from ..progress import progress
from .drafter import EagleDrafter, FeatureDrafter
from .plain import plain_sample
from .target import mix_cfg


def collect_features(target: Any, samples: int, guidance: float, generator: torch.Generator,
                     chunk: int = 250) -> tuple[torch.Tensor, torch.Tensor]:
    """Self-distilled data: ``tokens (M, N)`` and features ``(M, branches, N, dim)`` (``F_j`` predicts ``t_j``)."""
    num_classes = target.model.config.num_classes
    toks, feats = [], []
    with torch.no_grad():
        for lo in range(0, samples, chunk):
            labels = torch.randint(0, num_classes, (min(chunk, samples - lo),), generator=generator)
            session = target.start(class_labels=labels, guidance_scale=guidance)
            first = session.last_hidden[:, -1:]
            tokens = plain_sample(session, target.num_tokens, {"temperature": 1.0}, generator)
            session = target.start(class_labels=labels, guidance_scale=guidance)
            session.step(tokens[:, :-1], torch.zeros(len(labels), dtype=torch.long, device=tokens.device))
            f = torch.cat([first, session.last_hidden], 1)  # (R, N, dim)
            toks.append(tokens.cpu())
            feats.append(f.view(session.cfg_branches, len(labels), *f.shape[1:]).transpose(0, 1).float().cpu())
    return torch.cat(toks), torch.cat(feats)


def drafter_loss(head: FeatureDrafter, tokens: torch.Tensor, feats: torch.Tensor, guidance: float,
                 ce_weight: float = 0.1) -> tuple[torch.Tensor, torch.Tensor]:
    """``(total, ce)`` loss on a batch: ``tokens (b, N)``, ``feats (b, branches, N, dim)``."""
    b, branches = feats.shape[:2]
    rows = feats.transpose(0, 1).reshape(b * branches, *feats.shape[2:])  # cond rows first
    pred = head.features(tokens[:, :-1].repeat(branches, 1), rows[:, :-1])
    truth = rows[:, 1:]
    feat_loss = F.smooth_l1_loss(pred, truth)
    logits = mix_cfg(head.logits(pred), b, guidance)
    with torch.no_grad():
        teacher = mix_cfg(head.logits(truth), b, guidance).softmax(-1)
    ce = -(teacher * logits.log_softmax(-1)).sum(-1).mean()
    return feat_loss + ce_weight * ce, ce


def train_drafter(target: Any, out: str | Path, *, samples: int = 1000, epochs: int = 10, batch: int = 64,
                  lr: float = 1e-3, guidance: float | None = None, seed: int = 0,
                  show_progress: bool = True) -> dict[str, Any]:
    """Train an :class:`EagleDrafter` for a LlamaGen-style ``target`` and save it to ``out``.

    Returns (and writes as ``out/training.json``) the training record: settings, losses, seconds.

    Raises:
        ValueError: a setting out of range (named).
    """
    for name, value in (("samples", samples), ("epochs", epochs), ("batch", batch)):
        if value < 1:
            raise ValueError(f"{name}={value} is out of range; must be >= 1")
    started = time.perf_counter()
    generator = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    guidance = target.default_guidance_scale if guidance is None else guidance
    tokens, feats = collect_features(target, samples, guidance, generator)
    collect_s = time.perf_counter() - started
    for p in target.model.parameters():
        p.requires_grad_(False)
    drafter = EagleDrafter(target.model.config).to(target.device).train()
    head = FeatureDrafter(drafter, target.model)
    opt = torch.optim.AdamW(drafter.parameters(), lr=lr)
    history = []
    for _ in progress(range(epochs), desc="train-drafter", disable=not show_progress):
        order = torch.randperm(len(tokens), generator=generator)
        total, ce_total, steps = 0.0, 0.0, 0
        for lo in range(0, len(order), batch):
            idx = order[lo: lo + batch]
            loss, ce = drafter_loss(head, tokens[idx].to(target.device), feats[idx].to(target.device), guidance)
            opt.zero_grad()
            loss.backward()
            opt.step()
            total, ce_total, steps = total + loss.item(), ce_total + ce.item(), steps + 1
        history.append({"loss": round(total / steps, 5), "ce": round(ce_total / steps, 5)})
    drafter.eval().save_pretrained(out)
    record = {"samples": samples, "epochs": epochs, "batch": batch, "lr": lr, "guidance_scale": guidance,
              "seed": seed, "collect_s": round(collect_s, 1), "total_s": round(time.perf_counter() - started, 1),
              "history": history, "params": sum(p.numel() for p in drafter.parameters()),
              "note": "wall-clock on a loaded, shared CPU"}
    (Path(out) / "training.json").write_text(json.dumps(record, indent=2))
    return record
