"""The ``speech`` suite: Whisper ASR with a draft decoder against plain ``generate`` (cost side).

Workload: a random-weight Whisper of whisper-tiny's size (4+4 layers, d_model 384, 80 mel bins,
30 s inputs of random features), greedy transcription in English of ``tokens`` new tokens (EOS
suppressed, so every arm decodes the same length), batch ``batch``. Random weights make the
acceptance of a real drafter meaningless, so the arms separate cost from acceptance:

- ``baseline``: plain ``generate``;
- ``draft-replay-a{p}``: a 1-decoder-layer drafter sharing the target's encoder (distil-whisper
  style) whose compute is real but whose logits are replaced by the baseline's own transcript,
  corrupted with probability ``1 - p`` per position (a seeded table): acceptance ``~p`` is
  *forced*, the costs (drafter forwards, ``k + 1``-token verification, rollback) are measured;
- ``draft-random``: the same drafter with its random logits (acceptance ~0: the worst case);
- ``hf-assisted-random`` (peer, batch 1 only): transformers' assisted generation with that
  drafter, ``num_assistant_tokens=k``, constant schedule.

Every arm's tokens are compared with the baseline's (``quality.exact``). CPU figures are
cost-side only; speedups at a real acceptance need trained pairs.

Example:
    >>> doc = run_speech(batch=4, tokens=48, repeats=3)  # doctest: +SKIP
"""

from __future__ import annotations

import copy
import functools
from typing import Any

import torch

from ..stats import SpecStats
from .timing import Arm, latency_summary, machine_info, time_arms

EOT, SOT, EN, TRANSLATE, TRANSCRIBE, NOTS, VOCAB = 50257, 50258, 50259, 50358, 50359, 50363, 51865


def whisper_tiny_random(decoder_layers: int = 4, seed: int = 0) -> Any:
    """A random-weight ``WhisperForConditionalGeneration`` with whisper-tiny's dimensions and prompt ids."""
    from transformers import WhisperConfig, WhisperForConditionalGeneration

    torch.manual_seed(seed)
    cfg = WhisperConfig(vocab_size=VOCAB, num_mel_bins=80, encoder_layers=4, decoder_layers=decoder_layers,
                        d_model=384, encoder_attention_heads=6, decoder_attention_heads=6, encoder_ffn_dim=1536,
                        decoder_ffn_dim=1536, max_source_positions=1500, max_target_positions=448,
                        pad_token_id=EOT, bos_token_id=EOT, eos_token_id=EOT, decoder_start_token_id=SOT)
    model = WhisperForConditionalGeneration(cfg).eval()
    gc = model.generation_config
    gc.decoder_start_token_id, gc.pad_token_id, gc.eos_token_id = SOT, EOT, EOT
    gc.lang_to_id, gc.task_to_id = {"<|en|>": EN}, {"translate": TRANSLATE, "transcribe": TRANSCRIBE}
    gc.is_multilingual, gc.no_timestamps_token_id = True, NOTS
    gc.suppress_tokens, gc.begin_suppress_tokens = [EOT], None
    return model


def replay_drafter(drafter: Any, table: torch.Tensor, accept: float, seed: int = 0) -> Any:
    """``drafter`` computing as usual but predicting ``table[b, pos + 1]`` (corrupted w.p. ``1 - accept``).

    ``table`` (B, T) is the full decoder sequence of the reference run (prompt + transcript).
    """
    base = type(drafter)
    g = torch.Generator().manual_seed(seed)
    corrupt = torch.rand(table.shape, generator=g) >= accept
    targets = torch.where(corrupt, (table + 1) % drafter.config.vocab_size, table)

    @functools.wraps(base.forward)
    def forward(self: Any, *args: Any, **kwargs: Any) -> Any:
        out = base.forward(self, *args, **kwargs)
        pos = kwargs["decoder_position_ids"]
        nxt = targets.to(pos.device).gather(1, (pos + 1).clamp(max=targets.shape[1] - 1))
        out.logits = torch.full_like(out.logits, -1e4).scatter(-1, nxt[..., None], 0.0)
        return out

    clone = copy.copy(drafter)  # shares the modules: same compute, only the logits are replayed
    clone.__class__ = type(f"Replay{base.__name__}", (base,), {"forward": forward})
    return clone


def run_speech(*, batch: int | None = None, tokens: int = 48, num_draft_tokens: int = 4,
               accepts: tuple[float, ...] = (1.0, 0.6), repeats: int = 3, warmup: int = 1,
               device: str | None = None, show_progress: bool = True, **_: Any) -> dict[str, Any]:
    """Run the suite and return the JSON document (the benchmark JSON, docs/benchmarks/index.md); see the module docstring."""
    from ..multimodal.loop import speculative_generate

    dev = torch.device(device or "cpu")
    batch = batch or 1
    target = whisper_tiny_random().to(dev)
    small = whisper_tiny_random(decoder_layers=1, seed=1).to(dev)
    small.model.encoder = target.model.encoder  # distil-whisper style: the target's encoder
    feats = torch.randn(batch, 80, 3000, generator=torch.Generator().manual_seed(0)).to(dev)
    gen = {"language": "en", "max_new_tokens": tokens}
    with torch.no_grad():
        reference = target.generate(feats, **gen)
    prompt = torch.tensor([[SOT, EN, TRANSCRIBE, NOTS]]).expand(batch, -1)
    table = torch.cat([prompt, reference.cpu()], 1)
    outputs: dict[str, torch.Tensor] = {}
    stats: dict[str, SpecStats] = {}

    def plain(name: str) -> Arm:
        def run(_: list[int]) -> torch.Tensor:
            with torch.no_grad():
                outputs[name] = target.generate(feats, **gen)
            return outputs[name]
        return Arm(name, run, config={})

    def spec(name: str, drafter: Any, config: dict[str, Any]) -> Arm:
        def run(_: list[int]) -> torch.Tensor:
            stats[name] = SpecStats(method="draft")
            with torch.no_grad():
                outputs[name] = target.generate(feats, **gen, custom_generate=speculative_generate, drafter=drafter,
                                                num_draft_tokens=num_draft_tokens, spec_stats=stats[name])
            return outputs[name]
        return Arm(name, run, config={"num_draft_tokens": num_draft_tokens, **config})

    arms = [plain("baseline")]
    arms += [spec(f"draft-replay-a{p:g}", replay_drafter(small, table, p), {"drafter": "replay", "forced_accept": p})
             for p in accepts]
    arms.append(spec("draft-random", small, {"drafter": "random 1-layer decoder, shared encoder"}))
    if batch == 1:
        def assisted(_: list[int]) -> torch.Tensor:
            small.generation_config.num_assistant_tokens = num_draft_tokens
            small.generation_config.num_assistant_tokens_schedule = "constant"
            small.generation_config.assistant_confidence_threshold = 0.0
            with torch.no_grad():
                outputs["hf-assisted-random"] = target.generate(feats, **gen, assistant_model=small)
            return outputs["hf-assisted-random"]
        arms.append(Arm("hf-assisted-random", assisted, peer=True,
                        config={"num_assistant_tokens": num_draft_tokens, "schedule": "constant"}))
    time_arms(arms, [0], device=dev, repeats=repeats, warmup=warmup, show_progress=show_progress)
    base_median = latency_summary(arms[0].times)["median"]
    runs = []
    for arm in arms:
        s = stats.get(arm.name)
        latency = latency_summary(arm.times)
        runs.append({
            "method": arm.name if arm.name == "baseline" or arm.peer else "draft", "arm": arm.name, "peer": arm.peer,
            "config": arm.config, "latency_s": latency,
            "target_calls": s.target_calls if s else (tokens if arm.name == "baseline" else None),
            "target_evals": s.target_evals if s else None, "draft_calls": s.draft_calls if s else None,
            "acceptance_rate": round(s.acceptance_rate, 4) if s else None,
            "peak_mem_gb": arm.peak_mem_gb, "speedup_vs_baseline": round(base_median / latency["median"], 3),
            "quality": {"psnr": None, "ssim": None, "lpips": None, "fid": None,
                        "exact": bool(torch.equal(outputs[arm.name].cpu(), outputs["baseline"].cpu()))},
        })
    import transformers

    return {
        "suite": "speech",
        "machine": {**machine_info(dev), "transformers": transformers.__version__},
        "model": {"name": "whisper-tiny-size (random weights)", "params": sum(p.numel() for p in target.parameters()),
                  "dtype": "float32", "weights": "random",
                  "drafter": {"decoder_layers": 1, "encoder": "shared with the target",
                              "params_decoder": sum(p.numel() for p in small.model.decoder.parameters())}},
        "workload": {"tokens": tokens, "batch": batch, "seeds": [0], "audio_s": 30, "repeats": repeats,
                     "warmup": warmup, "language": "en", "eos": "suppressed"},
        "runs": runs,
        "notes": "cost side only: random weights; replay arms force the acceptance (the drafter's compute is real, "
                 "its tokens are the baseline transcript corrupted w.p. 1 - accept)",
    }


def noisy_drafter(model: Any, scale: float, seed: int = 0) -> Any:
    """The target itself with seeded Gaussian noise (``scale`` x the logits' std) on its logits: a drafter
    whose acceptance falls with ``scale`` (its cost is the target's: for acceptance mechanics only)."""
    base = type(model)
    g = torch.Generator().manual_seed(seed)

    @functools.wraps(base.forward)
    def forward(self: Any, *args: Any, **kwargs: Any) -> Any:
        out = base.forward(self, *args, **kwargs)
        noise = torch.randn(out.logits.shape, generator=g).to(out.logits.device)
        out.logits = out.logits + scale * out.logits.std(-1, keepdim=True) * noise
        return out

    clone = copy.copy(model)
    clone.__class__ = type(f"Noisy{base.__name__}", (base,), {"forward": forward})
    return clone


def run_codec_sweep(*, betas: tuple[float, ...] = (1.0, 0.5, 0.2, 0.05), noise: float = 0.1, batch: int = 2,
                    tokens: int = 64, seeds: tuple[int, ...] = (0, 1, 2), num_draft_tokens: int = 4) -> dict[str, Any]:
    """``relaxed-codec`` mechanics on a random MusicGen decoder: acceptance, target calls and token
    disagreement with plain greedy per ``beta`` (drafter: the target with noisy logits; no timings)."""
    from transformers import MusicgenDecoderConfig, MusicgenForCausalLM

    from ..multimodal.codec import codec_generate
    from ..pipelines.codec import token_disagreement

    torch.manual_seed(0)
    cfg = MusicgenDecoderConfig(vocab_size=2048, num_codebooks=4, hidden_size=256, num_hidden_layers=4,
                                num_attention_heads=4, ffn_dim=1024, pad_token_id=2048, bos_token_id=2048,
                                decoder_start_token_id=2048, eos_token_id=None, initializer_factor=0.3)
    target = MusicgenForCausalLM(cfg).eval()
    gc = target.generation_config
    gc.pad_token_id = gc.bos_token_id = gc.decoder_start_token_id = 2048
    runs = []
    for beta in betas:
        acc, calls, relaxed, dis, per_cb, exact = [], [], [], [], [], True
        for seed in seeds:
            g = torch.Generator().manual_seed(seed)
            ids = torch.cat([torch.full((batch * 4, 1), 2048), torch.randint(0, 2048, (batch * 4, 3), generator=g)], 1)
            with torch.no_grad():
                ref = target.generate(input_ids=ids, max_new_tokens=tokens, do_sample=False, num_return_sequences=1)
                stats = SpecStats(method="relaxed-codec")
                out = codec_generate(target, noisy_drafter(target, noise, seed), ids, max_new_tokens=tokens,
                                     num_draft_tokens=num_draft_tokens, beta=beta, spec_stats=stats)
            d = token_disagreement(out, ref)
            acc.append(stats.acceptance_rate)
            calls.append(stats.target_calls)
            relaxed.append(stats.extra["relaxed_tokens"])
            dis.append(d["overall"])
            per_cb.append(d["per_codebook"])
            exact &= bool(torch.equal(out, ref))
        n = len(seeds)
        runs.append({"method": "relaxed-codec", "config": {"beta": beta, "num_draft_tokens": num_draft_tokens,
                                                           "exact_codebooks": 1},
                     "acceptance_rate": round(sum(acc) / n, 4), "target_calls": round(sum(calls) / n, 2),
                     "baseline_target_calls": tokens, "relaxed_tokens": round(sum(relaxed) / n, 2),
                     "token_disagreement": round(sum(dis) / n, 4),
                     "token_disagreement_per_codebook": [round(sum(c) / n, 4) for c in zip(*per_cb)],
                     "quality": {"exact": exact}})
    import transformers

    return {"suite": "speech-codec", "machine": {**machine_info("cpu"), "transformers": transformers.__version__},
            "model": {"name": "musicgen-decoder (random weights, 4x256, 4 codebooks x 2048)",
                      "params": sum(p.numel() for p in target.parameters()), "dtype": "float32", "weights": "random"},
            "workload": {"tokens": tokens, "batch": batch, "seeds": list(seeds), "prompt_frames": 3,
                         "drafter": f"target with Gaussian logit noise x{noise} (acceptance mechanics only)"},
            "runs": runs,
            "notes": "random weights: disagreement and acceptance show the mechanics of beta, not audio quality; "
                     "no timings (the drafter costs as much as the target)"}


def speech_table(doc: dict[str, Any]) -> str:
    """One markdown row per arm of a ``speech`` document."""
    rows = ["| arm | median s | speedup | target calls | draft calls | acceptance | identical |",
            "|---|---:|---:|---:|---:|---:|---|"]
    for run in doc["runs"]:
        name = f"`{run['arm']}`" + (" (peer)" if run["peer"] else "")
        fmt = lambda v, spec: "-" if v is None else format(v, spec)  # noqa: E731
        rows.append(f"| {name} | {run['latency_s']['median']:.3f} | {run['speedup_vs_baseline']:.2f}x | "
                    f"{fmt(run['target_calls'], 'd')} | {fmt(run['draft_calls'], 'd')} | "
                    f"{fmt(run['acceptance_rate'], '.2f')} | {run['quality']['exact']} |")
    return "\n".join(rows)


def codec_table(doc: dict[str, Any]) -> str:
    """One markdown row per beta of a ``speech-codec`` document."""
    rows = ["| beta | acceptance | target calls (plain) | relaxed tokens | disagreement | per codebook | identical |",
            "|---:|---:|---:|---:|---:|---|---|"]
    for run in doc["runs"]:
        rows.append(f"| {run['config']['beta']:g} | {run['acceptance_rate']:.2f} | {run['target_calls']:g} "
                    f"({run['baseline_target_calls']}) | {run['relaxed_tokens']:g} | {run['token_disagreement']:.3f} | "
                    f"{', '.join(f'{v:.2f}' for v in run['token_disagreement_per_codebook'])} | "
                    f"{run['quality']['exact']} |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    """``python -m diffspec.bench.speech --batch 4 --out FILE.json`` (also ``diffspec bench speech``; ``--codec``: the
    relaxed-codec sweep, only here)."""
    import argparse
    import datetime as dt
    import json
    from pathlib import Path

    parser = argparse.ArgumentParser(prog="python -m diffspec.bench.speech", description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--tokens", type=int, default=48)
    parser.add_argument("--num-draft-tokens", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--device", default=None)
    parser.add_argument("--out", default=None)
    parser.add_argument("--codec", action="store_true", help="run the relaxed-codec beta sweep instead")
    args = parser.parse_args(argv)
    if args.codec:
        doc = run_codec_sweep(batch=args.batch, tokens=args.tokens, num_draft_tokens=args.num_draft_tokens)
    else:
        doc = run_speech(batch=args.batch, tokens=args.tokens, num_draft_tokens=args.num_draft_tokens,
                         repeats=args.repeats, warmup=args.warmup, device=args.device)
    doc = {"suite": doc.pop("suite"), "created": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), **doc}
    print(codec_table(doc) if args.codec else speech_table(doc))
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(doc, indent=2) + "\n")
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
