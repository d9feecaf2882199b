"""``multimodal-cost``: the cost side of multimodal speculative decoding at real size (random weights).

Per target (a Qwen2.5-VL-7B-size or LLaVA-1.5-7B-size language model, or ``tiny`` for CPU tests),
visual context length and batch, all measured after warmup, CUDA-synchronised, arms interleaved:

- ``prefill``: one target call over the prompt (batch 1; ``prefill_with_probe`` adds diffspec's
  attention-score hooks, as ``self-draft``/``compressed-draft`` run it);
- ``verify``: one target call on ``K+1`` tokens after the prefilled context (``K=0``: the plain
  decode step), ``cost_ratio[K] = verify[K] / verify[0]``;
- drafter side per round of ``K`` draft tokens: ``self-draft`` through diffspec's own
  :class:`~diffspec.multimodal.strategies.SelfDraftState` (per-round view of the target's cache with
  text + top-K visual entries chosen by :class:`~diffspec.multimodal.visual.AttentionProbe`,
  optionally half the layers), ``compressed-draft`` (a small same-family LM on the pruned prompt,
  its own prefill timed) and ``draft`` (the same small LM on the full prompt).

The vision tower is not built: the prompt is fed as ``inputs_embeds`` (random) of the stated
length, so no arm includes vision encoding. :mod:`~diffspec.bench.mm_cost_project` combines these
costs with acceptance measured elsewhere (trained tiny pair) into *projected* speedups.

Example:
    >>> doc = run_multimodal_cost("tiny", repeats=2)  # doctest: +SKIP
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Any

import torch
from transformers import DynamicCache

from ..multimodal.compressed_config import CompressedDraftConfig
from ..multimodal.prune import compact_index
from ..multimodal.self_config import SelfDraftConfig
from ..multimodal.slots import SlotState, drop_tail
from ..multimodal.strategies import SelfDraftState
from ..multimodal.visual import AttentionProbe, keep_count, select_visual
from .mm_cost_project import acceptance_sources, cost_table, project
from .timing import Arm, latency_summary, machine_info, time_arms

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
SELF_FIELDS = ("visual_top_k", "visual_ratio", "score_rows")
COMP_FIELDS = ("image_keep", "video_keep", "image_selection", "video_selection", "score_rows")
IMAGE_MAX = 2048
"""Contexts of at most this many visual tokens are an image (``image_keep``), longer ones video (``video_keep``)."""


def _positive_list(field: str, value: Any, allowed: str, low: int = 1) -> list[int]:
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


class _Cell:
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


def _fits(spec: LMSpec, tokens: int, batch: int, dtype: torch.dtype, device: torch.device,
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


def _machine(dev: torch.device) -> dict[str, Any]:
    """``machine_info`` (diffusers may be absent on a GPU box: this suite does not need it), plus transformers."""
    import platform

    import transformers

    try:
        info = machine_info(dev)
    except ImportError:
        name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else f"CPU ({platform.machine()})"
        info = {"device": name, "device_type": dev.type, "torch": torch.__version__, "diffusers": None,
                "cuda": torch.version.cuda, "python": platform.python_version(), "platform": platform.platform()}
    info["transformers"] = transformers.__version__
    if dev.type == "cpu":
        info["threads"] = torch.get_num_threads()
    return info


def _e2e(o: dict[str, Any], dev: torch.device, torch_dtype: torch.dtype, repeats: int, warmup: int,
         allow_cpu: bool) -> dict[str, Any] | None:
    """The measured end-to-end block (:mod:`~diffspec.bench.mm_cost_e2e`), or None with ``e2e_size=none``."""
    from .mm_cost_e2e import run_e2e

    size = str(o.get("e2e_size", "7b" if dev.type == "cuda" else "none"))
    if size == "none":
        return None
    if size == "7b" and dev.type != "cuda" and not allow_cpu:
        raise ValueError("e2e_size='7b' is a real-size architecture meant for a GPU; pass --device cuda, "
                         "--set e2e_size=tiny|none, or --allow-cpu")
    try:
        rates = tuple(float(r) for r in str(o.get("e2e_rates", "1.0,0.8")).split(",") if r.strip())
    except ValueError:
        raise ValueError(f"e2e_rates={o['e2e_rates']!r} is not allowed: forced rates in (0, 1], comma separated") from None
    ints = {}
    for field, default, low in (("e2e_frames", 64, 2), ("e2e_side", 448, 28), ("e2e_new_tokens", 96, 2), ("e2e_k", 5, 1),
                                ("e2e_repeats", min(repeats, 3), 1), ("e2e_warmup", min(warmup, 1), 0)):
        try:
            ints[field] = int(o.get(field, default))
        except ValueError:
            raise ValueError(f"{field}={o[field]!r} is not an integer (>= {low})") from None
        if ints[field] < low:
            raise ValueError(f"{field}={ints[field]} is out of range: >= {low}")
    return run_e2e(size, device=dev, dtype=torch_dtype, frames=ints["e2e_frames"], side=ints["e2e_side"],
                   new_tokens=ints["e2e_new_tokens"], k=ints["e2e_k"], rates=rates,
                   batches=tuple(_positive_list("e2e_batches", o.get("e2e_batches", "1"), "batch sizes >= 1")),
                   repeats=ints["e2e_repeats"], warmup=ints["e2e_warmup"])


@torch.inference_mode()
def run_multimodal_cost(model: str | None = None, *, device: str | None = None, dtype: str | None = None,
                        batch: int | None = None, repeats: int = 5, warmup: int = 2, allow_cpu: bool = False,
                        overrides: dict[str, Any] | None = None, **_: Any) -> dict[str, Any]:
    """Run the suite (module doc) and return the JSON document.

    ``overrides`` (``--set``): ``contexts`` (visual tokens, e.g. ``1024,8192``), ``batches``
    (``1,2,4,8``), ``ks`` (``1,2,4,8``), ``new_tokens`` (``96,256``), ``acceptance`` (per-draft
    rates in ``(0, 1]`` to project with, instead of the committed tiny-vlm JSON),
    ``acceptance_json`` (another ``multimodal`` suite JSON), ``time_budget_s`` (skip the remaining
    cells once exceeded), ``visual_top_k``/``visual_ratio`` (self-draft), ``image_keep``/``video_keep``.

    Raises:
        ValueError: unknown model or option, a bad value, or a real size on the CPU without ``allow_cpu``.
    """
    o = dict(overrides or {})
    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    names = [m.strip() for m in (model or (",".join(REAL) if dev.type == "cuda" else "tiny")).split(",") if m.strip()]
    bad = [m for m in names if m not in MODELS]
    if bad or not names:
        raise ValueError(f"model={model!r} is not allowed: choose a comma list of {', '.join(MODELS)}")
    if dev.type != "cuda" and not allow_cpu and any(m in REAL for m in names):
        raise ValueError(f"model={model!r} is a real-size architecture meant for a GPU (device is {dev}); pass "
                         "--device cuda, --model tiny, or --allow-cpu to time it on the CPU anyway")
    dtype_name = dtype or ("bfloat16" if dev.type == "cuda" else "float32")
    if dtype_name not in ("float32", "float16", "bfloat16"):
        raise ValueError(f"dtype={dtype_name!r} is not allowed; choose float32, float16 or bfloat16")
    for field, value, low in (("repeats", repeats, 1), ("warmup", warmup, 0)):
        if value < low:
            raise ValueError(f"{field}={value} is out of range; must be >= {low}")
    known = {"contexts", "batches", "ks", "new_tokens", "acceptance", "acceptance_json", "time_budget_s",
             "visual_top_k", "visual_ratio", "image_keep", "video_keep", "grid", "e2e_size", "e2e_frames", "e2e_side",
             "e2e_new_tokens", "e2e_k", "e2e_rates", "e2e_batches", "e2e_repeats", "e2e_warmup"}
    unknown = sorted(set(o) - known)
    if unknown:
        raise ValueError(f"multimodal-cost: unknown option(s) {', '.join(unknown)}; allowed: {', '.join(sorted(known))}")
    batches = [batch] if batch else _positive_list("batches", o.get("batches", "1,2,4,8"), "batch sizes >= 1")
    ks = _positive_list("ks", o.get("ks", "1,2,4,8"), "draft lengths K in [1, 64]")
    if max(ks) > 64:
        raise ValueError(f"ks={o.get('ks')!r} is out of range: draft lengths K in [1, 64]")
    new_tokens = _positive_list("new_tokens", o.get("new_tokens", "96,256"), "token counts >= 2", low=2)
    budget = float(o.get("time_budget_s", 0) or 0)
    if budget < 0:
        raise ValueError(f"time_budget_s={budget} is out of range: seconds >= 0 (0: no budget)")
    self_cfg = SelfDraftConfig(visual_top_k=int(o.get("visual_top_k", 512)), visual_ratio=float(o.get("visual_ratio", 0.1)))
    comp_cfg = CompressedDraftConfig(image_keep=float(o.get("image_keep", 0.25)), video_keep=float(o.get("video_keep", 0.1)))
    sources = acceptance_sources(o.get("acceptance"), o.get("acceptance_json"))
    torch_dtype = getattr(torch, dtype_name)
    start = time.perf_counter()
    with torch.inference_mode(False):
        e2e = _e2e(o, dev, torch_dtype, repeats, warmup, allow_cpu)
    if dev.type == "cuda":
        torch.cuda.empty_cache()
    grid = str(o.get("grid", True)).lower() not in ("false", "0", "no")
    if not grid:
        names = []
    runs: list[dict[str, Any]] = []
    prefill: list[dict[str, Any]] = []
    skipped: list[dict[str, Any]] = []
    models: dict[str, Any] = {}
    for name in names:
        t_name, d_name, default_ctx = MODELS[name]
        contexts = _positive_list("contexts", o["contexts"], "visual token counts >= 1") if "contexts" in o \
            else list(default_ctx)
        max_pos = TEXT_BEFORE + max(contexts) + TEXT_AFTER + 2 * max(ks) + 8
        target = LMS[t_name].build(dev, torch_dtype, max_pos)
        drafter = LMS[d_name].build(dev, torch_dtype, max_pos, seed=1)
        models[name] = {"target": {"lm": t_name, **asdict(LMS[t_name]),
                                   "params": sum(p.numel() for p in target.parameters())},
                        "drafter": {"lm": d_name, **asdict(LMS[d_name]),
                                    "params": sum(p.numel() for p in drafter.parameters())},
                        "contexts": contexts}
        for n_vis in contexts:
            cell = {"model": name, "visual_tokens": n_vis}
            if budget and time.perf_counter() - start > budget:
                skipped += [{**cell, "batch": b, "reason": "time_budget_s exceeded"} for b in batches]
                continue
            why = _fits(LMS[t_name], TEXT_BEFORE + n_vis + TEXT_AFTER, 1, torch_dtype, dev, 1.3)
            if why:
                skipped += [{**cell, "batch": b, "reason": why} for b in batches]
                continue
            c = _Cell(target, drafter, n_vis, dev, torch_dtype, self_cfg, comp_cfg, seed=n_vis)
            try:
                prefill.append({**cell, **c.prefills(repeats, warmup)})
            except torch.cuda.OutOfMemoryError as exc:
                skipped += [{**cell, "batch": b, "reason": f"prefill: CUDA out of memory: {str(exc)[:120]}"}
                            for b in batches]
                del c
                continue
            for b in batches:
                kept = prefill[-1]["self_draft_kept_tokens"] / c.T
                why = _fits(LMS[t_name], c.T, b, torch_dtype, dev, 1.2 + 2.5 * kept)
                if not why and budget and time.perf_counter() - start > budget:
                    why = "time_budget_s exceeded"
                if why:
                    skipped.append({**cell, "batch": b, "reason": why})
                    continue
                try:
                    runs += [{**cell, "context": "image" if c.is_image else "video", "peer": False, **r}
                             for r in c.batch(b, ks, repeats, warmup)]
                except torch.cuda.OutOfMemoryError as exc:
                    skipped.append({**cell, "batch": b, "reason": f"CUDA out of memory: {str(exc)[:120]}"})
            del c
        del target, drafter
        if dev.type == "cuda":
            torch.cuda.empty_cache()
    doc = {"suite": "multimodal-cost", "machine": _machine(dev),
           "model": {"name": ",".join(names) or "e2e only", "dtype": dtype_name, "weights": "random (speed does not depend on "
                     "weight values)", "models": models},
           "workload": {"tokens": new_tokens, "batch": batches, "ks": ks, "text_tokens": TEXT_BEFORE + TEXT_AFTER,
                        "repeats": repeats, "warmup": warmup, "self_draft": {k: v for k, v in self_cfg.to_dict().items() if k in SELF_FIELDS},
                        "compressed_draft": {k: v for k, v in comp_cfg.to_dict().items() if k in COMP_FIELDS}, "image_max_visual_tokens": IMAGE_MAX,
                        "elapsed_s": round(time.perf_counter() - start, 1)},
           "prefill": prefill, "runs": runs, "projection": project(prefill, runs, sources, new_tokens),
           "acceptance_sources": sources, "notes": _notes(dev)}
    if dev.type == "cpu":
        doc["wall_clock_caveat"] = ("CPU timings on shared cores, noisy (see min/max); tiny sizes check the suite's "
                                    "pipeline and JSON, they say nothing about real-size costs.")
    if e2e is not None:
        doc["e2e"] = e2e
    if skipped:
        doc["skipped"] = skipped
    return doc


def _notes(dev: torch.device) -> list[str]:
    notes = [
        "Measured here: costs only (random weights). Targets are the language models of the named VLMs "
        "(Qwen2.5-VL-7B: Qwen2 stack with 1-D RoPE in place of M-RoPE, same FLOPs and bytes; LLaVA-1.5-7B: Llama "
        "stack); no vision tower: the visual context is fed as random inputs_embeds of visual_tokens slots between "
        "16 + 16 text tokens, so vision encoding is in no figure (neither the target's nor a drafter's).",
        "Prefills are timed at batch 1; the batch-B caches are the batch-1 cache repeated. verify call_ms[K]: one "
        "target call on K+1 tokens after the prompt (K=0: the plain decode step), DynamicCache as transformers "
        "generate and diffspec's loop use it; cost_ratio[K] = call_ms[K] / call_ms[0] (medians).",
        "self-draft rows: diffspec's SelfDraftState (per-round view: text + top-K visual entries by the "
        "AttentionProbe scores of the prefill; half layers = even layers); draft_round_ms[K] = round_start (view "
        "build + 1 token) + K-1 single-token draft calls. compressed-draft / draft rows: the small same-family LM "
        "(random weights) with its own prefill on the pruned / full prompt (pruned slots gathered directly, at "
        "their original positions, as PrunePrefill does), K single-token calls per round.",
        "Arms of one (model, context, batch) are interleaved per repeat after untimed warmup; medians in ms, "
        "min/max in the JSON.",
        "projection: PROJECTED, not measured end to end: cost measured here x acceptance measured elsewhere (see "
        "acceptance_sources and projection_model).",
    ]
    if dev.type == "cpu":
        notes.append("CPU run: wall-clock on 2 shared cores (noisy); tiny sizes test the pipeline, not real costs.")
    return notes


def main(argv: list[str] | None = None) -> None:
    """``python -m diffspec.bench.mm_cost``: the suite without the CLI (``--set`` as ``KEY=VALUE``)."""
    import argparse
    import json
    from pathlib import Path

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default=None)
    parser.add_argument("--device", default=None)
    parser.add_argument("--dtype", default=None)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--allow-cpu", action="store_true")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    overrides = dict(pair.split("=", 1) for pair in args.set)
    doc = run_multimodal_cost(args.model, device=args.device, dtype=args.dtype, repeats=args.repeats,
                              warmup=args.warmup, allow_cpu=args.allow_cpu, overrides=overrides)
    import datetime as _dt

    doc = {"suite": doc.pop("suite"), "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
           **doc}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=2) + "\n")
    print(cost_table(doc))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()


__all__ = ["LMS", "MODELS", "LMSpec", "cost_table", "run_multimodal_cost"]
