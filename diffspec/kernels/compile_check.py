"""Compile every Triton kernel of :mod:`diffspec.kernels` for a CUDA architecture, on a machine without a GPU.

Triton lowers a kernel to PTX and assembles it with ``ptxas`` (shipped in the triton wheel)
without a driver or a device. :func:`compile_for` points Triton at a stand-in CUDA target and
turns every launch into a compile: each public entry point then runs on small CPU tensors with
``backend="triton"``, so its own argument handling picks the specializations a GPU run would
(dtypes, constexpr flags, tuple arguments, block sizes), and each compiled kernel is recorded
with its ``ptxas`` resource usage (registers, spilled/local bytes, shared memory) read by
``cuobjdump``. Nothing is launched: buffers the kernels would write read as zeros, so this checks
that the kernels build for the target (and how heavy they are), not their numbers (the
interpreter tests check those; the ``gpu`` tests both).

Run it where ``TRITON_INTERPRET`` is unset or ``0`` (the interpreter replaces the compiler when
a kernel module is imported, so this needs a fresh process):

    python -m diffspec.kernels.compile_check --arch 90 --arch 80 --json kernels-compile.json

Example:
    >>> import os
    >>> os.environ.get("TRITON_INTERPRET", "0") in ("", "0") or "use a process without TRITON_INTERPRET=1"
    True
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

ARCHS = (75, 80, 86, 89, 90)
"""CUDA compute capabilities accepted by ``--arch`` (Turing to Hopper)."""


@dataclass
class CompiledKernel:
    """One compiled specialization of a kernel."""

    case: str
    kernel: str
    arch: int
    constexprs: dict[str, Any]
    cubin_bytes: int
    registers: int | None = None
    stack_bytes: int | None = None
    local_bytes: int | None = None
    shared_bytes: int | None = None
    ptx_f64_ops: int = 0
    num_warps: int | None = None


@dataclass
class CompileReport:
    """Every kernel compiled for ``arch`` and every case that failed (with its error)."""

    arch: int
    compiled: list[CompiledKernel] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)
    wall_s: float = 0.0


class _StandInCuda:
    """The few driver calls Triton's compile path makes, answered for a fixed CUDA target."""

    def __init__(self, arch: int) -> None:
        from triton.backends.compiler import GPUTarget

        self.target = GPUTarget("cuda", arch, 32)

    def get_current_device(self) -> int:
        return 1000 + self.target.arch  # a device id per target: Triton caches compiled kernels per device

    def get_current_stream(self, device: int | None = None) -> int:
        return 0

    def get_current_target(self) -> Any:
        return self.target

    def get_active_torch_device(self) -> torch.device:
        return torch.device("cpu")


def _check_arch(arch: int) -> None:
    if arch not in ARCHS:
        raise ValueError(f"arch={arch} is not supported: choose one of {ARCHS} (compute capability x 10)")


@contextlib.contextmanager
def compile_for(arch: int = 90) -> Iterator[list[tuple[str, Any, dict[str, Any]]]]:
    """Within the block, Triton launches compile for ``sm_<arch>`` and return without running.

    Yields the list that collects ``(kernel name, compiled kernel, constexprs)`` per launch
    (``constexprs`` also names the launch options and, under ``"dtypes"``, its tensors' dtypes). Buffers
    allocated by ``torch.empty`` / ``torch.empty_like`` in the block are zero-filled (the kernels do
    not run, so the callers' post-processing reads defined values).

    Raises:
        RuntimeError: Triton's interpreter is on (``TRITON_INTERPRET=1``) or triton is missing.
        ValueError: unsupported ``arch``.
    """
    _check_arch(arch)
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        raise RuntimeError("compile_for needs a process without TRITON_INTERPRET=1 (the interpreter replaces the "
                           "compiler at import time): run `python -m diffspec.kernels.compile_check`")
    try:
        import triton.runtime.jit as jit
        from triton.runtime.driver import driver
    except ImportError as err:  # pragma: no cover - triton is a dev dependency
        raise RuntimeError("compile_for needs triton installed") from err
    from . import dispatch

    launches: list[tuple[str, Any, dict[str, Any]]] = []
    run, interpreting = jit.JITFunction.run, dispatch.interpreting
    empty, empty_like = torch.empty, torch.empty_like

    def compile_only(self: Any, *args: Any, grid: Any, warmup: bool, **kwargs: Any) -> Any:
        kernel = run(self, *args, grid=grid, warmup=True, **kwargs)
        names = list(self.arg_names)
        constexprs = {names[i]: args[i] if i < len(args) else kwargs.get(names[i]) for i in self.constexprs}
        constexprs.update({k: v for k, v in kwargs.items() if k in ("num_warps", "num_stages")})
        flat = [x for a in args for x in (a if isinstance(a, tuple) else (a,))]
        constexprs["dtypes"] = ",".join(sorted({str(x.dtype).removeprefix("torch.") for x in flat
                                                if isinstance(x, torch.Tensor)}))
        launches.append((self.fn.__name__, kernel, constexprs))
        return kernel

    previous = driver._active  # None on a machine without a GPU (reset_active() would raise there)
    driver.set_active(_StandInCuda(arch))
    jit.JITFunction.run = compile_only
    dispatch.interpreting = lambda: True  # lets backend="triton" through on CPU tensors
    torch.empty = lambda *a, **k: torch.zeros(*a, **k)
    torch.empty_like = lambda *a, **k: torch.zeros_like(*a, **k)
    try:
        yield launches
    finally:
        torch.empty, torch.empty_like = empty, empty_like
        dispatch.interpreting = interpreting
        jit.JITFunction.run = run
        driver._active = previous


def _resource_usage(cubin: bytes) -> dict[str, int]:
    """``ptxas`` resource usage of a cubin (registers, stack, local and shared bytes), via ``cuobjdump``."""
    tool = _cuobjdump()
    if tool is None or not cubin:
        return {}
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        out = subprocess.run([tool, "--dump-resource-usage", f.name], capture_output=True, text=True, check=False)
    found = dict(re.findall(r"\b(REG|STACK|SHARED|LOCAL):(\d+)", out.stdout))
    keys = {"REG": "registers", "STACK": "stack_bytes", "LOCAL": "local_bytes", "SHARED": "shared_bytes"}
    return {keys[k]: int(v) for k, v in found.items()}


def _cuobjdump() -> str | None:
    try:
        import triton
    except ImportError:  # pragma: no cover
        return None
    bundled = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    return str(bundled) if bundled.exists() else shutil.which("cuobjdump")


def _cases() -> dict[str, Callable[[], Any]]:
    """Small calls of every entry point covering the specializations a GPU run uses."""
    from . import (
        beta_tolerance,
        bin_tolerance,
        forecast,
        l1_error,
        reflection_coupling,
        rejection_sample,
        speculative_accept,
    )

    g = torch.Generator().manual_seed(0)
    dtypes = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}

    def rand(*shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return torch.randn(*shape, generator=g).to(dtype)

    def uni(*shape: int) -> torch.Tensor:
        return torch.rand(*shape, generator=g)

    cases: dict[str, Callable[[], Any]] = {}
    for name, dt in dtypes.items():
        for n in (2, 3, 4):
            cases[f"forecast-{name}-anchors{n}"] = (
                lambda dt=dt, n=n: forecast([rand(2, 3000, dtype=dt) for _ in range(n)], [1.0] * n, backend="triton"))
        cases[f"forecast-verify-{name}"] = lambda dt=dt: forecast(
            [rand(2, 3000, dtype=dt) for _ in range(3)], rand(3, 2), true=rand(2, 3000, dtype=dt), backend="triton")
        cases[f"l1-error-{name}"] = lambda dt=dt: l1_error(rand(2, 3000, dtype=dt), rand(2, 3000, dtype=dt),
                                                           backend="triton")
        cases[f"l1-error-base-{name}"] = lambda dt=dt: l1_error(
            rand(2, 3000, dtype=dt), rand(2, 3000, dtype=dt), rand(2, 3000, dtype=dt), backend="triton")
        cases[f"coupling-{name}"] = lambda dt=dt: reflection_coupling(
            rand(4, 3, 17, 17, dtype=dt), rand(4, 3, 17, 17, dtype=dt), rand(4, 3, 17, 17, dtype=dt),
            rand(4, 3, 17, 17, dtype=dt), uni(4) + 0.5, uni(4), backend="triton")

    def accept(vocab: int, dt: torch.dtype, warp: tuple[float, int, float], draft_logits: bool = False) -> Any:
        b, k = 2, 4
        logits = rand(b, k + 1, vocab, dtype=dt)
        q = rand(b, k, vocab, dtype=dt) if draft_logits else torch.softmax(rand(b, k, vocab), -1)
        drafts = torch.randint(0, vocab, (b, k), generator=g)
        t, tk, tp = warp
        return speculative_accept(logits, drafts, q, uni(b, k), uni(b, k + 1), temperature=t, top_k=tk, top_p=tp,
                                  draft_logits=draft_logits, backend="triton")

    for name, dt in dtypes.items():
        cases[f"accept-rows-{name}"] = lambda dt=dt: accept(1000, dt, (1.0, 0, 1.0))
        cases[f"accept-rows-topk-topp-{name}"] = lambda dt=dt: accept(1000, dt, (0.8, 50, 0.9))
        cases[f"accept-rows-draft-logits-{name}"] = lambda dt=dt: accept(1000, dt, (0.7, 20, 0.95), True)
        cases[f"accept-split-{name}"] = lambda dt=dt: accept(20000, dt, (1.0, 0, 1.0))
        cases[f"accept-split-draft-logits-{name}"] = lambda dt=dt: accept(20000, dt, (0.9, 0, 1.0), True)

    def probs(*shape: int) -> torch.Tensor:
        return torch.softmax(rand(*shape), -1)

    cases["rejection-sample"] = lambda: rejection_sample(probs(3, 5, 700), probs(3, 5, 700),
                                                         torch.randint(0, 700, (3, 5), generator=g), uni(3, 5),
                                                         uni(3, 5), backend="triton")
    cases["rejection-sample-mass"] = lambda: rejection_sample(
        probs(3, 5, 700), probs(3, 5, 700), torch.randint(0, 700, (3, 5), generator=g), uni(3, 5), uni(3, 5),
        accept_mass=(uni(3, 5), uni(3, 5)), backend="triton")
    for name, dt in dtypes.items():
        cases[f"bin-tolerance-{name}"] = lambda dt=dt: bin_tolerance(
            rand(2, 7, 1100, dtype=dt), torch.randint(844, 1100, (2, 7), generator=g), first_id=844, n_bins=256,
            reverse=True, tolerance=5, backend="triton")
        cases[f"beta-tolerance-{name}"] = lambda dt=dt: beta_tolerance(
            rand(4, 6, 2048, dtype=dt), torch.randint(0, 2048, (4, 5), generator=g), beta=0.5,
            relaxed=torch.tensor([True, False, True, True]), backend="triton")
    return cases


def triton_kernels() -> set[str]:
    """Names of the ``@triton.jit`` kernels the ``_*_triton`` modules launch (``name[grid](...)``; helpers excluded)."""
    import importlib
    import inspect
    import pkgutil

    from triton.runtime.jit import JITFunction

    from . import __path__ as pkg_path

    names = set()
    for mod in pkgutil.iter_modules(pkg_path):
        if mod.name.startswith("_") and mod.name.endswith("_triton"):
            module = importlib.import_module(f"{__package__}.{mod.name}")
            launched = set(re.findall(r"\b(\w+)\[", inspect.getsource(module)))
            names |= {value.fn.__name__ for attr, value in vars(module).items()
                      if isinstance(value, JITFunction) and attr in launched}
    return names


def check(arch: int = 90, cases: list[str] | None = None) -> CompileReport:
    """Compile every case (or the named ones) for ``sm_<arch>``; failures are recorded, not raised.

    Example:
        >>> report = check(90, cases=["l1-error-fp32"])   # doctest: +SKIP
        >>> report.failed, {k.kernel for k in report.compiled}  # doctest: +SKIP
        ({}, {'_l1_kernel'})
    """
    _check_arch(arch)
    all_cases = _cases()
    unknown = sorted(set(cases or ()) - set(all_cases))
    if unknown:
        raise ValueError(f"cases={unknown} are not known: choose from {sorted(all_cases)}")
    report, start = CompileReport(arch=arch), time.perf_counter()
    for name in cases or all_cases:
        with compile_for(arch) as launches:
            try:
                all_cases[name]()
            except Exception as err:  # noqa: BLE001 - every failure is reported with its case
                report.failed[name] = f"{type(err).__name__}: {err}"[:2000]
        for kernel_name, kernel, constexprs in launches:
            cubin = kernel.asm.get("cubin", b"")
            ptx = kernel.asm.get("ptx", "")
            if kernel.metadata.target.arch != arch:
                raise RuntimeError(f"{kernel_name} came back for sm_{kernel.metadata.target.arch}, not sm_{arch}")
            report.compiled.append(CompiledKernel(
                case=name, kernel=kernel_name, arch=arch, cubin_bytes=len(cubin),
                constexprs={k: v if isinstance(v, (int, float, bool, str)) or v is None else repr(v)
                            for k, v in constexprs.items()},
                ptx_f64_ops=len(re.findall(r"^\s*(?:add|sub|mul|fma|div)\.\S*f64", ptx, re.M)),
                num_warps=getattr(kernel.metadata, "num_warps", None), **_resource_usage(cubin)))
    report.wall_s = round(time.perf_counter() - start, 2)
    return report


def main(argv: list[str] | None = None) -> int:
    """CLI: compile for each ``--arch``, print a table, write ``--json``; exit 1 on any failure or spill."""
    parser = argparse.ArgumentParser(prog="python -m diffspec.kernels.compile_check", description=__doc__.split("\n")[0])
    parser.add_argument("--arch", type=int, action="append", help=f"compute capability x 10, one of {ARCHS} "
                        "(repeatable; default 90)")
    parser.add_argument("--case", action="append", help="only these cases (repeatable; default all)")
    parser.add_argument("--json", type=Path, help="write the reports here")
    args = parser.parse_args(argv)
    reports = [check(a, args.case) for a in (args.arch or [90])]
    bad = 0
    for r in reports:
        print(f"sm_{r.arch}: {len(r.compiled)} kernels compiled, {len(r.failed)} cases failed, {r.wall_s} s")
        seen: dict[tuple[str, str], CompiledKernel] = {}
        for k in r.compiled:
            seen.setdefault((k.kernel, json.dumps(k.constexprs, sort_keys=True)), k)
        for k in seen.values():
            spill = (k.local_bytes or 0) + (k.stack_bytes or 0)
            bad += spill > 0
            print(f"  {k.kernel:<20} {k.case:<34} regs {k.registers} local {k.local_bytes} stack {k.stack_bytes} "
                  f"shared {k.shared_bytes} f64 {k.ptx_f64_ops}{'  SPILLS' if spill else ''}")
        for case, err in r.failed.items():
            print(f"  FAILED {case}: {err.splitlines()[0] if err else ''}")
        bad += len(r.failed)
    if args.json:
        args.json.write_text(json.dumps({"triton": _triton_version(), "torch": torch.__version__,
                                         "reports": [asdict(r) for r in reports]}, indent=1))
    return 1 if bad else 0


def _triton_version() -> str | None:
    try:
        import triton
    except ImportError:  # pragma: no cover
        return None
    return triton.__version__


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
