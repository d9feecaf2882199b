"""Int8 storage of shipped weights: round trip within a row's quantization step, strict loading."""

import pytest
import torch

from diffspec.models.int8_weights import FILENAME, SCALE_SUFFIX, dequantize, load_int8, quantize, save_int8


def test_round_trip_error_is_within_half_a_step_per_row():
    torch.manual_seed(0)
    w = torch.randn(64, 128) * torch.logspace(-3, 1, 64)[:, None]  # rows of very different scale
    stored = quantize({"w": w, "b": torch.randn(64), "small": torch.randn(8, 8)})
    assert stored["w"].dtype == torch.int8 and stored["w" + SCALE_SUFFIX].shape == (64, 1)
    assert stored["b"].dtype == torch.float16 and stored["small"].dtype == torch.float16  # small: not quantized
    back = dequantize(stored)
    step = stored["w" + SCALE_SUFFIX].float()
    assert ((back["w"] - w).abs() <= 0.5 * step + 1e-6 * w.abs()).all()
    assert set(back) == {"w", "b", "small"}


def test_save_and_load_a_transformers_model(tmp_path):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=2)).eval()
    save_int8(model, tmp_path)
    assert (tmp_path / FILENAME).is_file() and not (tmp_path / "model.safetensors").exists()
    loaded = load_int8(LlamaForCausalLM, tmp_path)
    ids = torch.randint(0, 64, (2, 12))
    with torch.no_grad():
        a, b = model(ids).logits, loaded(ids).logits
    assert (a - b).abs().max() < 0.05 * a.abs().max()
    assert not torch.equal(a, b)  # it really is the quantized model


def test_missing_or_mismatched_weights_are_clear_errors(tmp_path):
    from transformers import LlamaConfig, LlamaForCausalLM

    with pytest.raises(ValueError, match="has no model.int8.safetensors"):
        load_int8(LlamaForCausalLM, tmp_path)
    small = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                                         num_attention_heads=4, num_key_value_heads=2))
    save_int8(small, tmp_path)
    small.config.num_hidden_layers = 2  # config now promises a layer the weights lack
    small.config.save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="does not match LlamaForCausalLM: missing"):
        load_int8(LlamaForCausalLM, tmp_path)


@pytest.mark.parametrize(("storage", "file", "tolerance"), [("float32", "model.safetensors", 0.0),
                                                            ("float16", "model.safetensors", 1e-3),
                                                            ("int8", FILENAME, 1 / 254)])
def test_a_llamagen_gpt_round_trips_in_each_storage(tmp_path, storage, file, tolerance):
    from diffspec.ar_image.targets.llamagen import LlamaGenTransformer
    from diffspec.ar_image.targets.llamagen_config import LlamaGenConfig
    from diffspec.models import load_gpt, save_gpt

    torch.manual_seed(0)
    config = LlamaGenConfig(dim=64, n_layer=2, n_head=2, vocab_size=128, num_classes=10, block_size=16, multiple_of=16)
    model = LlamaGenTransformer(config).eval()
    save_gpt(model, tmp_path, "int8" if storage != "int8" else "float32")  # the other weight file is replaced
    assert save_gpt(model, tmp_path, storage) == tmp_path / file
    assert sorted(p.name for p in tmp_path.glob("*.safetensors")) == [file]
    assert {p.dtype for p in model.parameters()} == {torch.float32}  # the saved model is left as it was
    loaded = load_gpt(tmp_path)
    for name, p in model.state_dict().items():
        q = loaded.state_dict()[name]
        assert q.dtype == torch.float32 and (q - p).abs().max() <= tolerance * p.abs().max() + 1e-7, name
    with pytest.raises(ValueError, match="storage='bfloat16' is not supported"):
        save_gpt(model, tmp_path, "bfloat16")


def test_a_pipeline_folder_with_an_int8_transformer_loads_as_its_diffusers_pipeline(tmp_path):
    from diffspec.models import load_pipeline
    from diffspec.testing.tiny_pipelines import save_tiny_pipeline

    folder = save_tiny_pipeline("tiny-flux-random", tmp_path / "flux")
    plain = load_pipeline(folder)
    (folder / "transformer" / "diffusion_pytorch_model.safetensors").unlink()
    save_int8(plain.transformer, folder / "transformer")
    pipe = load_pipeline(folder)
    assert type(pipe).__name__ == "FluxPipeline" and pipe.transformer.dtype == torch.float32
    for name, p in plain.transformer.state_dict().items():  # every weight within a quantization step of the original
        assert (pipe.transformer.state_dict()[name] - p).abs().max() <= 0.01 * p.abs().max() + 1e-3, name
    pipe.save_pretrained(tmp_path / "plain")  # the documented way back to a plain diffusers folder
    assert (tmp_path / "plain" / "transformer" / "diffusion_pytorch_model.safetensors").is_file()
