"""The ``multimodal`` suite: exact speculative captioning on the trained ``tiny-vlm`` pair vs plain ``generate``.

Workload: held-out :func:`~diffspec.data.scenes.render_scenes` images, the captioning prompt, the
same processor inputs, ``max_new_tokens`` and seeds in every arm (inputs are prepared once,
outside the timed region). Arms, at batch 1 (one call per image) and at the larger batches
(``-b4``, ``-b8``: the images in chunks): ``baseline`` (plain greedy ``generate``), ``draft``
(the VLM drafter), ``text-draft`` (the text-only drafter); peers at batch 1 (transformers
supports no more): ``assisted`` (``generate(assistant_model=drafter)``, the same drafter, its
defaults) and ``prompt-lookup`` (``prompt_lookup_num_tokens``); and a sampling pair
(``baseline-sample``, ``draft-sample``: ``do_sample=True``, one seed per image). Each arm's
speedup is against the baseline of the same batch and decoding mode; batch-1 greedy arms also
report ``speedup_vs_assisted``. Counted in an untimed pass (forward hooks on the target and
drafter): target calls, tokens per target call, drafter calls, accepted drafts per round;
``quality.exact`` is measured (greedy arms: every caption identical to the baseline's) and
``caption_exact_match`` is the share of captions equal to the scene's true caption.

Example:
    >>> doc = run_multimodal("tiny-vlm", images=4, repeats=1)  # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ..api import SpeculativePipeline
from .timing import Arm, latency_summary, machine_info, time_arms

EVAL_SEED = 10**6  # the held-out scenes of scripts/train_tiny_vlm.py
PEERS = ("assisted", "prompt-lookup")
SPEC_METHODS = {"draft": "draft", "text-draft": "text-draft"}


def _arm_names(batches: list[int], sampling: bool) -> list[str]:
    names = ["baseline", "draft", "text-draft", *PEERS]
    for b in batches:
        names += [f"baseline-b{b}", f"draft-b{b}", f"text-draft-b{b}"]
    if sampling:
        names += ["baseline-sample", "draft-sample"]
    return names


def _split(name: str) -> tuple[str, int, bool]:
    """``"draft-b4"`` → ``("draft", 4, False)``; ``"draft-sample"`` → ``("draft", 1, True)``."""
    sample = name.endswith("-sample")
    base = name.removesuffix("-sample")
    if "-b" in base and base.rsplit("-b", 1)[1].isdigit():
        method, batch = base.rsplit("-b", 1)
        return method, int(batch), sample
    return base, 1, sample


class _Counter:
    """Counts forward calls of a module (a hook, attached only in the untimed counting pass)."""

    def __init__(self, module: torch.nn.Module) -> None:
        self.calls = 0
        self._handle = module.register_forward_pre_hook(self._hook)

    def _hook(self, *_: Any) -> None:
        self.calls += 1

    def remove(self) -> None:
        self._handle.remove()


def _captions(tokens: torch.Tensor, eos: int, pad: int) -> list[tuple[int, ...]]:
    """New tokens per row up to and including the first EOS (padding dropped)."""
    out = []
    for row in tokens.tolist():
        cut = row.index(eos) + 1 if eos in row else len(row)
        out.append(tuple(t for t in row[:cut] if t != pad))
    return out


def run_multimodal(model: str = "tiny-vlm", *, methods: list[str] | None = None, device: str | None = None,
                   dtype: str | None = None, batch: int | None = None, repeats: int = 5, warmup: int = 1,
                   images: int = 16, max_new_tokens: int | None = None, batches: list[int] | None = None,
                   sampling: bool = True, overrides: dict[str, Any] | None = None, show_progress: bool = True,
                   **_: Any) -> dict[str, Any]:
    """Run the suite and return the JSON document (the benchmark JSON, docs/benchmarks/index.md).

    Args:
        model: ``"tiny-vlm"`` or a folder written by ``scripts/train_tiny_vlm.py``.
        methods: arm names to run (default: all; ``baseline`` and the per-batch baselines are always run).
        batch: one larger batch instead of ``batches`` (default 4 and 8).
        images: held-out scenes captioned per timed run (a multiple of every batch).
        max_new_tokens: caption budget (default: ``MAX_CAPTION_TOKENS``).
        overrides: ``DraftConfig`` fields for our arms (``num_draft_tokens``, ``schedule``, ...).
    """
    import transformers

    from ..data import render_scenes
    from ..models import resolve_model_path
    from ..models.tiny_vlm import MAX_CAPTION_TOKENS, caption_inputs, load_tiny_vlm

    batches = [batch] if batch else list(batches or [4, 8])
    bad = [b for b in batches if b < 1 or images % b]
    if bad:
        raise ValueError(f"images={images} must be a multiple of every batch size; got batch(es) {bad}")
    all_names = _arm_names(batches, sampling)
    names = list(methods or all_names)
    unknown = [m for m in names if m not in all_names]
    if unknown:
        raise ValueError(f"multimodal: unknown method(s) {', '.join(unknown)}; choose from {', '.join(all_names)}")
    needed_baselines = {f"baseline-b{_split(m)[1]}" for m in names if _split(m)[1] > 1}
    needed_baselines |= {"baseline-sample" for m in names if m.endswith("-sample")}
    names = ["baseline", *[n for n in all_names if n != "baseline" and (n in names or n in needed_baselines)]]
    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    folder = resolve_model_path(model)
    target, processor, drafter, text_drafter = load_tiny_vlm(folder, device=dev,
                                                             dtype=getattr(torch, dtype) if dtype else torch.float32)
    max_new = max_new_tokens or MAX_CAPTION_TOKENS
    overrides = dict(overrides or {})

    scenes, truth = render_scenes(images, seed=EVAL_SEED)
    tok = processor.tokenizer
    true_tokens = [tuple(tok(c, add_special_tokens=False)["input_ids"]) + (tok.eos_token_id,) for c in truth]
    chunks = {b: [{k: v.to(dev) for k, v in caption_inputs(processor, scenes[i: i + b]).items()}
                  for i in range(0, images, b)] for b in {1, *batches}}
    gen = {"max_new_tokens": max_new, "do_sample": False}
    specs = {m: SpeculativePipeline.from_pipe((target, processor), method=m, draft=d, **overrides)
             for m, d in (("draft", drafter), ("text-draft", text_drafter))}

    def runner(name: str) -> tuple[Callable[[dict, int], torch.Tensor], dict[str, Any], Any]:
        """``(call(inputs, seed) -> sequences, config, our pipeline or None)`` of one arm."""
        method, _, sample = _split(name)
        opts = {**gen, "do_sample": sample}
        if method in specs:
            spec = specs[method]

            def call(inputs: dict, seed: int) -> torch.Tensor:
                g = torch.Generator(dev).manual_seed(seed) if sample else None
                return spec(**inputs, **opts, generator=g).sequences
            drafter_kind = "VLM drafter" if method == "draft" else "text-only drafter"
            return call, {**spec.config.to_dict(), **opts, "drafter": drafter_kind}, spec
        extra: dict[str, Any] = {}
        config: dict[str, Any] = {"decoding": "plain generate", **opts}
        if method == "assisted":
            extra = {"assistant_model": drafter}
            gc = drafter.generation_config
            config = {"decoding": "transformers assisted generation, same VLM drafter", **opts,
                      "num_assistant_tokens": gc.num_assistant_tokens,
                      "num_assistant_tokens_schedule": gc.num_assistant_tokens_schedule,
                      "assistant_confidence_threshold": gc.assistant_confidence_threshold}
        elif method == "prompt-lookup":
            extra = {"prompt_lookup_num_tokens": 10}
            config = {"decoding": "transformers prompt lookup decoding", **opts, **extra}

        def plain(inputs: dict, seed: int) -> torch.Tensor:
            torch.manual_seed(seed)  # generate's sampling draws from the global RNG
            return target.generate(**inputs, **opts, **extra)
        return plain, config, None

    arms, calls, spec_of = [], {}, {}
    for name in names:
        call, config, spec = runner(name)
        b = _split(name)[1]
        calls[name], spec_of[name] = call, spec
        arms.append(Arm(name, lambda seeds, call=call, b=b: [call(x, s) for x, s in zip(chunks[b], seeds)],
                        peer=name in PEERS, config=config))
        arms[-1].stats["batch"] = b

    counts: dict[str, dict[str, int]] = {}
    outputs: dict[str, list[tuple[int, ...]]] = {}
    seeds = list(range(images))
    with torch.inference_mode():
        for arm in arms:  # untimed counting pass: forward hooks and the method's own stats per call
            b, spec = arm.stats["batch"], spec_of[arm.name]
            counters = [_Counter(m) for m in (target, drafter, text_drafter)]
            acc = {"accepted": 0, "proposed": 0, "rounds": 0}
            new: list[tuple[int, ...]] = []
            for inputs, seed in zip(chunks[b], seeds):
                out = calls[arm.name](inputs, seed)
                new += _captions(out[:, inputs["input_ids"].shape[1]:], tok.eos_token_id, tok.pad_token_id)
                if spec is not None:
                    acc["accepted"] += spec.stats.accepted
                    acc["proposed"] += spec.stats.proposed
                    acc["rounds"] += spec.stats.extra.get("rounds", 0) * b
            for c in counters:
                c.remove()
            outputs[arm.name] = new
            counts[arm.name] = {"target_calls": counters[0].calls,
                                "draft_calls": counters[1].calls + counters[2].calls, **acc}
        time_arms(arms, seeds, device=dev, repeats=repeats, warmup=warmup, show_progress=show_progress)

    runs = []
    medians = {a.name: latency_summary(a.times)["median"] for a in arms}
    for arm in arms:
        method, b, sample = _split(arm.name)
        ref_name = "baseline-sample" if sample else ("baseline" if b == 1 else f"baseline-b{b}")
        c = counts[arm.name]
        new_tokens = sum(len(r) for r in outputs[arm.name])
        calls_per_row = c["target_calls"] * b  # every call advances each of the b rows
        exact = None if sample else outputs[arm.name] == outputs[ref_name]
        rounds = c["rounds"]
        run = {"method": arm.name, "peer": arm.peer, "config": arm.config, "batch": b,
               "latency_s": latency_summary(arm.times), "target_calls": c["target_calls"],
               "target_evals": c["target_calls"] * b,
               "tokens_per_target_call": round(new_tokens / calls_per_row, 3) if calls_per_row else None,
               "draft_calls": c["draft_calls"],
               "accepted_per_round": round(c["accepted"] / rounds, 3) if rounds else None,
               "acceptance_rate": round(c["accepted"] / c["proposed"], 4) if c["proposed"] else None,
               "new_tokens": new_tokens, "peak_mem_gb": arm.peak_mem_gb,
               "speedup_vs_baseline": round(medians[ref_name] / medians[arm.name], 3),
               "quality": {"exact": exact, "caption_exact_match": round(
                   sum(o == t for o, t in zip(outputs[arm.name], true_tokens)) / images, 4),
                   "psnr": None, "ssim": None, "lpips": None, "fid": None}}
        if b == 1 and not sample and "assisted" in medians:
            run["speedup_vs_assisted"] = round(medians["assisted"] / medians[arm.name], 3)
        runs.append(run)
    return {
        "suite": "multimodal",
        "machine": {**machine_info(dev), "transformers": transformers.__version__},
        "model": {"name": model, "params": sum(p.numel() for p in target.parameters()),
                  "drafter_params": sum(p.numel() for p in drafter.parameters()),
                  "text_drafter_params": sum(p.numel() for p in text_drafter.parameters()),
                  "dtype": dtype or "float32", "weights": "trained (scripts/train_tiny_vlm.py)"},
        "workload": {"images": images, "tokens": max_new, "batch": 1, "batches": [1, *batches],
                     "seeds": seeds, "scene_seed": EVAL_SEED, "repeats": repeats, "warmup": warmup,
                     "prompt": "<image> describe the picture :"},
        "runs": runs,
        "notes": [
            "latency_s: seconds to caption all `images` scenes (one call per chunk of `batch`), interleaved "
            "arms, warmup excluded; processor inputs prepared once outside the timed region.",
            "speedup_vs_baseline: against plain generate at the same batch and decoding mode "
            "(baseline, baseline-bN, baseline-sample).",
            "target_calls: target forward calls over all chunks (prefill included, counted by a hook); "
            "tokens_per_target_call: new tokens per row per target call; accepted_per_round: accepted "
            "drafts per verify round per row (our arms; transformers does not report it for its peers).",
            "quality.exact: greedy captions identical to the same-batch plain generate, measured; null for "
            "sampling arms (exact in law, tested by chi-square in tests/multimodal/test_mm_sampling.py).",
            "peers (transformers assisted generation, prompt lookup) run at batch 1 only: transformers "
            "rejects batch > 1 for both.",
            "assisted: with transformers 5.23 the assistant's prefill receives neither pixel_values nor the "
            "target's encoder outputs (seen with a forward spy on the drafter), so the VLM drafter drafts "
            "without the image; its lower tokens_per_target_call is that, plus its per-round generate() "
            "overhead. Outputs stay identical to plain generate.",
        ],
    }
