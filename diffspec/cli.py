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
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .batch.items import MAX_SIDE, source_lines
from .cli_args import (
    DTYPES,
    Parser,
    UsageError,
    diffusion_methods_help,
    finite,
    non_negative,
    parse_overrides,
    pixels,
    positive,
    positive_list,
    quality,
    resolve_device,
    step_counts,
)

EXIT_USAGE = 2
EXIT_FAILURE = 1
MAX_MESSAGE = 600
"""Characters of an error message printed (the values in it are cut shorter where they are made)."""


# ---------------------------------------------------------------------------------------------- generate
def cmd_generate(args: argparse.Namespace) -> int:
    from .batch.command import run_generate

    return run_generate(args, parse_overrides(args.set), resolve_device(args.device))


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
    parser.add_argument("--height", type=positive, default=None, help="text-conditioned pipeline folders: height")
    parser.add_argument("--width", type=positive, default=None, help="text-conditioned pipeline folders: width")
    parser.add_argument("--num-frames", type=positive, default=None, help="video pipeline folders: frames")


def cmd_bench(args: argparse.Namespace) -> int:
    from .bench import run_bench
    from .bench.report import headline, markdown_table

    methods = [m.strip() for m in args.methods.split(",") if m.strip()] if args.methods else None
    device = resolve_device(args.device)
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
                    **({"quality_steps": step_counts(args.quality_steps)} if args.quality_steps else {}), **text)
    print(headline(doc))
    print(markdown_table(doc))
    if args.out:
        print(f"wrote {args.out}")
    return 0


# ---------------------------------------------------------------------------------------------- calibrate
def cmd_calibrate(args: argparse.Namespace) -> int:
    from .bench.calibrate import calibrate_model

    if args.method == "auto":
        return _calibrate_auto(args)
    if args.quality is not None or args.scheduler is not None:
        raise UsageError("--quality and --scheduler apply to --method auto")

    record, path = calibrate_model(args.model, target_psnr=args.target_psnr, steps=args.steps, samples=args.samples or 8,
                                   device=resolve_device(args.device), dtype=args.dtype, guidance_scale=args.guidance_scale,
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


def _calibrate_auto(args: argparse.Namespace) -> int:
    from .batch.command import scheduler_class
    from .bench.calibrate import calibrate_auto
    from .pipelines.auto import describe_choice

    if args.set or args.schedules or args.out is not None:
        raise UsageError("--set, --schedules and --out apply to --method speca")
    text = _text_workload(args)
    choice = calibrate_auto(args.model, quality="balanced" if args.quality is None else args.quality,
                            steps=args.steps or 50, samples=args.samples,
                            guidance_scale=args.guidance_scale,
                            prompts=text.get("prompts"), call_kwargs=text.get("call_kwargs"),
                            scheduler=scheduler_class(args.scheduler) if args.scheduler else None,
                            device=resolve_device(args.device), dtype=args.dtype or "float32")
    print(f"auto (quality {choice['quality']!r}): {describe_choice(choice)}; {choice['measured']} candidates "
          f"measured, cached in {choice['cache']}")
    return 0


# ---------------------------------------------------------------------------------------------- train-drafter
def cmd_train_drafter(args: argparse.Namespace) -> int:
    from .ar_image.drafter_train import train_drafter
    from .models import load_ar_target

    target = load_ar_target(args.model, device=resolve_device(args.device))
    record = train_drafter(target, args.out, samples=args.samples, epochs=args.epochs, batch=args.batch_size,
                           lr=args.lr, seed=args.seed)
    print(f"drafter trained in {record['total_s']} s: final loss {record['history'][-1]['loss']}, "
          f"ce {record['history'][-1]['ce']}; wrote {args.out}")
    return 0


# ---------------------------------------------------------------------------------------------- info
def cmd_info(args: argparse.Namespace) -> int:
    from .cli_info import format_info, info

    data = info()
    print(json.dumps(data, indent=2) if args.json else format_info(data))
    return 0


# ---------------------------------------------------------------------------------------------- parser
def build_parser() -> argparse.ArgumentParser:
    from . import __version__

    parser = Parser(prog="diffspec", description="Speculative and forecast acceleration for diffusers.")
    parser.add_argument("--version", action="version", version=f"diffspec {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)

    _add_generate(sub)
    merge = sub.add_parser("merge", help="combine the per-rank manifests of a generate folder into manifest.jsonl")
    merge.add_argument("out", type=Path, help="the --out folder of `diffspec generate`")
    merge.add_argument("--verify", action="store_true", help="re-hash every file against its sha256")
    merge.set_defaults(func=cmd_merge)
    _add_bench(sub)
    _add_calibrate(sub)
    _add_train_drafter(sub)
    inf = sub.add_parser("info", help="versions, devices, shipped models (their classes) and methods")
    inf.add_argument("--json", action="store_true", help="print the same as JSON (with each model's path)")
    inf.set_defaults(func=cmd_info)
    return parser


def _add_generate(sub: Any) -> None:
    gen = sub.add_parser("generate", help="generate a batch of images or videos into a folder, resumably",
                         description="Items come from --prompt-file (one prompt per line, or JSONL objects "
                         "with id, prompt|class_label, negative_prompt, seed, steps, height, width, num_frames, "
                         "fps, guidance_scale, method, config) or --class-labels; the flags below are the "
                         "defaults of fields an item leaves out. Under torchrun, accelerate launch or srun each "
                         "process takes its share of the items.")
    gen.add_argument("--model", default="tiny-dit", help="shipped model name or local diffusers folder")
    gen.add_argument("--method", default="taylor", help="acceleration method (see --help)").help_fn = \
        diffusion_methods_help  # the registry loads only to show it
    gen.add_argument("--quality", type=quality, default=None,
                     help="with --method auto: exact, high, balanced (default), fast, or a PSNR floor in dB; the "
                     "method is tuned on the items' own prompts and cached (see docs/auto.md)")
    gen.add_argument("--prompt-file", type=Path,
                     help="*.jsonl (.ndjson, .json) items, or one prompt (class name) per line")
    gen.add_argument("--class-labels", help="comma-separated class names or ids, instead of --prompt-file")
    gen.add_argument("--num-images-per-prompt", type=positive, default=1,
                     help="outputs per prompt, each its own item with the next seed (default 1)")
    gen.add_argument("--steps", type=positive, default=50, help="inference steps (default 50)")
    gen.add_argument("--seed", type=int, default=0, help="item i without a seed uses seed + i (default 0)")
    gen.add_argument("--negative-prompt", default=None,
                     help="text pipelines: negative prompt of items without one (default: the pipeline's own)")
    side_help = f"pixels, 1 to {MAX_SIDE} (default: the pipeline's own)"
    gen.add_argument("--height", type=pixels, default=None, help=side_help)
    gen.add_argument("--width", type=pixels, default=None, help=side_help)
    gen.add_argument("--num-frames", type=positive, default=None, help="video frames (default: the pipeline's own)")
    gen.add_argument("--fps", type=positive, default=None, help="frames per second of written videos (default 16)")
    gen.add_argument("--video-format", default=None, help="mp4 (needs imageio-ffmpeg, the default when installed), "
                     "webp or gif")
    gen.add_argument("--batch-size", type=positive, default=1,
                     help="items per pipeline call among items with equal settings (default 1: outputs then "
                     "do not depend on batching or on the number of processes)")
    gen.add_argument("--guidance-scale", type=finite, default=None,
                     help="a finite number (default: the pipeline's own)")
    gen.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="method config override")
    gen.add_argument("--scheduler", default=None, metavar="CLASS",
                     help="a diffusers scheduler class built from the pipeline's scheduler config (e.g. "
                     "DDPMScheduler: coupling and autospec need a stochastic sampler; default: the pipeline's own)")
    gen.add_argument("--device", default=None, help="cpu, cuda, cuda:1 (default: cuda if available; "
                     "cuda:LOCAL_RANK under a launcher)")
    gen.add_argument("--dtype", choices=DTYPES, default="float32", help="weights' dtype (default float32)")
    gen.add_argument("--rank", type=int, default=None, help="this process's rank (default: RANK or SLURM_PROCID)")
    gen.add_argument("--world-size", type=positive, default=None,
                     help="number of processes (default: WORLD_SIZE or SLURM_NTASKS, else 1)")
    gen.add_argument("--out", type=Path, required=True, help="output folder")
    gen.set_defaults(func=cmd_generate)


def _add_bench(sub: Any) -> None:
    bench = sub.add_parser("bench", help="run a benchmark suite and write its JSON")
    bench.add_argument("suite", help="benchmark suite (dit-cache, exact-diffusion, ar-image, ar-image-cost, "
                       "multimodal, multimodal-action, multimodal-cost, speech, kernels, auto)")
    bench.add_argument("--model", default=None,
                       help="default per suite: tiny-dit (dit-cache, exact-diffusion; or dit-xl-2-256 | pixart-1024 | "
                       "sd3-1024 | flux-1024 | wan-1.3b-512-17f on a GPU), tiny-ar (ar-image), tiny | llamagen-xl | llamagen-7b-size, "
                       "comma-separated (ar-image-cost), tiny-vlm (multimodal), tiny-vla "
                       "(multimodal-action), tiny | qwen2.5-vl-7b,llava-1.5-7b (multimodal-cost), "
                       "tiny-dit,tiny-flux,tiny-ar,tiny-ar-tex,tiny-ar-noisy,tiny-vlm "
                       "(auto); kernels takes none. exact-diffusion also takes a FluxPipeline folder judged by prompted scenes "
                       "(tiny-flux)")
    bench.add_argument("--methods", default=None, help="comma-separated methods and peers (default: all)")
    bench.add_argument("--device", default=None, help="cpu, cuda, cuda:1 (default: cuda if available)")
    bench.add_argument("--dtype", choices=DTYPES, default=None, help="default: bfloat16 on CUDA, else float32")
    bench.add_argument("--steps", type=step_counts, default=None, help="steps, or a sweep 50,100,250 (exact-diffusion)")
    bench.add_argument("--quality-steps", default=None, help="exact-diffusion: the sweep's step counts that get quality")
    bench.add_argument("--batch-size", type=positive, default=None,
                       help="images (sequences) per timed call (default: the suite's own)")
    bench.add_argument("--repeats", type=positive, default=3, help="timed runs per arm, interleaved (default 3)")
    bench.add_argument("--warmup", type=non_negative, default=1, help="untimed runs per arm first (default 1)")
    bench.add_argument("--quality-samples", type=positive, default=500,
                       help="samples per arm for the quality figures (default 500)")
    bench.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="method config override")
    bench.add_argument("--images", type=positive, default=None, help="multimodal: scenes captioned per timed run")
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


def _add_calibrate(sub: Any) -> None:
    cal = sub.add_parser("calibrate", help="fit speca's thresholds to a target PSNR (saved next to the model), or "
                         "choose method auto's method for a quality (cached)")
    cal.add_argument("--model", default="tiny-dit", help="shipped model name or local diffusers folder")
    cal.add_argument("--method", choices=("speca", "auto"), default="speca",
                     help="speca (default): its thresholds; auto: the fastest method meeting --quality, measured "
                     "and cached for `--method auto` at the same settings")
    cal.add_argument("--quality", type=quality, default=None,
                     help="--method auto: exact, high, balanced (default), fast, or a PSNR floor in dB")
    cal.add_argument("--scheduler", default=None, metavar="CLASS",
                     help="--method auto: a diffusers scheduler class to swap in (e.g. DDPMScheduler)")
    cal.add_argument("--target-psnr", type=finite, default=30.0, help="mean PSNR (dB) vs full compute (default 30)")
    cal.add_argument("--steps", type=positive, default=None, help="inference steps (default: 50, or 28 for flow models)")
    cal.add_argument("--samples", type=positive, default=None,
                     help="calibration samples (default: 8 for speca; for auto 16, 64 on AR image models)")
    cal.add_argument("--guidance-scale", type=finite, default=4.0, help="CFG scale of the calibration runs (default 4)")
    cal.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="other speca settings (k_max=...)")
    cal.add_argument("--device", default=None, help="cpu, cuda, cuda:1 (default: cuda if available)")
    cal.add_argument("--dtype", choices=DTYPES, default=None,
                     help="default: bfloat16 for real-size models on CUDA, else float32")
    cal.add_argument("--schedules", type=positive_list, default=[], metavar="N,N",
                     help="also search a fixed placement of N full steps per size (replayed by speca's replay_steps)")
    cal.add_argument("--schedule-granularities", default="block", metavar="G,G",
                     help="granularities to search the schedules at: block, module (default block)")
    cal.add_argument("--out", type=Path, default=None, help="folder for diffspec_speca.json, made if missing (default: the model's)")
    _add_text_workload_args(cal)
    cal.set_defaults(func=cmd_calibrate)


def _add_train_drafter(sub: Any) -> None:
    td = sub.add_parser("train-drafter", help="self-distil a LANTERN (EAGLE) drafter for an AR image model")
    td.add_argument("--model", default="tiny-ar", help="shipped AR model name or AR model folder")
    td.add_argument("--out", type=Path, required=True, help="folder for the drafter (config.json + safetensors)")
    td.add_argument("--samples", type=positive, default=1000, help="self-distilled sequences (default 1000)")
    td.add_argument("--epochs", type=positive, default=10, help="passes over the sequences (default 10)")
    td.add_argument("--batch-size", type=positive, default=64, help="sequences per optimiser step (default 64)")
    td.add_argument("--lr", type=finite, default=1e-3, help="learning rate (default 1e-3)")
    td.add_argument("--seed", type=int, default=0, help="seed of the sampled sequences and the training (default 0)")
    td.add_argument("--device", default=None, help="cpu, cuda, cuda:1 (default: cuda if available)")
    td.set_defaults(func=cmd_train_drafter)


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
