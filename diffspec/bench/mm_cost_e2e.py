"""``multimodal-cost`` end to end: measured wall time of the real loop at *forced* acceptance.

A random-weight Qwen2.5-VL (the language model at ``size``: ``7b`` = Qwen2.5-VL-7B's, with a
1-block vision tower; ``tiny`` for tests) decodes one long video with plain ``generate`` and with
diffspec's loop for ``self-draft`` (sparse KV, and + half layers) and ``compressed-draft`` (a
Qwen2.5-0.5B-size language model with the same 1-block tower, on 10% of the video tokens). Every
forward of the loop is real (drafter, full verification, rollback); only the accept decision is
forced: each draft is accepted with probability ``rate`` in turn (seeded, the same pattern every
run), the first rejected one is replaced by the target's argmax. Random weights make a real
acceptance meaningless; so the tokens are not the target's greedy ones (exactness is tested apart,
on CPU, in ``tests/multimodal``) and the figures are wall times of the loop at that acceptance.

Example:
    >>> doc = run_e2e("tiny", device="cpu", frames=4, side=56, new_tokens=8)  # doctest: +SKIP
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from typing import Any

import torch

from ..multimodal import loop as _loop
from ..multimodal.compressed_config import CompressedDraftConfig
from ..multimodal.self_config import SelfDraftConfig
from ..multimodal.strategies import strategy_for
from ..speculation.chain import emit_accepted
from ..stats import SpecStats
from .mm_cost_project import expected_accepted
from .mm_long_video import VEND, VIDEO_ID, VSTART, long_video_inputs
from .timing import Arm, latency_summary, time_arms

E2E_SIZES: dict[str, tuple[str, str]] = {"7b": ("qwen2.5-vl-7b-lm", "qwen2.5-0.5b"), "tiny": ("tiny-lm", "tiny-drafter")}
"""e2e size -> (target LM, drafter LM) of :data:`~diffspec.bench.mm_cost.LMS` (Qwen2.5-VL text stacks)."""


def build_vlm(lm: Any, vocab: int, device: torch.device, dtype: torch.dtype, seed: int = 0) -> Any:
    """A random-weight ``Qwen2_5_VLForConditionalGeneration`` with ``lm``'s text stack and a 1-block vision tower."""
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    half = lm.hidden // lm.heads // 2
    section = [16, 24, 24] if half == 64 else [half - 2 * (half // 3), half // 3, half // 3]
    text = dict(vocab_size=vocab, bos_token_id=1, eos_token_id=2, pad_token_id=0, hidden_size=lm.hidden,
                intermediate_size=lm.intermediate, num_hidden_layers=lm.layers, num_attention_heads=lm.heads,
                num_key_value_heads=lm.kv_heads, max_position_embeddings=131072,
                rope_parameters={"rope_type": "default", "rope_theta": lm.rope_theta, "mrope_section": section})
    vision = dict(depth=1, hidden_size=64, out_hidden_size=lm.hidden, intermediate_size=128, num_heads=4,
                  patch_size=14, spatial_merge_size=2, temporal_patch_size=2, in_channels=3, window_size=112,
                  fullatt_block_indexes=[0])
    cfg = Qwen2_5_VLConfig(text_config=text, vision_config=vision, video_token_id=VIDEO_ID,
                           image_token_id=VIDEO_ID - 1, vision_start_token_id=VSTART, vision_end_token_id=VEND)
    torch.manual_seed(seed)
    with torch.device(device):
        model = Qwen2_5_VLForConditionalGeneration._from_config(cfg, dtype=dtype).eval()
    model.generation_config.pad_token_id = 0
    model.generation_config.eos_token_id = None
    return model


@contextmanager
def forced_acceptance(rate: float, seed: int = 0) -> Iterator[None]:
    """Within the block, the loop's greedy accept takes each draft with probability ``rate`` in turn.

    The target's verification still runs in full; the first rejected draft becomes the target's
    argmax there (as a real rejection emits). Seeded per block: every run sees the same pattern.
    """
    if not 0.0 < rate <= 1.0:
        raise ValueError(f"e2e_rates: rate={rate} is out of range (0, 1]")
    gen = torch.Generator().manual_seed(seed)

    def forced(drafts: torch.Tensor, p_logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        ok = torch.rand(drafts.shape, generator=gen) < rate
        m = ok.long().cumprod(1).sum(1).to(drafts.device)
        return m, emit_accepted(drafts, m, p_logits.argmax(-1).gather(1, m[:, None])[:, 0])

    saved = _loop.greedy_accept
    _loop.greedy_accept = forced
    try:
        yield
    finally:
        _loop.greedy_accept = saved


def _batched(inputs: dict[str, torch.Tensor], batch: int, device: torch.device) -> dict[str, torch.Tensor]:
    out = {k: v.repeat(batch, *([1] * (v.ndim - 1))) for k, v in inputs.items()}
    return {k: v.to(device) for k, v in out.items()}


def run_e2e(size: str, *, device: torch.device | str, dtype: torch.dtype = torch.float32, frames: int = 64,
            side: int = 448, new_tokens: int = 96, k: int = 5, rates: tuple[float, ...] = (1.0, 0.8),
            batches: tuple[int, ...] = (1,), repeats: int = 3, warmup: int = 1) -> dict[str, Any]:
    """Time plain ``generate`` against the loop's arms at forced acceptance (module doc); the ``e2e`` block."""
    from .mm_cost import LMS

    if size not in E2E_SIZES:
        raise ValueError(f"e2e_size={size!r} is not allowed; choose one of {', '.join(E2E_SIZES)} (or none)")
    if frames < 2 or frames % 2 or side < 28 or side % 28:
        raise ValueError(f"e2e_frames={frames}, e2e_side={side}: frames must be even >= 2, side a multiple of 28")
    for r in rates:
        if not 0.0 < r <= 1.0:
            raise ValueError(f"e2e_rates={rates!r} is out of range: rates in (0, 1]")
    dev = torch.device(device)
    t_spec, d_spec = (LMS[n] for n in E2E_SIZES[size])
    vocab = max(t_spec.vocab, VIDEO_ID + 8)
    target = build_vlm(t_spec, vocab, dev, dtype)
    drafter = build_vlm(d_spec, vocab, dev, dtype, seed=1)
    base_inputs = long_video_inputs(frames, side)
    base_inputs["pixel_values_videos"] = base_inputs["pixel_values_videos"].to(dtype)
    n_visual = int((base_inputs["input_ids"] == VIDEO_ID).sum())
    gen = dict(max_new_tokens=new_tokens, do_sample=False)
    methods = {"self-draft (sparse KV)": (SelfDraftConfig(num_draft_tokens=k), None),
               "self-draft (sparse KV + half layers)": (
                   SelfDraftConfig(num_draft_tokens=k, draft_layers=tuple(range(0, t_spec.layers, 2))), None),
               "compressed-draft": (CompressedDraftConfig(num_draft_tokens=k), drafter)}
    rows: list[dict[str, Any]] = []
    for batch in batches:
        inputs = _batched(base_inputs, batch, dev)
        prefill_inputs = target.prepare_inputs_for_generation(**inputs, is_first_iteration=True, use_cache=True)
        stats: dict[str, SpecStats] = {}

        def plain(_: list[int], inputs: dict[str, Any] = inputs) -> torch.Tensor:
            return target.generate(**inputs, **gen)

        def prefill(_: list[int], p: dict[str, Any] = prefill_inputs) -> torch.Tensor:
            return target(**p, logits_to_keep=1).logits

        arms = [Arm("baseline", plain, config={"decoding": "plain generate, DynamicCache"}),
                Arm("target prefill only", prefill)]
        for name, (cfg, model) in methods.items():
            for rate in rates:
                label = f"{name} @ forced {rate:g}"

                def run(_: list[int], cfg: Any = cfg, model: Any = model, rate: float = rate, label: str = label,
                        inputs: dict[str, Any] = inputs, stats: dict[str, SpecStats] = stats) -> torch.Tensor:
                    s = SpecStats(method=label)
                    with forced_acceptance(rate, seed=0):
                        seqs = target.generate(**inputs, **gen, custom_generate=_loop.speculative_generate,
                                               drafter=model, drafter_inputs=inputs, num_draft_tokens=k,
                                               draft_strategy=strategy_for(cfg), spec_stats=s)
                    stats[label] = s
                    return seqs

                arms.append(Arm(label, run, config={**cfg.to_dict(), "forced_rate": rate}))
        with torch.no_grad():
            time_arms(arms, [0], device=dev, repeats=repeats, warmup=warmup, show_progress=False)
        base = latency_summary(arms[0].times)
        pre = latency_summary(arms[1].times)["median"]
        for arm in arms:
            lat = latency_summary(arm.times)
            row: dict[str, Any] = {"method": arm.name, "batch": batch, "config": arm.config, "latency_s": lat,
                                   "speedup_vs_baseline": (None if arm is arms[1] else
                                                           round(base["median"] / lat["median"], 3)),
                                   "peak_mem_gb": arm.peak_mem_gb}
            if arm.name in stats:
                s = stats[arm.name]
                row.update(target_calls=s.target_calls, draft_calls=s.draft_calls,
                           acceptance_rate=round(s.acceptance_rate, 4),
                           accepted_per_round=round(s.extra.get("accepted_per_round", 0.0), 3),
                           after_prefill_speedup=round((base["median"] - pre) / max(lat["median"] - pre, 1e-9), 3),
                           expected_accepted_per_round=round(expected_accepted(arm.config["forced_rate"], k), 3))
            rows.append(row)
    params = sum(p.numel() for p in target.parameters())
    return {"label": "measured end to end at FORCED acceptance (random weights; accept decision forced, every "
                     "forward real)",
            "size": size, "target": {"lm": E2E_SIZES[size][0], "params": params, "vision": "1-block tower (not "
                                                                                           "the real 32-block ViT)"},
            "drafter": {"lm": E2E_SIZES[size][1], "for": "compressed-draft"},
            "workload": {"frames": frames, "side": side, "visual_tokens": n_visual,
                         "prompt_tokens": int(base_inputs["input_ids"].shape[1]), "new_tokens": new_tokens,
                         "num_draft_tokens": k, "rates": list(rates), "batches": list(batches), "repeats": repeats,
                         "warmup": warmup, "log2_visual_tokens": round(math.log2(max(n_visual, 1)), 2)},
            "runs": rows,
            "notes": ["baseline: transformers generate (greedy, DynamicCache); arms: diffspec's loop with the accept "
                      "decision forced (each draft kept with probability forced_rate in turn, seeded, identical "
                      "pattern each run); tokens are therefore not the target's and exactness is not measured here.",
                      "after_prefill_speedup subtracts the median target prefill ('target prefill only' arm) from "
                      "both sides; compressed-draft still pays its drafter's prefill (and 1-block vision tower).",
                      "expected_accepted_per_round = rate (1 - rate^k) / (1 - rate); accepted_per_round is the measured one "
                      "(the loop's draft length shrinks near max_new_tokens)."]}


def e2e_from_options(o: dict[str, Any], dev: torch.device, dtype: torch.dtype, repeats: int, warmup: int,
                     allow_cpu: bool) -> Callable[[], dict[str, Any]] | None:
    """Validate the suite's ``e2e_*`` options; the e2e run as a callable (None with ``e2e_size=none``).

    Options: ``e2e_size`` (``7b`` default on CUDA, ``tiny``, ``none`` default on CPU), ``e2e_frames``
    (64) x ``e2e_side`` (448) video (``frames/2 * (side/28)^2`` tokens: 8192), ``e2e_new_tokens``
    (96), ``e2e_k`` (5), ``e2e_rates`` (``1.0,0.8``), ``e2e_batches`` (``1``), ``e2e_repeats``
    (min(repeats, 3)), ``e2e_warmup`` (min(warmup, 1)).
    """
    from .mm_cost_cells import positive_list

    size = str(o.get("e2e_size", "7b" if dev.type == "cuda" else "none"))
    if size == "none":
        return None
    if size not in E2E_SIZES:
        raise ValueError(f"e2e_size={size!r} is not allowed; choose one of {', '.join(E2E_SIZES)} or none")
    if size == "7b" and dev.type != "cuda" and not allow_cpu:
        raise ValueError("e2e_size='7b' is a real-size architecture meant for a GPU; pass --device cuda, "
                         "--set e2e_size=tiny|none, or --allow-cpu")
    try:
        rates = tuple(float(r) for r in str(o.get("e2e_rates", "1.0,0.8")).split(",") if r.strip())
    except ValueError:
        raise ValueError(f"e2e_rates={o['e2e_rates']!r} is not allowed: forced rates in (0, 1], comma separated") from None
    if not rates or any(not 0.0 < r <= 1.0 for r in rates):
        raise ValueError(f"e2e_rates={o.get('e2e_rates')!r} is out of range: forced rates in (0, 1]")
    ints: dict[str, int] = {}
    for field, default, low in (("e2e_frames", 64, 2), ("e2e_side", 448, 28), ("e2e_new_tokens", 96, 2),
                                ("e2e_k", 5, 1), ("e2e_repeats", min(repeats, 3), 1), ("e2e_warmup", min(warmup, 1), 0)):
        try:
            ints[field] = int(o.get(field, default))
        except ValueError:
            raise ValueError(f"{field}={o[field]!r} is not an integer (>= {low})") from None
        if ints[field] < low:
            raise ValueError(f"{field}={ints[field]} is out of range: >= {low}")
    frames, side = ints["e2e_frames"], ints["e2e_side"]
    if frames % 2 or side % 28:
        raise ValueError(f"e2e_frames={frames}, e2e_side={side}: frames must be even, side a multiple of 28")
    batches = tuple(positive_list("e2e_batches", o.get("e2e_batches", "1"), "batch sizes >= 1"))
    return partial(run_e2e, size, device=dev, dtype=dtype, frames=frames, side=side,
                   new_tokens=ints["e2e_new_tokens"], k=ints["e2e_k"], rates=rates, batches=batches,
                   repeats=ints["e2e_repeats"], warmup=ints["e2e_warmup"])
