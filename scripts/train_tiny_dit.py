"""Train tiny-dit: a class-conditional DiT on 16x16x4 latents of the tiny VAE (CPU, seeded).

Writes a standard diffusers ``DiTPipeline`` folder (transformer, vae, DDIM scheduler, id2label). The learning
rate warms up linearly, then follows a cosine to zero over ``--steps``; ``--init`` continues from a saved
tiny-dit, and blocks added by a larger ``--layers`` start as identities (zero adaLN-Zero modulation).

    python scripts/train_tiny_dit.py --vae /tmp/tiny-vae --steps 20000 --out diffspec/weights/tiny-dit
    python scripts/train_tiny_dit.py --vae diffspec/weights/tiny-dit/vae --init diffspec/weights/tiny-dit
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import time
from pathlib import Path

import torch
from diffusers import AutoencoderKL, DDIMScheduler, DDPMScheduler, DiTPipeline, DiTTransformer2DModel

from diffspec.data import SHAPE_CLASSES, make_grid_png, render_shapes
from diffspec.models import class_accuracy, reference_fid, save_dit_pipeline

NULL_CLASS = 1000  # DiTPipeline hard-codes the null (unconditional) label id
RECORD = Path("scripts/runs/tiny_dit.json")


def build_transformer(layers: int = 7, heads: int = 4, head_dim: int = 24,
                      patch_size: int = 2) -> DiTTransformer2DModel:
    """The tiny-dit transformer; labels are dropped by the training loop, once per sample (not per block).
    ``patch_size`` 1 gives 16x16 tokens per image instead of 8x8: four times the compute, the same weights."""
    model = DiTTransformer2DModel(
        num_attention_heads=heads, attention_head_dim=head_dim, in_channels=4, out_channels=4, num_layers=layers,
        sample_size=16, patch_size=patch_size, num_embeds_ada_norm=NULL_CLASS,
    )
    for m in model.modules():
        if type(m).__name__ == "LabelEmbedding":
            m.dropout_prob = 0.0
    return model


def load_into(model: DiTTransformer2DModel, folder: Path) -> int:
    """Copy a saved transformer's weights into ``model`` (same width, as many or more blocks).

    Blocks beyond the saved ones get zero adaLN-Zero modulation, so the grown model computes what the saved
    one did. Returns the number of copied blocks.
    """
    saved = DiTTransformer2DModel.from_pretrained(folder).float()
    missing, unexpected = model.load_state_dict(saved.state_dict(), strict=False)
    if unexpected:
        raise ValueError(f"{folder} does not fit the model: unexpected weights {unexpected[:3]}")
    copied = len(saved.transformer_blocks)
    with torch.no_grad():
        for block in model.transformer_blocks[copied:]:
            block.norm1.linear.weight.zero_()
            block.norm1.linear.bias.zero_()
    return copied


@torch.no_grad()
def encode_dataset(vae: AutoencoderKL, n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    lats, labels = [], []
    for i in range(0, n, 1000):
        x, y = render_shapes(min(1000, n - i), seed=seed + i)
        lats.append(vae.encode(x).latent_dist.sample() * vae.config.scaling_factor)
        labels.append(y)
    return torch.cat(lats), torch.cat(labels)


def learning_rate(step: int, peak: float, warmup: int, total: int, schedule: str = "cosine") -> float:
    """Linear warm-up to ``peak`` over ``warmup`` steps, then a cosine to zero at ``total`` (``schedule="cosine"``)
    or ``peak`` throughout (``"constant"``, how the shipped tiny-dit was trained).

    Example:
        >>> learning_rate(0, 1e-3, 10, 110), learning_rate(60, 1e-3, 10, 110), learning_rate(110, 1e-3, 10, 110)
        (0.0001, 0.0005, 0.0)
        >>> learning_rate(110, 1e-3, 0, 110, "constant")
        0.001
    """
    if step < warmup:
        return peak * (step + 1) / warmup
    if schedule == "constant":
        return peak
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return round(peak * 0.5 * (1 + math.cos(math.pi * progress)), 12)


def sample_timesteps(n: int, law: str, generator: torch.Generator, device: str) -> torch.Tensor:
    """Training timesteps in [0, 1000): ``"uniform"`` or ``"logit-normal"`` (sigmoid of a standard normal, scaled)."""
    if law == "uniform":
        return torch.randint(0, 1000, (n,), generator=generator, device=device)
    u = torch.sigmoid(torch.randn(n, generator=generator, device=device))
    return (u * 1000).long().clamp(0, 999)


def train(model: DiTTransformer2DModel, latents: torch.Tensor, labels: torch.Tensor,
          args: argparse.Namespace) -> tuple[DiTTransformer2DModel, dict]:
    """Epsilon- or velocity-prediction training (``args.prediction``) with label dropout and an EMA copy; returns the
    EMA model and the run's figures."""
    ema = copy.deepcopy(model).eval().requires_grad_(False)
    noise_sched = DDPMScheduler(num_train_timesteps=1000, beta_schedule="linear", beta_start=1e-4, beta_end=0.02)
    snr = noise_sched.alphas_cumprod / (1 - noise_sched.alphas_cumprod)
    weight = (snr.clamp(max=args.min_snr) / snr if args.min_snr > 0 else torch.ones_like(snr)).to(args.device)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
    g = torch.Generator(args.device).manual_seed(0)
    latents, labels = latents.to(args.device), labels.to(args.device)
    start, step, window, last_avg = time.time(), 0, torch.zeros((), device=args.device), float("nan")
    ema_params, params = list(ema.parameters()), list(model.parameters())
    while step < args.steps and time.time() - start < args.minutes * 60:
        timed = int((time.time() - start) / (args.minutes * 60) * args.steps)  # a time-capped run decays in time
        for group in opt.param_groups:
            group["lr"] = learning_rate(max(step, timed), args.lr, args.warmup, args.steps, args.schedule)
        idx = torch.randint(0, len(latents), (args.batch_size,), generator=g, device=args.device)
        x0, y = latents[idx], labels[idx].clone()
        y[torch.rand(len(y), generator=g, device=args.device) < args.label_dropout] = NULL_CLASS
        t = sample_timesteps(len(x0), args.timesteps, g, args.device)
        noise = torch.randn(x0.shape, generator=g, device=args.device)
        pred = model(noise_sched.add_noise(x0, noise, t), timestep=t, class_labels=y).sample
        target = noise_sched.get_velocity(x0, noise, t) if args.prediction == "v_prediction" else noise
        loss = (weight[t] * (pred - target).pow(2).mean(dim=(1, 2, 3))).mean()  # min-SNR weights (1 when off)
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        decay = min(args.ema, (1 + step) / (10 + step))
        with torch.no_grad():
            torch._foreach_lerp_(ema_params, params, 1 - decay)
            window += loss.detach()
        step += 1
        if step % 200 == 0:  # the one host sync: every 200 steps
            last_avg, window = float(window) / 200, torch.zeros((), device=args.device)
            print(f"step {step} loss {last_avg:.4f} lr {opt.param_groups[0]['lr']:.2e} "
                  f"({time.time() - start:.0f}s)", flush=True)
    if step % 200:  # the last, partial window
        last_avg = float(window) / (step % 200)
    return ema, {"steps": step, "batch_size": args.batch_size, "wall_s": time.time() - start,
                 "final_loss_avg200": last_avg}


@torch.no_grad()
def evaluate(folder: Path, n: int, steps: int = 50, guidance_scale: float = 4.0, device: str = "cpu") -> dict:
    """Class accuracy and reference FID of ``n`` samples (labels cycling over the classes, seeds 0..n-1, CPU
    generators) at the ``diffspec generate`` defaults: the pipeline's DDIM scheduler, 50 steps, guidance 4."""
    pipe = DiTPipeline.from_pretrained(folder).to(device)
    pipe.set_progress_bar_config(disable=True)
    labels = torch.arange(n) % len(SHAPE_CLASSES)
    images = []
    for i in range(0, n, 100):
        gens = [torch.Generator().manual_seed(s) for s in range(i, min(n, i + 100))]
        images.append(pipe(class_labels=labels[i:i + 100].tolist(), generator=gens, num_inference_steps=steps,
                           guidance_scale=guidance_scale, output_type="pt").images.cpu() * 2 - 1)
    images = torch.cat(images)
    return {"samples": n, "steps": steps, "guidance_scale": guidance_scale,
            "class_accuracy": round(class_accuracy(images, labels), 4), "reference_fid": round(reference_fid(images), 2)}


def write_record(run: dict, path: Path, continued: bool) -> dict:
    """The record: the latest run's figures at the top, every run (this one appended) under ``runs``."""
    previous = json.loads(path.read_text()) if continued and path.is_file() else None
    if previous is None:
        record = {**run, "total_steps": run["steps"], "runs": [run]}
    else:
        done = previous.get("total_steps", previous["steps"])
        runs = previous.get("runs", [{k: v for k, v in previous.items() if k != "runs"}])
        record = {**run, "total_steps": done + run["steps"], "runs": [*runs, {**run, "continued_from_steps": done}]}
    path.write_text(json.dumps(record, indent=2) + "\n")
    return record


def save_samples(folder: Path, png: str) -> None:
    """One row per class, 50 DDIM steps, guidance 4."""
    pipe = DiTPipeline.from_pretrained(folder)
    pipe.set_progress_bar_config(disable=True)
    gens = [torch.Generator().manual_seed(i) for i in range(100)]
    labels_grid = [c for c in range(len(SHAPE_CLASSES)) for _ in range(10)]
    images = pipe(class_labels=labels_grid, generator=gens, num_inference_steps=50, guidance_scale=4.0,
                  output_type="pt").images * 2 - 1
    make_grid_png(images, png, nrow=10)


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--vae", type=Path, required=True)
    p.add_argument("--out", type=Path, default=Path("diffspec/weights/tiny-dit"))
    p.add_argument("--init", type=Path, default=None,
                   help="continue from a saved tiny-dit folder (its record is extended with this run)")
    p.add_argument("--layers", type=int, default=7, help="transformer blocks (default 7; width 4 heads x 24)")
    p.add_argument("--heads", type=int, default=4, help="attention heads (default 4)")
    p.add_argument("--head-dim", type=int, default=24, help="width of a head (default 24)")
    p.add_argument("--patch-size", type=int, choices=(1, 2), default=2,
                   help="latent patch per token (default 2: 8x8 tokens; 1: 16x16 tokens, four times the compute)")
    p.add_argument("--steps", type=int, default=5_000, help="optimizer steps; the cosine reaches 0 here")
    p.add_argument("--minutes", type=float, default=600.0,
                   help="stop after this much wall time; the cosine then follows whichever of steps and time is further")
    p.add_argument("--lr", type=float, default=3e-4, help="peak learning rate")
    p.add_argument("--warmup", type=int, default=200, help="linear warm-up steps")
    p.add_argument("--schedule", choices=("cosine", "constant"), default="cosine",
                   help="cosine to 0 at --steps, or constant (the shipped tiny-dit's runs: --layers 5 --lr 5e-4 "
                   "--warmup 0 --schedule constant)")
    p.add_argument("--ema", type=float, default=0.999)
    p.add_argument("--label-dropout", type=float, default=0.1, help="share of null labels (classifier-free guidance)")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--data", type=int, default=60_000)
    p.add_argument("--eval-samples", type=int, default=1000, help="samples scored after training (0: none)")
    p.add_argument("--record", type=Path, default=RECORD)
    p.add_argument("--min-snr", type=float, default=0.0,
                   help="min-SNR-gamma loss weights min(SNR, gamma)/SNR (0: plain epsilon MSE, the shipped runs)")
    p.add_argument("--prediction", choices=("epsilon", "v_prediction"), default="epsilon",
                   help="what the transformer predicts (the scheduler is saved with the same prediction_type)")
    p.add_argument("--timesteps", choices=("uniform", "logit-normal"), default="uniform",
                   help="law of the training timesteps")
    p.add_argument("--device", default="cpu", help="where to train (cuda on a GPU machine)")
    p.add_argument("--threads", type=int, default=1,
                   help="torch threads (default 1: more threads than free cores slow training down sharply)")
    return p.parse_args()


def main() -> None:
    args = parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(args.threads)
    vae = AutoencoderKL.from_pretrained(args.vae).eval()
    t0 = time.time()
    latents, labels = encode_dataset(vae, args.data, seed=3_000_000)
    print(f"encoded {len(latents)} latents in {time.time() - t0:.0f}s; std {latents.std():.3f}", flush=True)
    model = build_transformer(args.layers, args.heads, args.head_dim, args.patch_size).train()
    copied = load_into(model, args.init / "transformer") if args.init is not None else 0
    ema, run = train(model.to(args.device), latents, labels, args)
    ema = ema.cpu()
    scheduler = DDIMScheduler(num_train_timesteps=1000, beta_schedule="linear", beta_start=1e-4, beta_end=0.02,
                              clip_sample=False, set_alpha_to_one=False, prediction_type=args.prediction)
    # stored in fp16 to keep the shipped file small; diffusers loads it back as float32 by default
    pipe = DiTPipeline(transformer=ema.half(), vae=vae, scheduler=scheduler, id2label=dict(enumerate(SHAPE_CLASSES)))
    save_dit_pipeline(pipe, args.out, SHAPE_CLASSES)  # class names kept in model_index.json
    print(f"saved {args.out}", flush=True)
    run.update({"data": f"{args.data} latents of render_shapes(seed=3000000+), VAE posterior samples",
                "lr": args.lr, "lr_schedule": f"linear warm-up {args.warmup} steps, cosine to 0 at {args.steps}"
                if args.schedule == "cosine" else f"linear warm-up {args.warmup} steps, then constant",
                "ema": args.ema, "label_dropout": args.label_dropout, "layers": args.layers, "heads": args.heads,
                "head_dim": args.head_dim, "patch_size": args.patch_size, "min_snr": args.min_snr,
                "prediction": args.prediction, "timesteps": args.timesteps, "device": args.device,
                "params": sum(p.numel() for p in ema.parameters()), "stored_dtype": "float16"})
    if copied:
        run["init_blocks"] = f"{copied} blocks from {args.init}, {args.layers - copied} new as identities"
    if args.eval_samples:
        run["eval"] = evaluate(args.out, args.eval_samples, device=args.device)
    record = write_record(run, args.record, continued=args.init is not None)
    save_samples(args.out, str(args.record.with_name(args.record.stem + "_samples.png")))
    print(json.dumps(record, indent=2))


if __name__ == "__main__":
    main()
