"""``multimodal-cost``: the cost side of multimodal speculative decoding at real size (random weights).

Per target (a Qwen2.5-VL-7B-size or LLaVA-1.5-7B-size language model, or ``tiny`` for CPU tests),
visual context length and batch, all measured after warmup, CUDA-synchronised, arms interleaved:

- ``prefill``: one target call over the prompt (batch 1; ``prefill_with_probe`` adds diffspec's
  attention-score hooks, as ``self-draft``/``compressed-draft`` run it);
- ``verify``: one target call on ``K+1`` tokens after the prefilled context (``K=0``: the plain
  decode step), ``cost_ratio[K] = verify[K] / verify[0]``;
- drafter side per round of ``K`` draft tokens: ``self-draft`` through diffspec's own
  :class:`~diffspec.multimodal.strategies.SelfDraftState` (per-round view of the target's cache with
  text + top-K visual entries chosen by :class:`~diffspec.multimodal.visual.AttentionProbe`,
  optionally half the layers), ``compressed-draft`` (a small same-family LM on the pruned prompt,
  its own prefill timed) and ``draft`` (the same small LM on the full prompt).

The vision tower is not built: the prompt is fed as ``inputs_embeds`` (random) of the stated
length, so no arm includes vision encoding. :mod:`~diffspec.bench.mm_cost_project` combines these
costs with acceptance measured elsewhere (trained tiny pair) into *projected* speedups;
:mod:`~diffspec.bench.mm_cost_e2e` adds a *measured* end-to-end block at forced acceptance.
Measurement pieces: :mod:`~diffspec.bench.mm_cost_cells`. On a one-shot GPU lease
``time_budget_s`` stops starting cells and ``checkpoint`` writes the document after each cell;
an exception in one cell or in the e2e block is recorded under ``errors`` and the run goes on.

Example:
Example:
    >>> doc = run_multimodal_cost("tiny", repeats=2)  # doctest: +SKIP
"""

from __future__ import annotations

import json
import platform
import time
import traceback
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from ..multimodal.compressed_config import CompressedDraftConfig
from ..multimodal.self_config import SelfDraftConfig
from .mm_cost_cells import (
    IMAGE_MAX,
    LMS,
    MODELS,
    REAL,
    TEXT_AFTER,
    TEXT_BEFORE,
    Cell,
    LMSpec,
    fits,
    positive_list,
)
from .mm_cost_project import acceptance_sources, cost_table, project
from .timing import machine_info

SELF_FIELDS = ("visual_top_k", "visual_ratio", "score_rows")
COMP_FIELDS = ("image_keep", "video_keep", "image_selection", "video_selection", "score_rows")
OPTIONS = ("contexts", "batches", "ks", "new_tokens", "acceptance", "acceptance_json", "time_budget_s", "checkpoint",
           "visual_top_k", "visual_ratio", "image_keep", "video_keep", "grid", "e2e_size", "e2e_frames", "e2e_side",
           "e2e_new_tokens", "e2e_k", "e2e_rates", "e2e_batches", "e2e_repeats", "e2e_warmup")
"""``--set`` keys of the suite (see :func:`run_multimodal_cost`)."""


def _machine(dev: torch.device) -> dict[str, Any]:
    """``machine_info`` (diffusers may be absent on a GPU box: this suite does not need it), plus transformers."""
    import transformers

    try:
        info = machine_info(dev)
    except ImportError:
        name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else f"CPU ({platform.machine()})"
        info = {"device": name, "device_type": dev.type, "torch": torch.__version__, "diffusers": None,
                "cuda": torch.version.cuda, "python": platform.python_version(), "platform": platform.platform()}
    info["transformers"] = transformers.__version__
    if dev.type == "cpu":
        info["threads"] = torch.get_num_threads()
    return info


def _error(where: dict[str, Any], exc: BaseException) -> dict[str, Any]:
    tb = traceback.format_exception(type(exc), exc, exc.__traceback__)
    return {**where, "error": f"{type(exc).__name__}: {exc}"[:300], "traceback_tail": "".join(tb[-3:])[-1500:]}


class _Run:
    """The suite's state while it runs; :meth:`doc` assembles the JSON document (also as a checkpoint)."""

    def __init__(self, dev: torch.device, dtype_name: str, o: dict[str, Any], batches: list[int], ks: list[int],
                 new_tokens: list[int], repeats: int, warmup: int, self_cfg: SelfDraftConfig,
                 comp_cfg: CompressedDraftConfig, sources: list[dict[str, Any]]) -> None:
        self.dev, self.dtype_name, self.o = dev, dtype_name, o
        self.batches, self.ks, self.new_tokens, self.repeats, self.warmup = batches, ks, new_tokens, repeats, warmup
        self.self_cfg, self.comp_cfg, self.sources = self_cfg, comp_cfg, sources
        self.start = time.perf_counter()
        self.names: list[str] = []
        self.runs: list[dict[str, Any]] = []
        self.prefill: list[dict[str, Any]] = []
        self.skipped: list[dict[str, Any]] = []
        self.errors: list[dict[str, Any]] = []
        self.models: dict[str, Any] = {}
        self.e2e: dict[str, Any] | None = None
        self.checkpoint = Path(o["checkpoint"]) if o.get("checkpoint") else None

    def over_budget(self) -> bool:
        budget = float(self.o.get("time_budget_s", 0) or 0)
        return bool(budget) and time.perf_counter() - self.start > budget

    def save(self, done: bool = False) -> None:
        if self.checkpoint is not None:
            self.checkpoint.parent.mkdir(parents=True, exist_ok=True)
            self.checkpoint.write_text(json.dumps(self.doc(complete=done), indent=2) + "\n")

    def doc(self, complete: bool = True) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "suite": "multimodal-cost", "machine": _machine(self.dev),
            "model": {"name": ",".join(self.names) or "e2e only", "dtype": self.dtype_name,
                      "weights": "random (speed does not depend on weight values)", "models": self.models},
            "workload": {"tokens": self.new_tokens, "batch": self.batches, "ks": self.ks,
                         "text_tokens": TEXT_BEFORE + TEXT_AFTER, "repeats": self.repeats, "warmup": self.warmup,
                         "self_draft": {k: v for k, v in self.self_cfg.to_dict().items() if k in SELF_FIELDS},
                         "compressed_draft": {k: v for k, v in self.comp_cfg.to_dict().items() if k in COMP_FIELDS},
                         "image_max_visual_tokens": IMAGE_MAX, "elapsed_s": round(time.perf_counter() - self.start, 1)},
            "prefill": self.prefill, "runs": self.runs,
            "projection": project(self.prefill, self.runs, self.sources, self.new_tokens),
            "acceptance_sources": self.sources, "notes": _notes(self.dev)}
        if not complete:
            doc["partial"] = "checkpoint written while the suite was running"
        if self.dev.type == "cpu":
            doc["wall_clock_caveat"] = ("CPU timings on shared cores, noisy (see min/max); tiny sizes check the "
                                        "suite's pipeline and JSON, they say nothing about real-size costs.")
        for key in ("e2e", "skipped", "errors"):
            if getattr(self, key):
                doc[key] = getattr(self, key)
        return doc

    def grid(self, name: str) -> None:
        """Every (context, batch) cell of one suite model."""
        o, dev = self.o, self.dev
        t_name, d_name, default_ctx = MODELS[name]
        contexts = positive_list("contexts", o["contexts"], "visual token counts >= 1") if "contexts" in o \
            else list(default_ctx)
        dtype = getattr(torch, self.dtype_name)
        max_pos = TEXT_BEFORE + max(contexts) + TEXT_AFTER + 2 * max(self.ks) + 8
        target = LMS[t_name].build(dev, dtype, max_pos)
        drafter = LMS[d_name].build(dev, dtype, max_pos, seed=1)
        self.models[name] = {"target": {"lm": t_name, **asdict(LMS[t_name]),
                                        "params": sum(p.numel() for p in target.parameters())},
                             "drafter": {"lm": d_name, **asdict(LMS[d_name]),
                                         "params": sum(p.numel() for p in drafter.parameters())},
                             "contexts": contexts}
        for n_vis in contexts:
            cell = {"model": name, "visual_tokens": n_vis}
            why = "time_budget_s exceeded" if self.over_budget() else \
                fits(LMS[t_name], TEXT_BEFORE + n_vis + TEXT_AFTER, 1, dtype, dev, 1.3)
            if why:
                self.skipped += [{**cell, "batch": b, "reason": why} for b in self.batches]
                continue
            c = Cell(target, drafter, n_vis, dev, dtype, self.self_cfg, self.comp_cfg, seed=n_vis)
            try:
                self.prefill.append({**cell, **c.prefills(self.repeats, self.warmup)})
            except Exception as exc:  # noqa: BLE001 - one cell's failure must not lose the others
                self.errors.append(_error({**cell, "stage": "prefill"}, exc))
                del c
                self.save()
                continue
            for b in self.batches:
                self._batch(c, cell, b, LMS[t_name])
            del c
            if dev.type == "cuda":
                torch.cuda.empty_cache()

    def _batch(self, c: Cell, cell: dict[str, Any], b: int, spec: LMSpec) -> None:
        kept = self.prefill[-1]["self_draft_kept_tokens"] / c.T
        dtype = getattr(torch, self.dtype_name)
        why = "time_budget_s exceeded" if self.over_budget() else \
            fits(spec, c.T, b, dtype, self.dev, 1.2 + 2.5 * kept)
        if why:
            self.skipped.append({**cell, "batch": b, "reason": why})
            return
        try:
            self.runs += [{**cell, "context": "image" if c.is_image else "video", "peer": False, **r}
                          for r in c.batch(b, self.ks, self.repeats, self.warmup)]
        except Exception as exc:  # noqa: BLE001 - recorded, the next cell runs
            self.errors.append(_error({**cell, "batch": b, "stage": "verify/draft"}, exc))
        self.save()


@torch.inference_mode()
def run_multimodal_cost(model: str | None = None, *, device: str | None = None, dtype: str | None = None,
                        batch: int | None = None, repeats: int = 5, warmup: int = 2, allow_cpu: bool = False,
                        overrides: dict[str, Any] | None = None, **_: Any) -> dict[str, Any]:
    """Run the suite (module doc) and return the JSON document.

    ``overrides`` (``--set``): ``contexts`` (visual tokens, e.g. ``1024,8192``), ``batches``
    (``1,2,4,8``), ``ks`` (``1,2,4,8``), ``new_tokens`` (``96,256``), ``acceptance`` (per-draft
    rates in ``(0, 1]`` to project with, instead of the committed tiny-vlm JSON),
    ``acceptance_json`` (another ``multimodal`` suite JSON), ``time_budget_s`` (no new cell once
    exceeded), ``checkpoint`` (a path rewritten after each cell), ``visual_top_k``/``visual_ratio``
    (self-draft), ``image_keep``/``video_keep``, ``grid=false`` (e2e only), ``e2e_*`` (see
    :func:`~diffspec.bench.mm_cost_e2e.e2e_from_options`; ``e2e_size=none`` skips it).

    Raises:
        ValueError: unknown model or option, a bad value, or a real size on the CPU without ``allow_cpu``.
    """
    from .mm_cost_e2e import e2e_from_options

    o = dict(overrides or {})
    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    names = [m.strip() for m in (model or (",".join(REAL) if dev.type == "cuda" else "tiny")).split(",") if m.strip()]
    bad = [m for m in names if m not in MODELS]
    if bad or not names:
        raise ValueError(f"model={model!r} is not allowed: choose a comma list of {', '.join(MODELS)}")
    if dev.type != "cuda" and not allow_cpu and any(m in REAL for m in names):
        raise ValueError(f"model={model!r} is a real-size architecture meant for a GPU (device is {dev}); pass "
                         "--device cuda, --model tiny, or --allow-cpu to time it on the CPU anyway")
    dtype_name = dtype or ("bfloat16" if dev.type == "cuda" else "float32")
    if dtype_name not in ("float32", "float16", "bfloat16"):
        raise ValueError(f"dtype={dtype_name!r} is not allowed; choose float32, float16 or bfloat16")
    for field, value, low in (("repeats", repeats, 1), ("warmup", warmup, 0)):
        if value < low:
            raise ValueError(f"{field}={value} is out of range; must be >= {low}")
    unknown = sorted(set(o) - set(OPTIONS))
    if unknown:
        raise ValueError(f"multimodal-cost: unknown option(s) {', '.join(unknown)}; allowed: {', '.join(OPTIONS)}")
    batches = [batch] if batch else positive_list("batches", o.get("batches", "1,2,4,8"), "batch sizes >= 1")
    ks = positive_list("ks", o.get("ks", "1,2,4,8"), "draft lengths K in [1, 64]")
    if max(ks) > 64:
        raise ValueError(f"ks={o.get('ks')!r} is out of range: draft lengths K in [1, 64]")
    new_tokens = positive_list("new_tokens", o.get("new_tokens", "96,256"), "token counts >= 2", low=2)
    if float(o.get("time_budget_s", 0) or 0) < 0:
        raise ValueError(f"time_budget_s={o['time_budget_s']} is out of range: seconds >= 0 (0: no budget)")
    self_cfg = SelfDraftConfig(visual_top_k=int(o.get("visual_top_k", 512)), visual_ratio=float(o.get("visual_ratio", 0.1)))
    comp_cfg = CompressedDraftConfig(image_keep=float(o.get("image_keep", 0.25)), video_keep=float(o.get("video_keep", 0.1)))
    sources = acceptance_sources(o.get("acceptance"), o.get("acceptance_json"))
    grid = str(o.get("grid", True)).lower() not in ("false", "0", "no")
    e2e_job = e2e_from_options(o, dev, getattr(torch, dtype_name), repeats, warmup, allow_cpu)  # validates first
    state = _Run(dev, dtype_name, o, batches, ks, new_tokens, repeats, warmup, self_cfg, comp_cfg, sources)
    if e2e_job is not None:
        try:
            with torch.inference_mode(False):
                state.e2e = e2e_job()
        except Exception as exc:  # noqa: BLE001 - the grid still runs
            state.errors.append(_error({"stage": "e2e"}, exc))
        if dev.type == "cuda":
            torch.cuda.empty_cache()
        state.save()
    for name in names if grid else []:
        state.names.append(name)
        state.grid(name)
        if dev.type == "cuda":
            torch.cuda.empty_cache()
    state.save(done=True)
    return state.doc()


def _notes(dev: torch.device) -> list[str]:
    notes = [
        "Measured here: costs only (random weights). Targets are the language models of the named VLMs "
        "(Qwen2.5-VL-7B: Qwen2 stack with 1-D RoPE in place of M-RoPE, same FLOPs and bytes; LLaVA-1.5-7B: Llama "
        "stack); no vision tower: the visual context is fed as random inputs_embeds of visual_tokens slots between "
        "16 + 16 text tokens, so vision encoding is in no figure (neither the target's nor a drafter's).",
        "Prefills are timed at batch 1; the batch-B caches are the batch-1 cache repeated. verify call_ms[K]: one "
        "target call on K+1 tokens after the prompt (K=0: the plain decode step), DynamicCache as transformers "
        "generate and diffspec's loop use it; cost_ratio[K] = call_ms[K] / call_ms[0] (medians).",
        "self-draft rows: diffspec's SelfDraftState (per-round view: text + top-K visual entries by the "
        "AttentionProbe scores of the prefill; half layers = even layers); draft_round_ms[K] = round_start (view "
        "build + 1 token) + K-1 single-token draft calls. compressed-draft / draft rows: the small same-family LM "
        "(random weights) with its own prefill on the pruned / full prompt (pruned slots gathered directly, at "
        "their original positions, as PrunePrefill does), K single-token calls per round.",
        "Arms of one (model, context, batch) are interleaved per repeat after untimed warmup; medians in ms, "
        "min/max in the JSON.",
        "projection: PROJECTED, not measured end to end: cost measured here x acceptance measured elsewhere (see "
        "acceptance_sources and projection_model).",
    ]
    if dev.type == "cpu":
        notes.append("CPU run: wall-clock on 2 shared cores (noisy); tiny sizes test the pipeline, not real costs.")
    return notes


def main(argv: list[str] | None = None) -> None:
    """``python -m diffspec.bench.mm_cost``: the suite without the CLI (``--set`` as ``KEY=VALUE``)."""
    import argparse
    import datetime as _dt

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default=None)
    parser.add_argument("--device", default=None)
    parser.add_argument("--dtype", default=None)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--allow-cpu", action="store_true")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    overrides = dict(pair.split("=", 1) for pair in args.set)
    doc = run_multimodal_cost(args.model, device=args.device, dtype=args.dtype, repeats=args.repeats,
                              warmup=args.warmup, allow_cpu=args.allow_cpu, overrides=overrides)
    doc = {"suite": doc.pop("suite"), "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
           **doc}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=2) + "\n")
    print(cost_table(doc))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()


__all__ = ["LMS", "MODELS", "LMSpec", "cost_table", "run_multimodal_cost"]
