"""The committed exact-diffusion sweep: cost at 50/100/250 DDPM steps, quality of the new arms at 100.

Two suite runs concatenated into one JSON (the first, cost only, is quick; the second measures
quality), from the repository root:
``OMP_NUM_THREADS=1 PYTHONPATH=. python scripts/exact_diffusion_sweep.py OUT.json [QUALITY_SAMPLES]``.
Quality of every arm at 50 and 250 steps is then added by ``scripts/exact_diffusion_quality_sweep.py``
(which re-runs those groups and replaces their runs in OUT.json).
"""

import json
import sys

from diffspec.bench import run_bench

out, n = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 200
common = {"model": "tiny-dit", "repeats": 2, "warmup": 1, "quality_samples": n, "solver_steps": (10, 20, 50)}
cost = run_bench("exact-diffusion", steps=[50, 250], quality_steps=[], **common)
json.dump(cost, open(out, "w"), indent=2)  # kept if the quality run is cut short
quality = run_bench("exact-diffusion", steps=[100], quality_methods=["coupling-forecast", "picard", "ddim",
                                                                     "dpm-solver++"], **common)
doc = {**quality, "created": [cost["created"], quality["created"]]}
doc["workload"] = {**quality["workload"], "steps": [50, 100, 250], "quality_steps": [100]}
doc["runs"] = sorted(cost["runs"] + quality["runs"], key=lambda r: r["steps"])
doc["notes"] = quality["notes"] + [
    "Two invocations concatenated (scripts/exact_diffusion_sweep.py): steps 50 and 250 without quality, then 100 "
    "with quality for baseline, coupling-forecast, picard and the ODE solvers; coupling, autospec and fewer-steps "
    "quality at 100 steps (400 samples) is in exact-diffusion-tiny-dit-cpu.json.",
]
json.dump(doc, open(out, "w"), indent=2)
