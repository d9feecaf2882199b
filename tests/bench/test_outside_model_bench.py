"""``diffspec bench kernels --methods outside-model``: the in-model / outside-model split on CPU."""

import pytest
import torch

from diffspec.bench.kernels import run_kernels


@pytest.fixture(scope="module")
def doc():
    return run_kernels(device="cpu", methods=["outside-model"], repeats=1, warmup=0,
                       overrides={"captions": 1, "steps": 2})


def test_split_adds_up_and_names_the_arm(doc):
    runs = {r["config"]["workload"]: r for r in doc["runs"] if r["kernel"] == "outside-model"}
    assert set(runs) == {"draft-sample", "draft", "relaxed-action"}
    for r in runs.values():
        assert r["config"]["arm"] == "reference"  # CPU: the Triton path is not exercised
        assert 0 < r["model_s_median"] < r["wall_s"]["median"]
        assert r["model_s_median"] + r["outside_model_s_median"] == pytest.approx(r["wall_s"]["median"], abs=1e-4)
        assert 0 < r["outside_model_share"]["median"] < 1 and r["target_calls"] > 0
        assert r["accept_kernel_s_median"] <= r["outside_model_s_median"]
    assert runs["draft-sample"]["accept_kernel_s_median"] > 0  # speculative_accept ran (and was clocked)
    assert runs["relaxed-action"]["accept_kernel_s_median"] > 0  # bin_tolerance ran
    assert runs["draft"]["accept_kernel_s_median"] == 0  # greedy: an argmax compare, no kernel entry point
    assert "Triton path is not exercised" in doc["machine"]["note"]


def test_unknown_part_is_named():
    with pytest.raises(ValueError, match="outside-model"):
        run_kernels(device=torch.device("cpu"), methods=["outside"])


def test_report_table_has_the_split(doc):
    from diffspec.bench.report import markdown_table

    table = markdown_table(doc)
    assert "| draft-sample | reference |" in table and "outside share" in table
