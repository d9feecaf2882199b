"""Measurement pieces of ``multimodal-cost``: real-size LM shapes and one (model, context) cell.

A :class:`Cell` holds a random-weight target LM and a small same-family drafter LM, a prompt of
``TEXT_BEFORE`` text + ``n_visual`` visual + ``TEXT_AFTER`` text slots fed as ``inputs_embeds`` (no
vision tower), times the prefills (batch 1), then per batch the verify calls and the drafters'
rounds (see :mod:`diffspec.bench.mm_cost`).

Example:
    >>> LMS["qwen2.5-vl-7b-lm"].kv_bytes(1, torch.bfloat16)  # 28 layers x 2 x 4 KV heads x 128 x 2 bytes
    57344
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import torch
from transformers import DynamicCache

from ..multimodal.compressed_config import CompressedDraftConfig
from ..multimodal.prune import compact_index
from ..multimodal.self_config import SelfDraftConfig
from ..multimodal.slots import SlotState, drop_tail
from ..multimodal.strategies import SelfDraftState
from ..multimodal.visual import AttentionProbe, keep_count, select_visual
from .timing import Arm, latency_summary, time_arms

TEXT_BEFORE, TEXT_AFTER = 16, 16
"""Text tokens around the visual block (the score rows of the probe are the last ones)."""


@dataclass(frozen=True)
class LMSpec:
    """A decoder-only LM's shape (transformers ``Qwen2Config`` or ``LlamaConfig``)."""

    family: str
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int
    vocab: int
    rope_theta: float = 10000.0

    def build(self, device: torch.device, dtype: torch.dtype, max_pos: int, seed: int = 0) -> Any:
        """The random-weight model, created directly on ``device`` in ``dtype``."""
        from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

        cfg_cls, model_cls = (Qwen2Config, Qwen2ForCausalLM) if self.family == "qwen2" else (LlamaConfig,
                                                                                             LlamaForCausalLM)
        cfg = cfg_cls(vocab_size=self.vocab, hidden_size=self.hidden, intermediate_size=self.intermediate,
                      num_hidden_layers=self.layers, num_attention_heads=self.heads,
                      num_key_value_heads=self.kv_heads, max_position_embeddings=max_pos, tie_word_embeddings=False,
                      rope_parameters={"rope_type": "default", "rope_theta": self.rope_theta})
        torch.manual_seed(seed)
        with torch.device(device):
            return model_cls._from_config(cfg, dtype=dtype).eval()

    def kv_bytes(self, tokens: int, dtype: torch.dtype) -> int:
        """Bytes of the KV cache for ``tokens`` cached slots (all rows together)."""
        elem = torch.empty((), dtype=dtype).element_size()
        return 2 * self.layers * self.kv_heads * (self.hidden // self.heads) * tokens * elem


LMS: dict[str, LMSpec] = {
    "qwen2.5-vl-7b-lm": LMSpec("qwen2", 3584, 28, 28, 4, 18944, 152064, 1e6),
    "qwen2.5-0.5b": LMSpec("qwen2", 896, 24, 14, 2, 4864, 151936, 1e6),
    "llava-1.5-7b-lm": LMSpec("llama", 4096, 32, 32, 32, 11008, 32064),
    "tinyllama-1.1b": LMSpec("llama", 2048, 22, 32, 4, 5632, 32064),
    "tiny-lm": LMSpec("qwen2", 64, 4, 4, 2, 128, 512),
    "tiny-drafter": LMSpec("qwen2", 32, 2, 2, 1, 64, 512),
}
MODELS: dict[str, tuple[str, str, tuple[int, ...]]] = {
    "qwen2.5-vl-7b": ("qwen2.5-vl-7b-lm", "qwen2.5-0.5b", (1024, 8192, 32768)),
    "llava-1.5-7b": ("llava-1.5-7b-lm", "tinyllama-1.1b", (1024, 8192)),
    "tiny": ("tiny-lm", "tiny-drafter", (64, 256)),
}
"""Suite model name -> (target LM, small same-family drafter LM, default visual context lengths)."""
REAL = ("qwen2.5-vl-7b", "llava-1.5-7b")
IMAGE_MAX = 2048
"""Contexts of at most this many visual tokens are an image (``image_keep``), longer ones video (``video_keep``)."""

def positive_list(field: str, value: Any, allowed: str, low: int = 1) -> list[int]:
    items = value if isinstance(value, (list, tuple)) else str(value).split(",")
    try:
        out = [int(v) for v in items if str(v).strip() != ""]
    except ValueError:
        raise ValueError(f"{field}={value!r} is not allowed: {allowed}") from None
    if not out or any(v < low for v in out):
        raise ValueError(f"{field}={value!r} is out of range: {allowed}")
    return sorted(set(out))


def _timer(arms: list[Arm], device: torch.device, repeats: int, warmup: int) -> dict[str, dict[str, float]]:
    """Interleaved timing (``time_arms``) of ``arms``; per arm ``{median, min, max, n}`` in milliseconds."""
    time_arms(arms, [0], device=device, repeats=repeats, warmup=warmup, show_progress=False)
    out = {}
    for arm in arms:
        s = latency_summary(arm.times)
        out[arm.name] = {k: (round(v * 1e3, 4) if k != "n" else v) for k, v in s.items()}
    return out


def _expand(cache: DynamicCache, batch: int) -> DynamicCache:
    if batch == 1:
        return cache
    out = DynamicCache()
    for i, layer in enumerate(cache.layers):
        out.update(layer.keys.expand(batch, -1, -1, -1).contiguous(),
                   layer.values.expand(batch, -1, -1, -1).contiguous(), i)
    return out


def _restore(cache: Any, length: int) -> None:
    """Crop ``cache`` back to ``length`` slots (the arms' ``enable``: untimed, idempotent)."""
    drop_tail(cache, cache.get_seq_length() - length)


def _call(model: Any, cache: Any, ids: torch.Tensor, start: int) -> torch.Tensor:
    L = ids.shape[1]
    pos = torch.arange(start, start + L, device=ids.device).expand(ids.shape[0], L)
    return model(input_ids=ids, position_ids=pos, past_key_values=cache, use_cache=True, logits_to_keep=L).logits


class Cell:
    """One (model, context) measurement: prefills, then per batch the verify and draft arms."""

    def __init__(self, target: Any, drafter: Any, n_visual: int, device: torch.device, dtype: torch.dtype,
                 self_cfg: SelfDraftConfig, comp_cfg: CompressedDraftConfig, seed: int) -> None:
        self.target, self.drafter, self.device = target, drafter, device
        self.T = TEXT_BEFORE + n_visual + TEXT_AFTER
        g = torch.Generator(device="cpu").manual_seed(seed)
        ids = torch.randint(0, target.config.vocab_size, (1, self.T), generator=g).to(device)
        self.visual = torch.zeros(1, self.T, dtype=torch.bool, device=device)
        self.visual[:, TEXT_BEFORE:TEXT_BEFORE + n_visual] = True
        self.embeds = target.get_input_embeddings()(ids).to(dtype)
        self.d_embeds = drafter.get_input_embeddings()(ids.clamp(max=drafter.config.vocab_size - 1)).to(dtype)
        self.pos = torch.arange(self.T, device=device)[None]
        self.mask = torch.ones(1, self.T, dtype=torch.long, device=device)
        self.n_visual, self.self_cfg, self.comp_cfg = n_visual, self_cfg, comp_cfg
        self.is_image = n_visual <= IMAGE_MAX

    def _prefill(self, model: Any, embeds: torch.Tensor, pos: torch.Tensor) -> Any:
        return model(inputs_embeds=embeds, position_ids=pos, use_cache=True, logits_to_keep=1).past_key_values

    def prefills(self, repeats: int, warmup: int) -> dict[str, Any]:
        """Time the prefills (batch 1); keep the target cache, the kept index sets and the drafter caches."""
        probe = AttentionProbe(self.target, self.mask, rows=self.self_cfg.score_rows)
        with probe:
            self.cache = self._prefill(self.target, self.embeds, self.pos)
        scores = probe.scores
        n_keep = keep_count(self.visual, self.self_cfg.visual_ratio, self.self_cfg.visual_top_k)
        kept = select_visual(self.visual, n_keep, scores, "attention")
        self.self_index = compact_index(~self.visual | kept)
        ratio = self.comp_cfg.image_keep if self.is_image else self.comp_cfg.video_keep
        mode = self.comp_cfg.image_selection if self.is_image else self.comp_cfg.video_selection
        c_kept = select_visual(self.visual, keep_count(self.visual, ratio), scores, mode)
        self.comp_index, _ = compact_index(~self.visual | c_kept)
        idx = self.comp_index
        self.comp_embeds = self.d_embeds.gather(1, idx[..., None].expand(-1, -1, self.d_embeds.shape[-1]))
        self.comp_pos = self.pos.gather(1, idx)
        self.d_cache = {"compressed-draft": self._prefill(self.drafter, self.comp_embeds, self.comp_pos),
                        "draft (small drafter, full context)": self._prefill(self.drafter, self.d_embeds, self.pos)}
        self.d_len = {name: c.get_seq_length() for name, c in self.d_cache.items()}

        def with_probe(_: list[int]) -> None:
            with AttentionProbe(self.target, self.mask, rows=self.self_cfg.score_rows):
                self._prefill(self.target, self.embeds, self.pos)

        arms = [Arm("prefill", lambda _: self._prefill(self.target, self.embeds, self.pos)),
                Arm("prefill_with_probe", with_probe),
                Arm("drafter_prefill:compressed-draft",
                    lambda _: self._prefill(self.drafter, self.comp_embeds, self.comp_pos)),
                Arm("drafter_prefill:draft (small drafter, full context)",
                    lambda _: self._prefill(self.drafter, self.d_embeds, self.pos))]
        times = _timer(arms, self.device, repeats, warmup)
        return {"target_prefill_ms": times["prefill"], "target_prefill_with_probe_ms": times["prefill_with_probe"],
                "drafter_prefill_ms": {k.split(":", 1)[1]: v for k, v in times.items() if k.startswith("drafter")},
                "prompt_tokens": self.T, "self_draft_kept_tokens": int(self.self_index[0].shape[1]),
                "compressed_draft_kept_tokens": int(idx.shape[1]),
                "compressed_keep_ratio": ratio, "compressed_selection": mode}

    def batch(self, B: int, ks: list[int], repeats: int, warmup: int) -> list[dict[str, Any]]:
        """Verify and draft-round arms at batch ``B`` (the batch-1 caches repeated along the batch)."""
        cache = _expand(self.cache, B)
        tok = torch.full((B, 1), 7, dtype=torch.long, device=self.device)
        arms: list[Arm] = []
        for k in [0, *ks]:
            ids = tok.expand(B, k + 1)
            arms.append(Arm(f"verify:{k}", lambda _, ids=ids: _call(self.target, cache, ids, self.T),
                            enable=lambda: _restore(cache, self.T)))
        slot = SlotState.after_prefill(cache, self.mask.expand(B, -1), None)
        index, valid = (t.expand(B, -1) for t in self.self_index)
        n_layers = len(self.target.get_decoder().layers)
        variants = {"self-draft (sparse KV)": None,
                    "self-draft (sparse KV + half layers)": tuple(range(0, n_layers, 2))}
        prep: dict[str, float] = {}
        hole, hv = tok[:, 0], torch.zeros_like(tok[:, 0])
        for name, run in variants.items():
            start = time.perf_counter()
            state = SelfDraftState(slot, index, valid, self.T, run, n_layers)
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
            prep[name] = round((time.perf_counter() - start) * 1e3, 4)
            for k in ks:
                def draft_round(_: list[int], state: SelfDraftState = state, k: int = k) -> None:
                    state.round_start(self.target, hole, hv, tok[:, 0])
                    for _i in range(k - 1):
                        state.forward(self.target, tok, logits_to_keep=1)

                arms.append(Arm(f"{name}:{k}", draft_round, enable=lambda: _restore(cache, self.T),
                                disable=lambda s=state: s.rollback(0, tok[:, 0])))
        for name, base in self.d_cache.items():
            d_cache, d_len = _expand(base, B), self.d_len[name]
            for k in ks:
                def small_round(_: list[int], d_cache: Any = d_cache, k: int = k) -> None:
                    for i in range(k):
                        _call(self.drafter, d_cache, tok, self.T + i)

                arms.append(Arm(f"{name}:{k}", small_round, enable=lambda c=d_cache, n=d_len: _restore(c, n)))
        times = _timer(arms, self.device, repeats, warmup)
        _restore(cache, self.T)
        for name, base in self.d_cache.items():
            _restore(base, self.d_len[name])
        decode = times["verify:0"]["median"]
        rows = [{"method": "target verify", "batch": B,
                 "call_ms": {str(k): times[f"verify:{k}"] for k in [0, *ks]},
                 "cost_ratio": {str(k): round(times[f"verify:{k}"]["median"] / decode, 4) for k in ks}}]
        for name in [*variants, *self.d_cache]:
            rounds = {str(k): times[f"{name}:{k}"] for k in ks}
            rows.append({"method": name, "batch": B, "draft_round_ms": rounds,
                         "draft_ms_per_token": {k: round(v["median"] / int(k), 4) for k, v in rounds.items()},
                         "draft_token_vs_decode": {k: round(v["median"] / int(k) / decode, 4)
                                                   for k, v in rounds.items()},
                         **({"view_prepare_ms": prep[name]} if name in prep else {})})
        return rows

def fits(spec: LMSpec, tokens: int, batch: int, dtype: torch.dtype, device: torch.device,
          factor: float) -> str | None:
    """Why (context, batch) would not fit in free GPU memory (None: it fits, or not on CUDA).

    ``factor``: bytes needed per byte of the batch's KV cache (the cache, the self-draft views, the
    per-layer copy a ``DynamicCache`` update makes), plus 2 GiB of activations.
    """
    if device.type != "cuda":
        return None
    torch.cuda.empty_cache()
    free, _ = torch.cuda.mem_get_info(device)
    need = spec.kv_bytes(tokens * batch, dtype) * factor + 2 * 2**30
    if need > free:
        return f"needs ~{need / 2**30:.1f} GiB (KV cache x{factor:.2f} + 2 GiB), {free / 2**30:.1f} GiB free"
    return None
