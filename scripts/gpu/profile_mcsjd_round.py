"""Profile rounds of diffspec's ``mc-sjd`` loop on a real-size random-weight LlamaGen (GPU): where the time
outside the target's forward goes.

Usage (device machine, repository root): ``python3 scripts/gpu/profile_mcsjd_round.py --out $OUT``.
Writes ``mcsjd-round-profile.txt`` (ops by self CPU time, kernel launches inside and outside
``session.step``) under ``--out``.
"""

from __future__ import annotations

import argparse
import os

import torch
from torch.profiler import ProfilerActivity, profile, record_function

from diffspec.ar_image.config import MCSJDConfig
from diffspec.ar_image.jacobi import jacobi_sample
from diffspec.bench.ar_image_cost import RoundClock, _session, _Stop, build_cost_model


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="llamagen-7b-size")
    parser.add_argument("--tokens", type=int, default=576)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--window", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--out", default=os.environ.get("OUT", "."))
    args = parser.parse_args()
    target = build_cost_model(args.model, args.tokens, args.device,
                              torch.bfloat16 if args.device == "cuda" else torch.float32)
    config = MCSJDConfig(window=args.window)

    def run(rounds: int, prof: bool) -> None:
        session = _session(target, args.batch, 4.0)
        if prof:
            step = session.step

            def step_marked(tokens: torch.Tensor, start: torch.Tensor) -> torch.Tensor:
                with record_function("target_forward"):
                    return step(tokens, start)

            session.step = step_marked
        gen = [torch.Generator(args.device).manual_seed(b) for b in range(args.batch)]
        try:
            jacobi_sample(session, target.num_tokens, config.window, config.coupling, config.init, config.sampling,
                          gen, bar=RoundClock(rounds))
        except _Stop:
            pass
        if args.device == "cuda":
            torch.cuda.synchronize()

    with torch.inference_mode():
        run(4, False)
        with profile(activities=[ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if args.device == "cuda" else [])) as p:
            run(args.rounds, True)
    events = p.key_averages()
    table = events.table(sort_by="self_cpu_time_total", row_limit=45)
    fwd = [e for e in events if e.key == "target_forward"]
    launches = [e for e in events if e.key in ("cudaLaunchKernel", "cuLaunchKernel", "cudaLaunchKernelExC")]
    lines = [f"{args.model} tokens={args.tokens} batch={args.batch} window={args.window} rounds={args.rounds}",
             f"target_forward: {[(e.count, round(e.cpu_time_total / 1e3, 2)) for e in fwd]} (count, CPU ms total)",
             f"kernel launches: {[(e.key, e.count, round(e.cpu_time_total / 1e3, 2)) for e in launches]}",
             table]
    text = "\n".join(lines)
    with open(os.path.join(args.out, "mcsjd-round-profile.txt"), "w") as f:
        f.write(text)
    print(text[:6000])


if __name__ == "__main__":
    main()
