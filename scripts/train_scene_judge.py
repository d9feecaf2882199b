"""Train the shipped scene judge and its reference feature statistics (CPU, seeded).

    python scripts/train_scene_judge.py --steps 1500

Each step draws fresh scenes: half prompted scenes (1-2 large shapes, tiny-flux's data), half
captioned scenes (2-3 shapes, small or large), with extra pixel noise of a random strength so that
imperfect samples are still read cell by cell. The statistics are those of real prompted scenes.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import save_file

from diffspec.data import parse_prompt, render_prompted_scenes, render_scenes
from diffspec.metrics import feature_stats
from diffspec.models.scene_judge import JUDGE_DIR, SceneJudge


def targets(texts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-cell targets of prompts or captions (sizes dropped): shape class (0 empty, 1 + shape index) and colour,
    each (n, 4)."""
    parsed = [parse_prompt(t.replace("small ", "").replace("large ", "")) for t in texts]
    present, shape, colour = (torch.stack(t) for t in zip(*parsed))
    return torch.where(present, shape + 1, 0), colour


def batch(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Half prompted, half captioned scenes with their per-cell targets (:func:`targets`)."""
    x1, p1 = render_prompted_scenes(n // 2, seed=seed)
    x2, p2 = render_scenes(n - n // 2, seed=seed)
    return torch.cat([x1, x2]), *targets(p1 + p2)


def accuracy(model: SceneJudge, x: torch.Tensor, shape: torch.Tensor, colour: torch.Tensor) -> dict[str, float]:
    with torch.no_grad():
        s, c = model(x)
    cell_ok = (s.argmax(-1) == shape) & ((c.argmax(-1) == colour) | (shape == 0))
    return {"cell_accuracy": round(float(cell_ok.float().mean()), 4),
            "scene_accuracy": round(float(cell_ok.all(1).float().mean()), 4)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=1500)
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--out", type=Path, default=JUDGE_DIR)
    p.add_argument("--stats-samples", type=int, default=10000)
    p.add_argument("--record", type=Path, default=Path("scripts/runs/scene_judge.json"))
    args = p.parse_args()
    torch.manual_seed(0)
    model = SceneJudge()
    opt = torch.optim.AdamW(model.parameters(), lr=2e-3, weight_decay=1e-4)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=2e-3, total_steps=args.steps)
    g = torch.Generator().manual_seed(1)
    start = time.time()
    for step in range(args.steps):
        x, shape, colour = batch(args.batch_size, seed=1_000_000 + step)  # fresh data every step
        x = x + torch.rand(len(x), 1, 1, 1, generator=g) * 0.2 * torch.randn(x.shape, generator=g)
        s, c = model(x)
        has = shape > 0
        loss = F.cross_entropy(s.flatten(0, 1), shape.flatten()) + F.cross_entropy(c[has], colour[has])
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        if step % 100 == 0 or step == args.steps - 1:
            print(f"step {step} loss {loss.item():.4f} ({time.time() - start:.0f}s)", flush=True)
    model.eval()
    held_out = {}  # training seeds start at 1e6
    for name, render in (("prompted_scenes", render_prompted_scenes), ("captioned_scenes", render_scenes)):
        x, texts = render(2000, seed=7)
        held_out[name] = accuracy(model, x, *targets(texts))
    with torch.no_grad():
        x, _ = render_prompted_scenes(args.stats_samples, seed=8)
        feats = torch.cat([model.features(x[i:i + 1000]) for i in range(0, len(x), 1000)]).double()
    mu, sigma = feature_stats(feats)
    args.out.mkdir(parents=True, exist_ok=True)
    state = {k: v.half() if v.is_floating_point() else v for k, v in model.state_dict().items()}
    save_file({k: v.contiguous() for k, v in state.items()}, str(args.out / "model.safetensors"))
    (args.out / "config.json").write_text(json.dumps(model.config) + "\n")
    save_file({"mu": torch.from_numpy(mu).float(), "sigma": torch.from_numpy(sigma).float()},
              str(args.out / "fid_stats.safetensors"))
    record = {"steps": args.steps, "batch_size": args.batch_size, "wall_s": round(time.time() - start, 1),
              "held_out": held_out, "stats": f"render_prompted_scenes({args.stats_samples}, seed=8)",
              "stored_dtype": "float16", "params": sum(v.numel() for v in model.parameters())}
    args.record.write_text(json.dumps(record, indent=2) + "\n")
    print(json.dumps(record, indent=2))



if __name__ == "__main__":
    main()
