"""Train the tiny VLA (``diffspec/weights/tiny-vla``) on expert "reach" episodes, CPU, a few minutes.

Usage:
    OMP_NUM_THREADS=1 python scripts/train_tiny_vla.py --steps 1500 --out diffspec/weights/tiny-vla

Each sample is ``[BOS, 6 state ids, 7 action ids]`` from :func:`diffspec.models.tiny_vla.sample_episodes`;
the loss is the cross-entropy of the 7 action tokens (teacher forced; half of the input action tokens
are shifted by up to ``--prefix-noise`` bins, so a prefix a few bins off, as relaxed acceptance feeds, stays
in distribution: without it the model derives later DoFs from the exact earlier bins and breaks on
near-bin prefixes). Held-out episodes (another seed)
report the greedy mean/max absolute action error at the end (written to ``train_log.json``).
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import torch

from diffspec.models.tiny_vla import (
    N_DOF,
    PROMPT_LEN,
    action_map,
    build_tiny_vla,
    encode_observation,
    sample_episodes,
)


def make_data(n_episodes: int, steps: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    states, actions = sample_episodes(n_episodes, steps, seed=seed)
    amap = action_map()
    ids = torch.cat([encode_observation(states), amap.actions_to_tokens(actions)], dim=-1)
    return ids.reshape(-1, PROMPT_LEN + N_DOF), actions.reshape(-1, N_DOF)


@torch.no_grad()
def evaluate(model: torch.nn.Module, ids: torch.Tensor, actions: torch.Tensor) -> dict[str, float]:
    """Greedy decode of the 7 action tokens (own prefix) vs the expert actions."""
    amap = action_map()
    out = model.generate(input_ids=ids[:, :PROMPT_LEN], attention_mask=torch.ones_like(ids[:, :PROMPT_LEN]),
                         max_new_tokens=N_DOF, min_new_tokens=N_DOF, do_sample=False)
    pred = amap.tokens_to_actions(out[:, PROMPT_LEN:])
    err = (pred - actions).abs()
    return {"mean_abs_error": float(err.mean()), "max_abs_error": float(err.max()),
            "p99_abs_error": float(err.flatten().quantile(0.99)),
            "bin_exact": float((out[:, PROMPT_LEN:] == ids[:, PROMPT_LEN:]).float().mean())}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=1500)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--episodes", type=int, default=4000)
    ap.add_argument("--prefix-noise", type=int, default=12,
                    help="max bins by which input action tokens are shifted (half of them), labels stay clean")
    ap.add_argument("--out", type=Path, default=Path("diffspec/weights/tiny-vla"))
    args = ap.parse_args()
    torch.manual_seed(0)
    ids, _ = make_data(args.episodes, 40, seed=1)
    test_ids, test_actions = make_data(50, 40, seed=12345)
    model = build_tiny_vla(seed=0).train()
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    g = torch.Generator().manual_seed(0)
    start = time.time()
    for step in range(args.steps):
        lr = args.lr * min(1.0, (step + 1) / 100) * 0.5 * (1 + math.cos(math.pi * step / args.steps))
        for group in opt.param_groups:
            group["lr"] = lr
        batch = ids[torch.randint(0, len(ids), (args.batch,), generator=g)]
        inputs = batch[:, :-1].clone()
        if args.prefix_noise > 0:  # near-bin action prefixes (what relaxed acceptance feeds) stay in distribution
            amap = action_map()
            acts = inputs[:, PROMPT_LEN:]
            shift = torch.randint(-args.prefix_noise, args.prefix_noise + 1, acts.shape, generator=g)
            shift = shift * (torch.rand(acts.shape, generator=g) < 0.5)
            inputs[:, PROMPT_LEN:] = amap.bins_to_tokens(amap.tokens_to_bins(acts) + shift)
        logits = model(input_ids=inputs).logits[:, PROMPT_LEN - 1:]
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), batch[:, PROMPT_LEN:].reshape(-1))
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % 100 == 0 or step == args.steps - 1:
            print(f"step {step} loss {loss.item():.3f} lr {lr:.2e} {time.time() - start:.0f}s", flush=True)
    model.eval()
    metrics = evaluate(model, test_ids, test_actions)
    print(metrics)
    args.out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(args.out)
    action_map().save_pretrained(args.out)
    log = {"steps": args.steps, "batch": args.batch, "lr": args.lr, "episodes": args.episodes,
           "prefix_noise": args.prefix_noise,
           "train_s": round(time.time() - start, 1), "held_out": metrics}
    (args.out / "train_log.json").write_text(json.dumps(log, indent=2) + "\n")


if __name__ == "__main__":
    main()
