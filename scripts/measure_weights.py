"""Measure what a storage change of ``diffspec/weights`` (``scripts/store_weights.py``) costs: each shipped
model's own quality figure with the "before" and "after" copies on the same seeds, next to the seed-to-seed noise
of the "before" copy (the same figure on other seeds).

Every image is scored with the "before" copy's classifiers (one fixed yardstick); the classifiers themselves are
scored on held-out real images. AR models: plain samples (class accuracy, reference FID, token agreement) and the
tokens per target call and acceptance of ``mc-sjd`` and ``lantern``; tiny-dit: samples at 25 steps; tiny-vla: its
held-out actions. A model whose files are byte-identical in both copies is recorded as unchanged, not rerun.

    cp -r diffspec/weights /tmp/weights-before && python scripts/store_weights.py diffspec/weights
    python scripts/measure_weights.py --before /tmp/weights-before --out scripts/runs/weights_storage.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
from safetensors.torch import load_file

sys.path.insert(0, str(Path(__file__).resolve().parent))
from train_tiny_ar import plain_sample  # noqa: E402
from train_tiny_vla import evaluate, make_data  # noqa: E402

from diffspec import SpeculativePipeline  # noqa: E402
from diffspec.data import render_shapes  # noqa: E402
from diffspec.metrics import feature_stats, frechet_distance, psnr  # noqa: E402
from diffspec.models import ShapeClassifier, load_ar_target, load_pipeline  # noqa: E402
from diffspec.models.tiny_vla import load_tiny_vla  # noqa: E402

DATA = {"shapes": {}, "shapes-tex": {"background": "textured", "texture_strength": 0.7, "noise": 0.05},
        "shapes-noisy": {"background": "textured", "texture_strength": 0.7, "noise": 0.4}}
"""Each reference classifier's data variant (see diffspec.models.classifier)."""


class Scorer:
    """Class accuracy and reference FID with one classifier folder (its weights and FID statistics)."""

    def __init__(self, folder: Path) -> None:
        self.model = ShapeClassifier(**json.loads((folder / "config.json").read_text()))
        self.model.load_state_dict(load_file(str(folder / "model.safetensors")))
        self.model.eval()
        stats = load_file(str(folder / "fid_stats.safetensors"))
        self.mu, self.sigma = stats["mu"].double().numpy(), stats["sigma"].double().numpy()

    @torch.no_grad()
    def features(self, images: torch.Tensor) -> torch.Tensor:
        return torch.cat([self.model.features(images[i:i + 500].float()) for i in range(0, len(images), 500)])

    def score(self, images: torch.Tensor, labels: torch.Tensor) -> dict[str, float]:
        feats = self.features(images)
        pred = self.model.out(feats).argmax(1)
        fid = frechet_distance(*feature_stats(feats.double()), self.mu, self.sigma)
        return {"class_accuracy": round(float((pred == labels).float().mean()), 4), "reference_fid": round(fid, 3)}


def same_files(before: Path, after: Path) -> bool:
    """Whether two folders hold the same files with the same bytes."""
    names = {p.relative_to(before) for p in before.rglob("*") if p.is_file()}
    if names != {p.relative_to(after) for p in after.rglob("*") if p.is_file()}:
        return False
    return all((before / n).read_bytes() == (after / n).read_bytes() for n in names)


def sizes(before: Path, after: Path) -> dict[str, dict[str, int]]:
    """Bytes of each top-level folder's files in both copies."""
    def total(folder: Path) -> int:
        return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())

    return {d.name: {"before": total(d), "after": total(after / d.name)} for d in sorted(before.iterdir()) if d.is_dir()}


def classifiers(before: Path, after: Path, n: int) -> dict:
    out = {}
    for name, options in DATA.items():
        held_out, labels = render_shapes(n, seed=7, **options)
        other, other_labels = render_shapes(n, seed=8, **options)
        b, a = Scorer(before / f"{name}-classifier"), Scorer(after / f"{name}-classifier")
        out[name] = {"held_out": f"render_shapes({n}, seed=7)", "before": b.score(held_out, labels),
                     "after": a.score(held_out, labels), "before_other_seeds": b.score(other, other_labels),
                     "feature_max_abs_diff": round(float((b.features(held_out) - a.features(held_out)).abs().max()), 5)}
    return out


def tiny_dit(before: Path, after: Path, n: int) -> dict:
    yardstick = Scorer(before / "shapes-classifier")
    labels = torch.arange(n) % 10

    def images(root: Path, offset: int) -> torch.Tensor:
        pipe = load_pipeline(root / "tiny-dit")
        pipe.set_progress_bar_config(disable=True)
        gens = [torch.Generator().manual_seed(offset + i) for i in range(n)]
        return pipe(class_labels=labels.tolist(), generator=gens, num_inference_steps=25, guidance_scale=4.0,
                    output_type="pt").images * 2 - 1

    b, a, other = images(before, 1000), images(after, 1000), images(before, 1000 + n)
    return {"samples": n, "steps": 25, "guidance_scale": 4.0, "before": yardstick.score(b, labels),
            "after": yardstick.score(a, labels), "before_other_seeds": yardstick.score(other, labels),
            "psnr_db_after_vs_before_same_seeds": round(psnr(a, b, data_range=2.0), 2),
            "psnr_db_before_other_seeds_vs_before": round(psnr(other, b, data_range=2.0), 2)}


def _speculative(folder: Path, method: str, n: int, offset: int) -> dict[str, float]:
    """Tokens per target call (mean over ``n`` images, seeds ``offset + i``) and acceptance rate of ``method``."""
    spec = SpeculativePipeline.from_pretrained(str(folder), method=method)
    spec.set_progress_bar_config(disable=True)
    gens = [torch.Generator().manual_seed(offset + s) for s in range(n)]
    spec(class_labels=[s % 10 for s in range(n)], generator=gens, output_type="tokens")
    return {"tokens_per_call": round(spec.stats.extra["tokens_per_call"], 3),
            "acceptance_rate": round(spec.stats.acceptance_rate, 4)}


def ar_model(name: str, before: Path, after: Path, n: int, n_spec: int) -> dict:
    targets = {"before": load_ar_target(before / name), "after": load_ar_target(after / name)}
    clf = targets["before"].reference_classifier
    yardstick = Scorer(before / f"{clf}-classifier")
    labels = torch.arange(n) % 10
    guidance = targets["before"].default_guidance_scale
    out: dict = {"samples": n, "guidance_scale": guidance, "reference_classifier": clf}
    tokens = {}
    for key, seed in (("before", 0), ("after", 0), ("before_other_seeds", 1)):
        target = targets[key.split("_")[0]]
        tokens[key], _, _ = plain_sample(target, labels, guidance, torch.Generator().manual_seed(seed))
        out[key] = yardstick.score(target.decode_tokens(tokens[key]), labels)
    out["token_agreement_same_seeds"] = round(float((tokens["before"] == tokens["after"]).float().mean()), 4)
    out["token_agreement_other_seeds"] = round(float((tokens["before"] == tokens["before_other_seeds"]).float().mean()), 4)
    for method in ("mc-sjd", "lantern"):
        out[method] = {"images": n_spec, **{key: _speculative(root / name, method, n_spec, offset)
                       for key, root, offset in (("before", before, 50_000), ("after", after, 50_000),
                                                 ("before_other_seeds", before, 60_000))}}
    return out


def tiny_vla(before: Path, after: Path) -> dict:
    ids, actions = make_data(50, 40, seed=12345)  # train_tiny_vla.py's held-out episodes
    other_ids, other_actions = make_data(50, 40, seed=54321)
    out = {}
    for key, root, data in (("before", before, (ids, actions)), ("after", after, (ids, actions)),
                            ("before_other_seeds", before, (other_ids, other_actions))):
        model, _ = load_tiny_vla(root / "tiny-vla")
        if model.dtype != torch.float32:
            raise ValueError(f"{root / 'tiny-vla'} loaded as {model.dtype}, not float32")
        out[key] = {k: round(v, 4) for k, v in evaluate(model, *data).items()}
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--before", type=Path, required=True)
    p.add_argument("--after", type=Path, default=Path("diffspec/weights"))
    p.add_argument("--samples", type=int, default=500, help="plain samples per AR model and per arm")
    p.add_argument("--dit-samples", type=int, default=200, help="tiny-dit samples per arm")
    p.add_argument("--spec-samples", type=int, default=50, help="images per mc-sjd / lantern arm")
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args()
    torch.manual_seed(0)
    start = time.time()
    record: dict = {"before": str(args.before), "after": str(args.after), "bytes": sizes(args.before, args.after),
                    "unchanged": sorted(d.name for d in args.before.iterdir()
                                        if d.is_dir() and same_files(d, args.after / d.name))}
    print(json.dumps(record), flush=True)
    steps = [("classifiers", lambda: classifiers(args.before, args.after, 2000)),
             ("tiny-dit", lambda: tiny_dit(args.before, args.after, args.dit_samples)),
             *[(name, lambda name=name: ar_model(name, args.before, args.after, args.samples, args.spec_samples))
               for name in ("tiny-ar", "tiny-ar-tex", "tiny-ar-noisy")],
             ("tiny-vla", lambda: tiny_vla(args.before, args.after))]
    for key, measure in steps:
        if key in record["unchanged"]:
            continue
        record[key] = measure()
        print(key, json.dumps(record[key]), flush=True)
    record["wall_s"] = round(time.time() - start, 1)
    if args.out is not None:
        args.out.write_text(json.dumps(record, indent=2) + "\n")


if __name__ == "__main__":
    main()
