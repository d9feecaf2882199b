"""Share of decode time spent outside the models, with the torch reference kernels and with the kernels.

Part of ``diffspec bench kernels`` (``--methods outside-model``). Each workload decodes through a
real method; forward hooks on the target and drafter modules clock every model call
(``perf_counter``, with a CUDA synchronize at both ends of a call on CUDA), and the rest of the wall
time of the call is "outside the model": acceptance, warping, sampling, cache bookkeeping, Python.
The part of it inside the acceptance kernel entry points (:data:`KERNEL_ENTRY_POINTS`, wrapped
with a clock for the run) is reported as ``accept_kernel_s_median``.
Workloads (the shipped tiny trained models, batch 1):

- ``draft-sample``: ``draft`` on ``tiny-vlm``, ``do_sample=True`` (``kernels.speculative_accept``
  with draft logits);
- ``draft``: the same, greedy (acceptance is an argmax compare, no kernel);
- ``relaxed-action``: ``tiny-vla``, ``r = 3``, previous-action drafts (``kernels.bin_tolerance``).

Arms: ``reference`` (``DIFFSPEC_KERNELS=0``: every kernel entry point runs its torch reference)
and, on CUDA only, ``kernels`` (auto dispatch: the Triton kernels). On CPU the auto dispatch is the
reference too, so only ``reference`` runs: the Triton path is not exercised there.

Example:
    >>> runs = outside_model_runs(torch.device("cpu"), repeats=1, warmup=0, captions=2, steps=2)  # doctest: +SKIP
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable
from contextlib import contextmanager
from typing import Any

import torch

WORKLOADS = ("draft-sample", "draft", "relaxed-action")


class _ModelClock:
    """Seconds spent inside the forward calls of some modules (hooks; nested calls counted once)."""

    def __init__(self, modules: list[torch.nn.Module], device: torch.device) -> None:
        self.seconds, self.calls, self._depth, self._t0 = 0.0, 0, 0, 0.0
        self._sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
        self._handles = [h for m in modules for h in (m.register_forward_pre_hook(self._enter),
                                                     m.register_forward_hook(self._exit))]

    def _enter(self, *_: Any) -> None:
        if self._depth == 0:
            self._sync()
            self._t0 = time.perf_counter()
        self._depth += 1

    def _exit(self, *_: Any) -> None:
        self._depth -= 1
        if self._depth == 0:
            self._sync()
            self.seconds += time.perf_counter() - self._t0
            self.calls += 1

    def remove(self) -> None:
        for h in self._handles:
            h.remove()


KERNEL_ENTRY_POINTS = ("speculative_accept", "rejection_sample", "bin_tolerance", "beta_tolerance")


@contextmanager
def _kernel_clock(device: torch.device):
    """Seconds inside the acceptance kernel entry points (callers look them up on ``diffspec.kernels``)."""
    from .. import kernels

    spent = [0.0]
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    originals = {name: getattr(kernels, name) for name in KERNEL_ENTRY_POINTS}

    def clocked(fn: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            sync()
            t0 = time.perf_counter()
            out = fn(*args, **kwargs)
            sync()
            spent[0] += time.perf_counter() - t0
            return out
        return call
    for name, fn in originals.items():
        setattr(kernels, name, clocked(fn))
    try:
        yield spent
    finally:
        for name, fn in originals.items():
            setattr(kernels, name, fn)


@contextmanager
def _kernels(enabled: bool):
    """``DIFFSPEC_KERNELS`` set for the block (``0`` forces the torch references)."""
    old = os.environ.get("DIFFSPEC_KERNELS")
    os.environ["DIFFSPEC_KERNELS"] = "1" if enabled else "0"
    try:
        yield
    finally:
        if old is None:
            del os.environ["DIFFSPEC_KERNELS"]
        else:
            os.environ["DIFFSPEC_KERNELS"] = old


def _vlm_workload(device: torch.device, captions: int, sample: bool) -> tuple[Callable[[], Any], list, Any]:
    from ..api import SpeculativePipeline
    from ..data import render_scenes
    from ..models import resolve_model_path
    from ..models.tiny_vlm import MAX_CAPTION_TOKENS, caption_inputs, load_tiny_vlm
    from .multimodal import EVAL_SEED

    target, processor, drafter, _ = load_tiny_vlm(resolve_model_path("tiny-vlm"), device=device)
    spec = SpeculativePipeline.from_pipe((target, processor), method="draft", draft=drafter)
    scenes, _ = render_scenes(captions, seed=EVAL_SEED)
    inputs = [{k: v.to(device) for k, v in caption_inputs(processor, scenes[i:i + 1]).items()} for i in range(captions)]

    def run() -> None:
        for i, x in enumerate(inputs):
            g = torch.Generator(device).manual_seed(i) if sample else None
            spec(**x, max_new_tokens=MAX_CAPTION_TOKENS, do_sample=sample, generator=g)
    return run, [target, drafter], target


def _vla_workload(device: torch.device, steps: int) -> tuple[Callable[[], Any], list, Any]:
    from ..api import SpeculativePipeline
    from ..models.tiny_vla import encode_observation, load_tiny_vla, sample_episodes
    from .vla import EPISODE_SEED

    vla, amap = load_tiny_vla(None, device=device)
    states, _ = sample_episodes(1, steps, seed=EPISODE_SEED)
    obs = encode_observation(states).to(device)
    spec = SpeculativePipeline.from_pipe(vla, method="relaxed-action", action_map=amap, tolerance=3,
                                         draft_source="previous")

    def run() -> None:
        spec.reset_episode()
        for t in range(obs.shape[1]):
            spec(input_ids=obs[0, t][None])
    return run, [vla], vla


def outside_model_runs(device: torch.device, *, repeats: int = 5, warmup: int = 1, captions: int = 8,
                       steps: int = 20) -> list[dict[str, Any]]:
    """JSON runs (one per workload and arm): wall, in-model and outside-model seconds per decode, per step.

    Args:
        device: where the models run (the ``kernels`` arm only on CUDA).
        repeats: timed repetitions per arm (interleaved); medians reported.
        captions: ``tiny-vlm`` scenes captioned per repetition.
        steps: ``tiny-vla`` actions decoded per repetition.
    """
    arms = {"reference": False, **({"kernels": True} if device.type == "cuda" else {})}
    runs = []
    for name in WORKLOADS:
        run, modules, target = (_vla_workload(device, steps) if name == "relaxed-action"
                                else _vlm_workload(device, captions, sample=name == "draft-sample"))
        clocks = {a: {"wall": [], "model": [], "steps": [], "accept": []} for a in arms}
        with torch.inference_mode():
            for enabled in arms.values():
                with _kernels(enabled):
                    for _ in range(warmup):
                        run()
            for r in range(repeats):
                order = list(arms.items())
                for arm, enabled in order[r % len(order):] + order[:r % len(order)]:  # interleaved
                    clock, steps_clock = _ModelClock(modules, device), _ModelClock([target], device)
                    with _kernels(enabled), _kernel_clock(device) as accept_s:
                        if device.type == "cuda":
                            torch.cuda.synchronize()
                        t0 = time.perf_counter()
                        run()
                        if device.type == "cuda":
                            torch.cuda.synchronize()
                        wall = time.perf_counter() - t0
                    clock.remove()
                    steps_clock.remove()
                    clocks[arm]["wall"].append(wall)
                    clocks[arm]["model"].append(clock.seconds)
                    clocks[arm]["steps"].append(steps_clock.calls)
                    clocks[arm]["accept"].append(accept_s[0])
        for arm, c in clocks.items():
            wall, model = statistics.median(c["wall"]), statistics.median(c["model"])
            outside = [w - m for w, m in zip(c["wall"], c["model"])]
            shares = [o / w for o, w in zip(outside, c["wall"])]
            n_steps = c["steps"][0]
            runs.append({"method": f"outside-model/{name}", "kernel": "outside-model", "peer": False,
                         "config": {"workload": name, "arm": arm, "kernels": "triton (auto)" if arms[arm] else
                                    "torch reference (DIFFSPEC_KERNELS=0)"},
                         "wall_s": {"median": round(wall, 5), "min": round(min(c["wall"]), 5),
                                    "max": round(max(c["wall"]), 5), "n": repeats},
                         "model_s_median": round(model, 5), "outside_model_s_median": round(statistics.median(outside), 5),
                         "outside_model_share": {"median": round(statistics.median(shares), 4),
                                                 "min": round(min(shares), 4), "max": round(max(shares), 4)},
                         "accept_kernel_s_median": round(statistics.median(c["accept"]), 5),
                         "target_calls": n_steps,
                         "outside_model_ms_per_target_call": round(1e3 * statistics.median(outside) / n_steps, 4)
                         if n_steps else None})
    return runs
