"""Fixtures of the batch tests: a tiny random-weight DiT pipeline saved locally (no hub)."""

import pytest
import torch


@pytest.fixture(scope="session")
def dit_dir(tmp_path_factory):
    from diffspec.models import save_dit_pipeline
    from diffspec.testing.image_pipelines import build_random_dit_pipeline

    return save_dit_pipeline(build_random_dit_pipeline(seed=0), tmp_path_factory.mktemp("pipe") / "dit")


@pytest.fixture(autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
