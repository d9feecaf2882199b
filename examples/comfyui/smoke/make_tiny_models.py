"""Write random-weight tiny models that ComfyUI's stock loaders accept (for the smoke test only).

Run with ComfyUI's Python from anywhere: ``python make_tiny_models.py /path/to/ComfyUI``. Writes

- ``models/diffusion_models/diffspec_tiny_flux.safetensors``: a Flux (no guidance embedding, so
  ComfyUI treats it as schnell-style) at Flux's fixed width (3072, 24 heads) with 1 double and 2 single
  blocks and 768-wide text / pooled inputs, so a CLIP-L conditions it (667M parameters, bf16);
- ``..._smooth.safetensors``: the same with the time-embedding input restricted to slow
  frequencies, so the random model varies smoothly with sigma as trained models do (random
  fast-frequency weights make block outputs change unpredictably from step to step);
- ``models/text_encoders/diffspec_random_clip_l.safetensors``: a random CLIP-L text encoder;
- ``models/vae/diffspec_random_taef1.safetensors``: a random 16-channel TAESD.
"""

import math
import os
import sys

comfy_root = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else ".")
sys.path.insert(0, comfy_root)
sys.argv = [sys.argv[0], "--cpu"]

import comfy.options  # noqa: E402

comfy.options.enable_args_parsing()

import comfy.ops  # noqa: E402
import torch  # noqa: E402
from comfy.ldm.flux.model import Flux  # noqa: E402
from comfy.taesd.taesd import TAESD  # noqa: E402
from safetensors.torch import save_file  # noqa: E402
from transformers import CLIPTextConfig, CLIPTextModelWithProjection  # noqa: E402

models = os.path.join(comfy_root, "models")


def save(sd: dict, folder: str, name: str) -> None:
    os.makedirs(os.path.join(models, folder), exist_ok=True)
    save_file({k: v.contiguous() for k, v in sd.items()}, os.path.join(models, folder, name))


torch.manual_seed(0)
flux = Flux(image_model="flux", operations=comfy.ops.disable_weight_init, dtype=torch.bfloat16, in_channels=16,
            out_channels=16, vec_in_dim=768, context_in_dim=768, hidden_size=3072, mlp_ratio=4.0, num_heads=24,
            depth=1, depth_single_blocks=2, axes_dim=[16, 56, 56], theta=10000, patch_size=2, qkv_bias=True,
            guidance_embed=False, txt_ids_dims=[])
with torch.no_grad():
    for name, p in flux.named_parameters():
        if name.endswith("bias"):
            p.zero_()
        elif name.endswith("scale"):
            p.fill_(1.0)
        else:
            p.normal_(0, 0.02)
sd = flux.state_dict()
save(sd, "diffusion_models", "diffspec_tiny_flux.safetensors")
# time_in sees [cos(1000 sigma f_i), sin(1000 sigma f_i)], f_i = 10000 ** (-i / 128): keep 1000 f_i <= 3
fast = 1000 * torch.exp(-math.log(10000.0) * torch.arange(128) / 128) > 3.0
w = sd["time_in.in_layer.weight"].clone()
w[:, :128][:, fast] = 0
w[:, 128:][:, fast] = 0
save({**sd, "time_in.in_layer.weight": w}, "diffusion_models", "diffspec_tiny_flux_smooth.safetensors")

clip = CLIPTextModelWithProjection(CLIPTextConfig(
    vocab_size=49408, hidden_size=768, intermediate_size=3072, num_hidden_layers=12, num_attention_heads=12,
    max_position_embeddings=77, hidden_act="quick_gelu", projection_dim=768)).half()
save(clip.state_dict(), "text_encoders", "diffspec_random_clip_l.safetensors")

taesd = TAESD(latent_channels=16)
with torch.no_grad():
    for name, p in taesd.named_parameters():
        if name == "vae_scale":
            p.fill_(1.0)
        elif name == "vae_shift" or name.endswith("bias"):
            p.zero_()
        else:
            p.normal_(0, (2.0 / p[0].numel()) ** 0.5)
save(taesd.state_dict(), "vae", "diffspec_random_taef1.safetensors")
print("written under", models)
