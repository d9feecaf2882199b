"""Finding the transformer blocks of a diffusers model and reading/writing their streams."""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

# (hidden index, encoder index) in the tuple a block returns; blocks that return a plain tensor
# need no entry. Mirrors diffusers' private TransformerBlockRegistry, which is used as fallback.
BLOCK_OUTPUT_LAYOUTS: dict[str, tuple[int, int | None]] = {
    "JointTransformerBlock": (1, 0),  # SD3 / SD3.5
    "FluxTransformerBlock": (1, 0),
    "FluxSingleTransformerBlock": (1, 0),
    "ChromaTransformerBlock": (1, 0),  # not in diffusers' registry (its single blocks return a tensor)
    "Flux2TransformerBlock": (1, 0),
    "QwenImageTransformerBlock": (1, 0),
    "CogVideoXBlock": (0, 1),
    "CogView4TransformerBlock": (0, 1),
    "HunyuanVideoTransformerBlock": (0, 1),
    "HunyuanVideoSingleTransformerBlock": (0, 1),
    "HunyuanVideo15TransformerBlock": (0, 1),
    "HunyuanImageTransformerBlock": (0, 1),
    "HunyuanImageSingleTransformerBlock": (0, 1),
    "MochiTransformerBlock": (0, 1),
    "WanVACETransformerBlock": (1, None),  # (hint, control stream); see BLOCK_STREAM_INPUTS
    "LTX2VideoTransformerBlock": (0, 1),  # (video, audio); see BLOCK_STREAM_INPUTS
    "Flux3SingleTransformerBlock": (1, 0),  # (text, content); its mode blocks return a tensor
    "LongCatImageTransformerBlock": (1, 0),
    "LongCatImageSingleTransformerBlock": (1, 0),
    "OvisImageTransformerBlock": (1, 0),
    "OvisImageSingleTransformerBlock": (1, 0),
}

# The inputs carrying a block's two forecast streams, where they are not named ``hidden_states`` (the stream at
# the layout's hidden index) and ``encoder_hidden_states`` (at its encoder index): stream -> the block's parameter.
# Wan VACE's control blocks read the main stream as ``hidden_states`` and transform ``control_hidden_states``; their
# other output, the hint, is a side output (see BlockIO.pack). LTX-2's blocks transform video (``hidden_states``)
# and audio (``audio_hidden_states``), and read their text streams (``encoder_hidden_states``...) unchanged.
BLOCK_STREAM_INPUTS: dict[str, dict[str, str]] = {
    "WanVACETransformerBlock": {"hidden_states": "control_hidden_states"},
    "LTX2VideoTransformerBlock": {"encoder_hidden_states": "audio_hidden_states"},
}

# The block lists to forecast, in execution order, where discovery would get them wrong: Wan VACE registers
# ``blocks`` first but runs ``vace_blocks`` first (``speca`` verifies the last list to run); Lumina 2 declares no
# ``_repeated_blocks`` (the longest list would leave its refiners running every step) and runs ``context_refiner``
# before ``noise_refiner``.
DEFAULT_BLOCK_LISTS: dict[str, tuple[str, ...]] = {
    "WanVACETransformer3DModel": ("vace_blocks", "blocks"),
    "Lumina2Transformer2DModel": ("context_refiner", "noise_refiner", "layers"),
    # FLUX.3: per-mode lists (text, then image, then reference images, nested in the ``mode_blocks`` dict), then the
    # joint blocks; the reference list runs only for image-to-image calls
    "Flux3Transformer2DModel": ("txt_mode_blocks", "mode_blocks.image", "mode_blocks.image_cond",
                                "single_transformer_blocks"),
}

# Block lists whose stream nothing reads after the list, only their side outputs (Wan VACE's control blocks: the
# hints, which the main list's forecast residual already carries). On a draft they are skipped with zero side
# outputs, and nothing of theirs is cached.
SIDE_OUTPUT_LISTS: dict[str, tuple[str, ...]] = {
    "WanVACETransformer3DModel": ("vace_blocks",),
}

# Blocks whose streams are sequence-first, (S, B, D) (ERNIE-Image's): BlockIO reads them batch-first (transposed
# views) and writes them back sequence-first; the verifier runs such a block on every row (its other inputs cannot
# be sliced to a row subset by the batch dimension) and keeps the checked rows.
SEQUENCE_FIRST_BLOCKS = frozenset({"ErnieImageSharedAdaLNBlock"})

# Transformer call arguments the hooks cannot honour, by class: argument -> why (raised as a ValueError when passed).
REFUSED_ARGS: dict[str, dict[str, str]] = {
    # its pipeline's default use_kv_cache=True: later steps feed the blocks the target tokens only (the block stream
    # changes length after step 0) and the cache holds every row's prefix (no per-row slicing)
    "QwenImage21Transformer2DModel": {
        "kv_cache": "the prefix KV cache changes the blocks' token count after the first step and cannot be sliced "
                    "per row; call the pipeline with use_kv_cache=False",
    },
}

_STREAMS = ("hidden_states", "encoder_hidden_states")

HIDDEN_ARGS = ("hidden_states", "x")
"""Names of a transformer's latent input, first match in its signature wins (Z-Image's takes ``x``).
A block's stream input: see :meth:`BlockIO.for_block`."""

SUPPORTED_TRANSFORMERS = (
    "DiTTransformer2DModel",
    "PixArtTransformer2DModel",
    "SD3Transformer2DModel",
    "FluxTransformer2DModel",
    "SanaTransformer2DModel",
    # speca caveat: on a draft the verified last block gets a drafted long-skip input, not block 0's output
    "HunyuanDiT2DModel",
    "CogVideoXTransformer3DModel",
    "WanTransformer3DModel",
    "HunyuanVideoTransformer3DModel",
    "LTXVideoTransformer3DModel",  # its rotary embedding is batched (B, S, D): sliced per row (rows.py)
    "Flux2Transformer2DModel",
    "ChromaTransformer2DModel",
    # also the edit models (zero_cond_t=True, Qwen-Image-Edit-2511 / QwenImageEditPlusPipeline): per-row img_shapes
    # and the blocks' 2B-row temb (real, then zero timestep) are sliced with the rows (rows.py)
    "QwenImageTransformer2DModel",
    "HunyuanVideo15Transformer3DModel",
    "SkyReelsV2Transformer3DModel",
    # caveat: a VACE hint added after the last block (its index in vace_layers) is zero on a draft; released
    # configs add none there
    "WanVACETransformer3DModel",
    "HunyuanImageTransformer2DModel",
    "SanaVideoTransformer3DModel",
    "Kandinsky5Transformer3DModel",
    "CogView4Transformer2DModel",
    "Lumina2Transformer2DModel",  # refiners and joint layers (DEFAULT_BLOCK_LISTS: it declares no _repeated_blocks)
    "ZImageTransformer2DModel",
    # video and audio streams both forecast (BLOCK_STREAM_INPUTS: audio read as the block's second stream)
    "LTX2VideoTransformer3DModel",
    # per-mode lists nested in a ModuleDict (DEFAULT_BLOCK_LISTS, dotted names); the text and reference-image mode
    # blocks run at timestep 0, so their forecast residuals stay constant
    "Flux3Transformer2DModel",
    # without the prefix KV cache (REFUSED_ARGS: use_kv_cache=False); the blocks' B + 1 modulation rows (the last at
    # t = 0) are sliced per row keeping the last (rows.py)
    "QwenImage21Transformer2DModel",
    "Krea2Transformer2DModel",  # its text fusion blocks (nested, timestep-independent) run every step
    # timestep 1 - sigma (steps.py INCREASING_TIMESTEPS); its pipeline's unconditional_transformer is a second model:
    # forecast only where hooked too
    "Ideogram4Transformer2DModel",
    "LongCatImageTransformer2DModel",
    "OvisImageTransformer2DModel",
    # sequence-first blocks (SEQUENCE_FIRST_BLOCKS): the speca verifier runs its block on every row, not the checked
    # subset only
    "ErnieImageTransformer2DModel",
)
"""Transformers tested with block forecasting (others with discoverable blocks usually work)."""


def find_block_lists(model: nn.Module, names: tuple[str, ...] | None = None) -> list[tuple[str, nn.ModuleList]]:
    """The model's lists of repeated transformer blocks, in execution (registration) order.

    ``names`` (the config's ``blocks`` field) names the ``nn.ModuleList`` attributes to use, dotted for a list
    nested in a container (``"mode_blocks.image"``)
    (by default those of :data:`DEFAULT_BLOCK_LISTS` for the model's class). Otherwise
    ``model._repeated_blocks`` (class names) when the model declares it, else the longest direct
    ``nn.ModuleList`` child whose items share one class.

    Raises:
        ValueError: if no block list can be found, or ``names`` names no non-empty ModuleList.
    """
    lists = [(n, m) for n, m in model.named_children() if isinstance(m, nn.ModuleList) and len(m) > 0]
    if names is None:
        names = DEFAULT_BLOCK_LISTS.get(type(model).__name__)
    if names is not None:
        by_name = dict(lists)
        for n in names:  # a dotted name: a list nested in a container (FLUX.3's ``mode_blocks.image``)
            if "." in n and n not in by_name:
                try:
                    sub = model.get_submodule(n)
                except AttributeError:
                    continue
                if isinstance(sub, nn.ModuleList) and len(sub) > 0:
                    by_name[n] = sub
        bad = [n for n in names if n not in by_name]
        if bad:
            raise ValueError(f"blocks={names!r}: {type(model).__name__} has no non-empty nn.ModuleList named "
                             f"{', '.join(map(repr, bad))}; its ModuleLists: {', '.join(by_name) or 'none'}")
        return [(n, by_name[n]) for n in names]
    repeated = set(getattr(model, "_repeated_blocks", None) or ())
    if repeated:
        found = [(n, m) for n, m in lists if all(type(b).__name__ in repeated for b in m)]
        if found:
            return found
    uniform = [(n, m) for n, m in lists if len({type(b) for b in m}) == 1]
    if not uniform:
        raise ValueError(
            f"could not find the transformer blocks of {type(model).__name__}: it declares no "
            "_repeated_blocks and has no nn.ModuleList of same-class blocks. Pass blocks=('name', ...) naming "
            "its nn.ModuleList attribute(s) of transformer blocks in execution order (e.g. "
            "method='taylor', blocks=('transformer_blocks',)). Supported transformers: "
            f"{', '.join(SUPPORTED_TRANSFORMERS)}."
        )
    return [max(uniform, key=lambda nm: len(nm[1]))]


def output_layout(block: nn.Module) -> tuple[int, int | None] | None:
    """``(hidden_index, encoder_index)`` of a tuple-returning block, or None if unknown."""
    name = type(block).__name__
    if name in BLOCK_OUTPUT_LAYOUTS:
        return BLOCK_OUTPUT_LAYOUTS[name]
    try:  # diffusers' private registry, when this version has the class registered
        from diffusers.hooks._helpers import TransformerBlockRegistry

        meta = TransformerBlockRegistry.get(type(block))
        return meta.return_hidden_states_index, meta.return_encoder_hidden_states_index
    except Exception:
        return None


@dataclass
class BlockIO:
    """Reads the hidden / encoder inputs of one block call and packs outputs in its layout."""

    block_name: str
    param_index: dict[str, int]
    layout: tuple[int, int | None] | None
    returns_tensor: bool | None = None  # learnt at the first full call
    tuple_len: int = 2
    aliases: dict[str, str] = field(default_factory=dict)  # stream name ("hidden_states") -> the block's parameter
    seq_first: bool = False  # streams are (S, B, D): SEQUENCE_FIRST_BLOCKS

    @classmethod
    def for_block(cls, block: nn.Module, forward: Any) -> BlockIO:
        params = list(inspect.signature(forward).parameters)
        name = type(block).__name__
        # the streams a block transforms: BLOCK_STREAM_INPUTS; else ``hidden_states``, or its first parameter
        # (Kandinsky 5's ``x`` / ``visual_embed``, Z-Image's ``x``), and ``encoder_hidden_states``
        aliases = dict(BLOCK_STREAM_INPUTS.get(name, {}))
        if "hidden_states" not in aliases and "hidden_states" not in params and params:
            aliases["hidden_states"] = params[0]
        aliases = {k: v for k, v in aliases.items() if k != v}
        return cls(name, {p: i for i, p in enumerate(params)}, output_layout(block), aliases=aliases,
                   seq_first=name in SEQUENCE_FIRST_BLOCKS)

    def _flip(self, stream: str, value: Any) -> Any:
        """A stream between the block's sequence-first layout and batch-first (its own inverse)."""
        if self.seq_first and stream in _STREAMS and isinstance(value, torch.Tensor):
            return value.transpose(0, 1)
        return value

    def arg(self, name: str, args: tuple, kwargs: dict) -> Any:
        """An input of the call; the streams (``hidden_states``, ``encoder_hidden_states``) batch-first."""
        stream, name = name, self.aliases.get(name, name)
        if name in kwargs:
            return self._flip(stream, kwargs[name])
        i = self.param_index.get(name)
        return self._flip(stream, args[i]) if i is not None and i < len(args) else None

    def as_kwargs(self, args: tuple, kwargs: dict) -> dict[str, Any]:
        """Every argument of a call by name."""
        names = sorted(self.param_index, key=self.param_index.__getitem__)
        return {**dict(zip(names, args)), **kwargs}

    def with_inputs(self, args: tuple, kwargs: dict, **values: Any) -> tuple[tuple, dict]:
        """``(args, kwargs)`` with the named inputs (``hidden_states=...``) replaced where they were passed."""
        args, kwargs = list(args), dict(kwargs)
        for name, value in values.items():
            value = self._flip(name, value)
            name = self.aliases.get(name, name)
            i = self.param_index.get(name)
            if name in kwargs:
                kwargs[name] = value
            elif i is not None and i < len(args):
                args[i] = value
        return tuple(args), kwargs

    def split_output(self, out: Any) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``(hidden, encoder)`` of a block's output; learns the output form on first use."""
        if isinstance(out, torch.Tensor):
            self.returns_tensor = True
            return self._flip("hidden_states", out), None
        if not isinstance(out, (tuple, list)) or self.layout is None:
            raise ValueError(
                f"block {self.block_name} returns {type(out).__name__} with an unknown layout; register it with "
                f"diffspec.forecast.blocks.BLOCK_OUTPUT_LAYOUTS[{self.block_name!r}] = (hidden_index, encoder_index)"
            )
        self.returns_tensor = False
        self.tuple_len = len(out)
        h_i, e_i = self.layout
        encoder = out[e_i] if e_i is not None else None
        return self._flip("hidden_states", out[h_i]), self._flip("encoder_hidden_states", encoder)

    def pack(self, hidden: torch.Tensor, encoder: torch.Tensor | None) -> Any:
        """Build an output in the block's own layout (on a draft step).

        Other tuple entries are side outputs that the model adds to a later list's stream between its
        blocks (Wan VACE's hints): that list's anchors already contain them, so a draft returns zeros.
        """
        hidden, encoder = self._flip("hidden_states", hidden), self._flip("encoder_hidden_states", encoder)
        if self.returns_tensor:
            return hidden
        h_i, e_i = self.layout  # type: ignore[misc]
        out: list[Any] = [None if i == e_i else torch.zeros_like(hidden) for i in range(self.tuple_len)]
        out[h_i] = hidden
        if e_i is not None:
            out[e_i] = encoder
        return tuple(out)
