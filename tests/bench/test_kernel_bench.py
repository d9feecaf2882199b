"""`diffspec bench kernels` on the CPU: the smoke run's JSON contract (no kernel claims)."""

import json

import pytest

from diffspec.bench import run_bench
from diffspec.cli import main


def test_cpu_smoke_json_contract(tmp_path):
    pytest.importorskip("triton")
    out = tmp_path / "kernels.json"
    doc = run_bench("kernels", out=out, device="cpu", repeats=1, warmup=0, allow_cpu=True)
    assert json.loads(out.read_text())["suite"] == "kernels"
    assert doc["machine"]["device_type"] == "cpu" and "no kernel performance claims" in doc["machine"]["note"]
    assert doc["workload"]["smoke"] is True and doc["copy_gbps"] > 0
    kernels = {r["kernel"] for r in doc["runs"]}
    assert kernels == {"d2d-copy", "forecast", "accept", "coupling"}
    for run in doc["runs"]:
        assert {"kernel", "gbps", "bandwidth_fraction", "speedup_vs_reference", "latency_s"} <= set(run), run
        assert run["gbps"] >= 0 and run["latency_s"]["median"] > 0
    interpreted = [r for r in doc["runs"] if r["method"] == "triton"]  # the interpreter arm, checked vs reference
    assert len(interpreted) == 6
    for run in interpreted:
        q = run["quality"]
        assert q.get("max_abs_diff_vs_reference", 0.0) < 1e-4 and q.get("rows_identical_to_reference", 1.0) == 1.0


def test_cli_reference_only_and_errors(tmp_path, capsys):
    out = tmp_path / "k.json"
    assert main(["bench", "kernels", "--device", "cpu", "--methods", "coupling", "--repeats", "1", "--warmup", "0",
                 "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert {r["method"] for r in doc["runs"]} == {"copy", "reference"}
    assert "CPU smoke" in capsys.readouterr().out
    with pytest.raises(ValueError, match="unknown kernels"):
        run_bench("kernels", device="cpu", methods=["softmax"])
