"""Every Triton kernel compiles for Hopper (sm_90) on this CPU machine: ptxas from the triton wheel, no GPU."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

triton = pytest.importorskip("triton")
PTXAS = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas"
ROOT = Path(__file__).resolve().parents[2]


def _run(args, tmp_path):
    env = {**os.environ, "TRITON_INTERPRET": "0", "TRITON_CACHE_DIR": str(tmp_path / "cache"),
           "TRITON_DEFAULT_FP_FUSION": "1", "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "diffspec.kernels.compile_check", *args], capture_output=True,
                          text=True, env=env, cwd=ROOT, timeout=600)


@pytest.mark.slow
@pytest.mark.skipif(not PTXAS.exists(), reason="triton wheel without ptxas")
def test_every_kernel_compiles_for_sm90_without_spills(tmp_path):
    out = tmp_path / "report.json"
    proc = _run(["--arch", "90", "--json", str(out)], tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads(out.read_text())["reports"][0]
    assert report["arch"] == 90 and report["failed"] == {}
    compiled = report["compiled"]
    check = ("from diffspec.kernels.compile_check import triton_kernels; print(','.join(sorted(triton_kernels())))")
    env = {**os.environ, "TRITON_INTERPRET": "0", "PYTHONPATH": str(ROOT)}
    launched = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, env=env,
                              check=True).stdout.strip().split(",")
    assert set(launched) == {k["kernel"] for k in compiled}  # every launched kernel, nothing else
    for k in compiled:
        assert k["cubin_bytes"] > 0 and k["arch"] == 90
        if k["registers"] is not None:  # cuobjdump read the resource usage
            assert 0 < k["registers"] <= 255 and k["local_bytes"] == 0 and k["stack_bytes"] == 0, k
    dtypes = {d for k in compiled if k["kernel"] == "_forecast_kernel" for d in k["constexprs"]["dtypes"].split(",")}
    assert {"bfloat16", "float16", "float32"} <= dtypes


def test_unknown_case_and_arch_are_rejected(tmp_path):
    proc = _run(["--arch", "91"], tmp_path)
    assert proc.returncode != 0 and "arch=91 is not supported" in proc.stderr
    proc = _run(["--case", "nope"], tmp_path)
    assert proc.returncode != 0 and "cases=['nope'] are not known" in proc.stderr


def test_refuses_to_run_under_the_interpreter():
    from diffspec.kernels.compile_check import compile_for

    if os.environ.get("TRITON_INTERPRET", "0") in ("", "0"):
        pytest.skip("this process compiles (no TRITON_INTERPRET)")
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET"):
        with compile_for(90):
            pass
