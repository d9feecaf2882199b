"""`diffspec bench multimodal` on the shipped tiny-vlm pair, tiny settings: JSON contract, measured exactness."""

from __future__ import annotations

import json

import pytest

from diffspec.bench import run_bench
from diffspec.bench.multimodal import _split
from diffspec.bench.report import headline, markdown_table


def test_arm_names_parse():
    assert _split("draft-b4") == ("draft", 4, False)
    assert _split("text-draft") == ("text-draft", 1, False)
    assert _split("draft-sample") == ("draft", 1, True)
    assert _split("prompt-lookup") == ("prompt-lookup", 1, False)


def test_multimodal_suite_json(tmp_path):
    out = tmp_path / "mm.json"
    doc = run_bench("multimodal", out=out, images=2, batches=[2], repeats=1, warmup=0, show_progress=False,
                    methods=["draft", "text-draft", "assisted", "prompt-lookup", "draft-b2", "draft-sample"])
    assert json.loads(out.read_text())["suite"] == "multimodal"
    runs = {r["method"]: r for r in doc["runs"]}
    assert set(runs) == {"baseline", "draft", "text-draft", "assisted", "prompt-lookup", "baseline-b2", "draft-b2",
                         "baseline-sample", "draft-sample"}  # the baselines each arm is compared with are added
    for name, r in runs.items():
        assert r["latency_s"]["n"] == 1 and r["speedup_vs_baseline"] > 0
        if not name.endswith("-sample"):
            assert r["quality"]["exact"] is True, name  # measured: captions identical to plain generate
    assert runs["baseline-sample"]["quality"]["exact"] is None
    base, draft = runs["baseline"], runs["draft"]
    assert base["tokens_per_target_call"] <= 1.0 and base["accepted_per_round"] is None
    assert draft["target_calls"] < base["target_calls"] and draft["tokens_per_target_call"] > 1.5
    assert draft["accepted_per_round"] > runs["text-draft"]["accepted_per_round"]  # the image helps the drafter
    assert runs["assisted"]["peer"] and runs["assisted"]["batch"] == 1 and "speedup_vs_assisted" in draft
    assert runs["draft-b2"]["batch"] == 2 and runs["draft-b2"]["target_evals"] == 2 * runs["draft-b2"]["target_calls"]
    table = markdown_table(doc)
    assert "`assisted` (peer)" in table and "multimodal on tiny-vlm" in headline(doc)


def test_multimodal_suite_rejects_bad_arguments():
    with pytest.raises(ValueError, match="unknown method"):
        run_bench("multimodal", methods=["medusa"], images=2, batches=[2])
    with pytest.raises(ValueError, match="multiple of every batch size"):
        run_bench("multimodal", images=3, batches=[2])


def test_cli_bench_multimodal(tmp_path, capsys):
    from diffspec.cli import main

    out = tmp_path / "cli.json"
    assert main(["bench", "multimodal", "--images", "2", "--batch-size", "2", "--methods", "draft,draft-b2",
                 "--repeats", "1", "--warmup", "0", "--set", "num_draft_tokens=8", "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["model"]["name"] == "tiny-vlm" and doc["workload"]["batches"] == [1, 2]
    assert [r["method"] for r in doc["runs"]] == ["baseline", "draft", "baseline-b2", "draft-b2"]
    assert doc["runs"][1]["config"]["num_draft_tokens"] == 8
    assert "| `draft-b2` | 2 |" in capsys.readouterr().out
