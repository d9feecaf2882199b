"""Where a `draft` caption's time goes on the trained tiny-vlm pair, against plain `generate` (CPU).

Forward hooks time every target / drafter forward and the drafter's preparation per caption;
the rest of the wall clock is generate's setup and the loop's own tensor work. The two arms run
interleaved (``repeats`` passes over the captions, each pass times both arms); every figure is
the median over the passes. Writes a JSON (default
``benchmarks/results/multimodal-tiny-vlm-cpu-profile.json``).

    OMP_NUM_THREADS=1 PYTHONPATH=. python scripts/profile_multimodal_draft.py [OUT.json] [k] [repeats]
"""

from __future__ import annotations

import collections
import datetime
import json
import statistics
import sys
import time
from pathlib import Path

import torch

import diffspec.multimodal.loop as loop
from diffspec import SpeculativePipeline
from diffspec.bench.multimodal import EVAL_SEED
from diffspec.bench.timing import machine_info
from diffspec.data import render_scenes
from diffspec.models.tiny_vlm import MAX_CAPTION_TOKENS, caption_inputs, load_tiny_vlm

N = 16


def main() -> None:
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "benchmarks/results/multimodal-tiny-vlm-cpu-profile.json")
    k = int(sys.argv[2]) if len(sys.argv) > 2 else 8
    target, processor, drafter, _ = load_tiny_vlm()
    images, _ = render_scenes(N, seed=EVAL_SEED)
    chunks = [caption_inputs(processor, images[i: i + 1]) for i in range(N)]
    spec = SpeculativePipeline.from_pipe((target, processor), method="draft", draft=drafter, num_draft_tokens=k)
    acc: dict[str, float] = collections.defaultdict(float)
    start: dict[str, float] = {}

    def timed(module: torch.nn.Module, key: str) -> None:
        module.register_forward_pre_hook(lambda *_: start.__setitem__(key, time.perf_counter()))

        def post(*_: object) -> None:
            acc[f"{key}_ms"] += time.perf_counter() - start[key]
            acc[f"{key}_calls"] += 1
        module.register_forward_hook(post)

    timed(target, "target_forward")
    timed(drafter, "drafter_forward")
    prepare = loop.prepare_drafter

    def timed_prepare(*args: object, **kwargs: object) -> object:
        t0 = time.perf_counter()
        result = prepare(*args, **kwargs)
        acc["prepare_drafter_ms (incl. its prefill forward)"] += time.perf_counter() - t0
        return result
    loop.prepare_drafter = timed_prepare
    repeats = int(sys.argv[3]) if len(sys.argv) > 3 else 5
    record = {"created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "machine": machine_info("cpu"), "captions": N, "num_draft_tokens": k, "repeats": repeats,
              "unit": "per caption, median over interleaved repeats"}
    gen = {"max_new_tokens": MAX_CAPTION_TOKENS, "do_sample": False}
    arms = {"draft": lambda c: spec(**c, **gen), "plain generate": lambda c: target.generate(**c, **gen)}
    rows: dict[str, list[dict[str, float]]] = {name: [] for name in arms}
    with torch.inference_mode():
        for run in arms.values():  # warmup
            for c in chunks:
                run(c)
        for _ in range(repeats):
            for name, run in arms.items():
                acc.clear()
                t0 = time.perf_counter()
                for c in chunks:
                    run(c)
                total = time.perf_counter() - t0
                row = {key: v / N * (1e3 if key.endswith("_ms") or "_ms " in key else 1) for key, v in acc.items()}
                row["total_ms"] = total / N * 1e3
                rows[name].append(row)
    for name, runs in rows.items():
        record[name] = {key: round(statistics.median(r[key] for r in runs), 3) for key in runs[0]}
    record["plain_over_draft_total"] = round(statistics.median(
        p["total_ms"] / d["total_ms"] for p, d in zip(rows["plain generate"], rows["draft"])), 3)
    out.write_text(json.dumps(record, indent=1) + "\n")
    print(json.dumps(record, indent=1))


if __name__ == "__main__":
    main()
