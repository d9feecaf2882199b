"""How much could any gate gain on ``tiny-dit`` by placing its full steps better than a fixed interval?

A gate (``speca``'s verifier, or any other) only decides *where* the full steps go. This measures what that
choice is worth on the trained ``tiny-dit`` at a given number of full steps: starting from a schedule, the
local search of ``diffspec calibrate --schedules`` (:func:`~diffspec.forecast.schedule_search.refine_schedule`)
moves one full step at a time and keeps a move when it raises the PSNR against the full run on the
*calibration seeds*. The start and the result are then scored on *held-out seeds* (neither calibration nor
benchmark seeds), so an over-fitted schedule shows.
Starts: the even grid ``taylor`` uses at that size (warmup 2, the rest evenly spaced to the last step) and
the calibrated gate's own placement (``replay_schedule`` of the shipped ``full_rate``). Replayed schedules
run without a verifier (``SpecaConfig(replay_steps=...)``), so full steps are the only compute.

Example:
    PYTHONPATH=. OMP_NUM_THREADS=1 python scripts/speca_schedule_headroom.py \\
        --out benchmarks/results/speca-schedule-headroom-tiny-dit-cpu.json
"""

from __future__ import annotations

import argparse
import json
import platform
from datetime import datetime, timezone
from pathlib import Path

import torch

from diffspec.bench.dit_cache_workloads import make_workload
from diffspec.bench.equal_evals import CALIBRATION_SEED0, build_arm, measure
from diffspec.bench.timing import Arm
from diffspec.bench.workload import count_compute
from diffspec.forecast.calibrate import replay_schedule
from diffspec.forecast.schedule_search import even_schedule, refine_schedule

RECORD = Path(__file__).resolve().parents[1] / "diffspec" / "weights" / "tiny-dit" / "diffspec_speca.json"
HELD_OUT_SEED0 = 300_000
"""Held-out seeds start here: disjoint from calibration (100000..), benchmark (0.., 1000..) and the
verifier-correlation script's seeds (200000..)."""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="12,18", help="numbers of full steps (comma-separated)")
    parser.add_argument("--calibration-seeds", type=int, default=10)
    parser.add_argument("--held-out-seeds", type=int, default=40)
    parser.add_argument("--sweeps", type=int, default=4)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()

    steps = 50
    wl = make_workload("tiny-dit", device=torch.device("cpu"), dtype=torch.float32, steps=steps, batch=10,
                       guidance_scale=4.0)
    baseline = Arm("baseline", lambda seeds: wl.generate(seeds))
    sets = {"calibration": list(range(CALIBRATION_SEED0, CALIBRATION_SEED0 + args.calibration_seeds)),
            "held_out": list(range(HELD_OUT_SEED0, HELD_OUT_SEED0 + args.held_out_seeds))}
    refs, full_units = {}, 0
    with torch.inference_mode():
        for name, seeds in sets.items():
            per_call, refs[name] = count_compute(wl, baseline, seeds)
            full_units = max(per_call)
    full_rate = json.loads(RECORD.read_text())["full_rate"]

    def psnr(schedule: list[int], granularity: str, which: str) -> float:
        arm = build_arm(wl, "speca-replay", {"granularity": granularity, "order": 2, "replay_steps": schedule})
        with torch.inference_mode():
            return measure(wl, arm, sets[which], refs[which], full_units)["psnr"]

    def search(start: tuple[int, ...], granularity: str) -> tuple[tuple[int, ...], float, int]:
        return refine_schedule(lambda s: psnr(list(s), granularity, "calibration"), start, sweeps=args.sweeps)

    results = []
    for n_full in [int(s) for s in args.sizes.split(",")]:
        granularity = "block" if n_full <= 14 else "module"
        for start_name, start in (("even grid", even_schedule(n_full, steps)),
                                  ("gate's placement", replay_schedule(full_rate, n_full))):
            found, found_cal, tried = search(start, granularity)
            row = {"full_steps": n_full, "granularity": granularity, "start": start_name,
                   "start_schedule": list(start),
                   "start_psnr": {"calibration": psnr(list(start), granularity, "calibration"),
                                  "held_out": psnr(list(start), granularity, "held_out")},
                   "searched_schedule": list(found), "searched_psnr": {"calibration": found_cal,
                                                                 "held_out": psnr(list(found), granularity, "held_out")},
                   "schedules_tried": tried}
            results.append(row)
            print(json.dumps(row), flush=True)
    doc = {"script": "scripts/speca_schedule_headroom.py", "created": datetime.now(timezone.utc).isoformat(),
           "machine": {"device": f"CPU ({platform.machine()}, {torch.get_num_threads()} threads)",
                       "torch": torch.__version__},
           "model": "tiny-dit", "steps": steps, "guidance_scale": 4.0, "order": 2,
           "seeds": {k: [v[0], v[-1]] for k, v in sets.items()},
           "rule": "refine_schedule: move one full step by +-1 or +-2, keep a move that raises calibration PSNR by "
                   "> 0.05 dB; held-out PSNR is never used by the search",
           "results": results}
    with open(args.out, "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
