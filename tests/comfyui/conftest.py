"""ComfyUI node-pack tests: tiny tensors, so one intra-op thread (no spin-waiting on a busy machine)."""

import pytest
import torch


@pytest.fixture(autouse=True)
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
