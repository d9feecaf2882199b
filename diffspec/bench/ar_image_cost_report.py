"""``ar-image-cost`` projection, goal check and markdown tables.

The projection multiplies two things measured in different places and says so: the per-call cost
measured by the suite (random weights, real-size config, this machine) and the step compression
(image tokens per target call) of ``sjd`` / ``mc-sjd`` / ``sjd-pac`` / ``mc-sjd-ra`` measured on a trained
reference model by the ``ar-image`` suite (a committed CPU JSON, by default ``tiny-ar-noisy``'s, whose next-token
laws are as flat as published models'; or figures given with ``--set step_compression=...``):
``projected speedup = plain time / (calls x call(K))`` with ``plain time = N x call(1)``,
``calls = N / step_compression`` and ``K`` the tokens the method feeds per call
(:func:`~diffspec.ar_image.config.tokens_fed_per_call`: ``L + 1`` for a window of ``L``, more for the tree methods).

Example:
    >>> read_compression(None, "mc-sjd@64:3.8")[0]
    [{'method': 'mc-sjd', 'window': 64, 'step_compression': 3.8}]
"""

from __future__ import annotations

import json
import platform
from pathlib import Path
from typing import Any

import torch

from ..ar_image.config import MCSJDConfig, MCSJDRAConfig, SJDConfig, SJDPACConfig, tokens_fed_per_call
from ..config import check_float, check_int

DEFAULT_SOURCE = Path(__file__).resolve().parents[2] / "benchmarks" / "results" / "ar-image-tiny-ar-noisy-cpu.json"
"""The committed ``ar-image`` run whose per-image step compression the projection uses by default
(``tiny-ar-noisy``, the reference model with published-range entropy: median top-1 probability 0.04;
500 images per arm; ``sjd`` at windows 16 and 64, ``mc-sjd`` at 64)."""
LABEL = "projected: cost measured here x acceptance measured on the trained {model}"
"""The projection's label; ``{model}`` is the acceptance source's model (:data:`LABEL_GIVEN` without one)."""
LABEL_GIVEN = "projected: cost measured here x step compression given on the command line"
GOAL_MODEL, GOAL_WINDOW, GOAL_OVERHEAD = "llamagen-7b-size", 64, 0.05
PROJECTED_CONFIGS = {c.method: c for c in (SJDConfig, MCSJDConfig, SJDPACConfig, MCSJDRAConfig)}
"""Exact ``ar-image`` methods the projection reads, by method name."""


def fed_k(entry: dict[str, Any], num_tokens: int) -> int:
    """Tokens per call ``K`` of a compression entry on ``num_tokens``-token images (its ``config``, else its window).

    Example:
        >>> fed_k({"method": "mc-sjd", "window": 64}, 256)
        65
    """
    cfg = entry.get("config")
    if cfg is None:
        return min(entry["window"], num_tokens - 1) + 1
    config = PROJECTED_CONFIGS[cfg["method"]]
    return tokens_fed_per_call(config(**{k: v for k, v in cfg.items() if k != "method"}), num_tokens)


def _parse_given(text: str) -> list[dict[str, Any]]:
    """``"mc-sjd@64:3.8,sjd@16:2.2"`` → compression entries (``ValueError`` naming ``step_compression``)."""
    out = []
    for item in str(text).split(","):
        try:
            head, value = item.split(":")
            method, window = head.split("@")
            entry = {"method": method.strip(), "window": int(window), "step_compression": float(value)}
        except ValueError:
            raise ValueError(f"step_compression={text!r}: each item must read METHOD@WINDOW:VALUE, "
                             "e.g. mc-sjd@64:3.8") from None
        check_int("step_compression window", entry["window"], 1, 4096)
        check_float("step_compression", entry["step_compression"], 1.0)
        out.append(entry)
    return out


def read_compression(path: str | Path | None, given: str | None) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Step compression per (method, window) for the projection, and where it came from.

    ``given`` (``--set step_compression=...``) wins; else the ``sjd`` / ``mc-sjd`` arms of the
    ``ar-image`` JSON at ``path`` (default :data:`DEFAULT_SOURCE`; ``quality.step_compression_per_image``
    where present, else the timed batch's ``step_compression``). A missing default file gives no
    projection; a missing explicit file raises ``ValueError``.
    """
    if given is not None:
        return _parse_given(given), {"kind": "given on the command line", "text": str(given)}
    file = Path(path) if path is not None else DEFAULT_SOURCE
    if not file.is_file():
        if path is not None:
            raise ValueError(f"acceptance_json={str(path)!r} is not a file; give a committed ar-image JSON")
        return [], {"kind": "none", "missing": str(file)}
    doc = json.loads(file.read_text())
    if doc.get("suite") != "ar-image":
        raise ValueError(f"acceptance_json={str(file)!r} is a {doc.get('suite')!r} JSON; give an ar-image one")
    entries = []
    for run in doc["runs"]:
        cfg = run.get("config", {})
        if cfg.get("method") not in PROJECTED_CONFIGS or "window" not in cfg:
            continue
        q = run.get("quality", {})
        per_image = q.get("step_compression_per_image")
        entries.append({"method": run["method"], "window": int(cfg["window"]), "config": cfg,
                        "step_compression": per_image if per_image is not None else run["step_compression"],
                        "field": "quality.step_compression_per_image" if per_image is not None else "step_compression",
                        "per_chunk": q.get("step_compression_per_chunk")})
    try:
        shown = str(file.relative_to(DEFAULT_SOURCE.parents[2]))
    except ValueError:
        shown = str(file)
    w = doc.get("workload", {})
    model = doc.get("model", {})
    return entries, {"kind": "ar-image JSON", "path": shown, "created": doc.get("created"),
                     "model": model.get("name"), "device": doc.get("machine", {}).get("device"),
                     "median_top1_prob": model.get("token_entropy", {}).get("median_top1_prob"),
                     "tokens": w.get("tokens"), "guidance_scale": w.get("guidance_scale"),
                     "images_per_arm": w.get("quality_samples"), "quality_chunk": w.get("quality_chunk")}


def project(runs: list[dict[str, Any]], compression: list[dict[str, Any]], source: dict[str, Any]) -> dict[str, Any]:
    """Projected speedups of every (config, tokens, batch) for every compression entry (see module doc)."""
    calls = {(r["config"]["model"], r["config"]["tokens"], r["config"]["batch"], r["config"]["k"]): r["call_ms"]
             for r in runs if r["part"] == "call"}
    rounds = {(r["config"]["model"], r["config"]["tokens"], r["config"]["batch"], r["config"]["window"]): r["round_ms"]
              for r in runs if r["part"] == "mc-sjd"}
    rows = []
    for (model, n, b, k), call1 in sorted(calls.items()):
        if k != 1:
            continue
        for c in compression:
            kw = fed_k(c, n)
            call_l = calls.get((model, n, b, kw))
            if call_l is None:
                continue
            sc = c["step_compression"]
            row = {"model": model, "tokens": n, "batch": b, "method": c["method"], "window": c["window"], "k": kw,
                   "step_compression": sc, "plain_ms_per_image": round(n * call1, 3),
                   "speculative_ms_per_image": round(n / sc * call_l, 3),
                   "projected_speedup": round(sc * call1 / call_l, 3)}
            loop = rounds.get((model, n, b, c["window"])) if kw == min(c["window"], n - 1) + 1 else None
            if loop is not None:  # a Jacobi window's loop (the tree methods' rounds are not timed)
                row["projected_speedup_with_loop"] = round(sc * call1 / loop, 3)
            rows.append(row)
    model = source.get("model")
    facts = [f"{source['tokens']} tokens"] if source.get("tokens") else []
    facts += [f"median top-1 probability {source['median_top1_prob']}"] if source.get("median_top1_prob") else []
    where = f"{model} ({'; '.join(facts)})" if model else "the figures given"
    return {"label": LABEL.format(model=model) if model else LABEL_GIVEN, "source": source, "rows": rows,
            "notes": ["projected_speedup = step_compression x call(1) / call(K), K = the tokens fed per call (L + 1 "
                      "for a window of L; the tree methods feed their nodes too, attended through a tree mask): "
                      "forwards only (the plain "
                      "loop's own sampling time is left out, which favours the baseline); "
                      "projected_speedup_with_loop replaces call(L + 1) by the measured mc-sjd round at window L "
                      "(used for sjd's entry too: its round differs by one independent draw instead of reusing "
                      "the test's outputs).",
                      f"The step compression is a per-image mean on {where} at batch 1: "
                      "a batch > 1 waits for its slowest row, so rows with batch > 1 are upper bounds; the source's "
                      "per-chunk figure is that effect at its quality chunk size."]}


def goal_check(runs: list[dict[str, Any]], device: torch.device) -> dict[str, Any]:
    """The cost target: <= 5% verification overhead per call at window 64 on the 7B-size config (GPU)."""
    text = f"<= {GOAL_OVERHEAD:.0%} verification overhead per call at window {GOAL_WINDOW} on {GOAL_MODEL} (GPU)"
    cells = [r for r in runs if r["part"] == "mc-sjd" and r["config"]["model"] == GOAL_MODEL
             and r["config"]["window"] == GOAL_WINDOW]
    if device.type != "cuda" or not cells:
        reason = "not run on a GPU" if device.type != "cuda" else f"no {GOAL_MODEL} window-{GOAL_WINDOW} rounds run"
        return {"goal": text, "met": None, "reason": reason}
    per_cell = {f"tokens {r['config']['tokens']} batch {r['config']['batch']}": r["overhead"] for r in cells}
    inside = {f"tokens {r['config']['tokens']} batch {r['config']['batch']}": r["in_round"]["overhead"]
              for r in cells}
    worst = max(per_cell.values())
    return {"goal": text, "met": worst <= GOAL_OVERHEAD, "worst_overhead": worst, "overhead": per_cell,
            "worst_overhead_in_round": max(inside.values()), "overhead_in_round": inside}


def machine_block(device: torch.device) -> dict[str, Any]:
    """:func:`~diffspec.bench.timing.machine_info`, or its torch-only part where diffusers is absent (GPU boxes)."""
    from .timing import machine_info

    try:
        return machine_info(device)
    except ImportError:
        name = torch.cuda.get_device_name(device) if device.type == "cuda" else f"CPU ({platform.machine()}, {torch.get_num_threads()} threads)"
        return {"device": name, "device_type": device.type, "torch": torch.__version__, "diffusers": None,
                "cuda": torch.version.cuda, "python": platform.python_version(), "platform": platform.platform()}


def cost_table(doc: dict[str, Any]) -> str:
    """Markdown: K-token call costs, loop-round overheads, projection (what ``diffspec bench`` prints)."""
    rows = ["| model | tokens | batch | K | call ms | ms/token | cost ratio |", "|---|---:|---:|---:|---:|---:|---:|"]
    for r in doc["runs"]:
        c = r["config"]
        if r["part"] == "call":
            rows.append(f"| {c['model']} | {c['tokens']} | {c['batch']} | {c['k']} | {r['call_ms']:.3f} | "
                        f"{r['ms_per_token']:.4f} | {r['cost_ratio']:.3f} |")
    loops = [r for r in doc["runs"] if r["part"] == "mc-sjd"]
    if loops:
        rows += ["", "| model | tokens | batch | window | mc-sjd round ms | forward ms | overhead | "
                 "in-round overhead |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
        rows += [f"| {r['config']['model']} | {r['config']['tokens']} | {r['config']['batch']} | "
                 f"{r['config']['window']} | {r['round_ms']:.3f} | {r['forward_ms']:.3f} | {r['overhead']:.1%} | "
                 f"{r['in_round']['overhead']:.1%} |" for r in loops]
    proj = doc.get("projection", {}).get("rows", [])
    if proj:
        rows += ["", f"{doc['projection']['label']}:", "", "| model | tokens | batch | method | window | K fed | "
                 "step compression | projected speedup | with loop |", "|---|---:|---:|---|---:|---:|---:|---:|---:|"]
        rows += [f"| {p['model']} | {p['tokens']} | {p['batch']} | {p['method']} | {p['window']} | {p['k']} | "
                 f"{p['step_compression']:.2f} | {p['projected_speedup']:.2f}x | "
                 + (f"{p['projected_speedup_with_loop']:.2f}x |" if "projected_speedup_with_loop" in p else "- |")
                 for p in proj]
    goal = doc.get("goal", {})
    rows += ["", f"goal ({goal.get('goal')}): " + ("not checked: " + goal.get("reason", "")
                                                   if goal.get("met") is None else
                                                   ("met" if goal["met"] else "NOT met") +
                                                   f", worst overhead {goal['worst_overhead']:.1%} (in-round "
                                                   f"{goal['worst_overhead_in_round']:.1%})")]
    return "\n".join(rows)
