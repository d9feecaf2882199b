"""Profile whole ``dit-cache`` runs per arm on a real-size random-weight DiT: where a forecast step's time goes.

On launch-bound models (DiT-XL/2 256², PixArt 1024² at batch 1 on an H200) the 2026-11-25 runs put a forecast
step at 3-9 ms in one process and 1.4-2.4 ms in another. This times one run of each arm (after a warmup run)
under ``torch.profiler`` and reports, per arm: wall-clock, summed GPU kernel time, kernel launches and host
syncs (``cudaStreamSynchronize`` / ``cudaDeviceSynchronize`` / device-to-host copies), and the ops with the most
CPU time. Usage (device machine, repository root)::

    python3 scripts/gpu/profile_dit_step.py --model dit-xl-2-256 --out $OUT
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from diffspec.bench.dit_cache_workloads import make_workload
from diffspec.bench.timing import Arm, synchronize
from diffspec.config import ForecastConfig, SpecaConfig
from diffspec.forecast.calibrate import replay_schedule

RECORD = Path(__file__).resolve().parents[2] / "diffspec" / "weights" / "tiny-dit" / "diffspec_speca.json"
SYNCS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaMemcpyAsync", "cudaMemcpy")
LAUNCHES = ("cudaLaunchKernel", "cuLaunchKernel", "cuLaunchKernelEx", "cudaLaunchKernelExC")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="dit-xl-2-256")
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--out", default=os.environ.get("OUT", "."))
    args = parser.parse_args()
    dev = torch.device(args.device)
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    w = make_workload(args.model, device=dev, dtype=dtype, steps=args.steps, batch=1, guidance_scale=4.0)
    full_rate = json.loads(RECORD.read_text())["full_rate"]
    arms = [Arm("baseline", lambda seeds: w.generate(seeds)), w.method_arm("taylor", ForecastConfig()),
            w.method_arm("speca", SpecaConfig()),
            w.method_arm("speca", SpecaConfig(replay_steps=replay_schedule(full_rate, 10)))]
    names = ["baseline", "taylor", "speca", "speca-replay10"]
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if dev.type == "cuda" else [])
    report: dict[str, dict] = {}
    lines = [f"{args.model}, {args.steps} steps, batch 1, {dtype}, {torch.cuda.get_device_name(dev) if dev.type == 'cuda' else 'cpu'}"]
    with torch.inference_mode():
        for name, arm in zip(names, arms):
            arm.enable()
            try:
                arm.run(w.seeds)  # warmup
                synchronize(dev)
                t0 = time.perf_counter()
                arm.run(w.seeds)
                synchronize(dev)
                wall = time.perf_counter() - t0
                with profile(activities=activities) as prof:
                    arm.run(w.seeds)
                    synchronize(dev)
            finally:
                arm.disable()
            events = prof.key_averages()
            gpu_ms = sum(e.self_device_time_total for e in events) / 1e3 if dev.type == "cuda" else None
            launches = sum(e.count for e in events if e.key in LAUNCHES)
            syncs = {e.key: e.count for e in events if e.key in SYNCS}
            report[name] = {"wall_s": round(wall, 4), "gpu_kernel_ms": gpu_ms, "launches": launches, "syncs": syncs}
            lines += [f"\n== {name}: wall {wall * 1e3:.1f} ms (unprofiled run), GPU kernels {gpu_ms} ms, "
                      f"launches {launches}, syncs {syncs}",
                      events.table(sort_by="self_cpu_time_total", row_limit=18)]
    out = Path(args.out)
    (out / f"dit-step-profile-{args.model}.json").write_text(json.dumps(report, indent=2))
    (out / f"dit-step-profile-{args.model}.txt").write_text("\n".join(lines))
    for name, r in report.items():
        print(name, r)


if __name__ == "__main__":
    main()
