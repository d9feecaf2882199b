"""Shared fixtures: tiny random-weight models built from configs (no hub)."""

import os

import torch

if not torch.cuda.is_available():  # before anything imports triton: @triton.jit reads it at decoration
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

QUICK = (
    # The quick suite, what `pytest -q` runs: every public entry point and every method once, in a few minutes on
    # two cores. Everything else is marked `full` and runs with `pytest -q -m full` (CI runs both). Naming a file or
    # folder on the command line runs all of its tests.
    "tests/test_api.py", "tests/test_checks.py", "tests/test_cli.py", "tests/test_config.py", "tests/test_metrics.py",
    "tests/test_stats.py",
    # diffusion: taylor, speca, coupling, autospec; the batch CLI; ComfyUI
    "tests/pipelines/test_forecast_pipeline.py", "tests/pipelines/test_call_arguments.py",
    "tests/pipelines/test_double_wrap.py", "tests/pipelines/test_auto.py::test_balanced_picks_the_fastest",
    "tests/pipelines/test_exact_sampling.py::test_random_dit_samples",
    "tests/pipelines/test_exact_sampling.py::test_a_planted_bias", "tests/pipelines/test_exact_sampling.py::test_unsup",
    "tests/forecast/test_taylor.py", "tests/speculation/test_coupling.py", "tests/batch/test_figures.py",
    "tests/batch/test_generate.py::test_jsonl_batch", "tests/batch/test_generate.py::test_bad_input",
    "tests/comfyui/test_comfy_nodes.py", "tests/comfyui/test_comfy_package.py",
    # AR image: sjd, mc-sjd, sjd-pac, mc-sjd-ra, gsd, lantern, lantern++
    "tests/pipelines/test_ar_image.py", "tests/ar_image/test_sjd_pac.py::test_greedy_is_identical_to_plain",
    "tests/ar_image/test_mc_sjd_ra.py::test_greedy_is_identical_to_plain",
    "tests/ar_image/test_gsd.py::test_config_validation_and_registry",
    "tests/ar_image/test_gsd.py::test_gsd_with_group_one_is_mc_sjd_on_the_toy",
    "tests/ar_image/test_lantern.py::test_registry_pipeline_and_stats",
    "tests/ar_image/test_lantern_tree.py::test_config_and_pipeline_routing",
    # multimodal: draft, text-draft, compressed-draft, self-draft, relaxed-action, relaxed-codec, speech
    "tests/multimodal/test_pipeline.py", "tests/multimodal/test_compressed_self_draft.py::test_pipeline_self",
    "tests/multimodal/test_action_pipeline.py", "tests/multimodal/test_relaxed_codec.py::test_pipeline_registry",
    "tests/multimodal/test_speech_pipeline.py::test_unsupported",
    # kernels, benchmarks, shipped models
    "tests/kernels/test_kernel_dispatch.py", "tests/bench/test_report.py", "tests/bench/test_counting.py",
    "tests/models/test_reference_models.py",
)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    quick = [item for item in items if item.nodeid.startswith(QUICK)]
    full = [item for item in items if not item.nodeid.startswith(QUICK)]
    for item in full:
        item.add_marker(pytest.mark.full)
    if not config.option.markexpr and config.args == config.getini("testpaths"):  # plain `pytest`: the quick suite
        config.hook.pytest_deselected(items=full)
        items[:] = quick
    if not torch.cuda.is_available():
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
