"""Train tiny-flux: a text-to-image ``FluxPipeline`` on prompted scenes (CPU, seeded).

A scaled-down ``FluxTransformer2DModel`` (double-stream then single-stream blocks), a word-level
tokenizer over the prompt vocabulary, tiny CLIP (pooled) and T5 (sequence) text encoders trained
with it, a tiny VAE trained on scenes (16x16x4 latents of 32x32 images, packed 2x2 as FLUX packs them) and
rectified flow matching (velocity = noise - data, logit-normal times), as ``FluxPipeline`` samples
with ``FlowMatchEulerDiscreteScheduler``. Prompts are dropped 10% of the time (the empty prompt), so
``true_cfg_scale`` with ``negative_prompt=""`` works too. Prompts are at most 17 tokens: the model is
trained and called with ``max_sequence_length=24``.

    python scripts/train_tiny_vae.py --data scenes --out /tmp/scene-vae --record scripts/runs/scene_vae.json
    python scripts/train_tiny_flux.py --vae /tmp/scene-vae --minutes 100 --out /tmp/tiny-flux
"""

from __future__ import annotations

import argparse
import copy
import json
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from diffusers import AutoencoderKL, FlowMatchEulerDiscreteScheduler, FluxPipeline, FluxTransformer2DModel

from diffspec.data import make_grid_png, render_prompted_scenes
from diffspec.data.prompted import PROMPT_WORDS
from diffspec.models import load_pipeline

MAX_SEQUENCE_LENGTH = 24
RECORD = Path("scripts/runs/tiny_flux.json")
DATA_SEED = 5_000_000


def build_tokenizer():
    """Lower-casing word-level tokenizer over :data:`PROMPT_WORDS` (pad 0, eos 1 appended, unk 2)."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "</s>": 1, "<unk>": 2, **{w: i + 3 for i, w in enumerate(PROMPT_WORDS)}}
    core = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    core.normalizer = normalizers.Lowercase()
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    core.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", 1)])
    return PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", eos_token="</s>", unk_token="<unk>",
                                   model_max_length=MAX_SEQUENCE_LENGTH)


def build_models(width: int, double: int, single: int):
    """(transformer, CLIP text encoder, T5 encoder), random weights, float32."""
    from transformers import CLIPTextConfig, CLIPTextModel, T5Config, T5EncoderModel

    vocab = len(PROMPT_WORDS) + 3
    heads = width // 32
    transformer = FluxTransformer2DModel(patch_size=1, in_channels=16, num_layers=double, num_single_layers=single,
                                         attention_head_dim=32, num_attention_heads=heads, joint_attention_dim=64,
                                         pooled_projection_dim=64, guidance_embeds=False, axes_dims_rope=(8, 12, 12))
    clip = CLIPTextModel(CLIPTextConfig(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                        num_attention_heads=2, max_position_embeddings=MAX_SEQUENCE_LENGTH,
                                        projection_dim=64, pad_token_id=0, bos_token_id=1, eos_token_id=1))
    t5 = T5EncoderModel(T5Config(vocab_size=vocab, d_model=64, d_kv=16, d_ff=128, num_layers=2, num_heads=4,
                                 relative_attention_num_buckets=16, decoder_start_token_id=0, pad_token_id=0,
                                 eos_token_id=1))
    return transformer, clip, t5


def load_parts(folder: Path) -> tuple:
    """(transformer, CLIP text encoder, T5 encoder) of a saved tiny-flux, to continue training."""
    pipe = load_pipeline(folder, dtype=torch.float32)
    return pipe.transformer, pipe.text_encoder, pipe.text_encoder_2


@torch.no_grad()
def encode_dataset(vae: AutoencoderKL, tokenizer, n: int) -> tuple[torch.Tensor, torch.Tensor, list[str]]:
    """Packed latents (n, 64, 16), token ids (n, MAX_SEQUENCE_LENGTH) and prompts of ``n`` scenes."""
    lats, prompts = [], []
    for i in range(0, n, 1000):
        x, p = render_prompted_scenes(min(1000, n - i), seed=DATA_SEED + i)
        z = vae.encode(x).latent_dist.sample() * vae.config.scaling_factor
        lats.append(FluxPipeline._pack_latents(z, len(z), 4, 16, 16))
        prompts += p
    return torch.cat(lats), tokenize(tokenizer, prompts), prompts


def tokenize(tokenizer, prompts: list[str]) -> torch.Tensor:
    return tokenizer(prompts, padding="max_length", max_length=MAX_SEQUENCE_LENGTH, truncation=True,
                     return_tensors="pt").input_ids


def text_inputs(clip, t5, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(T5 sequence embeddings, CLIP pooled embedding), as ``FluxPipeline.encode_prompt`` computes them."""
    return t5(ids)[0], clip(ids).pooler_output


def train(parts: tuple, latents: torch.Tensor, ids: torch.Tensor, empty_ids: torch.Tensor,
          args: argparse.Namespace) -> tuple[tuple, dict]:
    """Flow-matching training of all three parts with prompt dropout and EMA copies; returns the EMA parts."""
    transformer, clip, t5 = parts
    ema = tuple(copy.deepcopy(m).eval().requires_grad_(False) for m in parts)
    params = [p for m in parts for p in m.parameters()]
    opt = torch.optim.AdamW(params, lr=args.lr, weight_decay=0.0)
    dev = args.device
    img_ids = FluxPipeline._prepare_latent_image_ids(1, 8, 8, dev, torch.float32)
    txt_ids = torch.zeros(MAX_SEQUENCE_LENGTH, 3, device=dev)
    latents, ids, empty_ids = latents.to(dev), ids.to(dev), empty_ids.to(dev)
    g = torch.Generator(dev).manual_seed(0)
    ema_params = [p for m in ema for p in m.parameters()]
    start, step, window, last_avg = time.time(), 0, torch.zeros((), device=dev), float("nan")
    while step < args.steps and time.time() - start < args.minutes * 60:
        left = 1 - max(step / args.steps, (time.time() - start) / (args.minutes * 60))
        lr = args.lr * min(1.0, (step + 1) / args.warmup, left / args.decay)  # linear decay to 0 at the end
        for group in opt.param_groups:
            group["lr"] = lr
        idx = torch.randint(0, len(latents), (args.batch_size,), generator=g, device=dev)
        x0, tok = latents[idx], ids[idx].clone()
        tok[torch.rand(len(tok), generator=g, device=dev) < args.prompt_dropout] = empty_ids
        sigma = torch.sigmoid(torch.randn(len(x0), generator=g, device=dev))  # logit-normal times
        noise = torch.randn(x0.shape, generator=g, device=dev)
        xt = (1 - sigma[:, None, None]) * x0 + sigma[:, None, None] * noise
        seq, pooled = text_inputs(clip, t5, tok)
        v = transformer(hidden_states=xt, timestep=sigma, pooled_projections=pooled, encoder_hidden_states=seq,
                        txt_ids=txt_ids, img_ids=img_ids).sample
        loss = F.mse_loss(v, noise - x0)
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        decay = min(args.ema, (1 + step) / (10 + step))
        with torch.no_grad():
            torch._foreach_lerp_(ema_params, params, 1 - decay)
            window += loss.detach()
        step += 1
        if step % 200 == 0:  # the one host sync: every 200 steps
            last_avg, window = float(window) / 200, torch.zeros((), device=dev)
            print(f"step {step} loss {last_avg:.4f} lr {lr:.2e} ({time.time() - start:.0f}s)", flush=True)
    if step % 200:  # the last, partial window
        last_avg = float(window) / (step % 200)
    return tuple(m.cpu() for m in ema), {"steps": step, "batch_size": args.batch_size,
                                         "wall_s": round(time.time() - start, 1), "final_loss_avg200": round(last_avg, 5)}


def save(parts: tuple, vae: AutoencoderKL, tokenizer, out: Path) -> None:
    """Write the ``FluxPipeline`` folder with ``diffspec_model.json`` (call defaults, steps, judge).

    Every weight file is stored in float16 while the configs keep float32, so diffusers and transformers load
    float32 models (transformers 5 would otherwise load float16 text encoders); the transformer then goes to int8
    (:func:`store_transformer_int8`).
    """
    from safetensors.torch import load_file, save_file

    transformer, clip, t5 = parts
    pipe = FluxPipeline(scheduler=FlowMatchEulerDiscreteScheduler(), vae=vae, text_encoder=clip, tokenizer=tokenizer,
                        text_encoder_2=t5, tokenizer_2=copy.deepcopy(tokenizer), transformer=transformer)
    pipe.save_pretrained(out)
    for weights in out.glob("*/*.safetensors"):
        save_file({k: v.half() if v.is_floating_point() else v for k, v in load_file(str(weights)).items()},
                  str(weights), metadata={"format": "pt"})
    settings = {"call_defaults": {"height": 32, "width": 32, "max_sequence_length": MAX_SEQUENCE_LENGTH},
                "steps": 28, "judge": "prompted-scenes"}
    (out / "diffspec_model.json").write_text(json.dumps(settings, indent=2) + "\n")
    store_transformer_int8(out)


def store_transformer_int8(out: Path) -> None:
    """Store the folder's transformer as per-row int8 (:mod:`diffspec.models.int8_weights`: half the bytes of
    float16; ``load_pipeline`` dequantizes it, ``load_pipeline(out).save_pretrained(path)`` writes a plain folder)."""
    from diffspec.models.int8_weights import save_int8

    fp16 = out / "transformer" / "diffusion_pytorch_model.safetensors"
    transformer = FluxTransformer2DModel.from_pretrained(out / "transformer", torch_dtype=torch.float32)
    fp16.unlink()
    save_int8(transformer, out / "transformer")


@torch.no_grad()
def evaluate(folder: Path, n: int, steps: int = 28) -> dict:
    """Prompt adherence (the scene judge) and reference FID of ``n`` samples of held-out prompts (seeds 0..n-1, the
    ``dit-cache`` bench's prompts), next to the same figures for the VAE's reconstructions of the real scenes."""
    from diffspec.bench.dit_cache_workloads import JUDGED_PROMPT_SEED
    from diffspec.models.scene_judge import prompt_scores, scene_fid

    pipe = load_pipeline(folder)
    pipe.set_progress_bar_config(disable=True)
    real, prompts = render_prompted_scenes(n, seed=JUDGED_PROMPT_SEED)
    images = []
    for i in range(0, n, 100):
        gens = [torch.Generator().manual_seed(s) for s in range(i, min(n, i + 100))]
        images.append(pipe(prompts[i:i + 100], height=32, width=32, num_inference_steps=steps, generator=gens,
                           max_sequence_length=MAX_SEQUENCE_LENGTH, output_type="pt").images * 2 - 1)
    images = torch.cat(images)
    recon = pipe.vae.decode(pipe.vae.encode(real).latent_dist.mode()).sample.clamp(-1, 1)
    return {"samples": n, "steps": steps, "prompts": f"render_prompted_scenes({n}, seed={JUDGED_PROMPT_SEED})",
            **prompt_scores(images, prompts), "reference_fid": round(scene_fid(images), 3),
            "vae_reconstructions": {**prompt_scores(recon, prompts), "reference_fid": round(scene_fid(recon), 3)}}


def save_samples(folder: Path, png: Path) -> None:
    """Eight prompts of held-out scenes, eight seeds each (28 steps)."""
    pipe = load_pipeline(folder)
    pipe.set_progress_bar_config(disable=True)
    _, prompts = render_prompted_scenes(8, seed=123)
    images = pipe([p for p in prompts for _ in range(8)], height=32, width=32, num_inference_steps=28,
                  max_sequence_length=MAX_SEQUENCE_LENGTH, output_type="pt",
                  generator=[torch.Generator().manual_seed(s) for s in range(64)]).images
    make_grid_png(images * 2 - 1, png, nrow=8)
    png.with_suffix(".txt").write_text("\n".join(prompts) + "\n")


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--vae", type=Path, required=True,
                   help="a 16x16x4 AutoencoderKL that holds scenes: scripts/train_tiny_vae.py --data scenes (the "
                   "tiny-dit VAE washes their colours out)")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--width", type=int, default=96, help="transformer width (multiple of 32: heads of 32)")
    p.add_argument("--double", type=int, default=2, help="double-stream blocks")
    p.add_argument("--single", type=int, default=4, help="single-stream blocks")
    p.add_argument("--steps", type=int, default=100_000)
    p.add_argument("--minutes", type=float, default=100.0, help="stop after this much wall time")
    p.add_argument("--lr", type=float, default=5e-4)
    p.add_argument("--warmup", type=int, default=200)
    p.add_argument("--decay", type=float, default=0.2, help="share of the run (steps or minutes) the lr decays over")
    p.add_argument("--ema", type=float, default=0.999)
    p.add_argument("--prompt-dropout", type=float, default=0.1)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--data", type=int, default=60_000)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--device", default="cpu", help="where to train (cuda on a GPU machine)")
    p.add_argument("--init", type=Path, default=None, help="continue from a saved tiny-flux folder")
    p.add_argument("--record", type=Path, default=RECORD)
    p.add_argument("--eval-samples", type=int, default=1000, help="held-out prompts scored after training (0: none)")
    return p.parse_args()


def main() -> None:
    args = parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(args.threads)
    vae = AutoencoderKL.from_pretrained(args.vae, shift_factor=0.0).eval()  # FluxPipeline reads shift_factor
    tokenizer = build_tokenizer()
    t0 = time.time()
    latents, ids, _ = encode_dataset(vae, tokenizer, args.data)
    print(f"encoded {len(latents)} latents in {time.time() - t0:.0f}s; std {latents.std():.3f}", flush=True)
    parts = build_models(args.width, args.double, args.single) if args.init is None else load_parts(args.init)
    parts = tuple(m.float().train().to(args.device) for m in parts)
    ema, run = train(parts, latents, ids, tokenize(tokenizer, [""])[0], args)
    save(ema, vae, tokenizer, args.out)
    run.update({"data": f"{args.data} latents of render_prompted_scenes(seed={DATA_SEED}+), VAE posterior samples",
                "lr": args.lr, "warmup": args.warmup, "decay": args.decay, "ema": args.ema, "prompt_dropout": args.prompt_dropout,
                "transformer": {"width": args.width, "double": args.double, "single": args.single,
                                "params": sum(p.numel() for p in ema[0].parameters())},
                "text_encoder_params": sum(p.numel() for m in ema[1:] for p in m.parameters()),
                "max_sequence_length": MAX_SEQUENCE_LENGTH, "threads": args.threads, "device": args.device,
                "stored_dtype": "transformer int8 (per row), the rest float16"})
    if args.init is not None:
        run["init"] = str(args.init)
    if args.eval_samples:
        run["eval"] = evaluate(args.out, args.eval_samples)
    args.record.write_text(json.dumps(run, indent=2) + "\n")
    save_samples(args.out, args.record.with_name(args.record.stem + "_samples.png"))
    print(json.dumps(run, indent=2))


if __name__ == "__main__":
    main()
