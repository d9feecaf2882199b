"""Train the shipped shape classifier and its reference feature statistics (CPU, seeded).

    python scripts/train_classifier.py --steps 1500
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
from diffspec.models.classifier import WEIGHTS_DIR, ShapeClassifier, feature_stats


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--steps", type=int, default=1500)
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--out", type=Path, default=WEIGHTS_DIR)
    p.add_argument("--stats-samples", type=int, default=10000)
    args = p.parse_args()
    torch.manual_seed(0)
    model = ShapeClassifier(num_classes=len(SHAPE_CLASSES))
    opt = torch.optim.AdamW(model.parameters(), lr=2e-3, weight_decay=1e-4)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=2e-3, total_steps=args.steps)
    start = time.time()
    for step in range(args.steps):
        x, y = render_shapes(args.batch_size, seed=1_000_000 + step)  # fresh data every step
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        if step % 100 == 0 or step == args.steps - 1:
            print(f"step {step} loss {loss.item():.4f} ({time.time() - start:.0f}s)", flush=True)
    model.eval()
    with torch.no_grad():
        x, y = render_shapes(2000, seed=7)  # held out (training seeds start at 1e6)
        acc = (model(x).argmax(1) == y).float().mean().item()
        feats = torch.cat([model.features(render_shapes(1000, seed=20_000 + i)[0]) for i in
                           range(args.stats_samples // 1000)])
    mu, sigma = feature_stats(feats)
    args.out.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(args.out / "model.safetensors"))
    (args.out / "config.json").write_text(json.dumps(model.config, indent=2))
    save_file({"mu": torch.from_numpy(mu), "sigma": torch.from_numpy(sigma)}, str(args.out / "fid_stats.safetensors"))
    record = {"steps": args.steps, "batch_size": args.batch_size, "final_loss": loss.item(), "heldout_accuracy": acc,
              "heldout": "render_shapes(2000, seed=7)", "fid_stats": f"{args.stats_samples} images, seeds 20000+",
              "wall_s": time.time() - start}
    Path("scripts/runs/classifier.json").write_text(json.dumps(record, indent=2))
    print(json.dumps(record, indent=2))


if __name__ == "__main__":
    main()
