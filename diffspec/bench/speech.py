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
    targets = torch.where(corrupt, (table + 1) % VOCAB, table)

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
    """Run the suite and return the JSON document (DESIGN.md section 5); see the module docstring."""
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
    return {
        "suite": "speech",
        "machine": machine_info(dev),
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


def main(argv: list[str] | None = None) -> int:
    """``python -m diffspec.bench.speech --batch 4 --out FILE.json`` (not yet a ``diffspec bench`` suite)."""
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
    args = parser.parse_args(argv)
    doc = run_speech(batch=args.batch, tokens=args.tokens, num_draft_tokens=args.num_draft_tokens,
                     repeats=args.repeats, warmup=args.warmup, device=args.device)
    doc = {"suite": doc.pop("suite"), "created": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), **doc}
    print(speech_table(doc))
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(doc, indent=2) + "\n")
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
