"""Fixtures of the batch tests: a tiny random-weight DiT pipeline saved locally (no hub)."""

import pytest


@pytest.fixture(scope="session")
def dit_dir(tmp_path_factory):
    from diffspec.models import save_dit_pipeline
    from diffspec.testing.image_pipelines import build_random_dit_pipeline

    return save_dit_pipeline(build_random_dit_pipeline(seed=0), tmp_path_factory.mktemp("pipe") / "dit")


@pytest.fixture(autouse=True)
def _one_thread_each_module(one_thread):
    """Every batch test runs on one intra-op thread (``one_thread`` of tests/conftest.py)."""
