"""Loading transformers targets and drafters from local folders (``SpeculativePipeline.from_pretrained``).

A folder with a transformers ``config.json`` (and no diffusers ``model_index.json``) is loaded
with the class its config names (``architectures[0]``), else with the first auto class whose
mapping knows the model type: speech seq2seq (Whisper), image-text-to-text (LLaVA, Qwen2-VL),
causal LM (Llama, Qwen2, ``WhisperForCausalLM``, ``MusicgenForCausalLM``). Its processor
(tokenizer / feature extractor / image processor) is loaded when the folder has one. Other
model types get an adapter with :func:`register_loader`.

Example:
    >>> spec = SpeculativePipeline.from_pretrained("ckpt/whisper", method="draft",  # doctest: +SKIP
    ...                                            draft="ckpt/whisper-small-decoder")
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

AUTO_FAMILIES = (
    ("speech seq2seq (Whisper)", "AutoModelForSpeechSeq2Seq"),
    ("image-text-to-text VLMs (LLaVA, LLaVA-NeXT, Qwen2-VL, Qwen2.5-VL)", "AutoModelForImageTextToText"),
    ("causal LMs (Llama, Qwen2, WhisperForCausalLM, MusicgenForCausalLM)", "AutoModelForCausalLM"),
)
"""(family, transformers auto class) in lookup order."""

PROCESSOR_FILES = ("processor_config.json", "preprocessor_config.json", "tokenizer_config.json", "tokenizer.json")

_LOADERS: dict[str, Callable[..., Any]] = {}


def register_loader(model_type: str, loader: Callable[..., Any]) -> None:
    """Load folders whose ``config.model_type`` is ``model_type`` with ``loader(path, dtype=..., device=...)``.

    The loader returns a generative model (``generate``/``forward`` with a KV cache), or a
    ``(model, processor)`` pair.

    Example:
        >>> register_loader("my-tts", lambda path, dtype=None, device=None: MyTTS.from_pretrained(path))  # doctest: +SKIP
    """
    if not isinstance(model_type, str) or not model_type or not callable(loader):
        raise ValueError(f"register_loader({model_type!r}, {loader!r}): needs a model_type string and a callable")
    _LOADERS[model_type] = loader


def is_transformers_folder(folder: str | Path) -> bool:
    """Whether ``folder`` holds a transformers checkpoint (``config.json``, not a diffusers pipeline)."""
    folder = Path(folder)
    return (folder / "config.json").is_file() and not (folder / "model_index.json").is_file()


def _unsupported(what: str) -> ValueError:
    families = "; ".join(f"{name} via {auto}" for name, auto in AUTO_FAMILIES)
    return ValueError(f"{what} is not supported by diffspec's multimodal methods; supported: {families}. "
                      "Register an adapter for another model type with "
                      "diffspec.multimodal.loading.register_loader(model_type, loader), or build the model "
                      "yourself and call SpeculativePipeline.from_pipe((model, processor), method=..., draft=...)")


def _model_class(config: Any) -> Any:
    import transformers

    archs = getattr(config, "architectures", None) or []
    if archs:
        cls = getattr(transformers, archs[0], None)
        if cls is not None:
            if not cls.can_generate():
                raise _unsupported(f"{archs[0]} (model_type {config.model_type!r}, not a generative model)")
            return cls
    for _, auto_name in AUTO_FAMILIES:
        auto = getattr(transformers, auto_name)
        if type(config) in auto._model_mapping:
            return auto
    raise _unsupported(f"model_type {config.model_type!r}")


def load_model(path: str | Path, *, dtype: Any = None, device: Any = None) -> Any:
    """A generative transformers model from a local folder, in eval mode (see the module docstring).

    Raises:
        ValueError: not a transformers folder, or an unsupported model type (the message lists the
            supported families and how to register an adapter).
    """
    from transformers import AutoConfig

    folder = Path(path).expanduser()
    if not is_transformers_folder(folder):
        raise ValueError(f"{folder} is not a transformers model folder (no config.json)")
    config = AutoConfig.from_pretrained(folder)
    if config.model_type in _LOADERS:
        return _LOADERS[config.model_type](folder, dtype=dtype, device=device)
    model = _model_class(config).from_pretrained(folder, **({} if dtype is None else {"dtype": dtype}))
    return (model if device is None else model.to(device)).eval()


def load_processor(path: str | Path) -> Any:
    """The folder's processor (``AutoProcessor``), or None when it has no processor/tokenizer files."""
    from transformers import AutoProcessor

    folder = Path(path).expanduser()
    if not any((folder / name).is_file() for name in PROCESSOR_FILES):
        return None
    return AutoProcessor.from_pretrained(folder)


def load_target(path: str | Path, *, dtype: Any = None, device: Any = None) -> Any:
    """``(model, processor)`` from a folder (``model`` alone when there is no processor)."""
    loaded = load_model(path, dtype=dtype, device=device)
    if isinstance(loaded, tuple):
        return loaded
    processor = load_processor(path)
    return loaded if processor is None else (loaded, processor)
