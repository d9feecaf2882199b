import numpy as np
import pytest
import torch

import diffspec
from diffspec import SpeculativePipeline
from diffspec.ar_image.config import MCSJDConfig, SJDConfig
from diffspec.ar_image.plain import ARImageOutput
from diffspec.ar_image.targets.toy import ToyTableTarget
from diffspec.pipelines.ar_image import ARImagePipeline


def gen(seed=0):
    return torch.Generator().manual_seed(seed)


@pytest.fixture
def toy():
    return ToyTableTarget(vocab=4, grid=(4, 8), seed=0, scale=2.0)


def test_registry_and_dispatch(toy):
    table = {m.name: m for m in diffspec.methods("ar_image", available_only=True)}
    assert table["sjd"].config_class is SJDConfig and table["mc-sjd"].config_class is MCSJDConfig
    assert diffspec.api.target_family(toy) == "ar_image"
    spec = SpeculativePipeline.from_pipe(toy, method="mc-sjd", window=8, coupling="gumbel")
    assert isinstance(spec, ARImagePipeline) and spec.config == MCSJDConfig(window=8, coupling="gumbel")
    assert SpeculativePipeline.from_pipe(toy, method=SJDConfig(init="repeat")).config.init == "repeat"
    with pytest.raises(ValueError, match="'taylor' is a diffusion method but the target is a ar_image target"):
        SpeculativePipeline.from_pipe(toy, method="taylor")
    with pytest.raises(ValueError, match="window=0 is out of range"):
        SpeculativePipeline.from_pipe(toy, method="sjd", window=0)


@pytest.mark.parametrize("output_type", ["pil", "np", "pt", "tokens"])
def test_output_types_tokens_and_stats(toy, output_type):
    spec = SpeculativePipeline.from_pipe(toy, method="sjd", window=8)
    out = spec(class_labels=[0, 1, 1], generator=gen(), output_type=output_type)
    assert isinstance(out, ARImageOutput) and out.tokens.shape == (3, 32)
    if output_type == "pil":
        assert len(out.images) == 3 and out.images[0].size == (8, 4)
    elif output_type == "np":
        assert isinstance(out.images, np.ndarray) and out.images.shape == (3, 4, 8, 3)
    elif output_type == "pt":
        assert out.images.shape == (3, 3, 4, 8) and 0 <= float(out.images.min()) <= float(out.images.max()) <= 1
    else:
        assert out.images is None
    stats = out.spec_stats
    assert stats is spec.stats and stats.target_calls == stats.extra["iterations"] + 1
    assert stats.target_calls < 32 and stats.extra["step_compression"] == 32 / stats.target_calls
    assert stats.wall_s > 0
    images, tokens = spec(class_labels=[0], generator=gen(), output_type="pt", return_dict=False)
    assert images.shape == (1, 3, 4, 8) and tokens.shape == (1, 32)


def test_greedy_matches_target_plain_call_and_overrides_are_per_call(toy):
    spec = SpeculativePipeline.from_pipe(toy, method="mc-sjd", window=16)
    labels = [1, 0, 1, 1]
    ref = toy(class_labels=labels, guidance_scale=2.0, temperature=0, output_type="tokens").tokens
    out = spec(class_labels=labels, guidance_scale=2.0, temperature=0, output_type="tokens")
    assert torch.equal(out.tokens, ref) and spec.config.temperature == 1.0
    assert torch.equal(spec.plain(class_labels=labels, guidance_scale=2.0, temperature=0, output_type="tokens").tokens,
                       ref)
    assert spec.stats.target_calls == 32 and spec.stats.target_evals == 64
    assert torch.equal(toy.generate(class_labels=labels, guidance_scale=2.0, temperature=0), ref)
    with pytest.raises(ValueError, match="top_p=2.0 is out of range"):
        spec(class_labels=labels, top_p=2.0)


def test_disable_gives_the_target_call_and_same_seed_same_output(toy):
    spec = SpeculativePipeline.from_pipe(toy, method="sjd")
    a = spec(class_labels=[0, 1], generator=gen(3), output_type="tokens").tokens
    b = spec(class_labels=[0, 1], generator=gen(3), output_type="tokens").tokens
    assert torch.equal(a, b)
    spec.disable()
    plain = spec(class_labels=[0, 1], generator=gen(3), output_type="tokens")
    assert torch.equal(plain.tokens, toy(class_labels=[0, 1], generator=gen(3), output_type="tokens").tokens)
    assert plain.spec_stats.target_calls == 0  # the wrapper counted nothing: the target ran alone
    with pytest.raises(ValueError, match="output_type='latent' is not supported"):
        toy(class_labels=[0], output_type="latent")


def test_wrap_rejects_non_ar_targets():
    with pytest.raises(ValueError, match="needs an ARImageTarget"):
        ARImagePipeline.wrap(torch.nn.Linear(2, 2), SJDConfig())
