"""Benchmark JSON as markdown tables: what ``diffspec bench`` prints and what the docs pages show.

The docs' tables are generated: a page holds ``<!-- report:NAME -->`` ... ``<!-- /report:NAME -->``
and ``python -m diffspec.bench.report`` writes between them the table of ``benchmarks/results/NAME.json``
(its source, machine and weights above it, its noisy arms below). ``--check`` changes nothing and exits 1
when a page differs from what the committed JSON gives.

Example:
    >>> from pathlib import Path
    >>> text = Path("docs/benchmarks/diffusion.md").read_text()  # doctest: +SKIP
    >>> render_page(text, Path("benchmarks/results")) == text  # doctest: +SKIP
    True
"""

from __future__ import annotations

import argparse
import importlib
import json
import re
import sys
from pathlib import Path
from typing import Any

from .report_readers import Column, table
from .report_readers import fmt as _fmt

NOISY_SPREAD = 0.2  # an arm whose timed repeats spread over 20% of their median is marked noisy
MARKER = re.compile(r"<!-- report:(?P<name>[\w.\-*,]+) -->\n.*?<!-- /report:(?P=name) -->", re.S)
SHIPPED = Path(__file__).resolve().parents[1] / "weights"  # the trained reference models, one folder each


_READERS = {  # suite (or shape): module and table function, imported when a page needs it
    "speech": ("speech", "speech_table"),
    "speech-codec": ("speech", "codec_table"),
    "multimodal-cost": ("mm_cost_project", "cost_table"),
    "ar-image-cost": ("ar_image_cost_report", "cost_table"),
    "multimodal-action": ("vla", "action_table"),
    "ar-image-official-peers": ("report_readers", "official_peers_table"),
    "speca-schedule-holdout": ("report_readers", "holdout_table"),
    "exact-diffusion-compile": ("report_readers", "compile_table"),
    "comfyui-sampler-smoke": ("report_readers", "comfyui_smoke_table"),
    "multimodal-long-video-cost": ("report_readers", "long_video_table"),
    "lantern-tree-sweep": ("report_readers", "tree_sweep_table"),
    "lantern-diagnosis": ("report_readers", "lantern_diagnosis_table"),
    "auto": ("auto", "auto_table"),
}


def shape(doc: dict[str, Any]) -> str:
    """The document's kind: its suite, or what the script that wrote it measured."""
    if "like_with_like" in doc:
        return "exact-diffusion-compile"
    if "tv_p_q_mean" in doc:
        return "lantern-diagnosis"
    if "script" in doc and "rows" in doc:
        return Path(doc["script"]).stem.replace("_", "-")
    return str(doc.get("suite"))


def markdown_table(doc: dict[str, Any]) -> str:
    """One row per arm: latency, speedup, target calls/evals, quality vs the baseline.

    Example:
        >>> print(markdown_table(json.load(open("benchmarks/results/dit-cache-tiny-dit-cpu.json"))))  # doctest: +SKIP
    """
    kind = shape(doc)
    if kind in _READERS:
        module, function = _READERS[kind]
        return getattr(importlib.import_module(f"{__package__}.{module}"), function)(doc)
    if kind == "exact-diffusion":
        return _exact_table(doc)
    if kind == "ar-image":
        return _ar_table(doc)
    if kind == "multimodal":
        return _mm_table(doc)
    if kind == "kernels":
        return _kernels_table(doc)
    return _cache_table(doc)


def _cache_name(run: dict[str, Any]) -> str:
    name = f"`{run['method']}`" + (" (peer)" if run["peer"] else "")
    if "budget_evals" in run:
        name += f" @{run['budget_evals']:g}" + (" (over budget)" if run.get("over_budget") else "")
    return name


def _setting(run: dict[str, Any]) -> str:
    knobs = (run.get("selection") or {}).get("knobs") or {}
    return ", ".join(f"{k}={v}" for k, v in knobs.items()) or "-"


def _paired_accuracy(run: dict[str, Any]) -> str:
    q = run["quality"]
    if q.get("accuracy_delta") is None:
        return "-"
    return f"{100 * q['accuracy_delta']:+.2f} ± {100 * q['accuracy_delta_se']:.2f}"


_CACHE_COLUMNS: list[Column] = [  # dit-cache: every column, then the optional ones only where a run has them
    ("method", "---", _cache_name),
    ("median s", "---:", lambda r: f"{r['latency_s']['median']:.3f}"),
    ("speedup", "---:", lambda r: f"{r['speedup_vs_baseline']:.2f}x"),
    ("target calls", "---:", lambda r: f"{r['target_calls']}/{r.get('transformer_calls', r['target_calls'])}"),
    ("evals", "---:", lambda r: f"{r['target_evals']:.1f}"),
    ("ControlNet calls", "---:", lambda r: r.get("controlnet_calls", "-")),
    ("PSNR dB", "---:", lambda r: _fmt(r["quality"]["psnr"], ".1f")),
    ("SSIM", "---:", lambda r: _fmt(r["quality"]["ssim"], ".3f")),
    ("ref. FID", "---:", lambda r: _fmt(r["quality"]["fid"], ".2f")),
    ("accuracy", "---:", lambda r: _fmt(r["quality"]["accuracy"], ".3f")),
    ("accuracy change, paired, points", "---:", _paired_accuracy),
    ("setting (searched)", "---", _setting),
]
_OPTIONAL = {"ControlNet calls": "controlnet_calls", "accuracy change, paired, points": "accuracy_delta",
             "setting (searched)": "selection"}


def _cache_table(doc: dict[str, Any]) -> str:
    def present(key: str) -> bool:
        return any(key in run or key in run["quality"] for run in doc["runs"])

    columns = [c for c in _CACHE_COLUMNS if c[0] not in _OPTIONAL or present(_OPTIONAL[c[0]])]
    return table(doc["runs"], columns)


def _exact_table(doc: dict[str, Any]) -> str:
    rows = ["| method | steps | median s | speedup | sequential calls | fewer calls | rows/sample | acceptance | "
            "energy p | KS p (Bonf.) | ref. FID | accuracy |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for run in doc["runs"]:
        q = run["quality"]
        two = q.get("two_sample") or {}
        name = f"`{run['method']}`" + (" (peer)" if run["peer"] else "")
        steps = run.get("config", {}).get("num_inference_steps", run.get("steps"))
        rows.append(
            f"| {name} | {_fmt(steps, 'd')} | {run['latency_s']['median']:.3f} | {run['speedup_vs_baseline']:.2f}x | "
            f"{run['target_calls']} | "
            f"{run['calls_speedup_vs_baseline']:.2f}x | {run['target_evals']:.1f} | "
            f"{_fmt(run.get('acceptance_rate'), '.3f')} | {_fmt(two.get('energy', {}).get('p_value'), '.3f')} | "
            f"{_fmt(two.get('ks', {}).get('bonferroni_p'), '.3f')} | {_fmt(q['fid'], '.2f')} | {_fmt(q['accuracy'], '.3f')} |"
        )
    return "\n".join(rows)


def _ar_table(doc: dict[str, Any]) -> str:
    rows = ["| method | median s | speedup | target calls | step compression, timed image | per image, mean (x) | "
            "calls per chunk | token test p (Bonf.) | ref. FID | accuracy | same-seed tokens differ | TV / token |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for run in doc["runs"]:
        q = run["quality"]
        name = f"`{run['method']}`" + ("" if q.get("exact", True) else " (relaxed)")
        differ = (q.get("same_seed") or {}).get("vs_baseline", {}).get("token_disagreement")
        rows.append(
            f"| {name} | {run['latency_s']['median']:.3f} | {run['speedup_vs_baseline']:.2f}x | "
            f"{run['target_calls']} | {run['step_compression']:.2f}x | "
            f"{_fmt(q.get('step_compression_per_image'), '.2f')} | {_fmt(q.get('target_calls_per_chunk'), '.1f')} | "
            f"{_fmt((q.get('token_two_sample') or {}).get('bonferroni_p'), '.3f')} | {_fmt(q['fid'], '.2f')} | "
            f"{_fmt(q['accuracy'], '.3f')} | {_fmt(differ, '.3f')} | "
            f"{_fmt(q.get('relaxed_tv', q.get('tv_budget_mean')), '.3f')} |"
        )
    return "\n".join(rows)


def _mm_table(doc: dict[str, Any]) -> str:
    rows = ["| method | batch | median s | speedup | vs assisted | target calls | tokens/call | accepted/round | "
            "exact | caption match |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for run in doc["runs"]:
        q = run["quality"]
        name = f"`{run['method']}`" + (" (peer)" if run["peer"] else "")
        exact = "-" if q["exact"] is None else ("yes" if q["exact"] else "NO")
        rows.append(
            f"| {name} | {run['batch']} | {run['latency_s']['median']:.3f} | {run['speedup_vs_baseline']:.2f}x | "
            f"{_fmt(run.get('speedup_vs_assisted'), '.2f')} | {run['target_calls']} | "
            f"{_fmt(run['tokens_per_target_call'], '.2f')} | {_fmt(run['accepted_per_round'], '.2f')} | {exact} | "
            f"{q['caption_exact_match']:.2f} |"
        )
    return "\n".join(rows)


def _kernels_table(doc: dict[str, Any]) -> str:
    rows = ["| kernel | config | arm | median ms | GB/s | of copy BW | vs reference |",
            "|---|---|---|---:|---:|---:|---:|"]
    outside = [r for r in doc["runs"] if r["kernel"] == "outside-model"]
    for run in doc["runs"]:
        if run in outside:
            continue
        config = ", ".join(f"{k}={v}" for k, v in run.get("config", {}).items())
        name = run["method"] + (" (peer)" if run.get("peer") else "")
        if "error" in run:
            rows.append(f"| {run['kernel']} | {config} | {name} | error: {run['error'][:60]} | | | |")
            continue
        rows.append(f"| {run['kernel']} | {config} | {name} | {run['latency_s']['median'] * 1e3:.3f} | "
                    f"{run['gbps']:.1f} | {run['bandwidth_fraction']:.2f} | {_fmt(run['speedup_vs_reference'], '.2f')} |")
    if outside:
        rows += ["", "| workload | kernels | wall s | in models s | outside s | outside share | accept entry points s |",
                 "|---|---|---:|---:|---:|---:|---:|"]
        rows += [f"| {r['config']['workload']} | {r['config']['arm']} | {r['wall_s']['median']:.3f} | "
                 f"{r['model_s_median']:.3f} | {r['outside_model_s_median']:.3f} | "
                 f"{r['outside_model_share']['median']:.1%} | {r['accept_kernel_s_median']:.4f} |" for r in outside]
    return "\n".join(rows)


def _device(doc: dict[str, Any]) -> str:
    machine = doc.get("machine") or (doc.get("eager") or {}).get("machine") or {}
    return machine if isinstance(machine, str) else machine.get("device", "machine not recorded")


def _model_name(doc: dict[str, Any]) -> str:
    model = doc.get("model") or (doc.get("eager") or {}).get("model") or {}
    return model.get("name", "?") if isinstance(model, dict) else str(model)


def headline(doc: dict[str, Any]) -> str:
    """``suite on model (device), N steps (or tokens), batch B`` for the table's caption."""
    w = doc.get("workload") or {}
    kind = shape(doc)
    if kind == "kernels":
        smoke = " (CPU smoke: no kernel claims)" if w.get("smoke") else ""
        return f"kernels on {_device(doc)}: copy {doc['copy_gbps']} GB/s{smoke}"
    if kind in _READERS or not {"batch", "steps", "tokens", "images"} & set(w):
        return f"{kind} on {_model_name(doc)} ({_device(doc)})"
    if "images" in w:
        length = f"{w['images']} captions of <= {w['tokens']} tokens, batches {w['batches']}"
        return f"{kind} on {_model_name(doc)} ({_device(doc)}), {length}, {doc['model']['dtype']}"
    if "steps" in w:
        length = ",".join(map(str, w["steps"])) if isinstance(w["steps"], list) else w["steps"]
        length = f"{length} steps"
    else:
        length = f"{w['tokens']} tokens"
    return f"{kind} on {_model_name(doc)} ({_device(doc)}), {length}, batch {w['batch']}, {doc['model']['dtype']}"


def weights(doc: dict[str, Any]) -> str:
    """Whether the benchmarked weights were random or trained, as the JSON records it."""
    if doc.get("suite") == "kernels":
        return "none (kernels alone)"
    model = doc.get("model") if isinstance(doc.get("model"), dict) else {}
    recorded = model.get("weights")
    if recorded is None:
        name = _model_name(doc)
        return "trained (shipped)" if (SHIPPED / name).is_dir() else "random" if "random" in name else "not recorded"
    return "trained" if str(recorded).startswith("trained") else "random"


def _arm(run: dict[str, Any]) -> str:
    name = str(run.get("method", "?"))
    if "kernel" in run:
        config = run.get("config", {})
        detail = config.get("arm") or ", ".join(f"{k}={v}" for k, v in config.items())
        name = (name if name.startswith(run["kernel"]) else f"{run['kernel']} {name}") + f" ({detail})"
    if "budget_evals" in run:
        name += f" @{run['budget_evals']:g}"
    if "batch" in run:
        name += f" batch {run['batch']}"
    if "steps" in run:
        name += f" at {run['steps']} steps"
    return name


def noisy_arms(doc: dict[str, Any], limit: float = NOISY_SPREAD) -> list[tuple[str, float]]:
    """Arms whose timed repeats spread (max - min) over ``limit`` of their median: ``(arm, spread)``.

    Example:
        >>> noisy_arms({"runs": [{"method": "a", "latency_s": {"median": 1.0, "min": 0.9, "max": 1.5, "n": 3}}]})
        [('a', 0.6)]
    """
    noisy = []
    for run in doc.get("runs", []):
        timing = run.get("latency_s") or run.get("wall_s")
        if not isinstance(timing, dict) or timing.get("n", 0) < 2 or not timing.get("median"):
            continue
        spread = (timing["max"] - timing["min"]) / timing["median"]
        if spread > limit:
            noisy.append((_arm(run), round(spread, 3)))
    return noisy


def report_block(doc: dict[str, Any], name: str) -> str:
    """The generated body for ``name``: source, machine and weights, the table, its noisy arms."""
    lines = [f"Source: `benchmarks/results/{name}.json`: {headline(doc)}; weights: {weights(doc)}. "
             "Speedups are against the baseline of this run.", "", markdown_table(doc)]
    noisy = noisy_arms(doc)
    if noisy:
        arms = ", ".join(f"`{arm}` ({spread:.0%})" for arm, spread in noisy)
        lines += ["", f"Noisy (timed repeats spread over {NOISY_SPREAD:.0%} of their median; "
                      f"rerun with more repeats before quoting their time): {arms}."]
    return "\n".join(lines)


def render_page(text: str, results: Path) -> str:
    """``text`` with every report block regenerated from ``results/NAME.json``.

    A block whose name holds ``*`` or ``,`` is a table over several files (``report_sets``).

    Raises:
        FileNotFoundError: a block names a JSON that ``results`` does not hold.
    """
    def block(match: re.Match[str]) -> str:
        name = match["name"]
        if "*" in name or "," in name:
            from .report_sets import sets_block

            body = sets_block(name, results)
        else:
            body = report_block(json.loads((results / f"{name}.json").read_text()), name)
        return f"<!-- report:{name} -->\n{body}\n<!-- /report:{name} -->"

    return MARKER.sub(block, text)


def main(argv: list[str] | None = None) -> int:
    """Regenerate the docs' benchmark tables (``--check``: only report the pages that differ, exit 1)."""
    parser = argparse.ArgumentParser(prog="python -m diffspec.bench.report", description=main.__doc__)
    parser.add_argument("--docs", type=Path, default=Path("docs"), help="folder of markdown pages (default: docs)")
    parser.add_argument("--results", type=Path, default=Path("benchmarks/results"),
                        help="folder of benchmark JSON (default: benchmarks/results)")
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 when a page is out of date")
    args = parser.parse_args(argv)
    stale = []
    for page in sorted(args.docs.rglob("*.md")):
        text = page.read_text()
        new = render_page(text, args.results)
        if new != text:
            stale.append(page)
            if not args.check:
                page.write_text(new)
    verb = "out of date (run python -m diffspec.bench.report)" if args.check else "regenerated"
    for page in stale:
        print(f"{page}: {verb}")
    return 1 if stale and args.check else 0


if __name__ == "__main__":
    sys.exit(main())
