"""Shared fixtures: tiny random-weight models built from configs (no hub)."""

import os

import torch

if not torch.cuda.is_available():  # before anything imports triton: @triton.jit reads it at decoration
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="module")
def one_thread():
    """One intra-op thread for a module's tests: large batches of tiny ops run faster and immune to oversubscription.

    Use it with ``pytestmark = pytest.mark.usefixtures("one_thread")``.
    """
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def fresh_dynamo():
    """Reset torch.compile's caches and counters around a test (compile tests count graphs and recompiles)."""
    import torch._dynamo
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    yield
    torch._dynamo.reset()


@pytest.fixture
def tiny_dit_pipe():
    from diffspec.testing.image_pipelines import build_random_dit_pipeline

    return build_random_dit_pipeline(seed=0)
