"""Backend choice of the kernel entry points (CPU: auto is the torch reference)."""

from types import SimpleNamespace

import pytest
import torch

from diffspec import kernels
from diffspec.kernels import dispatch


def test_auto_on_cpu_is_the_reference(monkeypatch):
    monkeypatch.setattr(dispatch, "triton_available", lambda: True)
    assert dispatch.use_triton([torch.zeros(2), None], None) is False
    assert torch.equal(kernels.forecast([torch.ones(2, 3)], [2.0]), torch.full((2, 3), 2.0))


def test_auto_needs_every_tensor_on_cuda_and_kernels_enabled(monkeypatch):
    fake, cpu = SimpleNamespace(is_cuda=True), SimpleNamespace(is_cuda=False)
    monkeypatch.setattr(dispatch, "triton_available", lambda: True)
    assert dispatch.use_triton([fake, cpu], None) is False
    assert dispatch.use_triton([fake], None) is True
    monkeypatch.setenv("DIFFSPEC_KERNELS", "0")
    assert dispatch.use_triton([fake], None) is False
    assert dispatch.use_triton([fake], "torch") is False


def test_backend_errors(monkeypatch):
    with pytest.raises(ValueError, match="backend='cuda' is not supported"):
        dispatch.use_triton([torch.zeros(1)], "cuda")
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    monkeypatch.setattr(dispatch, "triton_available", lambda: True)
    with pytest.raises(ValueError, match="TRITON_INTERPRET=1"):
        kernels.forecast([torch.ones(2, 3)], [1.0], backend="triton")
    monkeypatch.setattr(dispatch, "triton_available", lambda: False)
    with pytest.raises(ValueError, match="needs the triton package"):
        dispatch.use_triton([torch.zeros(1)], "triton")


def test_triton_backend_runs_under_the_interpreter():
    pytest.importorskip("triton")
    if not dispatch.interpreting() and not torch.cuda.is_available():
        pytest.skip("TRITON_INTERPRET is not set (tests/conftest.py sets it on CPU)")
    a = torch.arange(6.0).view(2, 3)
    assert torch.equal(kernels.forecast([a, a], [1.0, 1.0], backend="triton"), 2 * a)


def test_import_diffspec_does_not_import_triton():
    import subprocess
    import sys

    code = ("import sys, torch, diffspec, diffspec.forecast.taylor as t; t.combine([torch.ones(2, 2)], [1.0]); "
            "print('triton' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
