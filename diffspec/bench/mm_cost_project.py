"""Projected end-to-end speedups for ``multimodal-cost``: measured costs x acceptance measured elsewhere.

Model (greedy, exact; per row of a batch):
``plain = B * prefill + (N - 1) * decode``;
``spec = B * prefill' + B * drafter_prefill + (N - 1) / (E[a] + 1) * (verify[K] + draft_round[K])``,
with ``prefill'`` the prefill with the score probe (``self-draft``, ``compressed-draft``) and
``E[a] = alpha (1 - alpha^K) / (1 - alpha)`` the mean accepted drafts per round for a per-draft
acceptance rate ``alpha`` (independent drafts), ``alpha`` from a committed ``multimodal`` JSON
(the trained tiny-vlm pair) or given. Every row says so: ``"projected"``.

Example:
    >>> round(expected_accepted(0.5, 2), 3)
    0.75
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

DEFAULT_ACCEPTANCE_JSON = Path(__file__).resolve().parents[2] / "benchmarks/results/multimodal-tiny-vlm-cpu.json"
LABEL = "projected: cost measured here x acceptance measured on the trained pair"
PROJECTION_MODEL = ("plain = B*prefill + (N-1)*decode; spec = B*prefill' + B*drafter_prefill + (N-1)/(E[a]+1) * "
                    "(verify[K] + draft_round[K]); E[a] = alpha*(1-alpha^K)/(1-alpha) (independent drafts); "
                    "prefill' includes the attention-score probe for self-draft/compressed-draft; B*prefill: "
                    "batch-B prefill taken as B x the measured batch-1 prefill (compute-bound), not measured; the "
                    "per-row acceptance is applied to the whole batch (a batch waits for its slowest row, so B>1 "
                    "rows are optimistic); decode/verify costs are measured at the prompt length (N adds <= 1% at "
                    ">= 8k context, more at 1k).")


def expected_accepted(alpha: float, k: int) -> float:
    """Mean accepted drafts per round for ``k`` drafts each accepted with probability ``alpha`` in turn."""
    return float(k) if alpha >= 1.0 else alpha * (1.0 - alpha**k) / (1.0 - alpha)


def _rates(value: Any) -> list[float]:
    items = value if isinstance(value, (list, tuple)) else str(value).split(",")
    try:
        rates = [float(v) for v in items if str(v).strip() != ""]
    except ValueError:
        raise ValueError(f"acceptance={value!r} is not allowed: per-draft rates in (0, 1], comma separated") from None
    if not rates or any(not 0.0 < r <= 1.0 for r in rates):
        raise ValueError(f"acceptance={value!r} is out of range: per-draft rates in (0, 1]")
    return rates


def acceptance_sources(acceptance: Any = None, acceptance_json: str | Path | None = None) -> list[dict[str, Any]]:
    """The acceptance rates to project with, each with where it comes from.

    Given ``acceptance``: those rates. Otherwise the batch-1 ``draft`` and ``text-draft`` arms of a
    ``multimodal`` suite JSON (default: the committed tiny-vlm CPU run), plus acceptance 1 (bound).
    """
    forced = {"label": "forced 1.0 (upper bound)", "acceptance_rate": 1.0, "source": "assumed, not measured"}
    if acceptance is not None:
        return [{"label": f"given {r:g}", "acceptance_rate": r, "source": "--set acceptance"}
                for r in _rates(acceptance)]
    path = Path(acceptance_json) if acceptance_json else DEFAULT_ACCEPTANCE_JSON
    if not path.is_file():
        raise ValueError(f"acceptance_json={str(path)!r} is not a file: give a multimodal suite JSON, or "
                         "--set acceptance=RATE[,RATE...]")
    doc = json.loads(path.read_text())
    if doc.get("suite") != "multimodal":
        raise ValueError(f"acceptance_json={str(path)!r} is a {doc.get('suite')!r} JSON; need a 'multimodal' one")
    out = [forced]
    for run in doc["runs"]:
        if run["method"] in ("draft", "text-draft") and run.get("acceptance_rate") is not None:
            out.append({"label": f"tiny-vlm {run['method']}", "acceptance_rate": run["acceptance_rate"],
                        "source": f"{path.name}: trained tiny-vlm pair, arm {run['method']!r} (batch 1, greedy, "
                        f"{doc['machine']['device']})",
                        "measured_at_k": run["config"].get("num_draft_tokens"),
                        "accepted_per_round_measured": run.get("accepted_per_round")})
    return out


def project(prefill: list[dict[str, Any]], runs: list[dict[str, Any]], sources: list[dict[str, Any]],
            new_tokens: list[int]) -> dict[str, Any]:
    """Projected speedups over plain decoding for every measured (model, context, batch, drafter) row."""
    pre = {(p["model"], p["visual_tokens"]): p for p in prefill}
    verify = {(r["model"], r["visual_tokens"], r["batch"]): r for r in runs if r["method"] == "target verify"}
    rows = []
    for r in runs:
        key = (r["model"], r["visual_tokens"], r["batch"])
        if r["method"] == "target verify" or key not in verify:
            continue
        p, v, B = pre[key[:2]], verify[key], r["batch"]
        decode = v["call_ms"]["0"]["median"]
        base_pre = B * p["target_prefill_ms"]["median"]
        if r["method"].startswith("draft"):
            spec_pre = base_pre + B * p["drafter_prefill_ms"][r["method"]]["median"]
        else:
            spec_pre = B * p["target_prefill_with_probe_ms"]["median"]
            spec_pre += B * p["drafter_prefill_ms"].get(r["method"], {"median": 0.0})["median"]
        for src in sources:
            alpha = src["acceptance_rate"]
            for n in new_tokens:
                plain = base_pre + (n - 1) * decode
                speed, decode_only = {}, {}
                for k, rnd in r["draft_round_ms"].items():
                    per_round = v["call_ms"][k]["median"] + rnd["median"]
                    loop = (n - 1) / (expected_accepted(alpha, int(k)) + 1.0) * per_round
                    speed[k] = round(plain / (spec_pre + loop), 3)
                    decode_only[k] = round((n - 1) * decode / loop, 3)
                best = max(speed, key=speed.get)
                rows.append({"model": r["model"], "visual_tokens": r["visual_tokens"], "batch": B,
                             "method": r["method"], "acceptance": src["label"], "acceptance_rate": alpha,
                             "new_tokens": n, "speedup": speed, "decode_only_speedup": decode_only, "best_k": int(best),
                             "best_speedup": speed[best], "plain_ms": round(plain, 3), "label": "projected"})
    return {"label": LABEL, "projection_model": PROJECTION_MODEL, "rows": rows}


def cost_table(doc: dict[str, Any]) -> str:
    """Markdown: per (model, context, batch) the cost ratio at each K and the best projected speedups."""
    ks = [str(k) for k in doc["workload"]["ks"]]
    rows = ["| model | visual tokens | batch | decode ms | cost ratio K=" + ",".join(ks) + " | best projected "
            f"x (N={doc['workload']['tokens'][0]}, per acceptance; method@K) |", "|---|---:|---:|---:|---|---|"]
    proj = doc["projection"]["rows"]
    n0 = doc["workload"]["tokens"][0]
    for r in doc["runs"]:
        if r["method"] != "target verify":
            continue
        key = (r["model"], r["visual_tokens"], r["batch"])
        best: dict[str, tuple[float, str]] = {}
        for p in proj:
            if (p["model"], p["visual_tokens"], p["batch"]) == key and p["new_tokens"] == n0:
                if p["best_speedup"] > best.get(p["acceptance"], (0.0, ""))[0]:
                    best[p["acceptance"]] = (p["best_speedup"], f"{p['method']}@{p['best_k']}")
        text = "; ".join(f"{a}: {x:.2f}x {m}" for a, (x, m) in best.items())
        ratios = ", ".join(f"{r['cost_ratio'][k]:.2f}" for k in ks)
        rows.append(f"| {r['model']} | {r['visual_tokens']} | {r['batch']} | {r['call_ms']['0']['median']:.2f} | "
                    f"{ratios} | {text} |")
    return "\n".join(rows)
