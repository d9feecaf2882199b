"""Where does ``mc-sjd`` lose tokens on a trained AR reference model, and can residual siblings recover them?

Runs ``mc-sjd`` (window 64, ``init="repeat"``, the ``ar-image`` arm) one image at a time and records, per
round, the verification of the window. Reports:

- where each round's first rejection falls (offset in the window; ``>= 10`` pooled);
- acceptance rate and mean TV between the verifying row ``p`` and the draft's law ``q`` per offset;
- for the rounds whose first rejection is at offset ``< 10``: how often the residual token, drawn as
  ``argmax(log (p - q)_+ + g)``, is among the ``w`` siblings ranked on ``log s + g`` (``s``: an estimate of
  the residual law known before the call) for ``w`` = 1, 2, 4, 8, 16: the hit rate of ``mc-sjd-ra``
  (:mod:`diffspec.ar_image.residual`, which ranks on ``q``).

Example:
    PYTHONPATH=. OMP_NUM_THREADS=2 python scripts/ar_rejection_profile.py --models tiny-ar-noisy,tiny-ar-tex \\
        --out benchmarks/results/ar-image-rejection-profile-cpu.json
"""

from __future__ import annotations

import argparse
import json
import platform
from datetime import datetime, timezone
from typing import Any

import torch

from diffspec.ar_image.jacobi import jacobi_sample
from diffspec.models import load_ar_target
from diffspec.speculation.sampling import gumbel, mrs
from diffspec.stats import SpecStats

POOL = 10
WIDTHS = (1, 2, 4, 8, 16)


def profile(model: str, images: int, window: int) -> dict[str, Any]:
    """The profile of one model (see the module docstring)."""
    target = load_ar_target(model, device="cpu")
    n = target.num_tokens
    rounds: list[list[tuple[torch.Tensor, ...]]] = []

    def record(p: torch.Tensor, q: torch.Tensor, x: torch.Tensor, g: Any) -> Any:
        res = mrs(p, q, x, g)
        rounds[-1].append((res.accepted[0].clone(), p[0, :POOL].clone(), q[0, :POOL].clone(), x[0, :POOL].clone(),
                           0.5 * (p[0] - q[0]).abs().sum(-1)))
        return res

    first = torch.zeros(POOL + 1)
    acc, tv, seen = torch.zeros(POOL), torch.zeros(POOL), torch.zeros(POOL)
    rejected: list[tuple[int, torch.Tensor, torch.Tensor, int]] = []
    calls = 0
    with torch.inference_mode():
        for seed in range(images):
            rounds.append([])
            session = target.start(class_labels=[seed % 10], guidance_scale=target.default_guidance_scale)
            stats = SpecStats()
            jacobi_sample(session, n, window, "maximal", "repeat", {"temperature": 1.0},
                          [torch.Generator().manual_seed(seed)], stats, acceptance=record)
            calls += stats.target_calls
            commit = 1
            for accepted, p, q, x, dist in rounds[-1]:
                left = n - commit
                accepted, dist = accepted[:left], dist[:left]
                lead = int(accepted.long().cumprod(0).sum())
                first[min(lead, POOL)] += 1
                k = min(POOL, left)
                acc[:k] += accepted[:k].float()
                tv[:k] += dist[:k]
                seen[:k] += 1
                if lead < min(POOL, left):
                    rejected.append((lead, p[lead], q[lead], int(x[lead])))
                commit += lead + 1
                if commit >= n:
                    break
    p = torch.stack([r[1] for r in rejected])
    q = torch.stack([r[2] for r in rejected])
    drafts = torch.tensor([r[3] for r in rejected])
    at0 = torch.tensor([r[0] == 0 for r in rejected])
    res = (p - q).clamp(min=0)
    res = res / res.sum(-1, keepdim=True)
    noise = gumbel(torch.rand(p.shape, generator=torch.Generator().manual_seed(0)))
    drawn = (res.log() + noise).argmax(-1)
    tiny = torch.finfo(q.dtype).tiny
    hits = {}
    for name, estimate in (("q", q), ("sqrt(q)", q.sqrt()), ("uniform", torch.ones_like(q))):
        score = (estimate.clamp(min=tiny).log() + noise).scatter(-1, drafts.unsqueeze(-1), float("-inf"))
        top = score.topk(max(WIDTHS), -1).indices
        hits[name] = {str(w): {"all": round((top[:, :w] == drawn.unsqueeze(1)).any(1).float().mean().item(), 3),
                               "offset_0": round((top[at0, :w] == drawn[at0].unsqueeze(1)).any(1).float().mean().item(),
                                                 3)}
                      for w in WIDTHS}
    total = first.sum()
    return {"images": images, "tokens": n, "window": window, "rounds": int(total),
            "step_compression_with_prefill": round(images * n / calls, 3),
            "first_rejection_offset": {(str(k) if k < POOL else f">={POOL}"): round((first[k] / total).item(), 3)
                                       for k in range(POOL + 1)},
            "acceptance_by_offset": [round(v, 3) for v in (acc / seen).tolist()],
            "tv_by_offset": [round(v, 3) for v in (tv / seen).tolist()],
            "rejections_profiled": len(rejected), "sibling_hit_rate": hits}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="tiny-ar-noisy,tiny-ar-tex")
    parser.add_argument("--images", type=int, default=150)
    parser.add_argument("--window", type=int, default=64)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    doc = {"what": __doc__.splitlines()[0], "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
           "machine": {"device": f"CPU ({platform.machine()})", "threads": torch.get_num_threads(),
                       "torch": torch.__version__},
           "models": {m: profile(m, args.images, args.window) for m in args.models.split(",")}}
    text = json.dumps(doc, indent=2)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
