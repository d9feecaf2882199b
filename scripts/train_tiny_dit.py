"""Train tiny-dit: a class-conditional DiT on 16x16x4 latents of the tiny VAE (CPU, seeded).

Writes a standard diffusers ``DiTPipeline`` folder (transformer, vae, DDIM scheduler, id2label).

    python scripts/train_tiny_dit.py --vae /tmp/tiny-vae --minutes 20 --out diffspec/weights/tiny-dit
"""

from __future__ import annotations

import argparse
import copy
import json
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from diffusers import AutoencoderKL, DDIMScheduler, DDPMScheduler, DiTPipeline, DiTTransformer2DModel

from diffspec.data import SHAPE_CLASSES, make_grid_png, render_shapes
from diffspec.models import save_dit_pipeline

NULL_CLASS = 1000  # DiTPipeline hard-codes the null (unconditional) label id


def build_transformer() -> DiTTransformer2DModel:
    model = DiTTransformer2DModel(
        num_attention_heads=4, attention_head_dim=24, in_channels=4, out_channels=4, num_layers=5,
        sample_size=16, patch_size=2, num_embeds_ada_norm=NULL_CLASS,
    )
    for m in model.modules():  # drop labels ourselves, once per sample (not per block)
        if type(m).__name__ == "LabelEmbedding":
            m.dropout_prob = 0.0
    return model


@torch.no_grad()
def encode_dataset(vae: AutoencoderKL, n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    lats, labels = [], []
    for i in range(0, n, 1000):
        x, y = render_shapes(min(1000, n - i), seed=seed + i)
        lats.append(vae.encode(x).latent_dist.sample() * vae.config.scaling_factor)
        labels.append(y)
    return torch.cat(lats), torch.cat(labels)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--vae", type=Path, required=True)
    p.add_argument("--out", type=Path, default=Path("diffspec/weights/tiny-dit"))
    p.add_argument("--minutes", type=float, default=20.0)
    p.add_argument("--max-steps", type=int, default=100_000)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--data", type=int, default=60_000)
    p.add_argument("--init", type=Path, default=None,
                   help="continue from a saved tiny-dit folder (its record in scripts/runs/tiny_dit.json is extended)")
    args = p.parse_args()
    torch.manual_seed(0)
    vae = AutoencoderKL.from_pretrained(args.vae).eval()
    t0 = time.time()
    latents, labels = encode_dataset(vae, args.data, seed=3_000_000)
    print(f"encoded {len(latents)} latents in {time.time() - t0:.0f}s; std {latents.std():.3f}", flush=True)

    model = build_transformer().train()
    previous = None
    if args.init is not None:
        model.load_state_dict(DiTTransformer2DModel.from_pretrained(args.init / "transformer").float().state_dict())
        previous = json.loads(Path("scripts/runs/tiny_dit.json").read_text())
    ema = copy.deepcopy(model).eval().requires_grad_(False)
    noise_sched = DDPMScheduler(num_train_timesteps=1000, beta_schedule="linear", beta_start=1e-4, beta_end=0.02)
    opt = torch.optim.AdamW(model.parameters(), lr=5e-4, weight_decay=0.0)
    g = torch.Generator().manual_seed(0)
    start, step, losses = time.time(), 0, []
    while time.time() - start < args.minutes * 60 and step < args.max_steps:
        idx = torch.randint(0, len(latents), (args.batch_size,), generator=g)
        x0, y = latents[idx], labels[idx].clone()
        y[torch.rand(len(y), generator=g) < 0.1] = NULL_CLASS
        t = torch.randint(0, 1000, (len(x0),), generator=g)
        noise = torch.randn(x0.shape, generator=g)
        pred = model(noise_sched.add_noise(x0, noise, t), timestep=t, class_labels=y).sample
        loss = F.mse_loss(pred, noise)
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        decay = min(0.999, (1 + step) / (10 + step))
        with torch.no_grad():
            for pe, pm in zip(ema.parameters(), model.parameters()):
                pe.lerp_(pm, 1 - decay)
        losses.append(loss.item())
        if step % 200 == 0:
            print(f"step {step} loss {sum(losses[-200:]) / len(losses[-200:]):.4f} ({time.time() - start:.0f}s)",
                  flush=True)
        step += 1

    scheduler = DDIMScheduler(num_train_timesteps=1000, beta_schedule="linear", beta_start=1e-4, beta_end=0.02,
                              clip_sample=False, set_alpha_to_one=False)
    # stored in fp16 to keep the shipped file small; diffusers loads it back as float32 by default
    pipe = DiTPipeline(transformer=ema.half(), vae=vae, scheduler=scheduler, id2label=dict(enumerate(SHAPE_CLASSES)))
    save_dit_pipeline(pipe, args.out, SHAPE_CLASSES)  # class names kept in model_index.json
    print(f"saved {args.out}", flush=True)
    record = {"steps": step, "batch_size": args.batch_size, "wall_s": time.time() - start,
              "final_loss_avg200": sum(losses[-200:]) / len(losses[-200:]), "data": f"{args.data} latents of "
              "render_shapes(seed=3000000+), VAE posterior samples", "lr": 5e-4, "ema": 0.999,
              "params": sum(p.numel() for p in ema.parameters()), "stored_dtype": "float16"}
    if previous is not None:  # a continuation: the EMA restarts from the loaded weights
        record = {**record, "total_steps": previous.get("total_steps", previous["steps"]) + step,
                  "runs": [*previous.get("runs", [{k: v for k, v in previous.items() if k != "runs"}]),
                           {"steps": step, "wall_s": record["wall_s"], "final_loss_avg200": record["final_loss_avg200"],
                            "continued_from_steps": previous.get("total_steps", previous["steps"])}]}
    Path("scripts/runs/tiny_dit.json").write_text(json.dumps(record, indent=2))

    # samples: one row per class, 50 DDIM steps, guidance 4
    pipe = DiTPipeline.from_pretrained(args.out)
    pipe.set_progress_bar_config(disable=True)
    gens = [torch.Generator().manual_seed(i) for i in range(100)]
    labels_grid = [c for c in range(len(SHAPE_CLASSES)) for _ in range(10)]
    images = pipe(class_labels=labels_grid, generator=gens, num_inference_steps=50, guidance_scale=4.0,
                  output_type="pt").images * 2 - 1
    make_grid_png(images, "scripts/runs/tiny_dit_samples.png", nrow=10)
    print(json.dumps(record, indent=2))


if __name__ == "__main__":
    main()
