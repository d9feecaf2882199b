"""Train a shipped shape classifier and its reference feature statistics (CPU, seeded).

    python scripts/train_classifier.py --steps 1500
    python scripts/train_classifier.py --background textured --texture-strength 0.7 --noise 0.05 \
        --out diffspec/weights/shapes-tex-classifier --record scripts/runs/classifier_tex.json --save-dtype float16

The data options are ``render_shapes`` keyword arguments; training, held-out and statistics
images all use them, so the reference FID compares against real images of the same variant.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import save_file

from diffspec.data import SHAPE_CLASSES, render_shapes
from diffspec.data.shapes import BACKGROUNDS
from diffspec.metrics import feature_stats
from diffspec.models.classifier import WEIGHTS_DIR, ShapeClassifier


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--steps", type=int, default=1500)
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--out", type=Path, default=WEIGHTS_DIR)
    p.add_argument("--stats-samples", type=int, default=10000)
    p.add_argument("--background", choices=BACKGROUNDS, default="plain", help="render_shapes background")
    p.add_argument("--texture-strength", type=float, default=0.6, help="render_shapes texture_strength (textured)")
    p.add_argument("--noise", type=float, default=0.04, help="render_shapes extra noise (textured)")
    p.add_argument("--record", type=Path, default=Path("scripts/runs/classifier.json"))
    p.add_argument("--save-dtype", choices=("float32", "float16"), default="float32",
                   help="dtype of the saved weights (the loader casts back to float32)")
    args = p.parse_args()
    data = ({} if args.background == "plain" else
            {"background": args.background, "texture_strength": args.texture_strength, "noise": args.noise})
    torch.manual_seed(0)
    model = ShapeClassifier(num_classes=len(SHAPE_CLASSES))
    opt = torch.optim.AdamW(model.parameters(), lr=2e-3, weight_decay=1e-4)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=2e-3, total_steps=args.steps)
    start = time.time()
    for step in range(args.steps):
        x, y = render_shapes(args.batch_size, seed=1_000_000 + step, **data)  # fresh data every step
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        if step % 100 == 0 or step == args.steps - 1:
            print(f"step {step} loss {loss.item():.4f} ({time.time() - start:.0f}s)", flush=True)
    model.eval()
    with torch.no_grad():
        x, y = render_shapes(2000, seed=7, **data)  # held out (training seeds start at 1e6)
        acc = (model(x).argmax(1) == y).float().mean().item()
        feats = torch.cat([model.features(render_shapes(1000, seed=20_000 + i, **data)[0]) for i in
                           range(args.stats_samples // 1000)])
    mu, sigma = feature_stats(feats)
    args.out.mkdir(parents=True, exist_ok=True)
    dtype = getattr(torch, args.save_dtype)
    save_file({k: (v.to(dtype) if v.is_floating_point() else v).contiguous() for k, v in model.state_dict().items()},
              str(args.out / "model.safetensors"))
    (args.out / "config.json").write_text(json.dumps(model.config, indent=2))
    save_file({"mu": torch.from_numpy(mu), "sigma": torch.from_numpy(sigma)}, str(args.out / "fid_stats.safetensors"))
    record = {"steps": args.steps, "batch_size": args.batch_size, "final_loss": loss.item(), "heldout_accuracy": acc,
              "heldout": "render_shapes(2000, seed=7, **data_options)", "fid_stats": f"{args.stats_samples} images, seeds 20000+",
              "wall_s": time.time() - start}
    if data:
        record.update(data_options=data, saved_dtype=args.save_dtype,
                      note="held-out, statistics and training images all use data_options")
    args.record.write_text(json.dumps(record, indent=2))
    print(json.dumps(record, indent=2))


if __name__ == "__main__":
    main()
