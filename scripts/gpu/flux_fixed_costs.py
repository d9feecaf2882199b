"""The per-image costs a FLUX pipeline call adds around its denoising loop (random weights, no hub), and the
end-to-end speedups they leave of the loop speedups measured by ``dit-cache``.

Times, on one device and in bf16, with the released components' configs and random weights: the T5-v1.1-XXL
encoder on 512 tokens, the CLIP ViT-L/14 text encoder on 77 tokens, and the FLUX VAE decoding a 1024² latent
(16 x 128 x 128). Every arm of a pipeline pays these once per image, so the end-to-end speedup of an arm is
``(loop_baseline + fixed) / (loop_arm + fixed)``, computed here from a committed ``dit-cache`` JSON.

Usage (device machine, repository root)::

    python3 scripts/gpu/flux_fixed_costs.py --loop-json benchmarks/results/dit-cache-flux-1024-h200-eager.json --out $OUT
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

import torch

T5_XXL = dict(vocab_size=32128, d_model=4096, d_kv=64, d_ff=10240, num_layers=24, num_heads=64,
              feed_forward_proj="gated-gelu", relative_attention_num_buckets=32, tie_word_embeddings=False)
CLIP_L = dict(vocab_size=49408, hidden_size=768, intermediate_size=3072, num_hidden_layers=12, num_attention_heads=12,
              max_position_embeddings=77, projection_dim=768, hidden_act="quick_gelu")
FLUX_VAE = dict(in_channels=3, out_channels=3, down_block_types=("DownEncoderBlock2D",) * 4,
                up_block_types=("UpDecoderBlock2D",) * 4, block_out_channels=(128, 256, 512, 512), layers_per_block=2,
                latent_channels=16, norm_num_groups=32, sample_size=1024, use_quant_conv=False,
                use_post_quant_conv=False)
TINY = {"t5": dict(vocab_size=128, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4,
                   feed_forward_proj="gated-gelu"),
        "clip": dict(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                     max_position_embeddings=77, projection_dim=32),
        "vae": dict(FLUX_VAE, block_out_channels=(32, 32, 32, 32), layers_per_block=1, norm_num_groups=8)}


def timed(fn, device: torch.device, repeats: int, warmup: int) -> list[float]:
    """Seconds of ``repeats`` synchronised calls of ``fn`` after ``warmup`` untimed ones."""
    out = []
    for i in range(warmup + repeats):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        if i >= warmup:
            out.append(time.perf_counter() - t0)
    return out


def main() -> None:
    from diffusers import AutoencoderKL
    from transformers import CLIPTextConfig, CLIPTextModel, T5Config, T5EncoderModel

    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--tiny", action="store_true", help="tiny configs (a CPU smoke test of the script)")
    parser.add_argument("--latent", type=int, default=128, help="latent side (128 for 1024²)")
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--loop-json", default=None, help="a dit-cache JSON whose loop times the speedups use")
    parser.add_argument("--out", default=os.environ.get("OUT", "."))
    args = parser.parse_args()
    dev = torch.device(args.device)
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    torch.manual_seed(0)
    with torch.device(dev):
        t5 = T5EncoderModel(T5Config(**(TINY["t5"] if args.tiny else T5_XXL))).to(dtype).eval()
        clip = CLIPTextModel(CLIPTextConfig(**(TINY["clip"] if args.tiny else CLIP_L))).to(dtype).eval()
        vae = AutoencoderKL(**(TINY["vae"] if args.tiny else FLUX_VAE)).to(dtype).eval()
    t5_ids = torch.randint(0, t5.config.vocab_size, (1, 512), device=dev)
    clip_ids = torch.randint(0, clip.config.vocab_size, (1, 77), device=dev)
    latent = torch.randn(1, 16, args.latent, args.latent, device=dev, dtype=dtype)
    with torch.inference_mode():
        costs = {"t5_encode_s": timed(lambda: t5(t5_ids), dev, args.repeats, args.warmup),
                 "clip_encode_s": timed(lambda: clip(clip_ids), dev, args.repeats, args.warmup),
                 "vae_decode_s": timed(lambda: vae.decode(latent), dev, args.repeats, args.warmup)}
    med = {k: statistics.median(v) for k, v in costs.items()}
    fixed = sum(med.values())
    doc = {"device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu", "dtype": str(dtype),
           "tiny": args.tiny, "latent": args.latent, "repeats": args.repeats, "warmup": args.warmup,
           "median_s": {k: round(v, 5) for k, v in med.items()}, "fixed_s": round(fixed, 5), "samples_s": costs}
    if args.loop_json:
        loop = json.loads(Path(args.loop_json).read_text())
        base = next(r for r in loop["runs"] if r["method"] == "baseline")["latency_s"]["median"]
        doc["loop_json"] = args.loop_json
        doc["end_to_end"] = {r["method"]: {"loop_speedup": r["speedup_vs_baseline"],
                                           "end_to_end_speedup": round((base + fixed) / (r["latency_s"]["median"]
                                                                                          + fixed), 3)}
                             for r in loop["runs"] if r["method"] != "baseline"}
    name = "flux-fixed-costs" + ("-tiny" if args.tiny else "") + ".json"
    (Path(args.out) / name).write_text(json.dumps(doc, indent=2))
    print(json.dumps({k: v for k, v in doc.items() if k != "samples_s"}, indent=1))


if __name__ == "__main__":
    main()
