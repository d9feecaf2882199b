"""Train ``tiny-vlm``: a LLaVA captioning ``render_scenes`` images, its VLM drafter and its text drafter (CPU, seeded).

Stage 1 trains the target (projector + 8-layer Llama over a frozen, randomly initialised CLIP
tower: a trainable tower collapsed before the deep decoder learnt to read it) on fresh scenes
every step; stage 2 the VLM drafter, whose frozen tower is the target's (copied) with its own
projector and 1-layer Llama; stage 3 the text-only drafter on prompt text + caption. All on
teacher-forced captions (the target's greedy output is the caption wherever it is exact). The
shipped drafter was retrained with ``--only drafter`` on the saved (fp16) target, so a one-go run
reproduces it up to the fp16 rounding of the copied tower. The target ships as per-row int8
(``diffspec.models.int8_weights``; converted from the fp16 one, held-out accuracy unchanged).
Writes ``diffspec/weights/tiny-vlm`` (fp16) and the record ``scripts/runs/tiny_vlm.json``
(configs, steps, losses, wall time, held-out caption accuracy of the shipped fp16 weights).

    python scripts/train_tiny_vlm.py --threads 1                  # target 1200, drafter 2000, text drafter 300 steps
    python scripts/train_tiny_vlm.py --only drafter --steps 0,2000,0   # retrain one role on the saved target
    python scripts/train_tiny_vlm.py --only target --grow --steps 300,0,0 --lr 5e-4,3e-3,3e-3  # deepen the target
    python scripts/train_tiny_vlm.py --eval-only
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from diffspec.data import render_scenes
from diffspec.models.tiny_vlm import (
    EOS_ID,
    IMAGE_ID,
    PAD_ID,
    PROMPT,
    ROLES,
    build_model,
    build_processor,
    caption_accuracy,
    default_dir,
    load_tiny_vlm,
    pixel_values,
    save_tiny_vlm,
)

RECORD = Path("scripts/runs/tiny_vlm.json")
EVAL_SEED = 10**6  # held-out scenes: seeds >= EVAL_SEED are never trained on
N_VISUAL = 16


def batch_tensors(tok, captions: list[str], text_only: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(input_ids, attention_mask, labels)`` right-padded: [visual tokens] + prompt + caption + EOS."""
    prompt = tok(PROMPT.replace("<image> ", ""), add_special_tokens=False)["input_ids"]
    head = ([] if text_only else [IMAGE_ID] * N_VISUAL) + prompt
    rows = [head + tok(c, add_special_tokens=False)["input_ids"] + [EOS_ID] for c in captions]
    width = max(map(len, rows))
    ids = torch.full((len(rows), width), PAD_ID)
    for i, r in enumerate(rows):
        ids[i, : len(r)] = torch.tensor(r)
    mask = (ids != PAD_ID).long()
    labels = ids.masked_fill(mask == 0, -100)
    labels[:, : len(head)] = -100
    return ids, mask, labels


def grow_from(model, old) -> None:
    """Start ``model`` (a deeper target) from the trained ``old`` one, as the same function: every
    weight is copied, ``old``'s decoder layer ``i`` becomes layer ``stride * i`` and the layers in
    between keep zero output projections (``o_proj``, ``down_proj``: identities on the residual)."""
    n_old = old.config.text_config.num_hidden_layers
    n_new = model.config.text_config.num_hidden_layers
    if n_new % n_old:
        raise ValueError(f"--grow needs a multiple of the saved target's {n_old} layers, got {n_new}")
    stride, state = n_new // n_old, model.state_dict()
    for key, value in old.state_dict().items():
        head, sep, tail = key.partition(".layers.")
        if sep and "language_model" in head:
            index, rest = tail.split(".", 1)
            key = f"{head}.layers.{int(index) * stride}.{rest}"
        state[key].copy_(value)


def train_role(role: str, model, tok, steps: int, lr: float, batch: int, seed: int, minutes: float) -> dict:
    """Train ``model`` for ``steps`` steps (cosine schedule), stopping early after ``minutes`` of wall clock."""
    text_only = role == "text-drafter"
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.98), weight_decay=0.01)
    warmup = 30
    start, step, losses = time.time(), 0, []
    model.train()
    while step < steps and time.time() - start < minutes * 60:
        frac = step / steps
        for group in opt.param_groups:
            group["lr"] = lr * min(1.0, (step + 1) / warmup) * (0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * frac)))
        images, captions = render_scenes(batch, seed=seed * 100_000 + step)
        ids, mask, labels = batch_tensors(tok, captions, text_only)
        kwargs = {} if text_only else {"pixel_values": pixel_values(images)}
        logits = model(input_ids=ids, attention_mask=mask, **kwargs).logits
        loss = F.cross_entropy(logits[:, :-1].flatten(0, 1), labels[:, 1:].flatten(), ignore_index=-100)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        losses.append(loss.item())
        if step % 50 == 0:
            print(f"{role} step {step} loss {sum(losses[-50:]) / len(losses[-50:]):.4f} ({time.time() - start:.0f}s)",
                  flush=True)
        step += 1
    model.eval()
    return {"steps": step, "wall_s": round(time.time() - start, 1), "batch_size": batch, "lr": lr,
            "steps_budget": steps, "minutes_cap": minutes, "train_ce_every_50": [round(sum(losses[i:i + 50]) / len(losses[i:i + 50]), 4)
                                                              for i in range(0, len(losses), 50)]}


def evaluate(folder: Path, n: int) -> dict:
    """Held-out caption accuracy of the saved (fp16 → float32) models."""
    target, processor, drafter, text_drafter = load_tiny_vlm(folder)
    images, captions = render_scenes(n, seed=EVAL_SEED)
    return {"held_out_scenes": n, "eval_seed": EVAL_SEED,
            "target": caption_accuracy(target, processor, images, captions),
            "drafter": caption_accuracy(drafter, processor, images, captions),
            "text-drafter": caption_accuracy(text_drafter, processor, images, captions, text_only=True)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", default="1200,2000,300", help="training steps: target,drafter,text-drafter")
    ap.add_argument("--max-minutes", type=float, default=10.0, help="wall-clock cap per model")
    ap.add_argument("--lr", default="2e-3,3e-3,3e-3")
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path, default=default_dir())
    ap.add_argument("--eval-only", action="store_true")
    ap.add_argument("--only", default=None, help="retrain these roles only (comma list); the others are loaded "
                    "from --out (e.g. --only drafter --steps 0,2000,0 after a target run)")
    ap.add_argument("--grow", action="store_true", help="with --only target: start the (deeper) target from the "
                    "saved one (grow_from) instead of from scratch")
    ap.add_argument("--eval-scenes", type=int, default=256)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    record = json.loads(RECORD.read_text()) if (args.eval_only or args.only) and RECORD.is_file() else {}
    record.setdefault("commands", []).append(" ".join(["python", *sys.argv]))
    if not args.eval_only:
        steps = dict(zip(ROLES, map(int, args.steps.split(","))))
        lrs = dict(zip(ROLES, map(float, args.lr.split(","))))
        processor = build_processor()
        tok = processor.tokenizer
        only = set(args.only.split(",")) if args.only else set(ROLES)
        models = {}
        if only != set(ROLES):
            models = dict(zip(("target", "processor", "drafter", "text-drafter"), load_tiny_vlm(args.out)))
            processor = models.pop("processor")
            tok = processor.tokenizer
        # retraining the target alone keeps the saved (frozen) vision tower, so the saved VLM drafter,
        # trained on that tower, still reads the same image features
        tower = models["target"].model.vision_tower.state_dict() if "target" in models else None
        for seed, role in enumerate(ROLES, start=1):
            if role not in only:
                continue
            torch.manual_seed(seed)
            model = build_model(role)
            for name, param in model.named_parameters():  # residual branches start at zero: a deep decoder
                if name.endswith(("o_proj.weight", "down_proj.weight")):  # Llama only (CLIP: out_proj, fc2)
                    torch.nn.init.zeros_(param)  # starts as a shallow one and learns to read the image fast
            if role == "drafter":  # the target's vision tower: the drafter learns projector + decoder
                model.model.vision_tower.load_state_dict(models["target"].model.vision_tower.state_dict())
            if role == "target" and tower is not None:
                model.model.vision_tower.load_state_dict(tower)
                if args.grow:
                    grow_from(model, models["target"])
                    model.model.vision_tower.requires_grad_(False)
            if role != "text-drafter":  # a frozen (random) vision encoder, as LLaVA freezes its CLIP: a
                model.model.vision_tower.requires_grad_(False)  # trainable one collapsed before the decoder read it
            previous = record.get(role) if role == "target" and args.grow else None
            record[role] = {"params": sum(p.numel() for p in model.parameters()),
                            "text_config": {k: v for k, v in (model.config.get_text_config().to_dict()).items()
                                            if k in ("hidden_size", "intermediate_size", "num_hidden_layers",
                                                     "num_attention_heads", "num_key_value_heads", "vocab_size")},
                            **train_role(role, model, tok, steps[role], lrs[role], args.batch_size, seed, args.max_minutes)}
            if previous:
                record[role]["grown_from"] = {k: previous.get(k) for k in ("params", "text_config", "steps", "wall_s", "lr")}
            models[role] = model
        save_tiny_vlm(args.out, models["target"], models["drafter"], models["text-drafter"], processor)
    record["machine"] = {"device": f"CPU ({platform.processor() or platform.machine()}, {args.threads} threads)",
                         "torch": torch.__version__}
    record["eval"] = evaluate(args.out, args.eval_scenes)
    print(json.dumps(record["eval"], indent=1))
    RECORD.parent.mkdir(parents=True, exist_ok=True)
    RECORD.write_text(json.dumps(record, indent=1) + "\n")


if __name__ == "__main__":
    main()
