"""Side by side: the official SJD / SCD (MC-SJD) code and diffspec's ``sjd`` / ``mc-sjd`` on ``tiny-ar`` (CPU or GPU).

The official code is never committed here; get it and the transformers it pins, outside the repo:

    git clone https://github.com/tyshiwo1/Accelerating-T2I-AR-with-SJD /tmp/peers/sjd   # (measured: b389cfb2)
    git clone https://github.com/junhyukso/SCD /tmp/peers/scd                           # (measured: 7322379d)
    pip install --no-deps --target /tmp/peers/site "transformers==4.47.1" "tokenizers==0.21.0" \
        "huggingface_hub==0.26.5" absl-py
    OMP_NUM_THREADS=1 PYTHONPATH=. python scripts/ar_image_official_peers.py --sjd-repo /tmp/peers/sjd \
        --scd-repo /tmp/peers/scd --peer-site /tmp/peers/site \
        --out benchmarks/results/ar-image-tiny-ar-cpu-official-peers.json

(``--sjd-repo``/``--scd-repo`` default to ``$DIFFSPEC_SJD_REPO``/``$DIFFSPEC_SCD_REPO``, ``--peer-site``
to ``$DIFFSPEC_PEER_SITE``.) The official files are imported unmodified; the CPU shims applied at
run time are listed in the JSON (``peers.shims``). Without checkouts the script prints what is
missing and exits with status 2.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sjd-repo", default=None, help="checkout of tyshiwo1/Accelerating-T2I-AR-with-SJD")
    parser.add_argument("--scd-repo", default=None, help="checkout of junhyukso/SCD")
    parser.add_argument("--sjd-commit", default=None, help="commit of the SJD checkout (when it is not a git work tree)")
    parser.add_argument("--scd-commit", default=None, help="commit of the SCD checkout (when it is not a git work tree)")
    parser.add_argument("--peer-site", default=os.environ.get("DIFFSPEC_PEER_SITE"),
                        help="folder put first on sys.path (transformers 4.47.1 for the official code)")
    parser.add_argument("--windows", default="8,16,32", help="windows L run by both (official: L <= N - 2)")
    parser.add_argument("--diffspec-windows", default="64", help="windows only diffspec can run on 64 tokens")
    parser.add_argument("--images", type=int, default=32)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--guidance-scale", type=float, default=None, help="default: the model's (3.0 for tiny-ar)")
    parser.add_argument("--top-k", type=int, default=0, help="0 = whole codebook (official: k = codebook size)")
    parser.add_argument("--law-samples", type=int, default=0, help="samples per arm for the token-law check")
    parser.add_argument("--law-window", type=int, default=16, help="window of the arms in the token-law check")
    parser.add_argument("--device", default="cpu", help="cpu or cuda (on CUDA each image is timed to a synchronize)")
    parser.add_argument("--model", default="tiny-ar", help="shipped AR model (tiny-ar, tiny-ar-noisy, tiny-ar-tex)")
    parser.add_argument("--out", default=None, help="JSON path (default: print)")
    args = parser.parse_args(argv)
    if args.peer_site:
        sys.path.insert(0, str(Path(args.peer_site).resolve()))
    import torch

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    from diffspec.bench.official_ar_run import run_official_peers

    doc = run_official_peers(
        sjd_repo=args.sjd_repo, scd_repo=args.scd_repo, sjd_commit=args.sjd_commit, scd_commit=args.scd_commit,
        windows=tuple(int(w) for w in args.windows.split(",") if w),
        diffspec_windows=tuple(int(w) for w in args.diffspec_windows.split(",") if w),
        images=args.images, warmup=args.warmup, guidance_scale=args.guidance_scale, top_k=args.top_k,
        law_samples=args.law_samples, law_window=args.law_window, device=args.device, model=args.model)
    if not doc["runs"]:
        print("official peers skipped: " + "; ".join(f"{k}: {v}" for k, v in doc["skipped"].items()), file=sys.stderr)
        return 2
    text = json.dumps(doc, indent=2)
    if args.out:
        Path(args.out).write_text(text + "\n")
    else:
        print(text)
    for c in doc["comparisons"]:
        print(f"L={c['window']}: {c['official']} / {c['diffspec']} wall = {c['wall_ratio_of_medians']} "
              f"(paired {c['wall_ratio_paired_median']}), step compression {c['step_compression']}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
