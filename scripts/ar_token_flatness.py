"""How flat are the images an AR image arm samples? Neighbour-equality statistics of its tokens.

For each arm (``plain`` decoding or any ``diffspec bench ar-image`` arm), sample ``--images`` images
of ``--model`` (class = seed % 10, seeds from ``--seed0``) and report the fraction of tokens equal to
their left / upper neighbour, the distinct tokens per image, the step compression per image and,
for relaxed arms, the TV per token they report. An exact arm matches ``plain``; a relaxed rule
that pulls its drafts' law into the image shows up as a shift (e.g. towards flat images, which the
``init="repeat"`` first drafts are).

Usage:
    OMP_NUM_THREADS=1 PYTHONPATH=. python scripts/ar_token_flatness.py --arms plain,mc-sjd,gsd-cb-k32-mintv \
        --images 500 --out flatness.json
"""

from __future__ import annotations

import argparse
import json
import subprocess

import torch

from diffspec import SpeculativePipeline
from diffspec.bench.ar_image import ARMS
from diffspec.models import load_ar_target


def neighbour_stats(tokens: torch.Tensor, grid: tuple[int, int]) -> dict[str, float]:
    """Left / up neighbour equality and distinct tokens per image of ``(B, rows * cols)`` tokens."""
    im = tokens.view(-1, *grid)
    distinct = torch.tensor([len(torch.unique(r)) for r in tokens], dtype=torch.float)
    return {"left_equal": round((im[:, :, 1:] == im[:, :, :-1]).float().mean().item(), 4),
            "up_equal": round((im[:, 1:, :] == im[:, :-1, :]).float().mean().item(), 4),
            "distinct_per_image": round(distinct.mean().item(), 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny-ar-tex")
    parser.add_argument("--arms", default="plain,mc-sjd,gsd-cb-k32-mintv")
    parser.add_argument("--images", type=int, default=500)
    parser.add_argument("--seed0", type=int, default=800_000)
    parser.add_argument("--chunk", type=int, default=50)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    target = load_ar_target(args.model, device=torch.device("cpu"))
    seeds = list(range(args.seed0, args.seed0 + args.images))
    guidance = target.default_guidance_scale
    rows = []
    for name in args.arms.split(","):
        arm = {"method": "mc-sjd"} if name == "plain" else ARMS[name]
        spec = SpeculativePipeline.from_pipe(target, **arm)
        spec.set_progress_bar_config(disable=True)
        run = spec.plain if name == "plain" else spec
        chunks, per_image, tv = [], 0.0, 0.0
        with torch.inference_mode():
            for c in range(0, len(seeds), args.chunk):
                part = seeds[c: c + args.chunk]
                chunks.append(run(class_labels=[s % 10 for s in part], guidance_scale=guidance, generator=[torch.Generator().manual_seed(s)
                                                                                 for s in part],
                                  output_type="tokens").tokens)
                extra = spec.stats.extra
                per_image += extra.get("tokens_per_call", 1.0) * len(part)
                tv += extra.get("relaxed_tv", 0.0) * len(part)
        row = {"arm": name, **neighbour_stats(torch.cat(chunks), target.grid),
               "step_compression_per_image": round(per_image / len(seeds), 3)}
        if name != "plain" and not getattr(spec.config, "exact", True):
            row["relaxed_tv"] = round(tv / len(seeds), 4)
        rows.append(row)
        print(row, flush=True)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    doc = {"suite": "ar-token-flatness", "model": args.model, "commit": commit, "images": args.images,
           "seeds": [seeds[0], seeds[-1]], "guidance_scale": guidance, "device": "cpu", "runs": rows}
    with open(args.out, "w") as f:
        json.dump(doc, f, indent=2)


if __name__ == "__main__":
    main()
