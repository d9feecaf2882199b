import torch

from diffspec import SpeculativePipeline


def _run(pipe, steps=20, seed=0):
    g = [torch.Generator().manual_seed(seed + i) for i in range(2)]
    return pipe(class_labels=[0, 1], num_inference_steps=steps, generator=g, output_type="pt").images


def test_taylor_on_dit_pipeline_counts_steps_and_disable_is_bit_identical(tiny_dit_pipe):
    baseline = _run(tiny_dit_pipe)
    spec = SpeculativePipeline.from_pipe(tiny_dit_pipe, method="taylor")
    g = [torch.Generator().manual_seed(i) for i in range(2)]
    out = spec(class_labels=[0, 1], num_inference_steps=20, generator=g, output_type="pt")
    stats = out.spec_stats
    assert stats is spec.stats and stats.method == "taylor"
    # 20 steps, warmup 3, interval 5, last step full: full at 0,1,2,7,12,17,19
    assert (stats.full_steps, stats.forecast_steps, stats.target_calls) == (7, 13, 7)
    assert stats.wall_s > 0 and stats.extra_mem_gb > 0
    assert not torch.equal(out.images, baseline)
    psnr = -10 * torch.log10(((out.images - baseline) ** 2).mean())
    assert psnr > 20

    # a second call resets the state and gives the same result
    g = [torch.Generator().manual_seed(i) for i in range(2)]
    again = spec(class_labels=[0, 1], num_inference_steps=20, generator=g, output_type="pt")
    assert torch.equal(again.images, out.images) and again.spec_stats.full_steps == 7

    # a different step count in the next call works too
    g = [torch.Generator().manual_seed(i) for i in range(2)]
    spec(class_labels=[0, 1], num_inference_steps=12, generator=g, output_type="pt")
    assert spec.stats.full_steps + spec.stats.forecast_steps == 12

    spec.disable()
    assert torch.equal(_run(tiny_dit_pipe), baseline)
    assert "forward" not in tiny_dit_pipe.transformer.transformer_blocks[0].__dict__


def test_attribute_forwarding_and_enable(tiny_dit_pipe):
    spec = SpeculativePipeline.from_pipe(tiny_dit_pipe, method="taylor")
    assert spec.transformer is tiny_dit_pipe.transformer and spec.pipe is tiny_dit_pipe
    assert "enabled" in repr(spec)
    spec.disable()
    spec.enable()
    assert spec.enabled
    _run(spec, steps=10)
    assert spec.stats.forecast_steps > 0
    spec.disable()


def test_from_pretrained_local_folder(tmp_path, tiny_dit_pipe):
    tiny_dit_pipe.save_pretrained(tmp_path / "pipe")
    spec = SpeculativePipeline.from_pretrained(tmp_path / "pipe", method="taylor", interval=2)
    assert spec.config.interval == 2
    spec.set_progress_bar_config(disable=True)
    baseline = _run(tiny_dit_pipe, steps=6)
    spec.disable()
    torch.testing.assert_close(_run(spec.pipe, steps=6), baseline)


def test_speca_on_dit_pipeline_with_calibration_file(tiny_dit_pipe, tmp_path):
    from diffspec.forecast.calibrate import CALIBRATION_FILE, save_calibration

    baseline = _run(tiny_dit_pipe)
    spec = SpeculativePipeline.from_pipe(tiny_dit_pipe, method="speca", k_min=0)
    assert spec.threshold_source == "fallback" and spec.config.calibrated
    out = _run(spec)
    stats = spec.stats
    assert stats.method == "speca" and stats.full_steps + stats.forecast_steps == 20
    assert stats.extra["checks"] > 0 and stats.extra["verifier_blocks"] > 0
    assert -10 * torch.log10(((out - baseline) ** 2).mean()) > 20
    assert torch.equal(_run(spec), out)  # a new call starts a new generation: same result
    _run(spec, steps=12)  # another step count in the next call
    assert spec.stats.full_steps + spec.stats.forecast_steps == 12
    spec.disable()
    assert torch.equal(_run(tiny_dit_pipe), baseline)

    # a saved pipeline folder with a calibration file: speca reads its thresholds
    tiny_dit_pipe.save_pretrained(tmp_path)
    save_calibration({"tau0": 0.5, "beta": 0.25, "tau_min": 0.0}, tmp_path)
    spec = SpeculativePipeline.from_pretrained(tmp_path, method="speca")
    assert spec.threshold_source.endswith(CALIBRATION_FILE)
    assert (spec.config.tau0, spec.config.beta, spec.config.tau_min) == (0.5, 0.25, 0.0)
    spec = SpeculativePipeline.from_pretrained(tmp_path, method="speca", tau0=0.1)  # explicit values win
    assert spec.config.tau0 == 0.1 and spec.config.beta == 0.25


def test_taylor_full_steps_holds_across_step_counts(tiny_dit_pipe):
    spec = SpeculativePipeline.from_pipe(tiny_dit_pipe, method="taylor", warmup=2, full_steps=6)
    for steps in (20, 31):  # the same number of full steps, placed for each generation's step count
        assert _run(spec, steps=steps).shape[0] == 2
        assert (spec.stats.full_steps, spec.stats.forecast_steps) == (6, steps - 6)
