"""Stage 1 of tiny-ar: fit the patch k-means tokenizer and tokenize the training set (CPU, seeded).

Run in its own process before ``train_tiny_ar.py`` (k-means and torch training in one process
ran several times slower here). Writes the tokenizer folder, a token file for the GPT stage and
the tokenizer part of the training record.

    python scripts/train_tiny_ar_tokenizer.py --out diffspec/weights/tiny-ar/tokenizer --tokens /tmp/tiny_ar_tokens.pt
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

import torch

from diffspec.ar_image.targets.patch_vq import PatchVQ, PatchVQConfig
from diffspec.data import make_grid_png, render_shapes
from diffspec.data.shapes import BACKGROUNDS
from diffspec.metrics import psnr

DATA_SEED = 4_000_000  # training images: render_shapes(seed=DATA_SEED + i), chunks of 1000
HELD_OUT_SEED = 7  # render_shapes(2000, seed=7): the classifier's held-out set


def render(n: int, seed: int, **shape_kwargs: object) -> tuple[torch.Tensor, torch.Tensor]:
    parts = [render_shapes(min(1000, n - i), seed=seed + i, **shape_kwargs) for i in range(0, n, 1000)]
    return torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])


def shape_options(args: argparse.Namespace) -> dict:
    """``render_shapes`` keyword arguments of the data variant (empty for the default plain images)."""
    if args.background == "plain":
        return {}
    return {"background": args.background, "texture_strength": args.texture_strength, "noise": args.noise}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--out", type=Path, default=Path("diffspec/weights/tiny-ar/tokenizer"))
    p.add_argument("--tokens", type=Path, default=Path("/tmp/tiny_ar_tokens.pt"))
    p.add_argument("--record", type=Path, default=Path("scripts/runs/tiny_ar_tokenizer.json"))
    p.add_argument("--data", type=int, default=80_000)
    p.add_argument("--fit-images", type=int, default=20_000)
    p.add_argument("--max-patches", type=int, default=300_000)
    p.add_argument("--codebook-size", type=int, default=1024)
    p.add_argument("--patch-size", type=int, default=4)
    p.add_argument("--iters", type=int, default=25)
    p.add_argument("--background", choices=BACKGROUNDS, default="plain", help="render_shapes background")
    p.add_argument("--texture-strength", type=float, default=0.6, help="render_shapes texture_strength (textured)")
    p.add_argument("--noise", type=float, default=0.04, help="render_shapes extra noise (textured)")
    args = p.parse_args()
    shape_kwargs = shape_options(args)
    t0 = time.time()
    images, labels = render(args.data, DATA_SEED, **shape_kwargs)
    t_render = time.time() - t0
    config = PatchVQConfig(image_size=32, patch_size=args.patch_size, codebook_size=args.codebook_size,
                           kmeans_iters=args.iters)
    t1 = time.time()
    vq = PatchVQ.fit(images[: args.fit_images], config, seed=0, max_patches=args.max_patches)
    t_fit = time.time() - t1
    t2 = time.time()
    tokens = torch.cat([vq.encode(x) for x in images.split(4096)]).to(torch.int16)
    t_encode = time.time() - t2
    vq.save_pretrained(args.out)
    args.tokens.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"tokens": tokens, "labels": labels, "data_seed": DATA_SEED, "shape_options": shape_kwargs}, args.tokens)

    held, _ = render_shapes(2000, seed=HELD_OUT_SEED, **shape_kwargs)
    recon = vq.decode_code(vq.encode(held))
    usage = torch.bincount(tokens.flatten().long(), minlength=config.codebook_size).double()
    freq = usage / usage.sum()
    record = {
        "tokenizer": {"class": "PatchVQ", **{k: getattr(config, k) for k in
                                             ("image_size", "patch_size", "codebook_size", "kmeans_iters")},
                      "grid": list(config.grid), "num_tokens": config.grid[0] * config.grid[1],
                      "fit": f"k-means on {args.max_patches} random patches of the first {args.fit_images} "
                             "training images, seed 0"},
        "data": f"{args.data} images of render_shapes(seed={DATA_SEED}+i, chunks of 1000), 32x32",
        "shape_options": shape_kwargs,
        "held_out_psnr_db": psnr(recon, held, data_range=2.0),
        "held_out": f"render_shapes(2000, seed={HELD_OUT_SEED}, **shape_options)",
        "codes_used_in_training_tokens": int((usage > 0).sum()),
        "unigram_entropy_nats": float(-(freq[freq > 0] * freq[freq > 0].log()).sum()),
        "wall_s": {"render": round(t_render, 1), "kmeans": round(t_fit, 1), "encode": round(t_encode, 1)},
        "machine": f"{platform.machine()} CPU, torch {torch.__version__}, {torch.get_num_threads()} thread(s), "
                   "shared and loaded (wall times are indicative only)",
    }
    args.record.parent.mkdir(parents=True, exist_ok=True)
    args.record.write_text(json.dumps(record, indent=2) + "\n")
    make_grid_png(torch.cat([held[:10], recon[:10]]), args.record.with_name(args.record.stem.replace("_tokenizer", "") + "_reconstructions.png"), nrow=10)
    print(json.dumps(record, indent=2))


if __name__ == "__main__":
    main()
