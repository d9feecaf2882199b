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
    "EasyAnimateTransformerBlock": (0, 1),  # not in diffusers' registry
    "CogView3PlusTransformerBlock": (0, 1),  # not in diffusers' registry
    "ConsisIDBlock": (0, 1),  # not in diffusers' registry
    "GlmImageTransformerBlock": (0, 1),  # not in diffusers' registry
    "JoyImageTransformerBlock": (0, 1),  # not in diffusers' registry
    "JoyImageEditPlusTransformerBlock": (0, 1),  # not in diffusers' registry
    "HiDreamBlock": (0, 1),  # HiDream's wrapper of its double blocks (the single ones return a tensor)
    "AuraFlowJointTransformerBlock": (1, 0),  # not in diffusers' registry (its single blocks return a tensor)
    "BriaTransformerBlock": (1, 0),  # returns (encoder, hidden); diffusers' registry says (0, None)
    "BriaSingleTransformerBlock": (1, 0),
    "BriaFiboTransformerBlock": (1, 0),  # not in diffusers' registry (its single blocks return a tensor)
    "Kandinsky6FusedTransformerDecoderBlock": (0, 1),  # (video, audio); see BLOCK_STREAM_INPUTS
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
    # Kandinsky 6's fused blocks: video ``vis`` and audio ``aud`` (their text contexts ``text_v`` / ``text_a`` are read)
    "Kandinsky6FusedTransformerDecoderBlock": {"hidden_states": "vis", "encoder_hidden_states": "aud"},
}

# The block lists to forecast, in execution order, where discovery would get them wrong: Wan VACE registers
# ``blocks`` first but runs ``vace_blocks`` first (``speca`` verifies the last list to run); Lumina 2 declares no
# ``_repeated_blocks`` (the longest list would leave its refiners running every step) and runs ``context_refiner``
# before ``noise_refiner``.
DEFAULT_BLOCK_LISTS: dict[str, tuple[str, ...]] = {
    "WanVACETransformer3DModel": ("vace_blocks", "blocks"),
    "Lumina2Transformer2DModel": ("context_refiner", "noise_refiner", "layers"),
    # no _repeated_blocks: the longest same-class list would be its caption projections
    "HiDreamImageTransformer2DModel": ("double_stream_blocks", "single_stream_blocks"),
    # no _repeated_blocks: the longest list (the single blocks) would leave the joint blocks running every step
    "AuraFlowTransformer2DModel": ("joint_transformer_blocks", "single_transformer_blocks"),
    "BriaTransformer2DModel": ("transformer_blocks", "single_transformer_blocks"),  # likewise
    # declares no _repeated_blocks: discovery would keep one of its two lists (the longer, or the first on a tie)
    "HunyuanVideoFramepackTransformer3DModel": ("transformer_blocks", "single_transformer_blocks"),
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

# Modules (nn.ModuleList attributes of the model) that the model runs between two blocks of a forecast list, outside
# them, adding their output to the list's stream: ConsisID's face perceiver cross-attentions (after every
# ``cross_attn_interval``-th block) and Wan-Animate's face adapters (after every ``inject_face_latents_blocks``-th
# block). A list's forecast residual already carries what they add inside it, so on a block-granularity draft those
# inside a list add nothing (zeros, nothing run); one after a list's last block runs as usual.
INTERLEAVED_MODULES: dict[str, tuple[str, ...]] = {
    "ConsisIDTransformer3DModel": ("perceiver_cross_attention",),
    "WanAnimateTransformer3DModel": ("face_adapter",),
}

# Transformer call arguments holding residuals that the model's forward adds to a list's stream between its blocks
# (ControlNet samples: after each block, or each block of a group, as diffusers 0.42 adds them), by class: the names
# clash (HunyuanDiT's ``controlnet_block_samples`` feed its blocks' long skips, Cosmos's ``block_controlnet_hidden_states``
# is added inside its blocks; a block input needs nothing). A list's forecast residual already carries what they add
# after its blocks but the last, so on a block-granularity draft with any of them passed the list's last block takes
# the stream its first block drafted, not what the model added to it since; what is added after the last block stays.
# Unlike INTERLEAVED_MODULES, nothing here can be kept from running: the model adds plain tensors.
BETWEEN_BLOCK_ARGS: dict[str, tuple[str, ...]] = {
    "FluxTransformer2DModel": ("controlnet_block_samples", "controlnet_single_block_samples"),
    "ChromaTransformer2DModel": ("controlnet_block_samples", "controlnet_single_block_samples"),  # single: in place
    "BriaTransformer2DModel": ("controlnet_block_samples", "controlnet_single_block_samples"),  # single: in place
    "SD3Transformer2DModel": ("block_controlnet_hidden_states",),
    "QwenImageTransformer2DModel": ("controlnet_block_samples",),
    "SanaTransformer2DModel": ("controlnet_block_samples",),
    "SanaVideoTransformer3DModel": ("controlnet_block_samples",),
    "ZImageTransformer2DModel": ("controlnet_block_samples",),  # {layer index: residual} for its main layers
}

# Block lists whose last blocks run as a list of their own, on a fresh stream: class -> (list, the model attribute
# holding the number of those trailing blocks). Motif-Video's DDT decoder (its last ``num_decoder_layers`` single blocks)
# starts again from the patch embeddings, with the encoder blocks' output as its second stream: the two parts are
# forecast as two lists, ``name[:-k]`` and ``name[-k:]`` (one list would pass the patch embeddings through on a draft).
SPLIT_BLOCK_LISTS: dict[str, tuple[str, str]] = {
    "MotifVideoTransformer3DModel": ("single_transformer_blocks", "num_decoder_layers"),
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
    "MochiTransformer3DModel",  # reversed timesteps (steps.INCREASING_TIMESTEPS); last block is context_pre_only
    "AllegroTransformer3DModel",  # its RoPE (per-axis tables, token positions) has no batch dimension
    "EasyAnimateTransformer3DModel",  # blocks called positionally; layout in BLOCK_OUTPUT_LAYOUTS
    "CogView3PlusTransformer2DModel",  # layout in BLOCK_OUTPUT_LAYOUTS
    # with is_train_face: the face perceiver cross-attentions between blocks return zeros on drafts
    # (INTERLEAVED_MODULES); the facial extractor before the blocks still runs at every step
    "ConsisIDTransformer3DModel",
    # tested in text-to-image; image-to-image with several prompts reads one KV cache per prompt's condition images,
    # which a sub-batch of rows (speca's verifier, partial recomputes) does not match
    "GlmImageTransformer2DModel",
    # dense and MoE blocks (expert-choice routing picks tokens within each row, so rows stay independent)
    "NucleusMoEImageTransformer2DModel",
    "PRXTransformer2DModel",  # its rotary table is batched (B, 1, S, ...): sliced per row (rows.py)
    # tested in text-to-image, its timestep grows (INCREASING_TIMESTEPS). Caveats: the model takes row 0's rotary
    # positions for every row (rows padded differently depend on their batch), and with input images
    # (input_img_latents, input_image_sizes keyed by row) a sub-batch of rows would misplace them
    "OmniGenTransformer2DModel",
    "JoyImageEditTransformer3DModel",  # reference and target items in one image stream, forecast together
    # padded patch sequences of per-row length: per-row shape_list (rows.py) and batched rotary tables
    "JoyImageEditPlusTransformer3DModel",
    # each block reads one Llama-3 layer, joined to its text stream (double) or its tokens (single) and cut off
    # after it: a draft's list residual covers the kept tokens, the verified last block reads its own layer
    "HiDreamImageTransformer2DModel",
    "AuraFlowTransformer2DModel",  # joint then single blocks (DEFAULT_BLOCK_LISTS: it declares no _repeated_blocks)
    # likewise; its ControlNet residuals added between blocks are not added twice on a draft (BETWEEN_BLOCK_ARGS)
    "BriaTransformer2DModel",
    # each block's text stream gets a fresh text-encoder layer in its second half of channels, between blocks: a
    # draft's list residual covers the kept half, the verified last block reads its own layer
    "BriaFiboTransformer2DModel",
    # noise refiner and main layers (its _repeated_blocks). speca recomputes rows within the whole batch (rows.py
    # BATCH_COUPLED_TRANSFORMERS: the gist count is the batch's); the switch to text-image prompt embeddings in
    # mid-generation (more gist tokens) resets the branch, as any change of the text's shape
    "BriaFibo2Transformer2DModel",
    # video and audio text lists, then the fused video / audio blocks (audio read as the blocks' second stream)
    "Kandinsky6Transformer3DModel",
    # history tokens (short / mid / long memory, zero timestep) are prepended to the chunk's: forecast with the stream
    "HeliosTransformer3DModel",
    # its DDT decoder (the last num_decoder_layers single blocks) forecast as a list of its own (SPLIT_BLOCK_LISTS)
    "MotifVideoTransformer3DModel",
    # per-frame timesteps (the clean image frame's 0); camera raymap / Plücker inputs are fixed per call, not forecast
    "SanaWMTransformer3DModel",
    # bidirectional (not the FAR causal variant); the target timestep r_timestep is read as a side input
    "AnyFlowTransformer3DModel",
    # one packed [text | audio | video] stream; t = 1 - sigma (steps.py); its layout and distinct timesteps are not
    # per row (rows.py CLASS_UNBATCHED_ARGS); the token refiner's nested blocks are not forecast (no timestep)
    "MiniMaxH3Transformer3DModel",
    # Cosmos-Predict2.5 (per-frame timesteps, a condition-mask channel); Transfer2.5's ControlNet residuals are added
    # inside the blocks (controlnet_residual), so a forecast carries the last full step's
    "CosmosTransformer3DModel",
    # caveat: with enable_temporal_reasoning the pipeline drops the reasoning frames mid-run; the token count change
    # resets the anchors (full steps follow)
    "ChronoEditTransformer3DModel",
    # its face adapters between blocks add nothing on a draft (INTERLEAVED_MODULES); the motion and face encoders run
    # on every call, outside the blocks
    "WanAnimateTransformer3DModel",
    # both block lists (DEFAULT_BLOCK_LISTS); a one-row call trims the text stream to the prompt, so rows are
    # recomputed within the whole batch (rows.py BATCH_COUPLED_TRANSFORMERS)
    "HunyuanVideoFramepackTransformer3DModel",
    # per-mode lists nested in a ModuleDict (DEFAULT_BLOCK_LISTS, dotted names); the text and reference-image mode
    # blocks run at timestep 0, so their forecast residuals stay constant
    "Flux3Transformer2DModel",
    # without the prefix KV cache (REFUSED_ARGS: use_kv_cache=False); the blocks' B + 1 modulation rows (the last at
    # t = 0) are sliced per row keeping the last (rows.py)
    "QwenImage21Transformer2DModel",
    "Krea2Transformer2DModel",  # its text fusion blocks (nested, timestep-independent) run every step
    # timestep 1 - sigma (steps.py INCREASING_TIMESTEPS); its pipeline's unconditional_transformer is a second model,
    # forecast with hooks of its own (pipelines/forecast.py DENOISERS)
    "Ideogram4Transformer2DModel",
    "LongCatImageTransformer2DModel",
    "OvisImageTransformer2DModel",
    # sequence-first blocks (SEQUENCE_FIRST_BLOCKS): the speca verifier runs its block on every row, not the checked
    # subset only
    "ErnieImageTransformer2DModel",
    # 1-D audio latents (B, C, T); the prepended global token (seconds + timestep embeddings) is forecast with the
    # stream; its rotary (cos, sin) tables have no batch dimension (rows.py)
    "StableAudioDiTModel",
    # 1-D audio latents; its learnt memory tokens (prepended inside the model) are forecast with the stream
    "StableAudio3DiTModel",
    # timestep 1 - t / 1000 (steps.py INCREASING_TIMESTEPS); tested at the default size, where its time-aware rotary
    # table (linear / NTK scaling around scaling_watershed) is the same at every step
    "LuminaNextDiT2DModel",
    # channels-last 1-D latents patched along time; sliding-window / full layers in one list (their mask is fixed)
    "AceStepTransformer1DModel",
    # timestep 1 - sigma (steps.py INCREASING_TIMESTEPS); its long skip adds the input embedding after the blocks
    "LongCatAudioDiTTransformer",
    # timestep 1 - sigma (steps.py INCREASING_TIMESTEPS), prepended as a token of the stream; tested as one window of
    # its modular pipeline's chunked loop (each window restarts the schedule: a new generation for the hooks)
    "MiniMaxMusic3Transformer1DModel",
    # text-free video super-resolution tiles; NABLA block masks are built per row inside the attention, its
    # sliding-tile prior (sparse_params' sta_mask) has no batch dimension (rows.py)
    "Kandinsky6SRTransformer3DModel",
)
"""Transformers tested with block forecasting (others with discoverable blocks usually work)."""

UNSUPPORTED_TRANSFORMERS: dict[str, str] = {
    "DreamLiteUNetModel": "a U-Net: its transformer blocks sit inside down / mid / up blocks joined by skip "
                          "connections, not in lists of blocks that run one after another",
    "DreamLiteTransformer2DModel": "a spatial transformer inside DreamLite's U-Net (DreamLiteUNetModel), one per "
                                   "U-Net stage and called without a timestep, so its steps cannot be told apart",
    # discovery would take the spatial list alone, its temporal blocks still running on drafts: a 40% error even
    # where every residual is constant
    "LatteTransformer3DModel": "a video transformer whose spatial (transformer_blocks) and temporal "
                               "(temporal_transformer_blocks) blocks run alternately, the stream reshaped from "
                               "(batch * frames, patches) to (batch * patches, frames) rows between them, while "
                               "block forecasting needs each block list to run as one contiguous stretch",
    "Cosmos3OmniTransformer": (
        "a transformer whose decoder layers run on one packed sequence without a batch dimension (text, vision, sound "
        "and action tokens placed by index tensors), its latents given as a list (vision_tokens) and its timesteps "
        "per patch (vision_timesteps): there are no batch rows to plan and no timestep argument to track steps by"),
    "WanAnimate2Transformer3DModel": (
        "a transformer whose blocks read a per-layer reference K/V cache that a separate kv_cache_mode='extract' "
        "call fills at the segment's first timestep: that call would be taken for a CFG branch of the first step, "
        "and a draft of it would leave the cache stale"),
    # the FAR causal sibling of AnyFlowTransformer3DModel (which is supported): AnyFlowFARPipeline denoises each chunk of
    # frames as a short generation of its own, then prefills the KV cache with a timestep-0 call on every frame so far
    "AnyFlowFARTransformer3DModel": (
        "a transformer whose blocks read a per-layer KV cache of the earlier frame chunks (frame-autoregressive "
        "generation), which a separate timestep-0 call (kv_cache_flag is_cache_step) writes in place between chunks: "
        "that call would be taken for a step of the finished chunk and could be drafted, leaving the cache unwritten, "
        "and the cache (batch at dim 1, written in place) cannot be sliced to a sub-batch of rows"),
    # SANA-WM's stage-2 refiner (the LTX-2 layout, video stream only); SanaWMTransformer3DModel (stage 1) is supported
    "SanaWMLTX2RefinerTransformer3DModel": (
        "a transformer whose blocks attend to a sliding-window KV cache of the earlier autoregressive frame blocks "
        "(SanaWMRefinerKVCache, kv_cache_mode), which timestep-0 capture calls on the same tokens write after each "
        "block's three Euler steps: such a call would be taken for a fourth step and could be drafted, leaving the "
        "cache without the block's keys and values, and the cache object cannot be sliced to a sub-batch of rows"),
}
"""Models whose structure block forecasting cannot honour: :func:`find_block_lists` refuses them with the reason."""


def find_block_lists(model: nn.Module, names: tuple[str, ...] | None = None) -> list[tuple[str, nn.ModuleList]]:
    """The model's lists of repeated transformer blocks, in execution (registration) order.

    ``names`` (the config's ``blocks`` field) names the ``nn.ModuleList`` attributes to use, dotted for a list
    nested in a container (``"mode_blocks.image"``)
    (by default those of :data:`DEFAULT_BLOCK_LISTS` for the model's class). Otherwise
    ``model._repeated_blocks`` (class names) when the model declares it, else the longest direct
    ``nn.ModuleList`` child whose items share one class. A list of :data:`SPLIT_BLOCK_LISTS` is returned as two
    (its leading and its trailing blocks).

    Raises:
        ValueError: if no block list can be found, ``names`` names no non-empty ModuleList, or the model is one of
            :data:`UNSUPPORTED_TRANSFORMERS` (a U-Net, block lists that run interleaved, no batch rows).
    """
    reason = UNSUPPORTED_TRANSFORMERS.get(type(model).__name__)
    if reason is not None:
        raise ValueError(f"{type(model).__name__} is not supported by block forecasting: it is {reason}")
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
        return _split_lists(model, [(n, by_name[n]) for n in names])
    repeated = set(getattr(model, "_repeated_blocks", None) or ())
    if repeated:
        found = [(n, m) for n, m in lists if all(type(b).__name__ in repeated for b in m)]
        if found:
            return _split_lists(model, found)
    uniform = [(n, m) for n, m in lists if len({type(b) for b in m}) == 1]
    if not uniform:
        raise ValueError(
            f"could not find the transformer blocks of {type(model).__name__}: it declares no "
            "_repeated_blocks and has no nn.ModuleList of same-class blocks. Pass blocks=('name', ...) naming "
            "its nn.ModuleList attribute(s) of transformer blocks in execution order (e.g. "
            "method='taylor', blocks=('transformer_blocks',)). Supported transformers: "
            f"{', '.join(SUPPORTED_TRANSFORMERS)}."
        )
    return _split_lists(model, [max(uniform, key=lambda nm: len(nm[1]))])


def _split_lists(model: nn.Module, lists: list[tuple[str, nn.ModuleList]]) -> list[tuple[str, nn.ModuleList]]:
    """``lists`` with the list of :data:`SPLIT_BLOCK_LISTS` cut before its trailing blocks (two lists of the same
    block modules), where the model has some."""
    name, attr = SPLIT_BLOCK_LISTS.get(type(model).__name__, (None, ""))
    k = int(getattr(model, attr, 0) or 0) if name else 0
    out: list[tuple[str, nn.ModuleList]] = []
    for n, blocks in lists:
        if n == name and 0 < k < len(blocks):
            out += [(f"{n}[:-{k}]", blocks[:-k]), (f"{n}[-{k}:]", blocks[-k:])]
        else:
            out.append((n, blocks))
    return out


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
