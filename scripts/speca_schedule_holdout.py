"""Do the schedules ``diffspec calibrate --schedules`` searched hold up on seeds the search never saw?

The search (:mod:`diffspec.forecast.schedule_search`) keeps a move when the *calibration* samples get closer
to their full-compute output, so it can fit their noise. For every schedule in ``tiny-dit``'s calibration
record this scores, on *held-out seeds* (neither the calibration's 5000.. nor the benchmarks' seeds), the
searched schedule and the two starts it came from at the same size and granularity: the even grid ``taylor``
uses and the calibrated gate's placement. All three are replayed without a verifier (order 2), so they
cost the same full steps.

Example:
    PYTHONPATH=. OMP_NUM_THREADS=1 python scripts/speca_schedule_holdout.py \\
        --out benchmarks/results/speca-schedule-holdout-tiny-dit-cpu.json
"""

from __future__ import annotations

import argparse
import json
import platform
from datetime import datetime, timezone

import torch

from diffspec.bench.dit_cache_workloads import make_workload
from diffspec.config import SpecaConfig
from diffspec.forecast.calibrate import load_calibration, replay_schedule
from diffspec.forecast.schedule_search import even_schedule
from diffspec.metrics import psnr
from diffspec.models import resolve_model_path

HELD_OUT_SEED0 = 300_000
"""Held-out seeds start here: disjoint from calibration (5000.., 100000..), benchmark (0.., 1000..) and the
verifier-correlation script's seeds (200000..)."""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=40)
    parser.add_argument("--record", default=None,
                        help="folder of another calibration record of tiny-dit (default: the shipped one)")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()

    record = load_calibration(args.record or resolve_model_path("tiny-dit"))
    if not record or not record.get("schedules"):
        raise SystemExit("tiny-dit's calibration record has no schedules: run `diffspec calibrate --schedules ...`")
    steps = record["steps"]
    wl = make_workload("tiny-dit", device=torch.device("cpu"), dtype=torch.float32, steps=steps, batch=args.seeds,
                       guidance_scale=record["guidance_scale"])
    seeds = list(range(HELD_OUT_SEED0, HELD_OUT_SEED0 + args.seeds))

    def score(schedule: tuple[int, ...], granularity: str) -> float:
        arm = wl.method_arm("speca", SpecaConfig(replay_steps=schedule, granularity=granularity, order=2))
        arm.enable()
        try:
            return psnr(arm.run(seeds), reference, data_range=1.0)
        finally:
            arm.disable()

    rows = []
    with torch.inference_mode():
        reference = wl.generate(seeds)
        for e in record["schedules"]:
            n, g = e["full_steps"], e["granularity"]
            schedules = {"searched": tuple(e["schedule"]), "even grid": even_schedule(n, steps),
                         "gate's placement": replay_schedule(record["full_rate"], n)}
            row = {"full_steps": n, "granularity": g, "searched_from": e["start"],
                   "calibration_psnr": {"searched": e["psnr"], **{k: v["start_psnr"] for k, v in e["starts"].items()}},
                   "held_out_psnr": {k: round(score(s, g), 3) for k, s in schedules.items()},
                   "schedules": {k: list(s) for k, s in schedules.items()}}
            rows.append(row)
            print(json.dumps({k: row[k] for k in ("full_steps", "granularity", "calibration_psnr", "held_out_psnr")}),
                  flush=True)
    doc = {"script": "scripts/speca_schedule_holdout.py", "created": datetime.now(timezone.utc).isoformat(),
           "machine": {"device": f"CPU ({platform.machine()}, {torch.get_num_threads()} threads)",
                       "torch": torch.__version__},
           "model": "tiny-dit", "steps": steps, "guidance_scale": record["guidance_scale"], "order": 2,
           "record": args.record or "shipped", "calibration_seeds": record["seeds"], "held_out_seeds": [seeds[0], seeds[-1]], "rows": rows}
    with open(args.out, "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
