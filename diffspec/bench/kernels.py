"""``diffspec bench kernels``: each fused kernel vs its torch reference, against the copy bandwidth.

First the device-to-device copy bandwidth is measured (``dst.copy_(src)`` of a large buffer: 2
bytes moved per byte copied). Then per kernel and shape, interleaved in one process: the eager
torch reference, ``torch.compile`` of the reference (CUDA), the Triton kernel (CUDA) and, for the
acceptance kernel, FlashInfer's ``chain_speculative_sampling`` (with a softmax in front, since it
takes probabilities) when it imports. Timing uses CUDA events around ``inner`` calls, after warmup.

Bytes are the algorithmic minimum, the same for every arm of a case: each input read once, each
output written once. ``gbps`` = bytes / median time; ``bandwidth_fraction`` = gbps / measured copy
GB/s; ``speedup_vs_reference`` = reference median / arm median.

Without CUDA the suite is a smoke run on tiny shapes with the reference arm only (``device`` in the
JSON says ``cpu``: no kernel claims); under ``TRITON_INTERPRET=1`` with ``allow_cpu`` the Triton
arm is added (interpreter timings, meaningful for nothing but testing the harness), and
``--set arms=reference,torch-compile`` with ``allow_cpu`` compiles the reference on the CPU.

Example:
    $ diffspec bench kernels --device cuda --out benchmarks/results/kernels-h100.json
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from .. import kernels
from ..kernels.accept import speculative_accept_reference
from ..kernels.anchors import forecast_reference
from ..kernels.coupling import reflection_coupling_reference
from ..kernels.dispatch import interpreting
from ..progress import progress
from .timing import latency_summary, machine_info

KERNELS = ("forecast", "accept", "coupling")
OUTSIDE_MODEL = "outside-model"
"""Opt-in part (``--methods outside-model``): decode-time share outside the models (:mod:`.outside_model`)."""


@dataclass
class Case:
    """One kernel at one shape: zero-argument callables per arm, the bytes they must move, a checker."""

    kernel: str
    config: dict[str, Any]
    bytes_moved: int
    arms: dict[str, Callable[[], Any]]
    check: Callable[[Any, Any], dict[str, Any]]
    peers: set[str] = field(default_factory=set)


def _timer(device: torch.device) -> Callable[[Callable[[], Any], int], float]:
    """Seconds per call of ``fn`` over ``inner`` calls (CUDA events on CUDA)."""
    if device.type == "cuda":
        def cuda_time(fn: Callable[[], Any], inner: int) -> float:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(inner):
                fn()
            end.record()
            end.synchronize()
            return start.elapsed_time(end) / 1e3 / inner
        return cuda_time

    def cpu_time(fn: Callable[[], Any], inner: int) -> float:
        t0 = time.perf_counter()
        for _ in range(inner):
            fn()
        return (time.perf_counter() - t0) / inner
    return cpu_time


def copy_bandwidth(device: torch.device, nbytes: int, repeats: int, warmup: int) -> dict[str, Any]:
    """GB/s of ``dst.copy_(src)`` for an ``nbytes`` buffer (read + write counted)."""
    src = torch.empty(nbytes // 4, dtype=torch.float32, device=device).uniform_()
    dst = torch.empty_like(src)
    timer = _timer(device)
    for _ in range(warmup):
        dst.copy_(src)
    times = [timer(lambda: dst.copy_(src), 5) for _ in range(repeats)]
    med = statistics.median(times)
    return {"method": "copy", "kernel": "d2d-copy", "peer": False, "config": {"bytes": nbytes},
            "latency_s": latency_summary(times), "gbps": round(2 * nbytes / med / 1e9, 2), "bandwidth_fraction": 1.0,
            "speedup_vs_reference": None}


def _max_diff(ref: Any, out: Any) -> dict[str, Any]:
    ref, out = (ref[0], out[0]) if isinstance(ref, tuple) else (ref, out)
    return {"max_abs_diff_vs_reference": float((ref.float() - out.float()).abs().max())}


def _token_agreement(ref: Any, out: Any) -> dict[str, Any]:
    m_ref, tok_ref = ref
    m, tok = out[0], out[1]
    emitted = (torch.arange(tok.shape[1], device=tok.device) <= m_ref[:, None])
    same = (m == m_ref) & ((tok == tok_ref) | ~emitted).all(1)
    return {"rows_identical_to_reference": float(same.float().mean())}


def forecast_cases(device: torch.device, dtype: torch.dtype, smoke: bool) -> Iterator[Case]:
    shape = (2, 64, 96) if smoke else (2, 4096, 3072)  # Flux-size hidden state (2 rows)
    g = torch.Generator(device=device).manual_seed(0)
    for order in (1, 2):
        weights = [1.0, -3.0, 3.0] if order == 2 else [-1.0, 2.0]  # Newton weights, uniform spacing
        anchors = [torch.randn(shape, generator=g, device=device).to(dtype) for _ in range(order + 1)]
        for verify in (False, True):
            true = torch.randn(shape, generator=g, device=device).to(dtype) if verify else None
            numel, size = anchors[0].numel(), anchors[0].element_size()
            nbytes = numel * size * (order + 1 + verify) + numel * 4
            yield Case("forecast", {"shape": list(shape), "dtype": str(dtype).replace("torch.", ""), "order": order,
                                    "verify": verify, "out_dtype": "float32"}, nbytes,
                       {"reference": lambda a=anchors, t=true, w=weights: forecast_reference(a, w, t),
                        "torch-compile": lambda a=anchors, t=true, w=weights: _compiled(forecast_reference)(a, w, t),
                        "triton": lambda a=anchors, t=true, w=weights: kernels.forecast(a, w, true=t, backend="triton")},
                       _max_diff)


def accept_cases(device: torch.device, smoke: bool) -> Iterator[Case]:
    grid = [(1000, 4, 2)] if smoke else [(v, k, b) for v in (16384, 32000, 151936) for k in (4, 8, 16)
                                         for b in (1, 8, 64)]
    warps = [(1.0, 0, 1.0)] if smoke else [(1.0, 0, 1.0), (0.8, 50, 0.9)]
    g = torch.Generator(device=device).manual_seed(1)
    for vocab, k, b in grid:
        logits = torch.randn(b, k + 1, vocab, generator=g, device=device) * 2
        q = (logits[:, :k] + 0.5 * torch.randn(b, k, vocab, generator=g, device=device)).softmax(-1)
        drafts = torch.multinomial(q.view(-1, vocab), 1, generator=g).view(b, k)
        ua = torch.rand(b, k, generator=g, device=device)
        ur = torch.rand(b, k + 1, generator=g, device=device)
        for temperature, top_k, top_p in (warps if (vocab, k, b) in ((32000, 8, 8), (1000, 4, 2)) else warps[:1]):
            kw = {"temperature": temperature, "top_k": top_k, "top_p": top_p}
            arms = {"reference": lambda kw=kw, a=(logits, drafts, q, ua, ur): speculative_accept_reference(*a, **kw),
                    "torch-compile": lambda kw=kw, a=(logits, drafts, q, ua, ur):
                        _compiled(speculative_accept_reference)(*a, **kw),
                    "triton": lambda kw=kw, a=(logits, drafts, q, ua, ur):
                        kernels.speculative_accept(*a, backend="triton", **kw)}
            peers = set()
            peer = _flashinfer(logits, drafts, q) if kw == {"temperature": 1.0, "top_k": 0, "top_p": 1.0} else None
            if peer is not None:
                arms["flashinfer"], peers = peer, {"flashinfer"}
            nbytes = logits.numel() * logits.element_size() + q.numel() * q.element_size()
            yield Case("accept", {"vocab": vocab, "K": k, "batch": b, **kw}, nbytes, arms, _token_agreement, peers)
        del logits, q


def coupling_cases(device: torch.device, smoke: bool) -> Iterator[Case]:
    g = torch.Generator(device=device).manual_seed(2)
    for k in ((2,) if smoke else (4, 8, 16)):
        shape = (k, 4, 8, 8) if smoke else (k, 16, 128, 128)
        view = (k, 1, 1, 1)
        a = torch.randn(shape, generator=g, device=device)
        b = a + torch.linspace(0, 0.02, k, device=device).view(view) * torch.randn(shape, generator=g, device=device)
        z = torch.randn(shape, generator=g, device=device)
        s = torch.rand(k, generator=g, device=device) + 0.5
        args = (a + s.view(view) * z, z, a, b, s, torch.rand(k, generator=g, device=device))
        yield Case("coupling", {"shape": list(shape), "dtype": "float32"}, 5 * a.numel() * a.element_size(),
                   {"reference": lambda args=args: reflection_coupling_reference(*args),
                    "torch-compile": lambda args=args: _compiled(reflection_coupling_reference)(*args),
                    "triton": lambda args=args: kernels.reflection_coupling(*args, backend="triton")},
                   lambda ref, out: _max_diff(ref.sample, out.sample))


_COMPILED: dict[Callable, Callable] = {}


def _compiled(fn: Callable) -> Callable:
    if fn not in _COMPILED:
        _COMPILED[fn] = torch.compile(fn)  # automatic dynamic shapes: one recompile, not one per shape
    return _COMPILED[fn]


def _flashinfer(logits: torch.Tensor, drafts: torch.Tensor, q: torch.Tensor) -> Callable[[], Any] | None:
    try:
        from flashinfer.sampling import chain_speculative_sampling
    except Exception:  # not installed, or no build for this GPU
        return None
    ids = drafts.int()

    def run() -> Any:
        out = chain_speculative_sampling(q, ids, logits.softmax(-1))
        return out[0] if isinstance(out, tuple) else out
    return run


def run_case(case: Case, arms: list[str], device: torch.device, copy_gbps: float, repeats: int, warmup: int,
             inner: int) -> list[dict[str, Any]]:
    """Time ``arms`` of ``case`` interleaved (rotating order each round); one JSON run per arm."""
    timer = _timer(device)
    names = [a for a in arms if a in case.arms]
    outputs, errors = {}, {}
    for name in names:
        try:
            for _ in range(max(warmup, 1)):
                outputs[name] = case.arms[name]()
        except Exception as exc:  # a peer or compile failure is recorded, not fatal
            errors[name] = f"{type(exc).__name__}: {exc}"[:300]
    live = [n for n in names if n not in errors]
    times: dict[str, list[float]] = {n: [] for n in live}
    for r in range(repeats):
        for name in live[r % max(len(live), 1):] + live[: r % max(len(live), 1)]:
            times[name].append(timer(case.arms[name], inner))
    ref_med = statistics.median(times["reference"]) if times.get("reference") else None
    runs = []
    for name in names:
        run: dict[str, Any] = {"method": name, "kernel": case.kernel, "peer": name in case.peers, "config": case.config}
        if name in errors:
            runs.append({**run, "error": errors[name]})
            continue
        med = statistics.median(times[name])
        gbps = case.bytes_moved / med / 1e9
        quality = {"exact": None}
        if name != "reference" and "reference" in outputs and name not in case.peers:
            quality.update(case.check(outputs["reference"], outputs[name]))
        runs.append({**run, "latency_s": latency_summary(times[name]), "bytes": case.bytes_moved,
                     "gbps": round(gbps, 2), "bandwidth_fraction": round(gbps / copy_gbps, 4),
                     "speedup_vs_reference": None if ref_med is None else round(ref_med / med, 3),
                     "speedup_vs_baseline": None if ref_med is None else round(ref_med / med, 3),
                     "quality": quality})
    return runs


def run_kernels(*, device: str | torch.device = "cpu", dtype: str | None = None, methods: list[str] | None = None,
                repeats: int = 5, warmup: int = 2, allow_cpu: bool = False, overrides: dict[str, Any] | None = None,
                **_unused: Any) -> dict[str, Any]:
    """Run the kernel suite; returns the JSON document (see the module docstring).

    Args:
        methods: kernels to run (``forecast``, ``accept``, ``coupling``; default all) and/or
            ``outside-model`` (:func:`~diffspec.bench.outside_model.outside_model_runs`, opt-in).
        dtype: forecast anchors' dtype (default bfloat16).
        allow_cpu: on CPU under ``TRITON_INTERPRET=1``, add the (interpreted) Triton arm.
        overrides: ``arms`` (comma-separated subset of reference, torch-compile, triton, flashinfer) and
            ``inner`` (calls per timed sample; default 10 on CUDA, 1 on CPU), ``captions`` and ``steps``
            (outside-model workload sizes), from ``--set KEY=VALUE``.
    """
    overrides = dict(overrides or {})
    unknown = set(overrides) - {"arms", "inner", "captions", "steps"}
    if unknown:
        raise ValueError(f"bench kernels: unknown --set keys {sorted(unknown)}; allowed: arms, inner, captions, steps")
    device = torch.device(device)
    cuda = device.type == "cuda"
    chosen = list(methods or KERNELS)
    bad = [m for m in chosen if m not in (*KERNELS, OUTSIDE_MODEL)]
    if bad:
        raise ValueError(f"unknown kernels {bad}; choose from {', '.join((*KERNELS, OUTSIDE_MODEL))}")
    arms = ["reference", "torch-compile", "triton", "flashinfer"] if cuda else \
        ["reference"] + (["triton"] if allow_cpu and interpreting() else [])
    if "arms" in overrides:
        allowed = arms + (["torch-compile"] if allow_cpu and not cuda else [])
        arms = [a for a in str(overrides["arms"]).split(",") if a in allowed]
        if "reference" not in arms:
            arms.insert(0, "reference")  # every speedup is measured against it
    inner = int(overrides.get("inner", 10 if cuda else 1))
    copy = copy_bandwidth(device, 2**30 if cuda else 2**24, repeats, warmup)
    anchor_dtype = getattr(torch, dtype or "bfloat16")
    cases: list[Iterator[Case]] = []
    if "forecast" in chosen:
        cases.append(forecast_cases(device, anchor_dtype, smoke=not cuda))
    if "accept" in chosen:
        cases.append(accept_cases(device, smoke=not cuda))
    if "coupling" in chosen:
        cases.append(coupling_cases(device, smoke=not cuda))
    runs = [copy]
    with progress(desc="bench kernels", disable=False) as bar:
        for group in cases:
            for case in group:
                runs.extend(run_case(case, arms, device, copy["gbps"], repeats, warmup, inner))
                bar.update()
    if OUTSIDE_MODEL in chosen:
        from .outside_model import outside_model_runs

        runs.extend(outside_model_runs(device, repeats=repeats, warmup=warmup,
                                       captions=int(overrides.get("captions", 8)), steps=int(overrides.get("steps", 20))))
    machine = machine_info(device)
    if not cuda:
        machine["note"] = ("CPU smoke run: reference arms on tiny shapes; no kernel performance claims. "
                           "outside-model runs (if any): CPU, torch reference kernels only (the Triton path is not "
                           "exercised on CPU); wall-clock on a shared CPU is noisy")
        load = os.getloadavg()
        machine["load_average_1_5_15"] = [round(x, 2) for x in load]
        machine["loaded"] = load[0] > (os.cpu_count() or 1)  # more runnable work than cores: timings are noisy
    return {"suite": "kernels", "machine": machine,
            "model": {"name": "kernels", "params": 0, "dtype": str(anchor_dtype).replace("torch.", "")},
            "workload": {"kernels": chosen, "arms": arms, "smoke": not cuda, "repeats": repeats, "warmup": warmup,
                         "inner": inner, "batch": None, "seeds": [0, 1, 2]},
            "copy_gbps": copy["gbps"], "runs": runs}
