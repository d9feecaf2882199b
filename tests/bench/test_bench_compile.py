"""``--compile`` in the diffusion bench suites: same samples as eager, nothing compiled after warmup,
recorded in the JSON, bad values refused.

Dynamo-level behaviour (shapes, guards, recompiles) does not depend on the backend, so most tests
use ``backend="eager"``; the slow ones run inductor (``torch.compile`` default mode) on the CPU.
"""

import pytest
import torch
import torch._dynamo
from torch._dynamo.utils import counters

from diffspec import SpeculativePipeline
from diffspec.bench import run_bench
from diffspec.bench.compiled import (
    COMPILE_MODES,
    PaddedRows,
    check_compile_mode,
    compile_transformer,
    eager,
    graphs_compiled,
    recompile_limit,
    row_buckets,
)
from diffspec.cli import main
from diffspec.config import CouplingConfig

TOL = dict(rtol=1e-4, atol=1e-4)
STEPS = 12


@pytest.fixture(autouse=True)
def _fresh_dynamo(fresh_dynamo):
    """Every test starts and ends with an empty dynamo cache and counters (tests/conftest.py)."""


@pytest.fixture
def pipe():
    from diffusers import DDPMScheduler

    from diffspec.models import load_pipeline

    p = load_pipeline("tiny-dit", dtype=torch.float32, device=torch.device("cpu"))
    p.scheduler = DDPMScheduler.from_config(p.scheduler.config)
    p.set_progress_bar_config(disable=True)
    return p


def _generate(pipe, plain, seed=0, batch=1):
    spec = SpeculativePipeline.from_pipe(pipe, method=CouplingConfig(lookahead=2, max_lookahead=2))
    run = spec.plain if plain else spec
    with torch.inference_mode():
        out = run(class_labels=[(seed + i) % 4 for i in range(batch)], num_inference_steps=STEPS, guidance_scale=4.0,
                  generator=torch.Generator().manual_seed(seed), output_type="latent")
    return out.images.float(), spec.stats


def _compile(pipe, backend):
    """The bench's arrangement: compiled transformer inside the row-padding wrapper."""
    padded = PaddedRows(compile_transformer(pipe.transformer, "default", "tiny-dit", backend),
                        [2 * u for u in row_buckets(2, fixed=(1,))])  # CFG: two rows per drafted state
    pipe.transformer = padded
    return padded


def test_compile_mode_is_checked_everywhere(capsys):
    assert check_compile_mode(None) == "none" and set(COMPILE_MODES) >= {"none", "default", "reduce-overhead",
                                                                        "repeated-blocks"}
    allowed = "none, default, reduce-overhead, repeated-blocks, blocks"
    for suite in ("exact-diffusion", "dit-cache"):
        with pytest.raises(ValueError, match=f"compile='fast' is not supported; choose one of {allowed}"):
            run_bench(suite, model="tiny-dit", compile="fast", steps=4, quality_samples=4)
    assert main(["bench", "exact-diffusion", "--compile", "max", "--steps", "4"]) == 2
    assert "compile='max'" in capsys.readouterr().err
    assert main(["bench", "ar-image", "--compile", "default"]) == 2
    assert "--compile applies to the exact-diffusion and dit-cache suites" in capsys.readouterr().err


def test_repeated_blocks_names_a_model_without_them(pipe):
    with pytest.raises(ValueError, match="'tiny-dit' .DiTTransformer2DModel. declares no _repeated_blocks"):
        compile_transformer(pipe.transformer, "repeated-blocks", "tiny-dit", "eager")
    assert compile_transformer(pipe.transformer, "none", "tiny-dit") is pipe.transformer


def test_padding_keeps_the_real_rows_and_counts_them_apart(pipe):
    assert row_buckets(32, fixed=(2,)) == [1, 2, 3, 4, 6, 8, 12, 16, 24, 32]
    model = pipe.transformer
    padded = PaddedRows(model, [2, 8])
    x, t = torch.randn(5, 4, 8, 8), torch.tensor([900, 800, 700, 600, 500])
    labels = torch.tensor([0, 1, 2, 3, 1000])
    with torch.no_grad():
        want = model(x, timestep=t, class_labels=labels).sample
        got = padded(x, timestep=t, class_labels=labels).sample
    assert got.shape == want.shape and torch.allclose(got, want, **TOL)
    assert padded.seen == {8} and padded.real_rows == 5 and padded.padded_rows == 3
    assert padded.config is model.config and padded.dtype == model.dtype  # attributes pipelines read
    with torch.no_grad():
        assert padded.prewarm() == [2, 8]
        with eager(padded):  # quality passes: unpadded, not counted
            padded(x, timestep=t, class_labels=labels)
    assert padded.real_rows == 5 and padded.active


@pytest.mark.parametrize("plain", [True, False], ids=["baseline", "coupling"])
def test_compiled_samples_match_eager_and_nothing_recompiles_after_warmup(pipe, plain):
    """Dynamo (eager backend): coupling's varying verify rows are padded to buckets compiled once."""
    want, want_stats = _generate(pipe, plain)
    padded = _compile(pipe, "eager")
    with recompile_limit(len(padded.buckets) + 4), torch._dynamo.config.patch(fail_on_recompile_limit_hit=True):
        first, stats = _generate(pipe, plain)
        seen = set(padded.seen)
        with torch.inference_mode():
            padded.prewarm()
        assert graphs_compiled() > 0 and not counters["graph_break"]
        counters.clear()
        with torch._dynamo.config.patch(error_on_recompile=True):
            second, _ = _generate(pipe, plain, seed=1)  # another seed: other row counts, same buckets
    assert graphs_compiled() == 0
    assert torch.allclose(first, want, **TOL) and stats.target_calls == want_stats.target_calls
    assert stats.target_evals == want_stats.target_evals  # padding is not counted
    if not plain:
        assert stats.target_calls < STEPS and len(seen) > 1  # several row counts were called
    else:
        assert seen == {2} and padded.padded_rows == 0  # the plain step is never padded


def test_exact_diffusion_json_records_compile():
    doc = run_bench("exact-diffusion", model="tiny-dit", steps=6, quality_samples=4, repeats=1, warmup=1,
                    methods=["coupling", "fewer-steps"], overrides={"lookahead": 2, "max_lookahead": 2},
                    compile="default", compile_backend="eager", show_progress=False)
    block = doc["compile"]
    assert block["mode"] == "default" and block["backend"] == "eager" and block["row_buckets"] == [2, 4]
    assert set(block["compiled_shapes"]) <= set(block["row_buckets"]) and 2 in block["compiled_shapes"]
    for run in doc["runs"]:
        assert run["compile"] == "default"
        assert run["compiled_graphs"]["after_warmup"] == 0, run["method"]
        assert set(run["rows"]["buckets"]) <= set(block["row_buckets"]) and run["rows"]["padding_fraction"] >= 0
    runs = {r["method"]: r for r in doc["runs"]}
    assert runs["baseline"]["rows"] == {"buckets": [2], "padding_fraction": 0.0}
    assert runs["coupling"]["quality"]["two_sample"] is not None
    assert any("compile:" in note for note in doc["notes"])


@pytest.mark.parametrize("mode", [pytest.param("default", marks=pytest.mark.slow), "blocks"])  # whole model: ~70 s
def test_dit_cache_json_records_compile(mode):
    """Forecast hooks on a compiled transformer: same outputs as eager, nothing compiled after warmup."""
    doc = run_bench("dit-cache", model="tiny-dit-random", steps=10, repeats=1, warmup=1, quality_samples=2,
                    methods=["taylor", "speca"], compile=mode, compile_backend="eager", show_progress=False)
    assert doc["compile"] == {"mode": mode, "backend": "eager", "dynamic": False}
    runs = {r["method"]: r for r in doc["runs"]}
    assert list(runs) == ["baseline", "taylor", "speca"]
    for run in runs.values():
        assert run["compile"] == mode and run["compiled_graphs"]["after_warmup"] == 0, run["method"]
        assert run["compiled_vs_eager_max_abs"] < 1e-4, run["method"]
    assert runs["taylor"]["target_calls"] < runs["baseline"]["target_calls"]
    with pytest.raises(ValueError, match="budget_evals is not supported"):
        run_bench("dit-cache", model="tiny-dit-random", compile="default", budget_evals=[5], steps=10)


@pytest.mark.slow
@pytest.mark.parametrize("plain", [True, False], ids=["baseline", "coupling"])
def test_inductor_samples_match_eager_without_recompiles(pipe, plain):
    """torch.compile default mode (inductor, C++ on the CPU): same samples within float tolerance."""
    want, _ = _generate(pipe, plain)
    padded = _compile(pipe, "inductor")
    with recompile_limit(len(padded.buckets) + 4):
        first, _ = _generate(pipe, plain)
        with torch.inference_mode():
            padded.prewarm()
        counters.clear()
        with torch._dynamo.config.patch(error_on_recompile=True):
            _generate(pipe, plain, seed=1)
    assert graphs_compiled() == 0
    assert torch.allclose(first, want, rtol=1e-3, atol=1e-3)
