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
import json
import re
import sys
from pathlib import Path
from typing import Any

NOISY_SPREAD = 0.2  # an arm whose timed repeats spread over 20% of their median is marked noisy
MARKER = re.compile(r"<!-- report:(?P<name>[\w.\-]+) -->\n.*?<!-- /report:(?P=name) -->", re.S)


def _fmt(value: Any, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def markdown_table(doc: dict[str, Any]) -> str:
    """One row per arm: latency, speedup, target calls/evals, quality vs the baseline.

    Example:
        >>> print(markdown_table(json.load(open("benchmarks/results/dit-cache-tiny-dit-cpu.json"))))  # doctest: +SKIP
    """
    if doc.get("suite") == "exact-diffusion":
        return _exact_table(doc)
    if doc.get("suite") == "ar-image":
        return _ar_table(doc)
    if doc.get("suite") == "multimodal":
        return _mm_table(doc)
    if doc.get("suite") == "kernels":
        return _kernels_table(doc)
    if doc.get("suite") == "speech":
        from .speech import speech_table

        return speech_table(doc)
    if doc.get("suite") == "multimodal-cost":
        from .mm_cost_project import cost_table

        return cost_table(doc)
    if doc.get("suite") == "ar-image-cost":
        from .ar_image_cost_report import cost_table

        return cost_table(doc)
    if doc.get("suite") == "multimodal-action":
        from .vla import action_table

        return action_table(doc)
    controlnet = any("controlnet_calls" in run for run in doc["runs"])  # a ControlNet workload: its full calls too
    rows = ["| method | median s | speedup | target calls | evals |" + (" ControlNet calls |" if controlnet else "")
            + " PSNR dB | SSIM | ref. FID | accuracy |",
            "|---|---:|---:|---:|---:|" + ("---:|" if controlnet else "") + "---:|---:|---:|---:|"]
    for run in doc["runs"]:
        q = run["quality"]
        name = f"`{run['method']}`" + (" (peer)" if run["peer"] else "")
        if "budget_evals" in run:
            name += f" @{run['budget_evals']:g}" + (" (over budget)" if run.get("over_budget") else "")
        rows.append(
            f"| {name} | {run['latency_s']['median']:.3f} | {run['speedup_vs_baseline']:.2f}x | "
            f"{run['target_calls']}/{run.get('transformer_calls', run['target_calls'])} | {run['target_evals']:.1f} | "
            + (f"{run.get('controlnet_calls', '-')} | " if controlnet else "")
            + f"{_fmt(q['psnr'], '.1f')} | {_fmt(q['ssim'], '.3f')} | {_fmt(q['fid'], '.2f')} | {_fmt(q['accuracy'], '.3f')} |"
        )
    return "\n".join(rows)


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
    rows = ["| method | median s | speedup | target calls | step compression | calls per chunk | "
            "token test p (Bonf.) | ref. FID | accuracy | same-seed tokens differ |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for run in doc["runs"]:
        q = run["quality"]
        name = f"`{run['method']}`" + ("" if q.get("exact", True) else " (relaxed)")
        differ = (q.get("same_seed") or {}).get("vs_baseline", {}).get("token_disagreement")
        rows.append(
            f"| {name} | {run['latency_s']['median']:.3f} | {run['speedup_vs_baseline']:.2f}x | "
            f"{run['target_calls']} | {run['step_compression']:.2f}x | {_fmt(q.get('target_calls_per_chunk'), '.1f')} | "
            f"{_fmt((q.get('token_two_sample') or {}).get('bonferroni_p'), '.3f')} | {_fmt(q['fid'], '.2f')} | "
            f"{_fmt(q['accuracy'], '.3f')} | {_fmt(differ, '.3f')} |"
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


def headline(doc: dict[str, Any]) -> str:
    """``suite on model (device), N steps (or tokens), batch B`` for the table's caption."""
    w = doc["workload"]
    if doc.get("suite") == "kernels":
        smoke = " (CPU smoke: no kernel claims)" if w.get("smoke") else ""
        return f"kernels on {doc['machine']['device']}: copy {doc['copy_gbps']} GB/s{smoke}"
    if "images" in w:
        length = f"{w['images']} captions of <= {w['tokens']} tokens, batches {w['batches']}"
        return f"{doc['suite']} on {doc['model']['name']} ({doc['machine']['device']}), {length}, {doc['model']['dtype']}"
    if "steps" in w:
        length = ",".join(map(str, w["steps"])) if isinstance(w["steps"], list) else w["steps"]
        length = f"{length} steps"
    else:
        length = f"{w['tokens']} tokens"
    return (f"{doc['suite']} on {doc['model']['name']} ({doc['machine']['device']}), {length}, "
            f"batch {w['batch']}, {doc['model']['dtype']}")


def weights(doc: dict[str, Any]) -> str:
    """Whether the benchmarked weights were random or trained, as the JSON records it."""
    if doc.get("suite") == "kernels":
        return "none (kernels alone)"
    model = doc.get("model") if isinstance(doc.get("model"), dict) else {}
    recorded = model.get("weights")
    if recorded is None:
        return "not recorded"
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

    Raises:
        FileNotFoundError: a block names a JSON that ``results`` does not hold.
    """
    def block(match: re.Match[str]) -> str:
        name = match["name"]
        doc = json.loads((results / f"{name}.json").read_text())
        return f"<!-- report:{name} -->\n{report_block(doc, name)}\n<!-- /report:{name} -->"

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
