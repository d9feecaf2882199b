"""Shared fixtures of the pipeline tests."""

import pytest
import torch


@pytest.fixture(scope="module")
def one_thread():
    """Large batches of tiny ops: one intra-op thread is faster and immune to oversubscription."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
