"""Official SJD / SCD peers: key conversion (no official code needed), skipping without checkouts."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from diffspec.ar_image.targets.llamagen import LlamaGenTransformer
from diffspec.ar_image.targets.llamagen_config import LlamaGenConfig
from diffspec.bench.official_ar_peers import (
    SCD_ENV,
    SJD_ENV,
    from_official_state,
    jacobi_params,
    official_llamagen_keys,
    official_model_args,
    peer_checkouts,
    to_official_state,
)
from diffspec.bench.official_ar_run import run_official_peers
from diffspec.models import load_ar_target

ROOT = Path(__file__).resolve().parents[2]


def _tiny(seed: int = 0) -> LlamaGenTransformer:
    torch.manual_seed(seed)
    cfg = LlamaGenConfig(dim=32, n_layer=2, n_head=2, vocab_size=16, num_classes=4, block_size=16, multiple_of=16)
    model = LlamaGenTransformer(cfg).eval()
    torch.nn.init.normal_(model.output.weight, std=0.2)  # zero-initialised by default: make the logits informative
    return model


def test_round_trip_diffspec_official_diffspec():
    model = _tiny()
    state = to_official_state(model)
    assert set(state) == official_llamagen_keys(model.config)
    # what an official checkpoint may carry besides weights (derived state) is dropped on the way back
    official = {**state, "freqs_cis": torch.zeros(3), "layers.0.attention.kv_cache.k_cache": torch.zeros(1),
                "causal_mask": torch.ones(2, 2)}
    back = from_official_state(official, model.config)
    fresh = _tiny(seed=1)
    fresh.load_state_dict(back, strict=True)
    tokens, labels = torch.randint(0, 16, (3, 16)), torch.tensor([0, 3, 4])
    with torch.no_grad():
        assert torch.equal(fresh(tokens, labels), model(tokens, labels))
        assert not torch.equal(_tiny(seed=1)(tokens, labels), model(tokens, labels))


def test_shipped_tiny_ar_has_the_official_layout():
    model = load_ar_target("tiny-ar").model
    assert set(to_official_state(model)) == official_llamagen_keys(model.config)
    args = official_model_args(model.config)
    assert (args["dim"], args["n_layer"], args["n_head"], args["vocab_size"]) == (128, 4, 4, 1024)
    assert (args["block_size"], args["cls_token_num"], args["num_classes"], args["model_type"]) == (64, 1, 10, "c2i")
    assert args["resid_dropout_p"] == args["ffn_dropout_p"] == args["token_dropout_p"] == 0.0


def test_conversion_rejects_foreign_keys():
    model = _tiny()
    state = to_official_state(model)
    with pytest.raises(ValueError, match="unexpected keys.*lm_head"):
        from_official_state({**state, "lm_head.weight": torch.zeros(1)}, model.config)
    state.pop("norm.weight")
    with pytest.raises(ValueError, match="missing keys.*norm.weight"):
        from_official_state(state, model.config)


def test_jacobi_params_follow_the_official_limits():
    p = jacobi_params(16, 64, 3.0, 1024)
    assert p["jacobi_loop_interval_r"] == 48 and p["max_num_new_tokens"] == 16 and p["image_top_k"] == 1024
    with pytest.raises(ValueError, match="window=64 is out of range"):
        jacobi_params(64, 64, 3.0, 1024)


def test_checkouts_absent_or_incomplete_are_skipped(tmp_path):
    found = peer_checkouts(None, None, env={})
    assert found["sjd"] is None and set(found["skipped"]) == {"sjd-official", "scd-official"}
    assert SJD_ENV in found["skipped"]["sjd-official"] and SCD_ENV in found["skipped"]["scd-official"]
    (tmp_path / "llamagen").mkdir()
    (tmp_path / "llamagen" / "llamagen.py").write_text("")
    found = peer_checkouts(str(tmp_path), None, env={})
    assert "lacks llamagen/llamagen_solver.py" in found["skipped"]["sjd-official"]


def test_driver_reports_skipped_without_checkouts(monkeypatch):
    monkeypatch.delenv(SJD_ENV, raising=False)
    monkeypatch.delenv(SCD_ENV, raising=False)
    doc = run_official_peers(show_progress=False)
    assert doc["runs"] == [] and "sjd-official" in doc["skipped"]
    env = {k: v for k, v in os.environ.items() if k not in (SJD_ENV, SCD_ENV, "DIFFSPEC_PEER_SITE")}
    env["PYTHONPATH"] = str(ROOT)
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "ar_image_official_peers.py")], env=env,
                          capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 2 and "official peers skipped" in proc.stderr and SJD_ENV in proc.stderr


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error raised without CUDA")
def test_driver_rejects_cuda_without_cuda():
    with pytest.raises(ValueError, match="device='cuda'"):
        run_official_peers(device="cuda", show_progress=False)
    with pytest.raises(ValueError, match="device='mps'"):
        run_official_peers(device="mps", show_progress=False)


@pytest.mark.slow
@pytest.mark.skipif(not os.environ.get(SJD_ENV), reason=f"needs an official SJD checkout in ${SJD_ENV}")
def test_official_gpt_matches_diffspec_logits():
    from diffspec.bench.official_ar_peers import OfficialArm, import_official, install_cpu_shims, logits_match

    found = peer_checkouts(None, None)
    install_cpu_shims()
    try:
        mods = import_official(found["sjd"], found["scd"])
    except ImportError as err:  # e.g. transformers >= 4.49 has no LogitsWarper
        pytest.skip(f"the official code does not import here (it pins transformers 4.47): {err}")
    target = load_ar_target("tiny-ar")
    arm = OfficialArm(mods, target.model.config, to_official_state(target.model), scheduler="sjd", window=8,
                      guidance=3.0, top_k=1024)
    assert logits_match(arm.model, target.model)["allclose_atol_1e-4"]
    tokens = arm(3, 0)
    assert tokens.shape == (1, 64) and 1 <= arm.calls < 64
