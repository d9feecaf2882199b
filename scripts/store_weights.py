"""Store the shipped weights narrower, in place: the LlamaGen GPTs (``*/gpt`` folders) as per-row int8
(``model.int8.safetensors``, read by ``diffspec.models.load_gpt``), every other float32 tensor as float16,
and the FID statistics (float64) as float32.

The loaders cast back to what the code computes in (float32 modules, float64 FID statistics), so a model's
outputs change only by the rounding of its weights; ``scripts/measure_weights.py`` measures what that costs.
Integer tensors, file names and safetensors metadata are kept; a file already narrow is left alone. Run it
after a training script has written float32 weights into ``diffspec/weights``.

    python scripts/store_weights.py diffspec/weights
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from diffspec.models import load_gpt, save_gpt

NARROWER = {torch.float32: torch.float16}
"""Weights: float32 -> float16."""
STATISTICS = ("fid_stats.safetensors", {torch.float64: torch.float32})
"""FID statistics (a file name and its rule): float64 -> float32, no narrower."""


def store_narrower(path: Path) -> tuple[int, int]:
    """Rewrite one ``.safetensors`` file with narrower dtypes; returns its sizes before and after."""
    rule = STATISTICS[1] if path.name == STATISTICS[0] else NARROWER
    with safe_open(str(path), framework="pt") as f:
        metadata = f.metadata()
        tensors = {k: f.get_tensor(k) for k in f.keys()}
    before = path.stat().st_size
    if not any(t.dtype in rule for t in tensors.values()):
        return before, before
    save_file({k: t.to(rule.get(t.dtype, t.dtype)).contiguous() for k, t in tensors.items()}, str(path),
              metadata=metadata)
    return before, path.stat().st_size


def store_int8_gpt(folder: Path) -> tuple[int, int]:
    """Store a ``LlamaGenTransformer`` folder's ``model.safetensors`` as int8; returns the sizes of its weight
    file before and after."""
    before = (folder / "model.safetensors").stat().st_size
    return before, save_gpt(load_gpt(folder), folder, "int8").stat().st_size


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("folder", type=Path, help="folder whose *.safetensors files are rewritten (recursively)")
    args = p.parse_args()
    for weights in sorted(args.folder.glob("*/gpt/model.safetensors")):
        before, after = store_int8_gpt(weights.parent)
        print(f"{weights.parent}: model.safetensors {before:,} -> model.int8.safetensors {after:,} bytes")
    total = [0, 0]
    for path in sorted(args.folder.rglob("*.safetensors")):
        before, after = store_narrower(path)
        total[0], total[1] = total[0] + before, total[1] + after
        if after != before:
            print(f"{path}: {before:,} -> {after:,} bytes")
    files = sum(path.stat().st_size for path in args.folder.rglob("*") if path.is_file())
    print(f"other safetensors: {total[0]:,} -> {total[1]:,} bytes; all files in {args.folder}: {files:,} bytes")


if __name__ == "__main__":
    main()
