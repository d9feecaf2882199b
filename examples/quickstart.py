"""Wrap the shipped tiny DiT with `taylor`, compare with the plain pipeline, save both grids.

    python examples/quickstart.py
"""

import torch

from diffspec import SpeculativePipeline
from diffspec.data import make_grid_png
from diffspec.metrics import psnr
from diffspec.models import load_pipeline

pipe = load_pipeline("tiny-dit")
labels = pipe.get_label_ids(["circle", "star", "crescent", "hexagon"])


def run(p):
    generators = [torch.Generator().manual_seed(i) for i in range(len(labels))]
    return p(class_labels=labels, num_inference_steps=50, generator=generators, output_type="pt").images


plain = run(pipe)
spec = SpeculativePipeline.from_pipe(pipe, method="taylor")  # interval=5, order=1 by default
fast = run(spec)
print(spec.stats.full_steps, "full and", spec.stats.forecast_steps, "forecast steps;",
      f"PSNR vs plain {psnr(fast, plain, data_range=1.0):.1f} dB")
spec.disable()  # pipe is now exactly the plain pipeline again
make_grid_png(torch.cat([plain, fast]) * 2 - 1, "quickstart.png", nrow=len(labels))
