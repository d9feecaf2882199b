"""Train the tiny AutoencoderKL of tiny-dit: 32x32x3 images <-> 16x16x4 latents (CPU, seeded).

    python scripts/train_tiny_vae.py --steps 1500 --out /tmp/tiny-vae
    python scripts/train_tiny_vae.py --data scenes --out /tmp/scene-vae --record scripts/runs/scene_vae.json

``--data scenes`` trains on prompted and captioned scenes (small saturated shapes on dark backgrounds, which the
shapes VAE washes out) and reports the scene judge's prompt accuracy of its reconstructions.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from diffusers import AutoencoderKL

from diffspec.data import render_prompted_scenes, render_scenes, render_shapes


def build_vae() -> AutoencoderKL:
    return AutoencoderKL(
        in_channels=3, out_channels=3,
        down_block_types=("DownEncoderBlock2D", "DownEncoderBlock2D"),
        up_block_types=("UpDecoderBlock2D", "UpDecoderBlock2D"),
        block_out_channels=(16, 32), layers_per_block=1, latent_channels=4, norm_num_groups=8, sample_size=32,
    )


def images(data: str, n: int, seed: int) -> torch.Tensor:
    """A batch of ``data`` images: shapes, or half prompted and half captioned scenes."""
    if data == "shapes":
        return render_shapes(n, seed=seed)[0]
    return torch.cat([render_prompted_scenes(n - n // 2, seed=seed)[0], render_scenes(n // 2, seed=seed)[0]])


def psnr(a: torch.Tensor, b: torch.Tensor) -> float:
    mse = ((a.clamp(-1, 1) - b) / 2).pow(2).mean()
    return float(-10 * torch.log10(mse))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--steps", type=int, default=1500)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--kl", type=float, default=1e-6)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--data", choices=("shapes", "scenes"), default="shapes")
    p.add_argument("--record", type=Path, default=Path("scripts/runs/tiny_vae.json"))
    args = p.parse_args()
    torch.manual_seed(0)
    vae = build_vae()
    opt = torch.optim.AdamW(vae.parameters(), lr=1e-3, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=1e-3, total_steps=args.steps, pct_start=0.1)
    start = time.time()
    for step in range(args.steps):
        x = images(args.data, args.batch_size, seed=2_000_000 + step)
        post = vae.encode(x).latent_dist
        rec = vae.decode(post.sample()).sample
        loss = F.mse_loss(rec, x) + args.kl * post.kl().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        if step % 100 == 0 or step == args.steps - 1:
            print(f"step {step} loss {loss.item():.5f} ({time.time() - start:.0f}s)", flush=True)
    vae.eval()
    with torch.no_grad():
        x = images(args.data, 512, seed=8)
        latents = vae.encode(x).latent_dist.mode()
        rec_psnr = psnr(vae.decode(latents).sample, x)
        std = latents.std().item()
    vae.register_to_config(scaling_factor=1.0 / std)
    vae.save_pretrained(args.out)
    record = {"steps": args.steps, "batch_size": args.batch_size, "final_loss": loss.item(),
              "heldout_psnr_db": rec_psnr, "latent_std": std, "scaling_factor": 1.0 / std,
              "heldout": f"{args.data}, 512 images, seed 8", "data": args.data, "wall_s": time.time() - start}
    if args.data == "scenes":
        from diffspec.models.scene_judge import prompt_scores

        real, prompts = render_prompted_scenes(1000, seed=10**7)
        with torch.no_grad():
            rec = vae.decode(vae.encode(real).latent_dist.mode()).sample.clamp(-1, 1)
        record["judge_on_reconstructions"] = {"images": "render_prompted_scenes(1000, seed=10**7)",
                                              **prompt_scores(rec, prompts)}
    args.record.write_text(json.dumps(record, indent=2))
    print(json.dumps(record, indent=2))


if __name__ == "__main__":
    main()
