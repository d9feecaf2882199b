"""Stage 2 of tiny-ar: train the class-conditional LlamaGen GPT on patch-VQ tokens (CPU, seeded), then evaluate.

Needs the tokens written by ``train_tiny_ar_tokenizer.py`` (run that first, in its own process).
Writes ``<out>/gpt`` (``diffspec.models.save_gpt``, per-row int8 unless ``--save-dtype`` says otherwise), the record
``scripts/runs/tiny_ar.json`` (config, steps, losses, wall time, machine, sample quality, per-token
entropy) and ``scripts/runs/tiny_ar_samples.png`` (one row per class, plain sampling).

    python scripts/train_tiny_ar.py --tokens /tmp/tiny_ar_tokens.pt --minutes 20
    python scripts/train_tiny_ar.py --eval-only          # re-evaluate the shipped weights
    python scripts/train_tiny_ar.py --eval-only --spec-samples 200   # plus sjd / mc-sjd step compression

The data variant (``render_shapes`` options, e.g. textured backgrounds) comes from the token file or,
with ``--eval-only``, from the tokenizer record; ``--record`` / ``--tokenizer-record`` name the
records of a candidate model (e.g. ``scripts/runs/tiny_ar_v2.json``).
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from diffspec.ar_image.target import ARImageTarget
from diffspec.ar_image.targets.llamagen import LlamaGenTransformer
from diffspec.ar_image.targets.llamagen_config import LlamaGenConfig
from diffspec.ar_image.targets.patch_vq import PatchVQ
from diffspec.ar_image.token_stats import per_token_entropy, summarize_entropy
from diffspec.data import SHAPE_CLASSES, make_grid_png, render_shapes
from diffspec.models import GPT_STORAGE, class_accuracy, load_ar_target, load_gpt, reference_fid, save_gpt
from diffspec.stats import SpecStats

RECORD = Path("scripts/runs/tiny_ar.json")
TOKENIZER_RECORD = Path("scripts/runs/tiny_ar_tokenizer.json")
VAL = 2000  # the last VAL tokenized images are held out


def build_config(vocab: int, grid: tuple[int, int], dim: int, layers: int, heads: int) -> LlamaGenConfig:
    return LlamaGenConfig(
        dim=dim, n_layer=layers, n_head=heads, multiple_of=32, vocab_size=vocab, block_size=grid[0] * grid[1],
        num_classes=len(SHAPE_CLASSES), cls_token_num=1, model_type="c2i", class_dropout_prob=0.1,
        token_dropout_p=0.0, resid_dropout_p=0.0, ffn_dropout_p=0.0, attn_dropout_p=0.0,
    )


@torch.no_grad()
def val_loss(model: LlamaGenTransformer, tokens: torch.Tensor, labels: torch.Tensor) -> float:
    model.eval()
    total = 0.0
    for x, y in zip(tokens.split(500), labels.split(500)):
        logits = model(x, y, drop_condition=torch.zeros(len(y), dtype=torch.bool))
        total += float(F.cross_entropy(logits.flatten(0, 1), x.flatten(), reduction="sum"))
    model.train()
    return total / tokens.numel()


def train(args: argparse.Namespace, vocab: int, grid: tuple[int, int]) -> tuple[LlamaGenTransformer, dict]:
    data = torch.load(args.tokens)
    tokens, labels = data["tokens"].long(), data["labels"].long()
    tr_x, tr_y, va_x, va_y = tokens[:-VAL], labels[:-VAL], tokens[-VAL:], labels[-VAL:]
    torch.manual_seed(0)
    config = build_config(vocab, grid, args.dim, args.layers, args.heads)
    model = LlamaGenTransformer(config).train()
    if args.init is not None:  # continue a previous run (fresh optimizer, new cosine cycle)
        model.load_state_dict(load_gpt(args.init).state_dict())
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.05}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95))
    g = torch.Generator().manual_seed(0)
    budget = args.minutes * 60
    start, step, losses, vals = time.time(), 0, [], []
    while step < args.max_steps:
        frac = (time.time() - start) / budget  # cosine over the wall-clock budget (machine-dependent step count)
        if frac >= 1:
            break
        lr = args.lr * min(1.0, (step + 1) / args.warmup) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))
        for group in opt.param_groups:
            group["lr"] = lr
        idx = torch.randint(0, len(tr_x), (args.batch_size,), generator=g)
        drop = torch.rand(args.batch_size, generator=g) < config.class_dropout_prob
        logits = model(tr_x[idx], tr_y[idx], drop_condition=drop)
        loss = F.cross_entropy(logits.flatten(0, 1), tr_x[idx].flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(loss.item())
        if step % 200 == 0:
            print(f"step {step} loss {sum(losses[-200:]) / len(losses[-200:]):.4f} lr {lr:.2e} "
                  f"({time.time() - start:.0f}s)", flush=True)
        if step % 1000 == 0 and step:
            vals.append({"step": step, "val_ce": val_loss(model, va_x, va_y)})
            print(f"  val CE {vals[-1]['val_ce']:.4f}", flush=True)
        step += 1
    wall = time.time() - start
    vals.append({"step": step, "val_ce": val_loss(model, va_x, va_y)})
    model.eval()
    record = {
        "gpt_config": config.to_dict(),
        "params": sum(p.numel() for p in model.parameters()),
        "data": f"{len(tr_x)} tokenized training images ({len(va_x)} more held out for val CE)",
        "optimizer": {"name": "AdamW", "lr": args.lr, "betas": [0.9, 0.95], "weight_decay": 0.05,
                      "warmup_steps": args.warmup, "schedule": "cosine to 0.1 x lr over the wall-clock budget",
                      "grad_clip": 1.0},
        "batch_size": args.batch_size, "steps": step, "wall_s": round(wall, 1), "minutes_budget": args.minutes,
        "train_ce_first200": sum(losses[:200]) / len(losses[:200]),
        "train_ce_last200": sum(losses[-200:]) / len(losses[-200:]),
        "train_ce_every_100": [round(sum(losses[i:i + 100]) / len(losses[i:i + 100]), 4)
                               for i in range(0, len(losses), 100)],
        "val_ce": vals,
    }
    return model, record


@torch.no_grad()
def plain_sample(target: ARImageTarget, labels: torch.Tensor, guidance: float, generator: torch.Generator,
                 batch: int = 250) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Plain AR sampling through the session protocol (CFG-mixed logits, temperature 1, full vocabulary).

    Returns:
        tokens ``(n, N)``, and the entropy (nats) and top-1 probability of the law each token was drawn from.
    """
    n_tok = target.num_tokens
    tokens, entropy, top1 = (torch.empty(len(labels), n_tok, dtype=d) for d in (torch.long, torch.float, torch.float))
    for rows in torch.arange(len(labels)).split(batch):
        session = target.start(class_labels=labels[rows], guidance_scale=guidance)
        logits = session.first_logits
        for i in range(n_tok):
            entropy[rows, i], top1[rows, i] = per_token_entropy(logits)
            tokens[rows, i] = torch.multinomial(torch.softmax(logits.float(), -1), 1, generator=generator)[:, 0]
            if i + 1 < n_tok:
                logits = session.step(tokens[rows, i : i + 1], torch.full((len(rows),), i))[:, 0]
    return tokens, entropy, top1


def spec_compression(folder: Path, n: int, batch: int, guidance: float) -> list[dict]:
    """Step compression (tokens / target calls) of ``sjd`` (window 16) and ``mc-sjd`` (window 64) over ``n`` samples."""
    from diffspec import SpeculativePipeline

    out = []
    for method, window in (("sjd", 16), ("mc-sjd", 64)):
        spec = SpeculativePipeline.from_pretrained(str(folder), method=method, window=window)
        spec.set_progress_bar_config(disable=True)
        calls, tokens, accepted, t0 = 0, 0, [], time.time()
        for start in range(0, n, batch):
            seeds = list(range(start, min(n, start + batch)))
            gens = [torch.Generator().manual_seed(50_000 + s) for s in seeds]
            result = spec(class_labels=[s % len(SHAPE_CLASSES) for s in seeds], guidance_scale=guidance,
                          generator=gens, output_type="tokens")
            stats: SpecStats = spec.stats
            calls, tokens = calls + stats.target_calls, tokens + result.tokens.shape[1]
            accepted.append(stats.acceptance_rate)
        out.append({"method": method, "window": window, "samples": n, "batch": batch, "guidance_scale": guidance,
                    "step_compression": round(tokens / calls, 3), "target_calls": calls,
                    "mean_acceptance_rate": round(sum(accepted) / len(accepted), 4),
                    "wall_s": round(time.time() - t0, 1)})
        print(json.dumps(out[-1]), flush=True)
    return out


def evaluate(target: ARImageTarget, vq: PatchVQ, n: int, guidances: list[float], shape_options: dict) -> dict:
    """Reference FID / class accuracy of plain samples and per-token entropy, per guidance scale."""
    out: dict = {"samples_per_setting": n, "sampling": "plain AR, CFG on logits, temperature 1, top-k 0 (full vocab)",
                 "settings": []}
    labels = torch.arange(n) % len(SHAPE_CLASSES)
    clf = getattr(target, "reference_classifier", "shapes")  # the classifier of the model's data variant
    out["reference_classifier"] = clf
    for guidance in guidances:
        t0 = time.time()
        tokens, entropy, top1 = plain_sample(target, labels, guidance, torch.Generator().manual_seed(0))
        images = target.decode_tokens(tokens)
        out["settings"].append({
            "guidance_scale": guidance, "reference_fid": round(reference_fid(images, clf), 2),
            "class_accuracy": round(class_accuracy(images, labels, clf), 4),
            **{k: round(v, 4) for k, v in summarize_entropy(entropy, top1).items()},
            "sampling_wall_s": round(time.time() - t0, 1),
        })
        print(json.dumps(out["settings"][-1]), flush=True)
    # the tokenizer's ceiling: held-out real images through encode/decode
    real, real_labels = render_shapes(n, seed=7, **shape_options)
    recon = vq.decode_code(vq.encode(real))
    out["tokenizer_reconstructions"] = {"images": f"render_shapes({n}, seed=7, **{shape_options})",
                                        "real_class_accuracy": round(class_accuracy(real, real_labels, clf), 4),
                                        "reference_fid": round(reference_fid(recon, clf), 2),
                                        "class_accuracy": round(class_accuracy(recon, real_labels, clf), 4),
                                        "real_reference_fid": round(reference_fid(real, clf), 2)}
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--tokens", type=Path, default=Path("/tmp/tiny_ar_tokens.pt"))
    p.add_argument("--out", type=Path, default=Path("diffspec/weights/tiny-ar"))
    p.add_argument("--minutes", type=float, default=20.0)
    p.add_argument("--max-steps", type=int, default=100_000)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--warmup", type=int, default=100)
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--init", type=Path, default=None,
                   help="continue from a saved gpt folder; the run is appended to the record's 'runs'")
    p.add_argument("--save-dtype", choices=GPT_STORAGE, default="int8",
                   help="storage of the saved GPT weights (float16 halves the file, per-row int8 quarters it; the "
                   "loader casts back to float32)")
    p.add_argument("--eval-only", action="store_true")
    p.add_argument("--no-eval", action="store_true", help="train and save only (evaluate later with --eval-only)")
    p.add_argument("--eval-samples", type=int, default=1000)
    p.add_argument("--guidance", type=float, nargs="+", default=[3.0, 1.0],
                   help="CFG scales to evaluate; the first one draws tiny_ar_samples.png")
    p.add_argument("--record", type=Path, default=RECORD)
    p.add_argument("--tokenizer-record", type=Path, default=TOKENIZER_RECORD)
    p.add_argument("--spec-samples", type=int, default=0,
                   help="also measure sjd / mc-sjd step compression over this many samples")
    p.add_argument("--spec-batch", type=int, default=8)
    args = p.parse_args()
    vq = PatchVQ.from_pretrained(args.out / "tokenizer")
    tokenizer_record = json.loads(args.tokenizer_record.read_text())
    shape_options = tokenizer_record.get("shape_options", {})
    samples_png = args.record.with_name(args.record.stem + "_samples.png")
    if args.eval_only:
        model = load_gpt(args.out / "gpt")
        record = json.loads(args.record.read_text())
    else:
        previous = json.loads(args.record.read_text()) if args.init is not None else None
        model, record = train(args, vq.config.codebook_size, vq.grid)
        if previous is not None:
            runs = previous.get("runs") or [{k: v for k, v in previous.items() if k not in ("tokenizer", "evaluation")}]
            record = {**record, "continued_from_steps": previous.get("total_steps", previous["steps"]),
                      "total_steps": previous.get("total_steps", previous["steps"]) + record["steps"],
                      "total_wall_s": round(sum(r["wall_s"] for r in runs) + record["wall_s"], 1),
                      "runs": [*runs, {k: v for k, v in record.items() if k != "gpt_config"}]}
        save_gpt(model, args.out / "gpt", args.save_dtype)
        record["saved_dtype"] = args.save_dtype
        print(f"saved {args.out / 'gpt'} ({args.save_dtype})", flush=True)
    record["tokenizer"] = tokenizer_record
    if not args.no_eval:
        target = load_ar_target(args.out)
        record["evaluation"] = evaluate(target, vq, args.eval_samples, args.guidance, shape_options)
        grid_labels = torch.arange(100) // 10  # one row per class
        tokens, _, _ = plain_sample(target, grid_labels, args.guidance[0], torch.Generator().manual_seed(1))
        make_grid_png(target.decode_tokens(tokens), samples_png, nrow=10)
    if args.spec_samples:
        record["speculative"] = spec_compression(args.out, args.spec_samples, args.spec_batch, args.guidance[0])
    record["machine"] = (f"{platform.machine()} CPU, torch {torch.__version__}, {torch.get_num_threads()} "
                         "thread(s), shared with other jobs (wall times are indicative only)")
    args.record.write_text(json.dumps(record, indent=2) + "\n")


if __name__ == "__main__":
    main()
