"""Quality of every exact-diffusion arm at one step count, merged into the committed sweep JSON.

``scripts/exact_diffusion_sweep.py`` measured quality at 100 steps only; this adds reference FID,
class accuracy and the two-sample test for every arm (no ODE-solver peers) at 50 and 250 steps.
One process per step count (each single-threaded), then merge, from the repository root:

``OMP_NUM_THREADS=1 PYTHONPATH=. python scripts/exact_diffusion_quality_sweep.py run STEPS SAMPLES PART.json``
``PYTHONPATH=. python scripts/exact_diffusion_quality_sweep.py merge SWEEP.json PART.json [PART.json ...]``

``merge`` replaces the sweep's runs at each part's step count with the part's runs (cost and quality
from the same invocation) and records the part's sample count in the notes.
"""

import json
import sys

from diffspec.bench import run_bench

METHODS = ["coupling", "autospec", "coupling-forecast", "fewer-steps", "picard"]

if sys.argv[1] == "run":
    steps, n, out = int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    doc = run_bench("exact-diffusion", model="tiny-dit", steps=[steps], quality_steps=[steps], methods=METHODS,
                    repeats=2, warmup=1, quality_samples=n, solver_steps=(), show_progress=False)
    json.dump(doc, open(out, "w"), indent=2)
else:
    sweep, parts = json.load(open(sys.argv[2])), [json.load(open(p)) for p in sys.argv[3:]]
    for part in parts:
        steps, n = part["workload"]["steps"], part["workload"]["quality_samples"]
        sweep["runs"] = [r for r in sweep["runs"] if r["steps"] != steps] + part["runs"]
        sweep["created"] = [*sweep["created"], part["created"]]
        sweep["workload"]["quality_steps"] = sorted({*sweep["workload"]["quality_steps"], steps})
        sweep["workload"].setdefault("quality_samples_by_steps", {})[str(steps)] = n
        sweep["notes"].append(f"Steps {steps}: cost and quality of every arm re-measured in one invocation of "
                              f"scripts/exact_diffusion_quality_sweep.py with {n} quality samples per arm "
                              "(independent seeds per arm).")
    sweep["runs"].sort(key=lambda r: r["steps"])
    json.dump(sweep, open(sys.argv[2], "w"), indent=2)
