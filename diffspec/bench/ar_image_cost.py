"""The ``ar-image-cost`` suite: what one verification call costs on real-size LlamaGen configs.

The other half of the AR-image speed claim (acceptance comes from trained models, see the
``ar-image`` suite). Random-weight LlamaGen GPTs (speed does not depend on weight values) are built
from :class:`~diffspec.ar_image.targets.llamagen_config.LlamaGenConfig`, no hub:

- ``llamagen-xl``: the official GPT-XL (dim 1280, 36 layers, 20 heads, vocab 16384, c2i; ~775M);
- ``llamagen-7b-size``: dim 4096, 32 layers, 32 heads, vocab 16384, c2i (a 7B-size config, not a
  released checkpoint);
- ``tiny``: dim 64, 2 layers, 4 heads, vocab 1024 (CPU tests).

For every (config, image tokens, batch) it measures, with the KV cache filled up to the middle of
the image, one target call (:meth:`~diffspec.ar_image.targets.llamagen_session.LlamaGenSession.step`, CFG
doubling the rows) that feeds ``K`` tokens: ``call_ms``, ``ms_per_token`` and ``cost_ratio = call(K) /
call(1)`` (``K = 1`` is the plain AR step; a Jacobi window of ``L`` drafts feeds ``L + 1`` tokens).
The ``K`` values are interleaved round by round, synchronised, after warmup. Then it times rounds of
diffspec's real ``mc-sjd`` loop (:func:`~diffspec.ar_image.jacobi.jacobi_sample` with
``MCSJDConfig(window=L)``) through its progress hook, which is called right after the round's one
host sync, so consecutive ticks bracket exactly one round (forward + acceptance + re-draft + window
bookkeeping): ``overhead = (round - forward) / round`` against the forward alone at ``K = L + 1``.
Finally the projection (:mod:`diffspec.bench.ar_image_cost_report`) combines these costs with the
step compression measured on a trained reference model (``tiny-ar-noisy`` by default), labelled as such.

Example:
    >>> doc = run_ar_image_cost("tiny", device="cpu", overrides={"tokens": 16, "ks": "1,4",
    ...                         "batches": "1", "windows": "4"}, repeats=2)  # doctest: +SKIP
"""

from __future__ import annotations

import math
import statistics
import time
from typing import Any

import torch

from ..ar_image.config import MCSJDConfig
from ..ar_image.jacobi import jacobi_sample
from ..ar_image.targets.cuda_graph import GraphedStep
from ..ar_image.targets.llamagen import LlamaGenConfig, LlamaGenTransformer
from ..ar_image.targets.llamagen_session import LlamaGenTarget
from ..config import check_bool, check_choice, check_float, check_int
from ..progress import progress
from .ar_image_cost_report import fed_k, project, read_compression
from .timing import latency_summary, synchronize

COST_CONFIGS: dict[str, dict[str, int]] = {
    "llamagen-xl": {"dim": 1280, "n_layer": 36, "n_head": 20, "vocab_size": 16384, "num_classes": 1000},
    "llamagen-7b-size": {"dim": 4096, "n_layer": 32, "n_head": 32, "vocab_size": 16384, "num_classes": 1000},
    "tiny": {"dim": 64, "n_layer": 2, "n_head": 4, "vocab_size": 1024, "num_classes": 10},
}
"""Random-weight configs of the suite (c2i, one class token; official LlamaGen field names)."""

REAL_SIZE = ("llamagen-xl", "llamagen-7b-size")
PARTS = ("call", "mc-sjd")
"""``methods`` of this suite: ``call`` (the K-token call table), ``mc-sjd`` (loop round overhead)."""
OVERRIDES = ("tokens", "ks", "batches", "windows", "rounds", "guidance_scale", "generators", "temperature",
             "top_k", "top_p", "acceptance_json", "step_compression", "graphs")
DEFAULTS: dict[str, Any] = {"tokens": (256, 576), "ks": (1, 4, 16, 32, 64), "batches": (1, 2, 4, 8),
                            "windows": (16, 64), "guidance_scale": 4.0, "generators": "per-row", "graphs": False}


def int_list(name: str, value: Any, lo: int, hi: int | None = None) -> tuple[int, ...]:
    """``64``, ``"1,16,64"`` or ``[1, 16]`` as a tuple of ints in ``[lo, hi]`` (``ValueError`` naming ``name``)."""
    if isinstance(value, str):
        try:
            value = [int(v) for v in value.split(",") if v.strip()]
        except ValueError:
            raise ValueError(f"{name}={value!r} must be comma-separated integers") from None
    values = tuple(value) if isinstance(value, (list, tuple)) else (value,)
    if not values:
        raise ValueError(f"{name}={value!r} is empty; give at least one integer")
    for v in values:
        check_int(name, v, lo, hi)
    return tuple(dict.fromkeys(values))


def build_cost_model(name: str, tokens: int, device: torch.device | str = "cpu",
                     dtype: torch.dtype = torch.float32, seed: int = 0) -> LlamaGenTarget:
    """A random-weight LlamaGen target of config ``name`` with ``tokens`` image tokens (a square grid).

    The official init zeroes the output layer (uniform logits, which would make every draft accepted);
    here it is drawn like the other layers, ``N(0, initializer_range)``.

    Raises:
        ValueError: unknown ``name`` or a ``tokens`` that is not a square >= 4.
    """
    check_choice("model", name, COST_CONFIGS)
    check_int("tokens", tokens, 4)
    side = math.isqrt(tokens)
    if side * side != tokens:
        raise ValueError(f"tokens={tokens} is not a square grid (16x16 = 256, 24x24 = 576, ...)")
    config = LlamaGenConfig(block_size=tokens, **COST_CONFIGS[name])
    torch.manual_seed(seed)
    with torch.device(device):  # init on the device: a 7B-size fp32 init on the CPU takes minutes
        model = LlamaGenTransformer(config)
        torch.nn.init.normal_(model.output.weight, std=config.initializer_range)
    return LlamaGenTarget(model.to(dtype).eval())


def _session(target: LlamaGenTarget, batch: int, guidance: float) -> Any:
    return target.start(class_labels=[i % target.model.config.num_classes for i in range(batch)],
                        guidance_scale=guidance)


def _graph(session: Any, graphs: bool, device: torch.device) -> Any:
    """``session`` with its ``step`` replayed from CUDA graphs when ``graphs`` (see :class:`GraphedStep`)."""
    if graphs:
        session.step = GraphedStep(session.step, device)
    return session


def time_calls(target: LlamaGenTarget, batch: int, ks: tuple[int, ...], *, guidance: float, repeats: int,
               warmup: int, device: torch.device, graphs: bool = False) -> dict[int, list[float]]:
    """Seconds of one ``session.step`` feeding ``K`` tokens at the image middle, for every ``K`` (interleaved).

    The cache holds tokens ``0 .. n/2 - 1`` (one prefill call); the call feeds positions
    ``start .. start + K - 1`` with ``start = min(n/2, n - K)``, overwriting the same slots each time.
    ``graphs``: every call after the prefill replays a CUDA graph (captured in the first warmup round).
    """
    n = target.num_tokens
    gen = torch.Generator(device).manual_seed(0)
    vocab = target.codebook_size
    with torch.inference_mode():
        session = _session(target, batch, guidance)
        mid = n // 2
        session.step(torch.randint(vocab, (batch, mid), generator=gen, device=device),
                     torch.zeros(batch, dtype=torch.long, device=device))
        _graph(session, graphs, device)
        feeds = {k: (torch.randint(vocab, (batch, k), generator=gen, device=device),
                     torch.full((batch,), min(mid, n - k), dtype=torch.long, device=device)) for k in ks}
        times: dict[int, list[float]] = {k: [] for k in ks}
        for r in range(warmup + repeats):
            order = ks[r % len(ks):] + ks[: r % len(ks)]
            for k in order:
                synchronize(device)
                start = time.perf_counter()
                session.step(*feeds[k])
                synchronize(device)
                if r >= warmup:
                    times[k].append(time.perf_counter() - start)
    return times


class _Stop(Exception):
    """Raised by :class:`RoundClock` once enough rounds are timed."""


class RoundClock:
    """A progress-bar stand-in for :func:`jacobi_sample`: stamps the clock at every tick.

    The loop ticks once before its first round and once per round right after the round's host
    sync, so tick-to-tick intervals are whole rounds. Raises :class:`_Stop` after ``limit`` rounds.
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.stamps: list[float] = []

    def update(self, n: int = 1) -> None:
        self.stamps.append(time.perf_counter())
        if len(self.stamps) > self.limit:
            raise _Stop

    @property
    def rounds(self) -> list[float]:
        """Seconds of each round ticked so far."""
        return [b - a for a, b in zip(self.stamps, self.stamps[1:])]


def _timed_step(session: Any, device: torch.device, out: list[float]) -> None:
    """Make ``session.step`` append its synchronised duration to ``out`` (instance attribute)."""
    step = session.step

    def timed(tokens: torch.Tensor, start: torch.Tensor) -> torch.Tensor:
        synchronize(device)
        t0 = time.perf_counter()
        logits = step(tokens, start)
        synchronize(device)
        out.append(time.perf_counter() - t0)
        return logits

    session.step = timed


def time_rounds(target: LlamaGenTarget, batch: int, window: int, *, guidance: float, sampling: dict[str, Any],
                generators: str, rounds: int, warmup: int, device: torch.device, graphs: bool = False
                ) -> dict[str, Any]:
    """Seconds of ``rounds`` rounds of the real ``mc-sjd`` loop, plain and with its forward timed inside.

    Generations alternate between the untouched loop (``rounds``) and one whose ``session.step`` is
    synchronised and timed (``instrumented``: ``(round, forward)`` pairs of the same rounds: a
    cross-check immune to drift between separate measurements; its extra sync makes it slightly
    pessimistic). The first generation of each kind drops ``warmup`` rounds, later ones their first
    round (it also holds the first drafts' set-up); generations restart (new seeds) until both kinds
    have ``rounds`` rounds. Also returns ``generations``, the number run. ``graphs``: plain generations replay
    each whole round from one CUDA graph (``jacobi_sample(cuda_graphs=True)``: the first round eager, the second
    captures, and neither is timed); instrumented ones replay only the target call (:class:`GraphedStep`,
    captured in their first round), since their synchronised timer cannot be captured.
    """
    config = MCSJDConfig(window=window, **sampling)
    plain: list[float] = []
    pairs: list[tuple[float, float]] = []
    seed = 0
    with torch.inference_mode():
        while len(plain) < rounds or len(pairs) < rounds:
            instrumented = len(plain) >= rounds or (seed % 2 == 1 and len(pairs) < rounds)
            have = len(pairs) if instrumented else len(plain)
            session = _session(target, batch, guidance)
            forward: list[float] = []
            if instrumented:  # its synchronised step cannot sit inside a captured round: graph the step alone
                _graph(session, graphs, device)
                _timed_step(session, device, forward)
            if generators == "per-row":
                gen: Any = [torch.Generator(device).manual_seed(seed * 1000 + b) for b in range(batch)]
            else:
                gen = torch.Generator(device).manual_seed(seed)
            first = 2 if graphs and not instrumented else 1  # a graphed generation captures in its second round
            drop = max(warmup, first) if seed < 2 else first
            clock = RoundClock(drop + rounds - have)
            try:
                jacobi_sample(session, target.num_tokens, config.window, config.coupling, config.init,
                              config.sampling, gen, bar=clock, cuda_graphs=graphs and not instrumented)
            except _Stop:
                pass
            synchronize(device)
            if instrumented:
                pairs += list(zip(clock.rounds, forward))[drop:]
            else:
                plain += clock.rounds[drop:]
            seed += 1
            if seed > 20 * rounds + 100:
                raise ValueError(f"windows={window}: generations end within {drop} round(s); too few rounds to time")
    return {"rounds": plain[:rounds], "instrumented": pairs[:rounds], "generations": seed}


def _ms(seconds: float) -> float:
    return round(seconds * 1e3, 4)


def run_ar_image_cost(model: str = "tiny", *, methods: list[str] | None = None, device: str | None = None,
                      dtype: str | None = None, batch: int | None = None, repeats: int = 10, warmup: int = 3,
                      overrides: dict[str, Any] | None = None, allow_cpu: bool = False,
                      show_progress: bool = True, **_: Any) -> dict[str, Any]:
    """Run the suite and return its JSON document (the benchmark JSON, docs/benchmarks/index.md, plus the cost fields).

    Args:
        model: one of :data:`COST_CONFIGS`, or several comma-separated.
        methods: parts to run, from :data:`PARTS` (default both).
        batch: one batch size instead of the default sweep ``1, 2, 4, 8``.
        repeats / warmup: timed and untimed calls per ``K``; the loop times ``rounds`` (default
            ``repeats``) rounds after ``warmup`` rounds (see :func:`time_rounds`).
        overrides: ``tokens``, ``ks``, ``batches``, ``windows``, ``rounds``, ``guidance_scale``,
            ``generators`` (``per-row`` | ``single``), sampling (``temperature``, ``top_k``, ``top_p``),
            ``acceptance_json`` (a committed ``ar-image`` JSON) or ``step_compression``
            (``"mc-sjd@64:3.8,sjd@16:2.2"``) for the projection.
        allow_cpu: time the real-size configs on the CPU anyway.

    Raises:
        ValueError: a bad model, part, override or value (the field is named).
    """
    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    names = [m.strip() for m in model.split(",") if m.strip()]
    for name in names:
        check_choice("model", name, COST_CONFIGS)
    if dev.type != "cuda" and not allow_cpu and any(n in REAL_SIZE for n in names):
        raise ValueError(f"--model {model} holds a real-size config meant for a GPU (device is {dev}); pass "
                         "--device cuda, or --allow-cpu to time it on the CPU anyway")
    parts = list(methods or PARTS)
    for part in parts:
        check_choice("methods", part, PARTS)
    opts = dict(overrides or {})
    for key in opts:
        check_choice("--set key", key, OVERRIDES)
    cfg = {**DEFAULTS, **opts}
    check_int("repeats", repeats, 1)
    check_int("warmup", warmup, 0)
    dtype_name = dtype or ("bfloat16" if dev.type == "cuda" else "float32")
    check_choice("dtype", dtype_name, ("float32", "float16", "bfloat16"))
    tokens_list = int_list("tokens", cfg["tokens"], 4)
    batches = int_list("batches", (batch,) if batch else cfg["batches"], 1, 1024)
    windows = int_list("windows", cfg["windows"], 1, 4096) if "mc-sjd" in parts else ()
    rounds = cfg.get("rounds", repeats)
    check_int("rounds", rounds, 1)
    guidance = cfg["guidance_scale"]
    check_float("guidance_scale", guidance, 0.0)
    check_choice("generators", cfg["generators"], ("per-row", "single"))
    graphs = cfg["graphs"]
    check_bool("graphs", graphs)
    if graphs and dev.type != "cuda":
        raise ValueError(f"graphs=true replays CUDA graphs and needs --device cuda (device is {dev})")
    sampling = MCSJDConfig(**{k: cfg[k] for k in ("temperature", "top_k", "top_p") if k in cfg}).sampling
    compression, source = read_compression(cfg.get("acceptance_json"), cfg.get("step_compression"))
    ks_base = int_list("ks", cfg["ks"], 1)
    for n in tokens_list:
        for k in ks_base:
            if k > n:
                raise ValueError(f"ks={k} is out of range for tokens={n}: allowed [1, {n}]")
    rows_per_image = 2 if guidance != 1.0 else 1
    runs: list[dict[str, Any]] = []
    configs: dict[str, Any] = {}
    # K = 1 is every cost ratio's denominator; a tree larger than the image cannot be timed as one contiguous call
    fed = {n: {fed_k(c, n) for c in compression} for n in tokens_list}
    ks_by_tokens = {n: tuple(sorted({1, *ks_base} | {min(w, n - 1) + 1 for w in windows} | {k for k in fed[n] if k <= n}))
                    for n in tokens_list}
    for name in names:
        for n in tokens_list:
            ks = ks_by_tokens[n]
            target = build_cost_model(name, n, dev, getattr(torch, dtype_name))
            params = sum(p.numel() for p in target.model.parameters())
            configs[name] = {"params": params, **COST_CONFIGS[name], "n_head": target.model.config.n_head,
                             "ffn_hidden": target.model.config.ffn_hidden}
            desc = f"{name} {n} tokens"
            for b in progress(batches, desc=desc, disable=not show_progress):
                calls = _cost_cells(target, name, n, b, ks, parts, guidance, repeats, warmup, dev, rows_per_image,
                                    graphs)
                runs += calls
                forward = {r["config"]["k"]: r["call_ms"] for r in calls}
                for w in windows:
                    runs.append(_round_cell(target, name, n, b, w, forward, guidance, sampling, cfg["generators"],
                                            rounds, warmup, dev, graphs))
            del target
            if dev.type == "cuda":
                torch.cuda.empty_cache()
    return _document(names, configs, dev, dtype_name, tokens_list, batches, ks_by_tokens, windows, guidance, sampling,
                     cfg["generators"], repeats, warmup, rounds, runs, compression, source, graphs)


def _cost_cells(target: LlamaGenTarget, name: str, n: int, b: int, ks: tuple[int, ...], parts: list[str],
                guidance: float, repeats: int, warmup: int, dev: torch.device, rows: int,
                graphs: bool = False) -> list[dict[str, Any]]:
    """The ``call`` rows of one (config, tokens, batch); the forward timings are also needed by ``mc-sjd``."""
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats(dev)
    times = time_calls(target, b, ks, guidance=guidance, repeats=repeats, warmup=max(warmup, 1) if graphs else warmup,
                       device=dev, graphs=graphs)
    peak = round(torch.cuda.max_memory_allocated(dev) / 2**30, 3) if dev.type == "cuda" else None
    base = statistics.median(times[1]) if 1 in times else None
    out = []
    for k in ks:
        med = statistics.median(times[k])
        out.append({"method": f"call-K{k}", "peer": False, "part": "call",
                    "config": {"model": name, "tokens": n, "batch": b, "rows": rows * b, "k": k,
                               "window": k - 1 if k > 1 else None, "start": min(n // 2, n - k)},
                    "latency_s": latency_summary(times[k]), "call_ms": _ms(med), "ms_per_token": _ms(med / k),
                    "cost_ratio": round(med / base, 4) if base else None, "peak_mem_gb": peak,
                    "reported": "call" in parts})
    return out


def _round_cell(target: LlamaGenTarget, name: str, n: int, b: int, w: int, forward: dict[int, float],
                guidance: float, sampling: dict[str, Any], generators: str, rounds: int, warmup: int,
                dev: torch.device, graphs: bool = False) -> dict[str, Any]:
    length = min(w, n - 1)
    timed = time_rounds(target, b, w, guidance=guidance, sampling=sampling, generators=generators,
                        rounds=rounds, warmup=warmup, device=dev, graphs=graphs)
    it = statistics.median(timed["rounds"]) * 1e3
    fwd = forward[length + 1]
    pairs = timed["instrumented"]
    return {"method": f"mc-sjd-round-L{w}", "peer": False, "part": "mc-sjd",
            "config": {"model": name, "tokens": n, "batch": b, "window": w, "k": length + 1, **sampling},
            "latency_s": latency_summary(timed["rounds"]), "round_ms": round(it, 4), "forward_ms": fwd,
            "overhead": round((it - fwd) / it, 4),
            "in_round": {"round_ms": _ms(statistics.median(r for r, _ in pairs)),
                         "forward_ms": _ms(statistics.median(f for _, f in pairs)),
                         "overhead": round(statistics.median((r - f) / r for r, f in pairs), 4)},
            "generations": timed["generations"]}


def _document(names: list[str], configs: dict[str, Any], dev: torch.device, dtype_name: str,
              tokens_list: tuple[int, ...], batches: tuple[int, ...], ks: dict[int, tuple[int, ...]],
              windows: tuple[int, ...],
              guidance: float, sampling: dict[str, Any], generators: str, repeats: int, warmup: int, rounds: int,
              runs: list[dict[str, Any]], compression: list[dict[str, Any]], source: dict[str, Any],
              graphs: bool = False) -> dict[str, Any]:
    from .ar_image_cost_report import goal_check, machine_block

    projection = project(runs, compression, source)
    keep = [r for r in runs if r.pop("reported", True)]
    return {
        "suite": "ar-image-cost",
        "machine": machine_block(dev),
        "model": {"name": ",".join(names), "params": {n: configs[n]["params"] for n in names}, "dtype": dtype_name,
                  "weights": "random (N(0, 0.02) every linear and embedding, output layer included; not trained)",
                  "configs": configs},
        "workload": {"tokens": list(tokens_list), "batch": list(batches),
                     "ks": {str(n): list(v) for n, v in ks.items()}, "windows": list(windows),
                     "guidance_scale": guidance, "rows_per_image": 2 if guidance != 1.0 else 1,
                     "position": "K tokens fed from the image middle, cache filled with the tokens before it",
                     "sampling": sampling, "generators": generators, "repeats": repeats, "warmup": warmup,
                     "rounds": rounds, "cuda_graphs": graphs},
        "runs": keep,
        "projection": projection,
        "goal": goal_check(keep, dev),
        "notes": [
            "call-K*: one target call (LlamaGenSession.step) feeding K tokens per image with CFG rows doubled; "
            "median of `repeats` synchronised calls after `warmup`, the K values interleaved round by round. "
            "A Jacobi window of L drafts feeds K = L + 1 tokens (the last committed token + L drafts).",
            "cost_ratio = call(K) / call(1); ms_per_token = call(K) / K. workload.ks per image size: the K values "
            "asked for plus 1 and L + 1 for every window L timed or projected (L clipped to tokens - 1). "
            "peak_mem_gb (CUDA): peak allocated during the cell's calls, weights and KV cache included.",
            "mc-sjd-round-L*: rounds of diffspec's own loop (jacobi_sample, MCSJDConfig(window=L)), timed between "
            "its progress ticks, which follow the round's one host sync; overhead = (round - forward) / round, "
            "forward = call-K(L+1) of the same config, tokens and batch. in_round: the same from generations "
            "run alternately with session.step synchronised and timed inside the loop (median per-round "
            "fraction; one extra sync per round makes it slightly pessimistic). Random weights: acceptance is "
            "meaningless here, only the per-round cost is (the window always feeds L + 1 tokens).",
            "Wall-clock on a shared CPU is noisy; only GPU figures speak to the GPU goals.",
            *(["cuda_graphs: call-K* cells replay each target call from a CUDA graph captured per input shape "
               "(diffspec.ar_image.targets.cuda_graph.GraphedStep) in untimed warmup; mc-sjd rounds replay the whole round "
               "(target call, acceptance, re-drafts, bookkeeping) from one graph (jacobi_sample(cuda_graphs=True)) "
               "plus the round's one host sync; in_round pairs replay only the target call (their timer syncs)."]
              if graphs else []),
        ],
    }
