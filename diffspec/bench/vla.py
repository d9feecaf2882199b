"""``diffspec bench multimodal-action``: relaxed-action vs plain greedy decoding of a VLA, per episode.

Every arm decodes the same episodes (one action per call, batch 1, as a robot controller does):
the observations are the held-out expert trajectories of :mod:`diffspec.models.tiny_vla`, fed open
loop, so all arms see the same observations and each arm's actions are compared step by step with
the plain greedy actions of the same episode. Arms: ``baseline`` (plain greedy ``generate``) and
``relaxed-action`` at every tolerance ``r`` and draft source; timing is interleaved, warmup
excluded (:func:`~diffspec.bench.timing.time_arms`).

Per arm the JSON reports target passes per action, accepted/proposed, wall-clock speedup, and the
action error vs plain greedy (mean, worst case over all DoF and steps), the token disagreement
rate, the error bound ``r * bin_width`` and the error vs the expert actions; and, closed loop
(``closed_loop``, default on, not timed), each arm driving the same start states with its own
actions: final distance to the goal, success rate and passes per action.

Example:
    >>> doc = run_multimodal_action(episodes=2, steps=10, repeats=1, tolerances="0,3")  # doctest: +SKIP
    >>> [(r["config"], r["passes_per_action"]) for r in doc["runs"]]  # doctest: +SKIP
"""

from __future__ import annotations

from typing import Any

import torch

from .timing import Arm, latency_summary, machine_info, time_arms

SOURCES = ("previous", "kalman")
TOLERANCES = (0, 1, 3, 5, 9)
EPISODE_SEED = 2024  # held out: training used seed 1, the training script's evaluation 12345


def _ints(value: Any, default: tuple[int, ...]) -> tuple[int, ...]:
    if value is None:
        return default
    if isinstance(value, int):
        return (value,)
    return tuple(int(v) for v in str(value).split(",") if v.strip())


def _names(value: Any, default: tuple[str, ...]) -> tuple[str, ...]:
    return default if value is None else tuple(v.strip() for v in str(value).split(",") if v.strip())


class _EpisodeArm(Arm):
    """Decodes every episode through one pipeline; keeps the last run's actions, tokens and passes."""

    def __init__(self, name: str, spec: Any, obs: torch.Tensor, config: dict[str, Any]) -> None:
        super().__init__(name=name, run=self._episodes, config=config)
        self.spec, self.obs = spec, obs
        self.actions = self.tokens = self.passes = None
        self.accepted = self.proposed = self.relaxed = 0

    @torch.inference_mode()
    def _episodes(self, seeds: list[int]) -> torch.Tensor:
        E, S = self.obs.shape[:2]
        actions, tokens, passes = [], [], []
        self.accepted = self.proposed = self.relaxed = 0
        for e in range(E):  # episodes and their steps are sequential by nature (one action per call)
            self.spec.reset_episode()
            for t in range(S):
                out = self.spec(input_ids=self.obs[e, t][None])
                st = self.spec.stats
                actions.append(out.actions[0])
                tokens.append(out.tokens[0])
                passes.append(st.target_calls)
                self.accepted += st.accepted
                self.proposed += st.proposed
                self.relaxed += st.extra.get("relaxed_tokens", 0)
        self.actions = torch.stack(actions).reshape(E, S, -1)
        self.tokens = torch.stack(tokens).reshape(E, S, -1)
        self.passes = torch.tensor(passes, dtype=torch.float)
        return self.actions

    @torch.inference_mode()
    def closed_loop(self, start: torch.Tensor, steps: int) -> dict[str, Any]:
        """Drive every episode from ``start`` (E, 6) with this arm's own actions (batch 1, not timed)."""
        from ..models.tiny_vla import SUCCESS_RADIUS, encode_observation, final_distance, rollout

        passes: list[int] = []

        def policy(state: torch.Tensor) -> torch.Tensor:
            out = self.spec(input_ids=encode_observation(state).to(self.obs.device))
            passes.append(self.spec.stats.target_calls)
            return out.actions.to(state.device)

        dist = []
        for e in range(start.shape[0]):  # one robot per episode, one action per call
            self.spec.reset_episode()
            states, actions = rollout(policy, start[e:e + 1], steps)
            dist.append(final_distance(states, actions))
        dist = torch.cat(dist)
        return {"final_distance_mean": round(float(dist.mean()), 5), "final_distance_max": round(float(dist.max()), 5),
                "success_rate": round(float((dist < SUCCESS_RADIUS).float().mean()), 4),
                "success_radius": SUCCESS_RADIUS, "passes_per_action": round(sum(passes) / len(passes), 4)}


def run_multimodal_action(model: str | None = "tiny-vla", *, methods: list[str] | None = None,
                          device: str | None = None, steps: int | None = None, repeats: int = 3, warmup: int = 1,
                          overrides: dict[str, Any] | None = None, episodes: int = 6,
                          tolerances: Any = None, sources: Any = None, closed_loop: Any = True,
                          show_progress: bool = True,
                          **_: Any) -> dict[str, Any]:
    """Run the suite and return the JSON document (the benchmark JSON, docs/benchmarks/index.md).

    Args:
        model: ``"tiny-vla"`` (the shipped trained model, default) or a ``save_pretrained`` folder of one.
        methods: ``baseline`` and/or ``relaxed-action`` (default both).
        steps: actions per episode (default 40).
        overrides: ``--set`` values: ``episodes``, ``tolerances`` ("0,1,3,5,9"), ``sources``
            ("previous,kalman"), ``closed_loop`` (true/false).
        episodes, tolerances, sources, closed_loop: as the overrides (the overrides win).
    """
    from ..api import SpeculativePipeline
    from ..models.tiny_vla import encode_observation, load_tiny_vla, sample_episodes

    ov = dict(overrides or {})
    episodes = int(ov.pop("episodes", episodes))
    tols = _ints(ov.pop("tolerances", tolerances), TOLERANCES)
    closed_loop = str(ov.pop("closed_loop", closed_loop)).lower() in ("1", "true", "yes")
    srcs = _names(ov.pop("sources", sources), SOURCES)
    if ov:
        raise ValueError(f"multimodal-action: unknown --set key(s) {', '.join(ov)}; "
                         "use episodes, tolerances, sources, closed_loop")
    names = list(methods or ("baseline", "relaxed-action"))
    bad = [m for m in names if m not in ("baseline", "relaxed-action")]
    if bad:
        raise ValueError(f"multimodal-action: unknown method(s) {', '.join(bad)}; choose from baseline, relaxed-action")
    dev = torch.device(device or "cpu")
    path = None if model in (None, "tiny-vla") else model
    vla, amap = load_tiny_vla(path, device=dev)
    n_steps = steps or 40
    states, expert = sample_episodes(episodes, n_steps, seed=EPISODE_SEED)
    obs = encode_observation(states).to(dev)

    base_spec = SpeculativePipeline.from_pipe(vla, method="relaxed-action", action_map=amap)
    base_spec.disable()
    arms = [_EpisodeArm("baseline", base_spec, obs, {})]
    if "relaxed-action" in names:
        for src in srcs:
            for r in tols:
                spec = SpeculativePipeline.from_pipe(vla, method="relaxed-action", action_map=amap, tolerance=r,
                                                     draft_source=src)
                arms.append(_EpisodeArm("relaxed-action", spec, obs, {"tolerance": r, "draft_source": src}))
    time_arms(arms, [EPISODE_SEED], device=dev, repeats=repeats, warmup=warmup, show_progress=show_progress)

    closed = [arm.closed_loop(states[:, 0], n_steps) for arm in arms] if closed_loop else [None] * len(arms)
    expert_closed = None
    if closed_loop:
        from ..models.tiny_vla import SUCCESS_RADIUS, expert_action, final_distance, rollout

        d = final_distance(*rollout(expert_action, states[:, 0], n_steps))
        expert_closed = {"final_distance_mean": round(float(d.mean()), 5),
                         "success_rate": round(float((d < SUCCESS_RADIUS).float().mean()), 4)}
    ref = arms[0]
    base_median = latency_summary(ref.times)["median"]
    expert = expert.to(dev)
    runs = []
    for arm, loop in zip(arms, closed):
        err = (arm.actions - ref.actions).abs()
        r = arm.config.get("tolerance")
        latency = latency_summary(arm.times)
        passes = float(arm.passes.mean())
        runs.append({
            "method": arm.name, "peer": False, "config": arm.config, "latency_s": latency,
            "target_calls": int(arm.passes.sum()), "target_evals": int(arm.passes.sum()), "peak_mem_gb": arm.peak_mem_gb,
            "speedup_vs_baseline": round(base_median / latency["median"], 3),
            "passes_per_action": round(passes, 4), "max_passes_per_action": int(arm.passes.max()),
            "fewer_passes_vs_baseline": round(float(ref.passes.mean()) / passes, 3),
            "acceptance_rate": round(arm.accepted / arm.proposed, 4) if arm.proposed else None,
            "quality": {
                "exact": bool(torch.equal(arm.tokens, ref.tokens)),
                "token_disagreement": round(float((arm.tokens != ref.tokens).float().mean()), 4),
                "mean_abs_action_error": round(float(err.mean()), 5),
                "max_abs_action_error": round(float(err.max()), 5),
                "error_bound_per_token": None if r is None else amap.tolerance_bound(r),
                "relaxed_token_rate": round(arm.relaxed / arm.tokens.numel(), 4),
                "expert_mean_abs_error": round(float((arm.actions - expert).abs().mean()), 5),
                "closed_loop": loop,
                "psnr": None, "ssim": None, "lpips": None, "fid": None,
            },
        })
    params = sum(p.numel() for p in vla.parameters())
    return {"suite": "multimodal-action", "machine": machine_info(dev),
            "model": {"name": "tiny-vla" if path is None else str(path), "params": params, "dtype": "float32"},
            "workload": {"episodes": episodes, "steps_per_episode": n_steps, "tokens": amap.n_dof, "batch": 1,
                         "seeds": [EPISODE_SEED], "n_bins": amap.n_bins,
                         "observations": "held-out expert trajectories, open loop (every arm sees the same ones)",
                         "baseline": "plain greedy generate, one action (7 tokens) per call",
                         "closed_loop": None if not closed_loop else {
                             "what": "each arm drives the same start states with its own actions (not timed); "
                                     "success = final distance to the goal < success_radius",
                             "expert": expert_closed}},
            "runs": runs}


def action_table(doc: dict[str, Any]) -> str:
    """The suite's runs as a markdown table."""
    rows = ["| method | r | draft | passes/action | fewer passes | median s | speedup | acceptance | "
            "token disagr. | mean err | max err | bound/token | expert err | closed-loop success | final dist. |",
            "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for run in doc["runs"]:
        q, c = run["quality"], run["config"]
        acc = "-" if run["acceptance_rate"] is None else f"{run['acceptance_rate']:.3f}"
        bound = "-" if q["error_bound_per_token"] is None else f"{q['error_bound_per_token']:.4f}"
        rows.append(f"| `{run['method']}` | {c.get('tolerance', '-')} | {c.get('draft_source', '-')} | "
                    f"{run['passes_per_action']:.2f} | {run['fewer_passes_vs_baseline']:.2f}x | "
                    f"{run['latency_s']['median']:.3f} | {run['speedup_vs_baseline']:.2f}x | {acc} | "
                    f"{q['token_disagreement']:.3f} | {q['mean_abs_action_error']:.4f} | "
                    f"{q['max_abs_action_error']:.4f} | {bound} | {q['expert_mean_abs_error']:.4f} | "
                    f"{_closed(q.get('closed_loop'))} |")
    return "\n".join(rows)


def _closed(loop: dict[str, Any] | None) -> str:
    return "- | -" if not loop else f"{loop['success_rate']:.2f} | {loop['final_distance_mean']:.4f}"
