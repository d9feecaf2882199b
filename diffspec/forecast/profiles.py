"""What the forecast engine knows about each transformer class: one :class:`ModelProfile` row per class.

Block discovery is generic (``_repeated_blocks``, else the longest list of same-class blocks; the
``timestep`` argument; ``out - in`` residuals), so most rows only name a class that is tested and say
what to watch. A row holds the rest: block lists discovery would get wrong, a block's output layout
or stream inputs, modules or arguments the model adds between blocks, timesteps that grow, arguments
without a batch dimension, or why the class is refused. Adding a family is one row here plus one
tiny random-weight fixture (``tests/forecast/test_profiles.py`` checks both ways).

``docs/supported-models.md`` is generated from this table:
``python -m diffspec.forecast.profiles --markdown > docs/supported-models.md``.

Example:
    >>> profile_of("MochiTransformer3DModel").increasing_timesteps
    True
    >>> block_profile("FluxTransformerBlock").layout  # returns (encoder, hidden)
    (1, 0)
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn


@dataclass(frozen=True)
class BlockProfile:
    """What the engine must know about a block class beyond its signature.

    Args:
        name: the block's class name.
        layout: ``(hidden index, encoder index)`` in the tuple it returns (FLUX: ``(1, 0)``, it returns
            ``(encoder, hidden)``). Blocks returning a tensor need none; diffusers' own
            ``TransformerBlockRegistry`` is read for the others.
        streams: the block parameters carrying its two forecast streams where they are not
            ``hidden_states`` / ``encoder_hidden_states``: stream -> parameter.
        sequence_first: its streams are ``(S, B, D)``: read batch-first, written back sequence-first; the
            verifier runs it on every row (its other inputs cannot be sliced to rows by the batch dimension).
        modules: submodules forecast at ``granularity="module"`` (their outputs before the block's gates).
        draft_forward: at module granularity, what runs instead of the block's forward on a draft.
        earlier_inputs: inputs carrying an earlier block's output (long skips): forecast for the verifier.
    """

    name: str
    layout: tuple[int, int | None] | None = None
    streams: Mapping[str, str] = field(default_factory=dict)
    sequence_first: bool = False
    modules: tuple[str, ...] = ()
    draft_forward: Callable[..., Any] | None = None
    earlier_inputs: tuple[str, ...] = ()


@dataclass(frozen=True)
class ModelProfile:
    """Everything the engine must know about one transformer class that discovery does not find.

    Args:
        name: the transformer's class name.
        blocks: profiles of its block classes that need one.
        block_lists: the block lists to forecast, in execution order, where discovery would get them wrong
            (dotted for a list nested in a container: ``"mode_blocks.image"``).
        split_list: ``(list, attribute)``: the list's last ``model.<attribute>`` blocks restart from a fresh stream
            and are forecast as a list of their own.
        side_output_lists: lists whose stream nothing reads after them, only their side outputs (which the next
            list's residual carries): skipped on a draft with zero side outputs, nothing cached.
        interleaved_modules: ``nn.ModuleList`` attributes the model runs between two blocks of a list, adding their
            output to its stream: zeros on a block-granularity draft inside a list (its residual carries them).
        between_block_args: call arguments holding residuals the model adds between blocks (ControlNet samples): with
            any passed, a draft's last block takes the stream its first block drafted.
        refused_args: call arguments the hooks cannot honour: argument -> why (raised when passed).
        increasing_timesteps: its pipelines pass ``1 - sigma``: a decrease, not a rise, starts a generation.
        batch_coupled: its token layout depends on the whole batch: rows are recomputed within the whole batch.
        unbatched_args: arguments (of the model or its blocks) without a batch dimension, never sliced to rows.
        refused: why block forecasting cannot honour the model ("" when supported).
        note: what a user should know (tested modes, caveats).
    """

    name: str
    blocks: tuple[BlockProfile, ...] = ()
    block_lists: tuple[str, ...] | None = None
    split_list: tuple[str, str] | None = None
    side_output_lists: tuple[str, ...] = ()
    interleaved_modules: tuple[str, ...] = ()
    between_block_args: tuple[str, ...] = ()
    refused_args: Mapping[str, str] = field(default_factory=dict)
    increasing_timesteps: bool = False
    batch_coupled: bool = False
    unbatched_args: frozenset[str] = frozenset()
    refused: str = ""
    note: str = ""


def flux_single_draft(host: Any, block: nn.Module, list_index: int, block_index: int, hidden_states: torch.Tensor,
                      encoder_hidden_states: torch.Tensor, temb: torch.Tensor, **_: Any) -> tuple[torch.Tensor, ...]:
    """``FluxSingleTransformerBlock`` on a module-granularity draft: ``x + gate(temb) * forecast(proj_out)``, so its
    attention and MLP do not run either (``host``: the hooks, :meth:`~.hooks.ForecastHooks.module_forecast`)."""
    text_len = encoder_hidden_states.shape[1]
    x = torch.cat([encoder_hidden_states, hidden_states], dim=1)
    gate = block.norm.linear(block.norm.silu(temb)).chunk(3, dim=1)[2]  # AdaLayerNormZeroSingle's gate
    out = x + gate.unsqueeze(1) * host.module_forecast(list_index, f"m{block_index}.proj_out.0", x)
    if out.dtype == torch.float16:
        out = out.clip(-65504, 65504)
    return out[:, :text_len], out[:, text_len:]


def _block(name: str, layout: tuple[int, int | None] = (0, 1), **facts: Any) -> BlockProfile:
    return BlockProfile(name, layout, **facts)


_REVERSED = (1, 0)  # returns (encoder, hidden)
BASIC = BlockProfile("BasicTransformerBlock", modules=("attn1", "attn2", "ff"))
HUNYUAN_VIDEO = (_block("HunyuanVideoTransformerBlock"), _block("HunyuanVideoSingleTransformerBlock"))
_CONTROLNET = ("controlnet_block_samples", "controlnet_single_block_samples")
_NOT_REPEATED = "declares no _repeated_blocks (discovery would keep one list)"

_ROWS = (
    ModelProfile("DiTTransformer2DModel", (BASIC,)),
    ModelProfile("PixArtTransformer2DModel", (BASIC,)),
    ModelProfile("SD3Transformer2DModel", (_block("JointTransformerBlock", _REVERSED,
                                                   modules=("attn", "attn2", "ff", "ff_context")),),
                 between_block_args=("block_controlnet_hidden_states",)),
    ModelProfile("FluxTransformer2DModel", (
        _block("FluxTransformerBlock", _REVERSED, modules=("attn", "ff", "ff_context")),
        _block("FluxSingleTransformerBlock", _REVERSED, modules=("proj_out",), draft_forward=flux_single_draft)),
        between_block_args=_CONTROLNET),
    ModelProfile("SanaTransformer2DModel", between_block_args=("controlnet_block_samples",)),
    ModelProfile("HunyuanDiT2DModel", (BlockProfile("HunyuanDiTBlock", earlier_inputs=("skip",)),),
                 note="speca: on a draft the verified last block gets a forecast long-skip input, not block 0's output"),
    ModelProfile("CogVideoXTransformer3DModel", (_block("CogVideoXBlock"),)),
    ModelProfile("WanTransformer3DModel"),
    ModelProfile("HunyuanVideoTransformer3DModel", HUNYUAN_VIDEO),
    ModelProfile("LTXVideoTransformer3DModel", note="its batched rotary embedding (B, S, D) is sliced per row"),
    ModelProfile("Flux2Transformer2DModel", (_block("Flux2TransformerBlock", _REVERSED),)),
    ModelProfile("ChromaTransformer2DModel", (_block("ChromaTransformerBlock", _REVERSED),),
                 between_block_args=_CONTROLNET, note="its single blocks add ControlNet residuals in place"),
    ModelProfile("QwenImageTransformer2DModel", (_block("QwenImageTransformerBlock", _REVERSED),),
                 between_block_args=("controlnet_block_samples",),
                 note="also the edit models (zero_cond_t): per-row img_shapes and the blocks' 2B-row temb (real, then "
                      "zero timestep) are sliced with the rows"),
    ModelProfile("HunyuanVideo15Transformer3DModel", (_block("HunyuanVideo15TransformerBlock"),)),
    ModelProfile("SkyReelsV2Transformer3DModel"),
    ModelProfile("WanVACETransformer3DModel",
                 (_block("WanVACETransformerBlock", (1, None), streams={"hidden_states": "control_hidden_states"}),),
                 block_lists=("vace_blocks", "blocks"), side_output_lists=("vace_blocks",),
                 note="the control blocks run first and only feed hints, which the main blocks' residual carries: "
                      "skipped on a draft, nothing cached. A hint added after the last main block would be zero on a "
                      "draft (no released config adds one)"),
    ModelProfile("HunyuanImageTransformer2DModel", (_block("HunyuanImageTransformerBlock"),
                                                    _block("HunyuanImageSingleTransformerBlock"))),
    ModelProfile("SanaVideoTransformer3DModel", between_block_args=("controlnet_block_samples",)),
    ModelProfile("Kandinsky5Transformer3DModel"),
    ModelProfile("CogView4Transformer2DModel", (_block("CogView4TransformerBlock"),)),
    ModelProfile("Lumina2Transformer2DModel", block_lists=("context_refiner", "noise_refiner", "layers"),
                 increasing_timesteps=True, note=f"refiners and joint layers: it {_NOT_REPEATED}"),
    ModelProfile("ZImageTransformer2DModel", between_block_args=("controlnet_block_samples",),
                 increasing_timesteps=True, note="latents as a list of per-row tensors"),
    ModelProfile("LTX2VideoTransformer3DModel",
                 (_block("LTX2VideoTransformerBlock", streams={"encoder_hidden_states": "audio_hidden_states"}),),
                 note="video and audio streams both forecast"),
    ModelProfile("MochiTransformer3DModel", (_block("MochiTransformerBlock"),), increasing_timesteps=True,
                 note="its last block is context_pre_only"),
    ModelProfile("AllegroTransformer3DModel", note="its RoPE (per-axis tables, token positions) has no batch dimension"),
    ModelProfile("EasyAnimateTransformer3DModel", (_block("EasyAnimateTransformerBlock"),),
                 note="blocks called positionally"),
    ModelProfile("CogView3PlusTransformer2DModel", (_block("CogView3PlusTransformerBlock"),)),
    ModelProfile("ConsisIDTransformer3DModel", (_block("ConsisIDBlock"),),
                 interleaved_modules=("perceiver_cross_attention",),
                 note="with is_train_face the face perceiver cross-attentions between blocks add nothing on a draft; "
                      "the facial extractor before the blocks runs at every step"),
    ModelProfile("GlmImageTransformer2DModel", (_block("GlmImageTransformerBlock"),),
                 note="tested in text-to-image; image-to-image with several prompts reads one KV cache per prompt's "
                      "condition images, which a sub-batch of rows (speca's verifier, partial recomputes) does not match"),
    ModelProfile("NucleusMoEImageTransformer2DModel",
                 note="dense and MoE blocks (expert-choice routing picks tokens within each row)"),
    ModelProfile("PRXTransformer2DModel", note="its batched rotary table (B, 1, S, ...) is sliced per row"),
    ModelProfile("OmniGenTransformer2DModel", increasing_timesteps=True,
                 note="tested in text-to-image. Caveats: the model takes row 0's rotary positions for every row (rows "
                      "padded differently depend on their batch); with input images a sub-batch of rows would misplace "
                      "them"),
    ModelProfile("JoyImageEditTransformer3DModel", (_block("JoyImageTransformerBlock"),),
                 note="reference and target items in one image stream, forecast together"),
    ModelProfile("JoyImageEditPlusTransformer3DModel", (_block("JoyImageEditPlusTransformerBlock"),),
                 note="padded patch sequences of per-row length: per-row shape_list and batched rotary tables"),
    ModelProfile("HiDreamImageTransformer2DModel", (_block("HiDreamBlock"),),
                 block_lists=("double_stream_blocks", "single_stream_blocks"),
                 note="it declares no _repeated_blocks (the longest list would be its caption projections); each block "
                      "reads one Llama-3 layer: a draft's residual covers the kept tokens, the verified last block "
                      "reads its own layer"),
    ModelProfile("AuraFlowTransformer2DModel", (_block("AuraFlowJointTransformerBlock", _REVERSED),),
                 block_lists=("joint_transformer_blocks", "single_transformer_blocks"),
                 note=f"joint then single blocks: it {_NOT_REPEATED}"),
    ModelProfile("BriaTransformer2DModel", (_block("BriaTransformerBlock", _REVERSED),
                                            _block("BriaSingleTransformerBlock", _REVERSED)),
                 block_lists=("transformer_blocks", "single_transformer_blocks"), between_block_args=_CONTROLNET,
                 note=f"joint then single blocks: it {_NOT_REPEATED}"),
    ModelProfile("BriaFiboTransformer2DModel", (_block("BriaFiboTransformerBlock", _REVERSED),),
                 note="each block's text stream gets a fresh text-encoder layer in half its channels: a draft's "
                      "residual covers the kept half, the verified last block reads its own layer"),
    ModelProfile("BriaFibo2Transformer2DModel", batch_coupled=True,
                 note="every row gets the batch's largest gist-token count, so rows are recomputed within the whole "
                      "batch; the switch to longer prompt embeddings mid-generation restarts the branch"),
    ModelProfile("Kandinsky6Transformer3DModel",
                 (_block("Kandinsky6FusedTransformerDecoderBlock", streams={"hidden_states": "vis",
                                                                            "encoder_hidden_states": "aud"}),),
                 note="video and audio text lists, then the fused video / audio blocks (audio as second stream)"),
    ModelProfile("HeliosTransformer3DModel",
                 note="history tokens (short / mid / long memory) are prepended to the chunk's and forecast with them"),
    ModelProfile("MotifVideoTransformer3DModel", split_list=("single_transformer_blocks", "num_decoder_layers"),
                 note="its DDT decoder (the last num_decoder_layers single blocks) restarts from the patch embeddings: "
                      "forecast as a list of its own"),
    ModelProfile("SanaWMTransformer3DModel",
                 note="per-frame timesteps (the clean image frame's 0); camera inputs are fixed per call"),
    ModelProfile("AnyFlowTransformer3DModel", note="bidirectional; the target timestep r_timestep is a side input"),
    ModelProfile("MiniMaxH3Transformer3DModel", increasing_timesteps=True,
                 unbatched_args=frozenset({"timestep", "temb", "timestep_indices", "token_tags", "position_ids",
                                           "video_indices", "audio_indices", "text_indices", "adaln_indices"}),
                 note="one packed [text | audio | video] layout replicated over the batch: its distinct timesteps and "
                      "index tensors are not per row; the token refiner's nested blocks run at every step"),
    ModelProfile("CosmosTransformer3DModel",
                 note="Cosmos-Predict2.5; Transfer2.5's ControlNet residuals are added inside the blocks, so a forecast "
                      "carries the last full step's"),
    ModelProfile("ChronoEditTransformer3DModel",
                 note="with enable_temporal_reasoning the pipeline drops the reasoning frames mid-run: the token count "
                      "change restarts the anchors"),
    ModelProfile("WanAnimateTransformer3DModel", interleaved_modules=("face_adapter",),
                 note="its face adapters between blocks add nothing on a draft; the motion and face encoders run at "
                      "every step"),
    ModelProfile("HunyuanVideoFramepackTransformer3DModel", HUNYUAN_VIDEO,
                 block_lists=("transformer_blocks", "single_transformer_blocks"), batch_coupled=True,
                 note=f"both lists: it {_NOT_REPEATED}; a one-row call trims the text to the prompt, so rows are "
                      "recomputed within the whole batch"),
    ModelProfile("Flux3Transformer2DModel", (_block("Flux3SingleTransformerBlock", _REVERSED),),
                 block_lists=("txt_mode_blocks", "mode_blocks.image", "mode_blocks.image_cond",
                              "single_transformer_blocks"),
                 note="per-mode lists (text, image, reference images: image-to-image only) nested in a ModuleDict, "
                      "then the joint blocks"),
    ModelProfile("QwenImage21Transformer2DModel",
                 refused_args={"kv_cache": "the prefix KV cache changes the blocks' token count after the first step "
                                           "and cannot be sliced per row; call the pipeline with use_kv_cache=False"},
                 note="call its pipeline with use_kv_cache=False; the blocks' B + 1 modulation rows (the last at t = 0) "
                      "are sliced per row keeping the last"),
    ModelProfile("Krea2Transformer2DModel", note="its text fusion blocks (timestep-independent) run at every step"),
    ModelProfile("Ideogram4Transformer2DModel", increasing_timesteps=True,
                 note="its pipeline's unconditional_transformer is forecast with hooks of its own"),
    ModelProfile("LongCatImageTransformer2DModel", (_block("LongCatImageTransformerBlock", _REVERSED),
                                                    _block("LongCatImageSingleTransformerBlock", _REVERSED))),
    ModelProfile("OvisImageTransformer2DModel", (_block("OvisImageTransformerBlock", _REVERSED),
                                                 _block("OvisImageSingleTransformerBlock", _REVERSED))),
    ModelProfile("ErnieImageTransformer2DModel", (BlockProfile("ErnieImageSharedAdaLNBlock", sequence_first=True),),
                 note="sequence-first blocks: speca's verifier runs its block on every row"),
    ModelProfile("StableAudioDiTModel",
                 note="1-D audio latents; the prepended global token is forecast with the stream; its rotary tables "
                      "have no batch dimension"),
    ModelProfile("StableAudio3DiTModel", note="1-D audio latents; its memory tokens are forecast with the stream"),
    ModelProfile("LuminaNextDiT2DModel", increasing_timesteps=True,
                 note="tested at the default size, where its time-aware rotary table is the same at every step"),
    ModelProfile("AceStepTransformer1DModel",
                 note="channels-last 1-D latents; sliding-window and full layers in one list"),
    ModelProfile("LongCatAudioDiTTransformer", increasing_timesteps=True,
                 note="its long skip adds the input embedding after the blocks"),
    ModelProfile("MiniMaxMusic3Transformer1DModel", increasing_timesteps=True,
                 note="tested as one window of its modular pipeline's chunked loop (each window is a new generation)"),
    ModelProfile("Kandinsky6SRTransformer3DModel",
                 note="text-free video super-resolution tiles; its sliding-tile prior has no batch dimension"),
    # refused
    ModelProfile("DreamLiteUNetModel", refused="a U-Net: its transformer blocks sit inside down / mid / up blocks joined "
                                               "by skip connections, not in lists of blocks that run one after another"),
    ModelProfile("DreamLiteTransformer2DModel",
                 refused="a spatial transformer inside DreamLite's U-Net (DreamLiteUNetModel), one per U-Net stage and "
                         "called without a timestep, so its steps cannot be told apart"),
    ModelProfile("LatteTransformer3DModel",
                 refused="a video transformer whose spatial (transformer_blocks) and temporal "
                         "(temporal_transformer_blocks) blocks run alternately, the stream reshaped from (batch * "
                         "frames, patches) to (batch * patches, frames) rows between them, while block forecasting "
                         "needs each block list to run as one contiguous stretch"),
    ModelProfile("Cosmos3OmniTransformer",
                 refused="a transformer whose decoder layers run on one packed sequence without a batch dimension "
                         "(text, vision, sound and action tokens placed by index tensors), its latents given as a list "
                         "(vision_tokens) and its timesteps per patch (vision_timesteps): there are no batch rows to "
                         "plan and no timestep argument to track steps by"),
    ModelProfile("WanAnimate2Transformer3DModel",
                 refused="a transformer whose blocks read a per-layer reference K/V cache that a separate "
                         "kv_cache_mode='extract' call fills at the segment's first timestep: that call would be taken "
                         "for a CFG branch of the first step, and a draft of it would leave the cache stale"),
    ModelProfile("AnyFlowFARTransformer3DModel",
                 refused="a transformer whose blocks read a per-layer KV cache of the earlier frame chunks "
                         "(frame-autoregressive generation), which a separate timestep-0 call (kv_cache_flag "
                         "is_cache_step) writes in place between chunks: that call would be taken for a step of the "
                         "finished chunk and could be drafted, leaving the cache unwritten, and the cache (batch at dim "
                         "1, written in place) cannot be sliced to a sub-batch of rows"),
    ModelProfile("SanaWMLTX2RefinerTransformer3DModel",
                 refused="a transformer whose blocks attend to a sliding-window KV cache of the earlier autoregressive "
                         "frame blocks (SanaWMRefinerKVCache, kv_cache_mode), which timestep-0 capture calls on the same "
                         "tokens write after each block's three Euler steps: such a call would be taken for a fourth "
                         "step and could be drafted, leaving the cache without the block's keys and values, and the "
                         "cache object cannot be sliced to a sub-batch of rows"),
)

PROFILES: dict[str, ModelProfile] = {p.name: p for p in _ROWS}
"""Every row, by transformer class name: the supported (tested) classes, in the order errors list them, then those
refused with the reason. A class without a row gets the generic profile (:func:`profile_of`)."""

BLOCKS: dict[str, BlockProfile] = {b.name: b for p in _ROWS for b in p.blocks}
"""Every block profile of the table, by block class name (a block class used by several models has one)."""


def profile_of(model: nn.Module | str) -> ModelProfile:
    """The row of ``model``'s class (a transformer or its class name); an empty profile for a class without one."""
    name = model if isinstance(model, str) else type(model).__name__
    return PROFILES.get(name) or ModelProfile(name)


def block_profile(block: nn.Module | str) -> BlockProfile:
    """The profile of ``block``'s class (a block or its class name); an empty profile for a class without one."""
    name = block if isinstance(block, str) else type(block).__name__
    return BLOCKS.get(name) or BlockProfile(name)


def register(profile: ModelProfile) -> None:
    """Add (or replace) the row of a transformer class, and its block profiles, for this process.

    Example:
        >>> register(ModelProfile("MyTransformer", (BlockProfile("MyBlock", layout=(1, 0)),)))  # doctest: +SKIP
    """
    PROFILES[profile.name] = profile
    BLOCKS.update({b.name: b for b in profile.blocks})


def supported() -> list[str]:
    """The transformer classes tested with block forecasting, in table order."""
    return [p.name for p in PROFILES.values() if not p.refused]


def _facts(profile: ModelProfile) -> list[str]:
    """What a row changes from the generic engine, in words (the docs' column)."""
    facts = [f"block lists {', '.join(f'`{n}`' for n in profile.block_lists)}"] if profile.block_lists else []
    if profile.split_list:
        facts.append(f"`{profile.split_list[0]}` split before its last `{profile.split_list[1]}` blocks")
    facts += [f"`{n}` skipped on drafts (side outputs only)" for n in profile.side_output_lists]
    facts += [f"`{n}` between blocks" for n in profile.interleaved_modules]
    if profile.between_block_args:
        facts.append(f"residuals between blocks: {', '.join(f'`{n}`' for n in profile.between_block_args)}")
    if profile.increasing_timesteps:
        facts.append("timesteps grow (`1 - sigma`)")
    facts += [f"refuses `{n}`" for n in profile.refused_args]
    if profile.batch_coupled:
        facts.append("rows recomputed within the batch")
    if profile.blocks and all(b.modules for b in profile.blocks):
        facts.append("also `granularity=\"module\"`")
    return facts + ([profile.note] if profile.note else []) or ["generic"]


def markdown() -> str:
    """``docs/supported-models.md``: the supported and refused transformers, from :data:`PROFILES`."""
    lines = [
        "# Supported models (`taylor`, `speca`)",
        "",
        "Generated from `diffspec/forecast/profiles.py` by `python -m diffspec.forecast.profiles --markdown`; "
        "do not edit by hand.",
        "",
        "Each transformer below is tested on a tiny random-weight config called the way its diffusers pipeline "
        "calls it. Others whose blocks can be found (`_repeated_blocks`, else the longest `nn.ModuleList` of "
        "same-class blocks) usually work; when discovery fails the error names the `blocks=` field to pass.",
        "",
        "| Transformer | What the engine knows beyond discovery |",
        "|---|---|",
        *(f"| `{p.name}` | {'; '.join(_facts(p))} |" for p in PROFILES.values() if not p.refused),
        "",
        "## Refused with the reason",
        "",
        "| Transformer | Why |",
        "|---|---|",
        *(f"| `{p.name}` | it is {p.refused} |" for p in PROFILES.values() if p.refused),
        "",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    if sys.argv[1:] != ["--markdown"]:
        sys.exit("usage: python -m diffspec.forecast.profiles --markdown > docs/supported-models.md")
    sys.stdout.write(markdown())
