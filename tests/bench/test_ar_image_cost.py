"""The ``ar-image-cost`` suite on the tiny config (CPU): JSON fields, cost ratios, projection, validation."""

from __future__ import annotations

import json

import pytest
import torch

from diffspec.bench import SUITES, run_bench
from diffspec.bench.ar_image_cost import RoundClock, _Stop, build_cost_model, run_ar_image_cost, time_rounds
from diffspec.bench.ar_image_cost_report import (
    DEFAULT_SOURCE,
    LABEL,
    LABEL_GIVEN,
    cost_table,
    read_compression,
)
from diffspec.cli import main

SMALL = {"tokens": 16, "ks": "1,4", "batches": "1,2", "windows": 4}


@pytest.fixture(scope="module")
def doc(tmp_path_factory: pytest.TempPathFactory) -> dict:
    torch.manual_seed(0)
    out = tmp_path_factory.mktemp("cost") / "cost.json"
    run_bench("ar-image-cost", out=out, model="tiny", device="cpu", repeats=2, warmup=1, overrides=SMALL,
              show_progress=False)
    return json.loads(out.read_text())


def test_registered_and_json_fields(doc: dict) -> None:
    assert "ar-image-cost" in SUITES
    assert doc["suite"] == "ar-image-cost" and doc["machine"]["device_type"] == "cpu"
    assert doc["workload"]["ks"] == {"16": [1, 4, 5, 16]}  # + window 4 (K 5) and the source's 64 clipped (K 16)
    calls = [r for r in doc["runs"] if r["part"] == "call"]
    assert len(calls) == 2 * 4
    for r in calls:
        assert {"call_ms", "ms_per_token", "cost_ratio", "latency_s"} <= set(r)
        assert r["call_ms"] > 0 and r["cost_ratio"] > 0
        assert r["ms_per_token"] == pytest.approx(r["call_ms"] / r["config"]["k"], rel=1e-3)
        assert r["config"]["rows"] == 2 * r["config"]["batch"]  # CFG doubles the rows
        if r["config"]["k"] == 1:
            assert r["cost_ratio"] == 1.0
    rounds = [r for r in doc["runs"] if r["part"] == "mc-sjd"]
    assert [r["config"]["batch"] for r in rounds] == [1, 2]
    for r in rounds:
        fwd = next(c["call_ms"] for c in calls if c["config"]["batch"] == r["config"]["batch"] and c["config"]["k"] == 5)
        assert r["forward_ms"] == fwd and r["latency_s"]["n"] == 2
        assert r["overhead"] == pytest.approx((r["round_ms"] - fwd) / r["round_ms"], abs=1e-3)
        assert 0 < r["in_round"]["overhead"] < 1 and r["in_round"]["forward_ms"] > 0
    assert doc["goal"]["met"] is None and "GPU" in doc["goal"]["reason"]


def test_projection_from_committed_tiny_ar_json(doc: dict) -> None:
    proj = doc["projection"]
    assert proj["label"] == LABEL.format(model="tiny-ar-noisy") and proj["source"]["path"].endswith(DEFAULT_SOURCE.name)
    assert proj["source"]["median_top1_prob"] < 0.05  # the default source has published-range entropy
    source = json.loads(DEFAULT_SOURCE.read_text())
    mc = next(r for r in source["runs"] if r["method"] == "mc-sjd")
    row = next(p for p in proj["rows"] if p["method"] == "mc-sjd" and p["batch"] == 1)
    assert row["step_compression"] == mc["quality"]["step_compression_per_image"]
    call = {r["config"]["k"]: r["call_ms"] for r in doc["runs"] if r["part"] == "call" and r["config"]["batch"] == 1}
    assert row["k"] == 16  # window 64 clipped to the 16-token image
    assert row["projected_speedup"] == pytest.approx(row["step_compression"] * call[1] / call[16], rel=1e-2)
    table = cost_table(doc)  # the markdown names the source's model and the tokens fed per call
    assert f"{proj['label']}:" in table and "{model}" not in table and "| K fed |" in table


def test_given_compression_and_loop_projection() -> None:
    doc = run_ar_image_cost("tiny", device="cpu", repeats=1, warmup=0, show_progress=False,
                            overrides={**SMALL, "batches": 1, "step_compression": "mc-sjd@4:2.5"})
    (row,) = doc["projection"]["rows"]
    loop = next(r for r in doc["runs"] if r["part"] == "mc-sjd")
    call1 = next(r["call_ms"] for r in doc["runs"] if r["part"] == "call" and r["config"]["k"] == 1)
    assert row["window"] == 4 and row["k"] == 5
    assert row["projected_speedup_with_loop"] == pytest.approx(2.5 * call1 / loop["round_ms"], rel=1e-2)
    assert doc["projection"]["source"]["kind"] == "given on the command line"
    assert doc["projection"]["label"] == LABEL_GIVEN


def test_tree_methods_project_with_the_tokens_they_feed(tmp_path) -> None:
    """``mc-sjd-ra`` / ``sjd-pac`` entries are costed at K = their tree's tokens per call, not at their window."""
    from diffspec.ar_image.config import MCSJDRAConfig, SJDPACConfig, tokens_fed_per_call

    ra = MCSJDRAConfig(window=4, width=1, depth=2, follow=1)
    pac = SJDPACConfig(window=64, width=2, depth=2)
    source = {"suite": "ar-image", "model": {"name": "toy"}, "workload": {"tokens": 64}, "runs": [
        {"method": "mc-sjd-ra-small", "config": ra.to_dict(), "step_compression": 3.0},
        {"method": "sjd-pac", "config": pac.to_dict(), "step_compression": 4.0}]}
    path = tmp_path / "source.json"
    path.write_text(json.dumps(source))
    doc = run_ar_image_cost("tiny", methods=["call"], device="cpu", repeats=1, warmup=0, show_progress=False,
                            overrides={"tokens": 16, "ks": 1, "batches": 1, "acceptance_json": str(path)})
    k_ra, k_pac = tokens_fed_per_call(ra, 16), tokens_fed_per_call(pac, 16)
    assert (k_ra, k_pac) == (1 + 4 + 2 * 1 * 2, 1 + 2 + 4 + 13)
    assert doc["workload"]["ks"] == {"16": [1, k_ra]}  # the 20-token pac tree exceeds the image: not timed
    (row,) = doc["projection"]["rows"]
    call = {r["config"]["k"]: r["call_ms"] for r in doc["runs"]}
    assert row["method"] == "mc-sjd-ra-small" and row["k"] == k_ra and "projected_speedup_with_loop" not in row
    assert row["projected_speedup"] == pytest.approx(3.0 * call[1] / call[k_ra], rel=1e-2)


def test_k1_always_measured_for_the_ratio() -> None:
    doc = run_ar_image_cost("tiny", methods=["call"], device="cpu", repeats=1, warmup=0, show_progress=False,
                            overrides={"tokens": 16, "ks": 8, "batches": 1, "step_compression": "mc-sjd@4:2"})
    assert [r["config"]["k"] for r in doc["runs"]] == [1, 5, 8]
    assert all(r["cost_ratio"] > 0 for r in doc["runs"])


def test_only_loop_part_still_reports_forward() -> None:
    doc = run_ar_image_cost("tiny", methods=["mc-sjd"], device="cpu", repeats=1, warmup=0, show_progress=False,
                            overrides={**SMALL, "batches": 1})
    assert {r["part"] for r in doc["runs"]} == {"mc-sjd"}
    assert doc["runs"][0]["forward_ms"] > 0


def test_round_clock_times_whole_rounds_across_generations() -> None:
    target = build_cost_model("tiny", 16)
    timed = time_rounds(target, 2, 4, guidance=4.0, sampling={"temperature": 1.0, "top_k": 0, "top_p": 1.0},
                        generators="single", rounds=12, warmup=1, device=torch.device("cpu"))
    assert len(timed["rounds"]) == 12 and all(t > 0 for t in timed["rounds"]) and timed["generations"] >= 2
    assert len(timed["instrumented"]) == 12
    assert all(0 < fwd < rnd for rnd, fwd in timed["instrumented"])  # the forward is part of its round
    clock = RoundClock(2)
    clock.update()
    clock.update()
    with pytest.raises(_Stop):
        clock.update()
    assert len(clock.rounds) == 2


def test_real_size_configs_are_named_honestly() -> None:
    xl = build_cost_model("llamagen-xl", 256, device="meta")
    big = build_cost_model("llamagen-7b-size", 576, device="meta")
    assert 0.74e9 < sum(p.numel() for p in xl.model.parameters()) < 0.80e9  # official GPT-XL: 775M
    assert 6.0e9 < sum(p.numel() for p in big.model.parameters()) < 7.5e9
    assert xl.grid == (16, 16) and big.grid == (24, 24) and big.model.config.dim == 4096
    tiny = build_cost_model("tiny", 16)
    assert tiny.model.output.weight.abs().sum() > 0  # not the official zero init (uniform logits)


@pytest.mark.parametrize(("kwargs", "field"), [
    ({"overrides": {"tokens": 250}}, "tokens=250"),
    ({"overrides": {"tokens": 16, "ks": "0,4"}}, "ks=0"),
    ({"overrides": {"tokens": 16, "ks": "1,32"}}, "ks=32"),
    ({"overrides": {"tokens": 16, "batches": 0}}, "batches=0"),
    ({"overrides": {"tokens": 16, "windows": "a"}}, "windows="),
    ({"overrides": {"tokens": 16, "generators": "many"}}, "generators="),
    ({"overrides": {"tokens": 16, "step_compression": "mc-sjd:3"}}, "step_compression="),
    ({"overrides": {"tokens": 16, "acceptance_json": "/nonexistent.json"}}, "acceptance_json="),
    ({"overrides": {"window": 4}}, "--set key='window'"),
    ({"model": "llamagen-13b"}, "model='llamagen-13b'"),
    ({"methods": ["plain"]}, "methods='plain'"),
    ({"repeats": 0}, "repeats=0"),
    ({"model": "tiny,llamagen-xl"}, "--allow-cpu"),
])
def test_bad_values_name_the_field(kwargs: dict, field: str) -> None:
    args = {"model": "tiny", "device": "cpu", "show_progress": False, **kwargs}
    with pytest.raises(ValueError, match=field.replace("[", r"\[").replace("(", r"\(")):
        run_ar_image_cost(**args)


def test_read_compression_given_format() -> None:
    entries, source = read_compression(None, "mc-sjd@64:3.8,sjd@16:2.2")
    assert [e["window"] for e in entries] == [64, 16] and source["text"] == "mc-sjd@64:3.8,sjd@16:2.2"
    with pytest.raises(ValueError, match="step_compression"):
        read_compression(None, "mc-sjd@64:0.5")


def test_cli_runs_tiny_and_refuses_real_size_on_cpu(tmp_path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "c.json"
    code = main(["bench", "ar-image-cost", "--model", "tiny", "--device", "cpu", "--repeats", "1", "--warmup", "0",
                 "--batch-size", "1", "--set", "tokens=16", "--set", "ks=1,4", "--set", "windows=4",
                 "--out", str(out)])
    printed = capsys.readouterr().out
    assert code == 0 and out.is_file() and "cost ratio" in printed and "mc-sjd round ms" in printed
    assert main(["bench", "ar-image-cost", "--model", "llamagen-xl", "--device", "cpu"]) == 2
    assert "--allow-cpu" in capsys.readouterr().err


def test_cuda_graphs_need_cuda_and_a_bool() -> None:
    with pytest.raises(ValueError, match="needs --device cuda"):
        run_ar_image_cost("tiny", device="cpu", overrides={"graphs": True})
    with pytest.raises(ValueError, match="graphs='yes' must be True or False"):
        run_ar_image_cost("tiny", device="cpu", overrides={"graphs": "yes"})
