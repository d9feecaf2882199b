"""Finding the transformer blocks of a diffusers model and reading/writing their streams."""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from .profiles import block_profile, profile_of, supported
from .rows import take_call_rows

_STREAMS = ("hidden_states", "encoder_hidden_states")
_STREAM_PARAMS = {"hidden": "hidden_states", "encoder": "encoder_hidden_states"}  # the engine's stream -> parameter

HIDDEN_ARGS = ("hidden_states", "x")
"""Names of a transformer's latent input, first match in its signature wins (Z-Image's takes ``x``).
A block's stream input: see :meth:`BlockIO.for_block`."""


def find_block_lists(model: nn.Module, names: tuple[str, ...] | None = None) -> list[tuple[str, nn.ModuleList]]:
    """The model's lists of repeated transformer blocks, in execution (registration) order.

    ``names`` (the config's ``blocks`` field) names the ``nn.ModuleList`` attributes to use, dotted for a list
    nested in a container (``"mode_blocks.image"``); by default the ``block_lists`` of the model's
    :class:`~.profiles.ModelProfile`. Otherwise ``model._repeated_blocks`` (class names) when the model declares it,
    else the longest direct ``nn.ModuleList`` child whose items share one class. The profile's ``split_list`` is
    returned as two (its leading and its trailing blocks).

    Raises:
        ValueError: if no block list can be found, ``names`` names no non-empty ModuleList, or the model's profile
            refuses it (a U-Net, block lists that run interleaved, no batch rows).

    Example:
        >>> [name for name, _ in find_block_lists(pipe.transformer)]  # doctest: +SKIP
        ['transformer_blocks', 'single_transformer_blocks']
    """
    profile = profile_of(model)
    if profile.refused:
        raise ValueError(f"{profile.name} is not supported by block forecasting: it is {profile.refused}")
    lists = [(n, m) for n, m in model.named_children() if isinstance(m, nn.ModuleList) and len(m) > 0]
    if names is None:
        names = profile.block_lists
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
            f"{', '.join(supported())}."
        )
    return _split_lists(model, [max(uniform, key=lambda nm: len(nm[1]))])


def _split_lists(model: nn.Module, lists: list[tuple[str, nn.ModuleList]]) -> list[tuple[str, nn.ModuleList]]:
    """``lists`` with the profile's ``split_list`` cut before its trailing blocks (two lists of the same block
    modules), where the model has some."""
    name, attr = profile_of(model).split_list or (None, "")
    k = int(getattr(model, attr, 0) or 0) if name else 0
    out: list[tuple[str, nn.ModuleList]] = []
    for n, blocks in lists:
        if n == name and 0 < k < len(blocks):
            out += [(f"{n}[:-{k}]", blocks[:-k]), (f"{n}[-{k}:]", blocks[-k:])]
        else:
            out.append((n, blocks))
    return out


def output_layout(block: nn.Module) -> tuple[int, int | None] | None:
    """``(hidden_index, encoder_index)`` of a tuple-returning block (its :class:`~.profiles.BlockProfile`, else
    diffusers' registry), or None if unknown."""
    layout = block_profile(block).layout
    if layout is not None:
        return layout
    try:  # diffusers' private registry, when this version has the class registered
        from diffusers.hooks._helpers import TransformerBlockRegistry

        meta = TransformerBlockRegistry.get(type(block))
        return meta.return_hidden_states_index, meta.return_encoder_hidden_states_index
    except Exception:
        return None


@dataclass
class BlockIO:
    """A diffusers block's streams (:class:`~.engine.StreamIO`): its hidden / encoder inputs, read from a call, and
    outputs packed in its layout. Streams are named ``"hidden"`` and ``"encoder"``, batch-first.

    Example:
        >>> io = BlockIO.for_block(block, block.forward)  # doctest: +SKIP
        >>> io.streams((), {"hidden_states": x, "encoder_hidden_states": text})  # doctest: +SKIP
        {'hidden': x, 'encoder': text}
    """

    block_name: str
    param_index: dict[str, int]
    layout: tuple[int, int | None] | None
    returns_tensor: bool | None = None  # learnt at the first full call
    tuple_len: int = 2
    aliases: dict[str, str] = field(default_factory=dict)  # stream name ("hidden_states") -> the block's parameter
    seq_first: bool = False  # streams are (S, B, D) (the block profile's ``sequence_first``)
    earlier: tuple[str, ...] = ()  # inputs carrying an earlier block's output (the block profile's ``earlier_inputs``)
    unbatched: frozenset[str] = frozenset()  # arguments never sliced to rows (the model profile's ``unbatched_args``)
    whole_batch: bool = False  # the verifier runs on the checked rows only

    @classmethod
    def for_block(cls, block: nn.Module, forward: Any, unbatched: frozenset[str] = frozenset()) -> BlockIO:
        """The I/O of ``block`` called through ``forward`` (its signature names the inputs)."""
        params = list(inspect.signature(forward).parameters)
        profile = block_profile(block)
        # the streams a block transforms: its profile's ``streams``; else ``hidden_states``, or its first parameter
        # (Kandinsky 5's ``x`` / ``visual_embed``, Z-Image's ``x``), and ``encoder_hidden_states``
        aliases = dict(profile.streams)
        if "hidden_states" not in aliases and "hidden_states" not in params and params:
            aliases["hidden_states"] = params[0]
        aliases = {k: v for k, v in aliases.items() if k != v}
        return cls(profile.name, {p: i for i, p in enumerate(params)}, output_layout(block), aliases=aliases,
                   seq_first=profile.sequence_first, earlier=profile.earlier_inputs, unbatched=unbatched)

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

    def streams(self, args: tuple, kwargs: dict) -> dict[str, Any]:
        """The call's stream inputs."""
        return {stream: self.arg(param, args, kwargs) for stream, param in _STREAM_PARAMS.items()}

    def inputs(self, args: tuple, kwargs: dict) -> dict[str, Any]:
        """The call's stream inputs, as anchors keep them (the tensors themselves: a block does not write them)."""
        return self.streams(args, kwargs)

    def earlier_inputs(self, args: tuple, kwargs: dict) -> dict[str, Any]:
        """The call's inputs carrying an earlier block's output (HunyuanDiT's long ``skip``)."""
        return {name: self.arg(name, args, kwargs) for name in self.earlier}

    def outputs(self, out: Any) -> dict[str, Any]:
        """The streams of a block's output; learns the output form on first use."""
        if isinstance(out, torch.Tensor):
            self.returns_tensor = True
            return {"hidden": self._flip("hidden_states", out), "encoder": None}
        if not isinstance(out, (tuple, list)) or self.layout is None:
            raise ValueError(
                f"block {self.block_name} returns {type(out).__name__} with an unknown layout; register it with "
                f"diffspec.forecast.profiles.register(ModelProfile('<transformer class>', (BlockProfile("
                f"{self.block_name!r}, layout=(hidden_index, encoder_index)),)))"
            )
        self.returns_tensor = False
        self.tuple_len = len(out)
        h_i, e_i = self.layout
        encoder = out[e_i] if e_i is not None else None
        return {"hidden": self._flip("hidden_states", out[h_i]), "encoder": self._flip("encoder_hidden_states", encoder)}

    def observe(self, out: Any) -> None:
        """Learn the output form from a real output, once."""
        if self.returns_tensor is None:
            self.outputs(out)

    def pack(self, streams: dict[str, Any]) -> Any:
        """Build an output in the block's own layout (on a draft step).

        Other tuple entries are side outputs that the model adds to a later list's stream between its
        blocks (Wan VACE's hints): that list's anchors already contain them, so a draft returns zeros.
        """
        hidden = self._flip("hidden_states", streams["hidden"])
        encoder = self._flip("encoder_hidden_states", streams.get("encoder"))
        if self.returns_tensor:
            return hidden
        h_i, e_i = self.layout  # type: ignore[misc]
        out: list[Any] = [None if i == e_i else torch.zeros_like(hidden) for i in range(self.tuple_len)]
        out[h_i] = hidden
        if e_i is not None:
            out[e_i] = encoder
        return tuple(out)

    def run_rows(self, run: Any, args: tuple, kwargs: dict, replace: dict[str, Any] | None, rows: torch.Tensor,
                 batch: int) -> dict[str, Any]:
        """The output streams of the rows ``rows`` of ``run`` (the real block) on the call's inputs, the named ones
        ``replace``'d (streams and earlier inputs): run on those rows only, or on every row of a sequence-first
        block (its other inputs cannot be sliced by the batch dimension)."""
        if replace is not None:
            args, kwargs = self.with_inputs(args, kwargs, **{_STREAM_PARAMS.get(k, k): v for k, v in replace.items()})
        subset = len(rows) < batch
        if subset and not self.seq_first:
            names = sorted(self.param_index, key=self.param_index.__getitem__)
            args, kwargs = take_call_rows(args, kwargs, names, rows, batch, unbatched=self.unbatched)
        outs = self.outputs(run(*args, **kwargs))
        if subset and self.seq_first:
            index = rows.to(outs["hidden"].device, non_blocking=True)
            outs = {k: v.index_select(0, index) if v is not None else None for k, v in outs.items()}
        return outs
