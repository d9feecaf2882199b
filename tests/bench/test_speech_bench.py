"""The speech bench's tools: the replay drafter forces the acceptance it is given; the codec table."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "multimodal"))
from speech_tiny import EN, NOTS, SOT, TIMESTAMPS, TRANSCRIBE, features, whisper, whisper_shared_encoder  # noqa: E402

from diffspec.bench.speech import codec_table, replay_drafter  # noqa: E402
from diffspec.multimodal.loop import speculative_generate  # noqa: E402
from diffspec.stats import SpecStats  # noqa: E402


def test_replay_drafter_forces_acceptance():
    target = whisper()
    feats = features(3, 0)
    kw = dict(language="en", max_new_tokens=10, suppress_tokens=TIMESTAMPS + [100])  # no EOS: full length
    ref = target.generate(feats, **kw)
    table = torch.cat([torch.tensor([[SOT, EN, TRANSCRIBE, NOTS]]).expand(3, -1), ref], 1)
    small = whisper_shared_encoder(target)
    rates = []
    for accept in (1.0, 0.0):
        stats = SpecStats()
        out = target.generate(feats, **kw, custom_generate=speculative_generate, num_draft_tokens=3,
                              drafter=replay_drafter(small, table, accept), spec_stats=stats)
        assert torch.equal(out, ref)
        rates.append(stats.acceptance_rate)
    assert rates == [1.0, 0.0]


def test_codec_table_rows():
    doc = {"runs": [{"config": {"beta": 0.5}, "acceptance_rate": 0.25, "target_calls": 10.0, "baseline_target_calls": 16,
                     "relaxed_tokens": 3, "token_disagreement": 0.125, "token_disagreement_per_codebook": [0.0, 0.25],
                     "quality": {"exact": False}}]}
    assert codec_table(doc).splitlines()[-1] == "| 0.5 | 0.25 | 10 (16) | 3 | 0.125 | 0.00, 0.25 | False |"


def test_speech_suite_through_run_bench(tmp_path):
    from diffspec.bench import run_bench
    from diffspec.bench.report import markdown_table

    out = tmp_path / "speech.json"
    doc = run_bench("speech", out=out, tokens=4, accepts=(1.0,), repeats=1, warmup=0, show_progress=False,
                    methods=None, overrides={})
    assert out.exists() and doc["suite"] == "speech"
    assert all(run["quality"]["exact"] for run in doc["runs"])
    assert markdown_table(doc).count("\n") >= len(doc["runs"])
