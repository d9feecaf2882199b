"""``speca`` on a real-size random-weight DiT replaying the full-step schedule that calibration chose on
the trained ``tiny-dit`` (random weights make the gate's own decisions unrepresentative).

The schedule comes from ``diffspec/weights/tiny-dit/diffspec_speca.json`` (its per-step full rate at 50
steps), thinned to ``n`` full steps by :func:`diffspec.forecast.calibrate.replay_schedule`. One JSON per
``n``, each with its own same-seed baseline. Usage (device machine, repository root)::

    python3 scripts/gpu/dit_cache_replay.py --model flux-1024 --full 10,17 --out $OUT
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import torch

from diffspec.bench.dit_cache import run_dit_cache
from diffspec.forecast.calibrate import replay_schedule

RECORD = Path(__file__).resolve().parents[2] / "diffspec" / "weights" / "tiny-dit" / "diffspec_speca.json"


def device_tag(device: str) -> str:
    """``h100`` / ``h200`` / ... from the GPU's name (``cpu`` off the GPU), for file names."""
    if not device.startswith("cuda"):
        return "cpu"
    name = torch.cuda.get_device_name(device).lower()
    return next((k for k in ("h100", "h200", "a100", "l40s") if k in name), "gpu")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="flux-1024")
    parser.add_argument("--full", default="10,17", help="full steps of each replayed schedule")
    parser.add_argument("--compile", default="none")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--out", default=os.environ.get("OUT", "."))
    args = parser.parse_args()
    record = json.loads(RECORD.read_text())
    for n in (int(v) for v in args.full.split(",")):
        steps = replay_schedule(record["full_rate"], n)
        doc = run_dit_cache(args.model, methods=["speca"], device=args.device, steps=record["steps"],
                            repeats=args.repeats, warmup=1, overrides={"speca.replay_steps": steps},
                            compile=args.compile, show_progress=False)
        doc["notes"].append(f"speca replays the full-step schedule calibration chose on the trained tiny-dit "
                            f"({RECORD.name}: target PSNR {record['target_psnr']} dB, {record['full_steps']} full "
                            f"steps per image at {record['steps']} steps), thinned to {n} full steps: {list(steps)}; "
                            "no verifier runs in replay mode")
        compiled = "" if args.compile == "none" else f"-{args.compile}"
        path = Path(args.out) / f"dit-cache-{args.model}-{device_tag(args.device)}-replay{n}{compiled}.json"
        path.write_text(json.dumps(doc, indent=2))
        run = doc["runs"][-1]
        print(f"{args.model} replay n={n}: {run['latency_s']['median']:.3f}s, "
              f"{run['speedup_vs_baseline']:.2f}x, evals {run['target_evals']}, PSNR {run['quality']['psnr']}")


if __name__ == "__main__":
    main()
