"""Does ``speca``'s verifier error track the actual forecast error on the trained ``tiny-dit``?

Runs ``speca`` with a threshold that rejects nothing (every draft from step ``warmup`` on is checked,
``k_min=0``) and, on every call, the untouched transformer on the same inputs: the *actual* error
of a drafted step is ``||y_draft - y_full||_1 / ||y_full||_1`` of the whole model output (max over
the CFG-batched rows), the *verifier* error is the one the gate logs for that step (max over rows).
Reports Spearman rank correlations: over all checked drafts, per drafted run length, and within a
step index across seeds (does ``e`` rank the seeds' drafts at the same step right?).

Example:
    PYTHONPATH=. OMP_NUM_THREADS=1 python scripts/speca_verifier_correlation.py \\
        --out benchmarks/results/speca-verifier-correlation-tiny-dit-cpu.json
"""

from __future__ import annotations

import argparse
import copy
import json
import platform
from datetime import datetime, timezone

import torch

from diffspec import SpeculativePipeline
from diffspec.config import SpecaConfig
from diffspec.models import load_pipeline


def spearman(x: torch.Tensor, y: torch.Tensor) -> float:
    """Rank correlation (no tie correction; the errors are continuous)."""
    rx, ry = x.argsort().argsort().double(), y.argsort().argsort().double()
    return round(torch.corrcoef(torch.stack([rx, ry]))[0, 1].item(), 3)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=8)
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--k-max", type=int, default=8)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()

    pipe = load_pipeline("tiny-dit", dtype=torch.float32, device=torch.device("cpu"))
    pipe.set_progress_bar_config(disable=True)
    clean = copy.deepcopy(pipe.transformer)
    cfg = SpecaConfig(tau0=1e30, beta=1.0, tau_min=0.0, k_min=0, k_max=args.k_max, order=1, warmup=3)
    spec = SpeculativePipeline.from_pipe(pipe, method=cfg)
    actual: list[float] = []

    def hook(module, call_args, kwargs, out):  # after speca's own hook: the committed output
        y = out[0] if isinstance(out, tuple) else out.sample
        ref = clean(*call_args, **kwargs)
        r = ref[0] if isinstance(ref, tuple) else ref.sample
        actual.append(((y - r).abs().flatten(1).sum(1) / r.abs().flatten(1).sum(1)).max().item())

    handle = pipe.transformer.register_forward_hook(hook, with_kwargs=True)
    rows = []  # (seed, step, drafts since the last full step, verifier error, actual error)
    seeds = list(range(200_000, 200_000 + args.seeds))  # disjoint from bench and calibration seeds
    with torch.inference_mode():
        for seed in seeds:
            actual.clear()
            spec.stats.reset()
            spec(class_labels=[seed % len(pipe.labels)], generator=torch.Generator().manual_seed(seed),
                 num_inference_steps=args.steps, guidance_scale=4.0, output_type="pt")
            checked = {int(s): e for s, e, _ in spec.stats.extra.get("checked_errors", [])}
            since = 0
            for step, err in enumerate(actual):
                if step in checked:
                    rows.append((seed, step, since + 1, checked[step], err))
                since = 0 if err == 0.0 else since + 1
    handle.remove()
    v, a = torch.tensor([r[3] for r in rows]), torch.tensor([r[4] for r in rows])
    run, step = torch.tensor([r[2] for r in rows]), torch.tensor([r[1] for r in rows])
    by_run = {int(k): {"n": int((run == k).sum()), "spearman": spearman(v[run == k], a[run == k]),
                       "verifier_median": round(v[run == k].median().item(), 5),
                       "actual_median": round(a[run == k].median().item(), 5)}
              for k in sorted(set(run.tolist())) if (run == k).sum() >= 8}
    within = [spearman(v[step == s], a[step == s]) for s in sorted(set(step.tolist())) if (step == s).sum() >= 6]
    thirds = {f"steps {lo}-{hi - 1}": {"verifier_median": round(v[(step >= lo) & (step < hi)].median().item(), 5),
                                       "actual_median": round(a[(step >= lo) & (step < hi)].median().item(), 5)}
              for lo, hi in ((3, 17), (17, 33), (33, args.steps))}
    doc = {"script": "scripts/speca_verifier_correlation.py", "created": datetime.now(timezone.utc).isoformat(),
           "machine": {"device": f"CPU ({platform.machine()}, {torch.get_num_threads()} threads)",
                       "torch": torch.__version__},
           "model": "tiny-dit", "steps": args.steps, "seeds": [seeds[0], seeds[-1]], "config": cfg.to_dict(),
           "n_checked_drafts": len(rows), "spearman_all": spearman(v, a), "by_run_length": by_run,
           "within_step_mean_spearman": round(sum(within) / len(within), 3), "within_step_groups": len(within),
           "by_trajectory_part": thirds,
           "rows": [{"seed": r[0], "step": r[1], "run": r[2], "verifier": round(r[3], 6), "actual": round(r[4], 6)}
                    for r in rows]}
    with open(args.out, "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")
    print(json.dumps({k: doc[k] for k in ("n_checked_drafts", "spearman_all", "within_step_mean_spearman",
                                          "by_trajectory_part")}, indent=1))


if __name__ == "__main__":
    main()
