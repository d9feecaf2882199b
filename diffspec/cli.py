"""``diffspec generate | merge | bench | calibrate | info``.

Bad input (paths, model names, values) ends with one line ``diffspec: error: ...`` on stderr and
exit code 2, never a traceback.

Example:
    $ diffspec generate --model tiny-dit --method taylor --prompt-file examples/prompts.txt --out out/
    $ torchrun --nproc_per_node 2 -m diffspec generate --model tiny-dit --prompt-file items.jsonl --out out/
    $ diffspec merge out/
    $ diffspec bench dit-cache --model tiny-dit --out benchmarks/results/dit-cache-tiny-dit-cpu.json
    $ diffspec bench multimodal --out benchmarks/results/multimodal-tiny-vlm-cpu.json
    $ diffspec info
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

from .batch.items import MAX_SIDE, shorten, source_lines

EXIT_USAGE = 2
EXIT_FAILURE = 1
DTYPES = ("float32", "float16", "bfloat16")
MAX_MESSAGE = 600
"""Characters of an error message printed (the values in it are cut shorter where they are made)."""


class UsageError(Exception):
    """Bad command-line input: reported as one line, exit code 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # one line instead of usage + message
        raise UsageError(f"{message} (see `{self.prog} --help`)")


def parse_overrides(pairs: Sequence[str]) -> dict[str, Any]:
    """``["interval=4", "form=taylor"]`` → ``{"interval": 4, "form": "taylor"}`` (ints, floats, bools parsed)."""
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep or not key:
            raise UsageError(f"--set expects KEY=VALUE, got {pair!r}")
        value: Any = raw
        if raw.lower() in ("true", "false"):
            value = raw.lower() == "true"
        else:
            for cast in (int, float):
                try:
                    value = cast(raw)
                    break
                except ValueError:
                    continue
        out[key] = value
    return out


def _step_counts(text: str) -> int | list[int]:
    """``"100"`` -> 100; ``"50,100,250"`` -> a sweep (exact-diffusion)."""
    values = _positive_list(text)
    return values[0] if len(values) == 1 else values


def _positive_list(text: str) -> list[int]:
    """``"12,18"`` -> ``[12, 18]`` (each >= 1)."""
    return [_positive(v) for v in text.split(",") if v.strip()]


def _positive(text: str) -> int:
    return _integer(text, 1)


def _side(text: str) -> int:
    """An image side in pixels: 1 to ``MAX_SIDE``."""
    return _integer(text, 1, MAX_SIDE)


def _integer(text: str, lo: int, hi: int | None = None) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{shorten(text)} is not an integer") from None
    if value < lo or (hi is not None and value > hi):
        allowed = f">= {lo}" if hi is None else f"{lo} to {hi}"
        raise argparse.ArgumentTypeError(f"{value} is out of range; must be {allowed}")
    return value


def _finite(text: str) -> float:
    """A finite number (``nan`` and ``inf`` are refused)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{shorten(text)} is not a number") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{shorten(text)} is not a finite number")
    return value


def _device(name: str | None) -> str:
    import torch

    if name is None:
        return "cuda" if torch.cuda.is_available() else "cpu"
    try:
        dev = torch.device(name)
    except RuntimeError:
        raise UsageError(f"--device {name!r} is not a torch device (cpu, cuda, cuda:1, ...)") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise UsageError(f"--device {name}: CUDA is not available on this machine; use --device cpu")
    return name


# ---------------------------------------------------------------------------------------------- generate
def cmd_generate(args: argparse.Namespace) -> int:
    from .batch.command import run_generate

    return run_generate(args, parse_overrides(args.set), _device(args.device))


def cmd_merge(args: argparse.Namespace) -> int:
    from .batch.command import run_merge

    return run_merge(args)


# ---------------------------------------------------------------------------------------------- bench
def _text_workload(args: argparse.Namespace) -> dict[str, Any]:
    """``--prompt-file`` / ``--height`` / ``--width`` / ``--num-frames`` as a text-conditioned pipeline workload's
    ``prompts`` and ``call_kwargs`` (only those given)."""
    out: dict[str, Any] = {}
    if args.prompt_file is not None:
        out["prompts"] = [text for _, text in source_lines(args.prompt_file, "--prompt-file")]
    sizes = {k: v for k, v in (("height", args.height), ("width", args.width), ("num_frames", args.num_frames))
             if v is not None}
    if sizes:
        out["call_kwargs"] = sizes
    return out


def _add_text_workload_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--prompt-file", type=Path, default=None,
                        help="text-conditioned pipeline folders: prompts, one per line (default: eight built-in ones)")
    parser.add_argument("--height", type=_positive, default=None, help="text-conditioned pipeline folders: height")
    parser.add_argument("--width", type=_positive, default=None, help="text-conditioned pipeline folders: width")
    parser.add_argument("--num-frames", type=_positive, default=None, help="video pipeline folders: frames")


def cmd_bench(args: argparse.Namespace) -> int:
    from .bench import run_bench
    from .bench.report import headline, markdown_table

    methods = [m.strip() for m in args.methods.split(",") if m.strip()] if args.methods else None
    device = _device(args.device)
    model = {"model": args.model} if args.model else {}  # each suite has its own default model
    if args.compile is not None and args.suite not in ("exact-diffusion", "dit-cache"):
        raise UsageError(f"--compile applies to the exact-diffusion and dit-cache suites, not {args.suite!r}")
    text = _text_workload(args)
    if text and args.suite != "dit-cache":
        raise UsageError(f"--prompt-file, --height, --width and --num-frames apply to the dit-cache suite, not "
                         f"{args.suite!r}")
    doc = run_bench(args.suite, out=args.out, **model, methods=methods, device=device, dtype=args.dtype,
                    steps=args.steps, batch=args.batch_size, repeats=args.repeats, warmup=args.warmup,
                    quality_samples=args.quality_samples, overrides=parse_overrides(args.set),
                    allow_cpu=args.allow_cpu, **({"images": args.images} if args.images else {}),
                    **({"budget_evals": args.budget_evals} if args.budget_evals else {}),
                    **({"compile": args.compile} if args.compile is not None else {}),
                    **({"quality_steps": _step_counts(args.quality_steps)} if args.quality_steps else {}), **text)
    print(headline(doc))
    print(markdown_table(doc))
    if args.out:
        print(f"wrote {args.out}")
    return 0


# ---------------------------------------------------------------------------------------------- calibrate
def cmd_calibrate(args: argparse.Namespace) -> int:
    from .bench.calibrate import calibrate_model

    record, path = calibrate_model(args.model, target_psnr=args.target_psnr, steps=args.steps, samples=args.samples,
                                   device=_device(args.device), dtype=args.dtype, guidance_scale=args.guidance_scale,
                                   out=args.out, overrides=parse_overrides(args.set),
                                   schedules=args.schedules,
                                   schedule_granularities=args.schedule_granularities.split(","),
                                   **_text_workload(args))
    verdict = "reached" if record["reached"] else "NOT reached (best PSNR kept)"
    print(f"speca thresholds: tau0={record['tau0']:.4g} beta={record['beta']:g} tau_min={record['tau_min']:g}; "
          f"target {record['target_psnr']} dB {verdict}: {record['psnr']} dB with {record['full_steps']}/"
          f"{record['steps']} full steps on {record['samples']} samples")
    for e in record.get("schedules", []):
        print(f"schedule of {e['full_steps']} full steps ({e['granularity']}, from the {e['start']}): "
              f"{e['psnr']} dB: {e['schedule']}")
    print(f"wrote {path}")
    return 0


# ---------------------------------------------------------------------------------------------- train-drafter
def cmd_train_drafter(args: argparse.Namespace) -> int:
    from .ar_image.drafter_train import train_drafter
    from .models import load_ar_target

    target = load_ar_target(args.model, device=_device(args.device))
    record = train_drafter(target, args.out, samples=args.samples, epochs=args.epochs, batch=args.batch_size,
                           lr=args.lr, seed=args.seed)
    print(f"drafter trained in {record['total_s']} s: final loss {record['history'][-1]['loss']}, "
          f"ce {record['history'][-1]['ce']}; wrote {args.out}")
    return 0


# ---------------------------------------------------------------------------------------------- info
def info() -> dict[str, Any]:
    """Versions, devices, shipped models and methods (what ``diffspec info`` prints)."""
    import platform

    import diffusers
    import torch
    import transformers

    from . import __version__
    from .api import methods
    from .models import SHIPPED_MODELS

    devices = ["cpu"] + [f"cuda:{i} ({torch.cuda.get_device_name(i)})" for i in range(torch.cuda.device_count())]
    return {
        "diffspec": __version__, "python": platform.python_version(), "torch": torch.__version__,
        "diffusers": diffusers.__version__, "transformers": transformers.__version__, "cuda": torch.version.cuda,
        "devices": devices,
        "models": {name: str(path) + ("" if path.is_dir() else " (missing)") for name, path in SHIPPED_MODELS.items()},
        "methods": [{"name": m.name, "family": m.family, "kind": "exact" if m.exact else "relaxed",
                     "status": m.status} for m in methods()],
    }


def cmd_info(args: argparse.Namespace) -> int:
    data = info()
    if args.json:
        print(json.dumps(data, indent=2))
        return 0
    for key in ("diffspec", "python", "torch", "diffusers", "transformers", "cuda"):
        print(f"{key:13} {data[key]}")
    print(f"{'devices':13} {', '.join(data['devices'])}")
    print("models:")
    for name, path in data["models"].items():
        print(f"  {name:11} {path}")
    print("methods:")
    for m in data["methods"]:
        print(f"  {m['name']:18} {m['family']:10} {m['kind']:8} {m['status']}")
    return 0


# ---------------------------------------------------------------------------------------------- parser
def build_parser() -> argparse.ArgumentParser:
    from . import __version__

    parser = _Parser(prog="diffspec", description="Speculative and forecast acceleration for diffusers.")
    parser.add_argument("--version", action="version", version=f"diffspec {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    gen = sub.add_parser("generate", help="generate a batch of images or videos into a folder, resumably",
                         description="Items come from --prompt-file (one prompt per line, or JSONL objects "
                         "with id, prompt|class_label, negative_prompt, seed, steps, height, width, num_frames, "
                         "fps, guidance_scale, method, config) or --class-labels; the flags below are the "
                         "defaults of fields an item leaves out. Under torchrun, accelerate launch or srun each "
                         "process takes its share of the items.")
    gen.add_argument("--model", default="tiny-dit", help="shipped model name or local diffusers folder")
    gen.add_argument("--method", default="taylor", help="acceleration method, or 'none' for the plain pipeline")
    gen.add_argument("--prompt-file", type=Path,
                     help="*.jsonl (.ndjson, .json) items, or one prompt (class name) per line")
    gen.add_argument("--class-labels", help="comma-separated class names or ids, instead of --prompt-file")
    gen.add_argument("--num-images-per-prompt", type=_positive, default=1)
    gen.add_argument("--steps", type=_positive, default=50, help="inference steps (default 50)")
    gen.add_argument("--seed", type=int, default=0, help="item i without a seed uses seed + i (default 0)")
    gen.add_argument("--negative-prompt", default=None)
    side = f"pixels, 1 to {MAX_SIDE} (default: the pipeline's own)"
    gen.add_argument("--height", type=_side, default=None, help=side)
    gen.add_argument("--width", type=_side, default=None, help=side)
    gen.add_argument("--num-frames", type=_positive, default=None, help="video frames (default: the pipeline's own)")
    gen.add_argument("--fps", type=_positive, default=None, help="frames per second of written videos (default 16)")
    gen.add_argument("--video-format", default=None, help="mp4 (needs imageio-ffmpeg, the default when installed), "
                     "webp or gif")
    gen.add_argument("--batch-size", type=_positive, default=1,
                     help="items per pipeline call among items with equal settings (default 1: outputs then "
                     "do not depend on batching or on the number of processes)")
    gen.add_argument("--guidance-scale", type=_finite, default=None,
                     help="a finite number (default: the pipeline's own)")
    gen.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="method config override")
    gen.add_argument("--scheduler", default=None, metavar="CLASS",
                     help="a diffusers scheduler class built from the pipeline's scheduler config (e.g. "
                     "DDPMScheduler: coupling and autospec need a stochastic sampler; default: the pipeline's own)")
    gen.add_argument("--device", default=None, help="cpu, cuda, cuda:1 (default: cuda if available; "
                     "cuda:LOCAL_RANK under a launcher)")
    gen.add_argument("--dtype", choices=DTYPES, default="float32", help="weights' dtype (default float32)")
    gen.add_argument("--rank", type=int, default=None, help="this process's rank (default: RANK or SLURM_PROCID)")
    gen.add_argument("--world-size", type=_positive, default=None,
                     help="number of processes (default: WORLD_SIZE or SLURM_NTASKS, else 1)")
    gen.add_argument("--out", type=Path, required=True, help="output folder")
    gen.set_defaults(func=cmd_generate)

    merge = sub.add_parser("merge", help="combine the per-rank manifests of a generate folder into manifest.jsonl")
    merge.add_argument("out", type=Path, help="the --out folder of `diffspec generate`")
    merge.add_argument("--verify", action="store_true", help="re-hash every file against its sha256")
    merge.set_defaults(func=cmd_merge)

    bench = sub.add_parser("bench", help="run a benchmark suite and write its JSON")
    bench.add_argument("suite", help="benchmark suite (dit-cache, exact-diffusion, ar-image, ar-image-cost, "
                       "multimodal, multimodal-action, multimodal-cost, speech, kernels)")
    bench.add_argument("--model", default=None,
                       help="default per suite: tiny-dit (dit-cache, exact-diffusion; or dit-xl-2-256 | pixart-1024 | "
                       "sd3-1024 | flux-1024 | wan-1.3b-512-17f on a GPU), tiny-ar (ar-image), tiny | llamagen-xl | llamagen-7b-size, "
                       "comma-separated (ar-image-cost), tiny-vlm (multimodal), tiny-vla "
                       "(multimodal-action), tiny | qwen2.5-vl-7b,llava-1.5-7b (multimodal-cost); kernels takes none")
    bench.add_argument("--methods", default=None, help="comma-separated methods and peers (default: all)")
    bench.add_argument("--device", default=None)
    bench.add_argument("--dtype", choices=DTYPES, default=None, help="default: bfloat16 on CUDA, else float32")
    bench.add_argument("--steps", type=_step_counts, default=None, help="steps, or a sweep 50,100,250 (exact-diffusion)")
    bench.add_argument("--quality-steps", default=None, help="exact-diffusion: the sweep's step counts that get quality")
    bench.add_argument("--batch-size", type=_positive, default=None)
    bench.add_argument("--repeats", type=_positive, default=3)
    bench.add_argument("--warmup", type=int, default=1)
    bench.add_argument("--quality-samples", type=_positive, default=500)
    bench.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="method config override")
    bench.add_argument("--images", type=_positive, default=None, help="multimodal: scenes captioned per timed run")
    bench.add_argument("--allow-cpu", action="store_true", help="time real-size models on the CPU anyway")
    _add_text_workload_args(bench)
    bench.add_argument("--budget-evals", type=lambda v: [float(b) for b in v.split(",")], default=None,
                       metavar="B[,B...]", help="dit-cache: tune every arm to these full-evaluation budgets "
                       "(searched on calibration seeds) and compare them at equal evals")
    bench.add_argument("--compile", default=None, metavar="MODE",
                       help="exact-diffusion, dit-cache: compile the transformer every arm runs: none (default), "
                       "default, reduce-overhead (CUDA graphs), repeated-blocks (diffusers' regional compile), "
                       "blocks (diffspec's regional compile, also DiT); compiled in the untimed warmup")
    bench.add_argument("--out", type=Path, default=None, help="JSON file to write")
    bench.set_defaults(func=cmd_bench)

    cal = sub.add_parser("calibrate", help="fit speca's thresholds to a target PSNR; saved next to the model")
    cal.add_argument("--model", default="tiny-dit", help="shipped model name or local diffusers folder")
    cal.add_argument("--target-psnr", type=_finite, default=30.0, help="mean PSNR (dB) vs full compute (default 30)")
    cal.add_argument("--steps", type=_positive, default=None, help="inference steps (default: 50, or 28 for flow models)")
    cal.add_argument("--samples", type=_positive, default=8, help="calibration samples (default 8)")
    cal.add_argument("--guidance-scale", type=_finite, default=4.0)
    cal.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="other speca settings (k_max=...)")
    cal.add_argument("--device", default=None)
    cal.add_argument("--dtype", choices=DTYPES, default=None)
    cal.add_argument("--schedules", type=_positive_list, default=[], metavar="N,N",
                     help="also search a fixed placement of N full steps per size (replayed by speca's replay_steps)")
    cal.add_argument("--schedule-granularities", default="block", metavar="G,G",
                     help="granularities to search the schedules at: block, module (default block)")
    cal.add_argument("--out", type=Path, default=None, help="folder for diffspec_speca.json, made if missing (default: the model's)")
    _add_text_workload_args(cal)
    cal.set_defaults(func=cmd_calibrate)

    td = sub.add_parser("train-drafter", help="self-distil a LANTERN (EAGLE) drafter for an AR image model")
    td.add_argument("--model", default="tiny-ar", help="shipped AR model name or AR model folder")
    td.add_argument("--out", type=Path, required=True, help="folder for the drafter (config.json + safetensors)")
    td.add_argument("--samples", type=_positive, default=1000, help="self-distilled sequences (default 1000)")
    td.add_argument("--epochs", type=_positive, default=10)
    td.add_argument("--batch-size", type=_positive, default=64)
    td.add_argument("--lr", type=_finite, default=1e-3)
    td.add_argument("--seed", type=int, default=0)
    td.add_argument("--device", default=None)
    td.set_defaults(func=cmd_train_drafter)

    inf = sub.add_parser("info", help="versions, devices, shipped models and methods")
    inf.add_argument("--json", action="store_true")
    inf.set_defaults(func=cmd_info)
    return parser


def _error(message: str) -> None:
    """``diffspec: error: MESSAGE`` on stderr, as one line of at most ``MAX_MESSAGE`` characters."""
    text = " ".join(line.strip() for line in message.splitlines() if line.strip())
    if len(text) > MAX_MESSAGE:
        text = text[:MAX_MESSAGE] + "..."
    print(f"diffspec: error: {text}", file=sys.stderr)


def main(argv: Sequence[str] | None = None) -> int:
    """Console entry point; returns the exit code."""
    try:
        args = build_parser().parse_args(argv)
        return args.func(args)
    except (UsageError, ValueError) as exc:
        _error(str(exc))
        return EXIT_USAGE
    except (FileNotFoundError, PermissionError, NotADirectoryError, IsADirectoryError) as exc:
        _error(f"{exc.strerror or exc}: {exc.filename}")
        return EXIT_USAGE
    except OSError as exc:  # a full disk, an I/O error: a failure of the machine, not of the input
        _error(f"{exc.strerror or exc}" + (f": {exc.filename}" if exc.filename else ""))
        return EXIT_FAILURE
    except KeyboardInterrupt:
        print("diffspec: interrupted; rerun the same command to resume", file=sys.stderr)
        return 130
    except BaseException as exc:
        from .batch.command import Terminated

        if isinstance(exc, Terminated):
            print("diffspec: terminated (SIGTERM); rerun the same command to resume", file=sys.stderr)
            return 143
        raise


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
