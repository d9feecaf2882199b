"""Markdown tables of the benchmark JSON that is not one ``diffspec bench`` run of the common contract.

Each reader is a list of columns ``(header, align, cell)`` over the rows its document holds: the official
AR peers run side by side, the schedule hold-out replay, the compiled-against-eager comparison, the ComfyUI
sampler smoke test, the long-video cost run, the LANTERN tree sweep and its diagnosis. Every ratio a reader shows is one its
own run measured (the same file, the same process).

Example:
    >>> print(table([{"a": 1}], [("a", "---:", lambda r: r["a"])]))
    | a |
    |---:|
    | 1 |
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

Column = tuple[str, str, Callable[[dict[str, Any]], Any]]


def fmt(value: Any, spec: str) -> str:
    """``value`` formatted with ``spec``, ``-`` when it is missing."""
    return "-" if value is None else format(value, spec)


def table(rows: list[dict[str, Any]], columns: list[Column]) -> str:
    """A markdown table, one line per row, one cell per column."""
    lines = ["| " + " | ".join(c[0] for c in columns) + " |", "|" + "|".join(c[1] for c in columns) + "|"]
    lines += ["| " + " | ".join(str(c[2](row)) for c in columns) + " |" for row in rows]
    return "\n".join(lines)


def _token_test(run: dict[str, Any]) -> str:
    test = (run.get("quality") or {}).get("token_two_sample")
    return "-" if not test else f"{'pass' if test['passed'] else 'FAIL'} (p {test['bonferroni_p']:.2f})"


def official_peers_table(doc: dict[str, Any]) -> str:
    """diffspec's Jacobi samplers and the official SJD / SCD code, timed per image in one process."""
    arms = table(doc["runs"], [
        ("arm", "---", lambda r: f"`{r['method']}`"),
        ("median s / image", "---:", lambda r: fmt(r["latency_s"]["median"], ".3f")),
        ("speedup", "---:", lambda r: fmt(r["speedup_vs_baseline"], ".2f") + "x"),
        ("step compression per image", "---:", lambda r: fmt(r.get("step_compression_per_image"), ".2f") + "x"),
        ("token test", "---", _token_test),
    ])
    pairs = table(doc["comparisons"], [
        ("window", "---:", lambda c: c["window"]),
        ("diffspec", "---", lambda c: f"`{c['diffspec']}` ({c['step_compression'][c['diffspec']]:.2f}x)"),
        ("official", "---", lambda c: f"`{c['official']}` ({c['step_compression'][c['official']]:.2f}x)"),
        ("official / diffspec time, medians", "---:", lambda c: f"{c['wall_ratio_of_medians']:.2f}x"),
        ("paired per image", "---:", lambda c: f"{c['wall_ratio_paired_median']:.2f}x"),
    ])
    return f"{arms}\n\n{pairs}"


def holdout_table(doc: dict[str, Any]) -> str:
    """PSNR (dB) of each searched schedule, the even grid and the gate's placement, on calibration and held-out seeds."""
    kinds = ("searched", "even grid", "gate's placement")
    return table(doc["rows"], [
        ("full steps", "---:", lambda r: r["full_steps"]),
        ("granularity", "---", lambda r: r["granularity"]),
        ("searched from", "---", lambda r: r["searched_from"]),
        ("calibration: " + " / ".join(kinds), "---", lambda r: " / ".join(f"{r['calibration_psnr'][k]:.1f}" for k in kinds)),
        ("held out: " + " / ".join(kinds), "---", lambda r: " / ".join(f"{r['held_out_psnr'][k]:.1f}" for k in kinds)),
    ])


def compile_table(doc: dict[str, Any]) -> str:
    """Every arm eager against the eager baseline, then compiled against the compiled baseline."""
    rows = [{"arm": arm, **values} for arm, values in doc["like_with_like"].items()]
    return table(rows, [
        ("arm", "---", lambda r: f"`{r['arm']}`"),
        ("eager s", "---:", lambda r: f"{r['eager_latency_s']:.2f}"),
        ("x eager baseline", "---:", lambda r: f"{r['speedup_vs_baseline_eager']:.2f}"),
        ("compiled s", "---:", lambda r: f"{r['compiled_latency_s']:.2f}"),
        ("x compiled baseline", "---:", lambda r: f"{r['speedup_vs_baseline_compiled']:.2f}"),
        ("calls", "---:", lambda r: r["target_calls_compiled"]),
        ("graphs after warmup", "---:", lambda r: r["compiled_graphs_after_warmup"]),
    ])


def comfyui_smoke_table(doc: dict[str, Any]) -> str:
    """The sampler node in a real ComfyUI: model calls and the final latent against the plain sampler's."""
    return table(doc["runs"], [
        ("variant", "---", lambda r: r["variant"]),
        ("steps", "---:", lambda r: r["steps"]),
        ("batch", "---:", lambda r: r["batch"]),
        ("sequential model calls", "---:", lambda r: r["sequential_model_calls"]),
        ("rows / sample", "---:", lambda r: fmt(r.get("rows_per_sample"), ".1f")),
        ("accepted / proposed", "---:", lambda r: f"{r['accepted']}/{r['proposed']}" if "proposed" in r else "-"),
        ("latent max abs diff vs plain", "---:", lambda r: fmt(r.get("latent_max_abs_diff_vs_plain"), ".1e")),
    ])


def long_video_table(doc: dict[str, Any]) -> str:
    """Multimodal drafters on a long video at forced acceptance 1: the cost side only."""
    return table(doc["runs"], [
        ("arm", "---", lambda r: f"`{r['method']}`"),
        ("median s (min)", "---:", lambda r: f"{r['latency_s']['median']:.2f} ({r['latency_s']['min']:.2f})"),
        ("speedup, medians / mins", "---:", lambda r: f"{r['speedup_vs_baseline']:.2f} / {r['speedup_vs_baseline_min']:.2f}"),
        ("after prefill", "---:", lambda r: f"{r['after_prefill_speedup']:.2f}"),
        ("target calls", "---:", lambda r: r["target_calls"]),
        ("drafter ms / step", "---:", lambda r: fmt(r.get("draft_ms_per_step"), ".1f")),
    ])


def tree_sweep_table(doc: dict[str, Any]) -> str:
    """LANTERN++ static trees against ``mc-sjd`` on the same images, one batched pass each."""
    return table(doc["runs"], [
        ("arm", "---", lambda r: f"`{r['arm']}`"),
        ("exact", "---", lambda r: "yes" if r["exact"] else "no"),
        ("step compression per image", "---:", lambda r: f"{r['step_compression_per_image']:.2f}x"),
        ("vs `mc-sjd`, same images", "---:", lambda r: f"{r['compression_vs_mc_sjd']:.2f}x"),
        ("tokens differing from plain, same seed", "---:", lambda r: f"{r['token_disagreement_vs_plain']:.3f}"),
        ("TV budget / token", "---:", lambda r: f"{r['tv_budget_mean']:.3f}"),
    ])


def lantern_diagnosis_table(doc: dict[str, Any]) -> str:
    """LANTERN's relaxed acceptance per ``(k, delta)``: its budget against the TV of the law it emits."""
    return table(doc["rows"], [
        ("`k`", "---:", lambda r: r["k"]),
        ("`delta`", "---:", lambda r: f"{r['delta']:g}"),
        ("mean budget per draft", "---:", lambda r: f"{r['draft_budget_mean']:.3f}"),
        ("acceptance", "---:", lambda r: f"{r['acceptance_mean']:.3f}"),
        ("emitted TV(e, p) mean / p90", "---:", lambda r: f"{r['emitted_tv_vs_p_mean']:.3f} / {r['emitted_tv_vs_p_p90']:.3f}"),
        ("emitted mass on codes with p < 1e-3", "---:", lambda r: f"{r['emitted_mass_on_p_below_1e-3']:.3f}"),
        ("codes taken", "---:", lambda r: f"{r['neighbours_taken_mean']:.1f}"),
    ])
