"""Diagnose LANTERN's relaxed acceptance on ``tiny-ar``: per-position emitted law vs the target law.

Records ``(p, q)`` at every verified draft position of real ``lantern`` runs (hooking
``relaxed_mrs``), then computes, for several ``delta`` and ``k``, the closed-form law of the token a
position emits (accepted draft or residual draw):
``e(y) = min(q(y), p(y) + B_y) + (1 - sum_x min(q(x), p(x) + B_x)) r(y)``, ``r ~ (p - q)_+``,
checks it by Monte Carlo against ``relaxed_mrs`` itself, and reports ``TV(e, p)`` next to the
per-draft budget ``TV(p, p~_x) = B_x <= delta`` and the decoded-patch distance of the neighbours.

Example:
    python scripts/lantern_diagnose.py --images 16 --out benchmarks/results/ar-image-tiny-ar-cpu-lantern-diagnosis.json
"""

from __future__ import annotations

import argparse
import json

import torch

from diffspec import SpeculativePipeline
from diffspec.ar_image import lantern as lantern_mod
from diffspec.ar_image.neighbours import latent_neighbours
from diffspec.ar_image.relaxed import neighbour_budget, relaxed_mrs
from diffspec.models import load_ar_target


def emitted_law(p: torch.Tensor, q: torch.Tensor, nb: torch.Tensor, delta: float) -> torch.Tensor:
    """Closed-form law of the token emitted at each position (rows of ``p``/``q``: ``(N, V)``)."""
    n, vocab = p.shape
    every = torch.arange(vocab).expand(n, -1)
    budget = neighbour_budget(p.unsqueeze(1).expand(-1, vocab, -1), every, nb, delta)  # (N, V): B_y
    kept = torch.minimum(q, p + budget)
    res = (p - q).clamp_min(0)
    mass = res.sum(-1, keepdim=True)
    res = torch.where(mass > 0, res / mass.clamp_min(1e-30), p)
    return kept + (1 - kept.sum(-1, keepdim=True)).clamp_min(0) * res


def _position_stats(p: torch.Tensor, q: torch.Tensor, nb: torch.Tensor, nb_dist: torch.Tensor,
                    delta: float) -> dict[str, torch.Tensor]:
    """Per-position statistics of a block of rows (drafts weighted by ``q``, the law they are drawn from)."""
    n, vocab = p.shape
    every = torch.arange(vocab).expand(n, -1)
    e = emitted_law(p, q, nb, delta)
    budget = neighbour_budget(p.unsqueeze(1).expand(-1, vocab, -1), every, nb, delta)
    mass = p.unsqueeze(1).expand(-1, vocab, -1).gather(-1, nb[every])  # (n, V, k)
    taken = mass.cumsum(-1) <= delta
    n_taken = taken.sum(-1).double()
    dist_taken = (taken * nb_dist.unsqueeze(0)).sum(-1) / n_taken.clamp_min(1)
    some = (q * (n_taken > 0)).sum(-1)
    return {"tv": 0.5 * (e - p).abs().sum(-1), "budget": (q * budget).sum(-1), "budget_max": budget.max(-1).values,
            "accept": torch.minimum(q, p + budget).sum(-1), "tail_e": (e * (p < 1e-3)).sum(-1),
            "tail_p": (p * (p < 1e-3)).sum(-1), "taken": (q * n_taken).sum(-1),
            "dist": torch.where(some > 0, (q * dist_taken * (n_taken > 0)).sum(-1) / some.clamp_min(1e-12),
                                torch.full_like(some, float("nan")))}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--images", type=int, default=16)
    ap.add_argument("--mc", type=int, default=200_000)
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    torch.manual_seed(0)
    target = load_ar_target("tiny-ar")
    vocab = target.codebook_size
    rec: list[tuple[torch.Tensor, torch.Tensor]] = []
    orig = lantern_mod.relaxed_mrs

    def hook(p, q, draft, neighbours, delta, lam, generator):  # noqa: ANN001, ANN202
        rec.append((p.reshape(-1, vocab).clone(), q.reshape(-1, vocab).clone()))
        return orig(p, q, draft, neighbours, delta, lam, generator)

    lantern_mod.relaxed_mrs = hook
    out: dict = {"model": "tiny-ar", "vocab": vocab, "guidance_scale": target.default_guidance_scale,
                 "images": args.images, "machine": "CPU"}
    try:
        spec = SpeculativePipeline.from_pipe(target, method="lantern", delta=0.0)  # exact trajectory
        spec.set_progress_bar_config(disable=True)
        with torch.inference_mode():
            for s in range(args.images):
                spec(class_labels=[s % 10], generator=torch.Generator().manual_seed(s), output_type="tokens")
    finally:
        lantern_mod.relaxed_mrs = orig
    p = torch.cat([r[0] for r in rec]).double()
    q = torch.cat([r[1] for r in rec]).double()
    p, q = p / p.sum(-1, keepdim=True), q / q.sum(-1, keepdim=True)
    out["positions"] = p.shape[0]
    out["p_top1_median"] = float(p.max(-1).values.median())
    out["tv_p_q_mean"] = float(0.5 * (p - q).abs().sum(-1).mean())
    codebook = target.codebook.float()
    pair = torch.cdist(codebook, codebook)
    off = pair[~torch.eye(vocab, dtype=torch.bool)]
    out["code_distance_median_all_pairs"] = round(float(off.median()), 4)
    out["code_distance_nearest_mean"] = round(float(pair.masked_fill(torch.eye(vocab, dtype=torch.bool), float("inf")).min(1).values.mean()), 4)
    rows = []
    for k in (vocab - 1, 64, 16, 4):
        nb = latent_neighbours(codebook, k)
        nb_dist = pair.gather(1, nb)  # (V, k), nearest first
        for delta in (0.0, 0.01, 0.05, 0.1):
            parts = [_position_stats(p[i:i + 32], q[i:i + 32], nb, nb_dist, delta) for i in range(0, p.shape[0], 32)]
            cat = {key: torch.cat([part[key] for part in parts]) for key in parts[0]}
            tv = cat["tv"]
            row = {"k": k, "delta": delta,
                   "emitted_tv_vs_p_mean": round(float(tv.mean()), 4),
                   "emitted_tv_vs_p_p90": round(float(tv.quantile(0.9)), 4),
                   "emitted_tv_vs_p_max": round(float(tv.max()), 4),
                   "frac_positions_tv_over_delta": round(float((tv > delta + 1e-9).double().mean()), 4),
                   "draft_budget_mean": round(float(cat["budget"].mean()), 4),
                   "draft_budget_max": round(float(cat["budget_max"].max()), 4),
                   "acceptance_mean": round(float(cat["accept"].mean()), 4),
                   "emitted_mass_on_p_below_1e-3": round(float(cat["tail_e"].mean()), 4),
                   "p_mass_below_1e-3": round(float(cat["tail_p"].mean()), 4),
                   "neighbours_taken_mean": round(float(cat["taken"].mean()), 2),
                   "taken_neighbour_code_distance_mean": round(float(cat["dist"].nanmean()), 4)}
            rows.append(row)
            print(row, flush=True)
    out["rows"] = rows
    # Monte Carlo check of the closed form on the position with the largest delta=0.1 TV (k = V-1)
    nb = latent_neighbours(codebook, vocab - 1)
    e = emitted_law(p, q, nb, 0.1)
    i = int((0.5 * (e - p).abs().sum(-1)).argmax())
    g = torch.Generator().manual_seed(1)
    pi, qi = p[i].float(), q[i].float()
    draft = torch.multinomial(qi, args.mc, replacement=True, generator=g)
    res = relaxed_mrs(pi.expand(args.mc, -1), qi.expand(args.mc, -1), draft, nb, 0.1, None, g)
    hist = torch.bincount(res.tokens, minlength=vocab).double() / args.mc
    mc = {"position": i, "samples": args.mc, "tv_mc_vs_closed_form": round(float(0.5 * (hist - e[i]).abs().sum()), 4),
          "tv_mc_vs_p": round(float(0.5 * (hist - p[i]).abs().sum()), 4),
          "tv_closed_form_vs_p": round(float(0.5 * (e[i] - p[i]).abs().sum()), 4),
          "p_top1": round(float(p[i].max()), 4), "q_top1": round(float(q[i].max()), 4)}
    res0 = relaxed_mrs(pi.expand(args.mc, -1), qi.expand(args.mc, -1), draft, nb, 0.0, None, g)
    hist0 = torch.bincount(res0.tokens, minlength=vocab).double() / args.mc
    mc["tv_mc_vs_p_delta0"] = round(float(0.5 * (hist0 - p[i]).abs().sum()), 4)
    out["monte_carlo"] = mc
    print(mc)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
