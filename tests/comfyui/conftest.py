"""ComfyUI node-pack tests: tiny tensors, so one intra-op thread (no spin-waiting on a busy machine)."""

import pytest


@pytest.fixture(autouse=True)
def _one_thread_each_module(one_thread):
    """Every node-pack test runs on one intra-op thread (``one_thread`` of tests/conftest.py)."""
