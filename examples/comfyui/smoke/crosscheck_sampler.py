"""Check the diffspec Speculative Sampler against ComfyUI's own k-diffusion samplers (a ComfyUI checkout).

``python crosscheck_sampler.py COMFYUI_DIR OUT.json [n]`` imports ComfyUI's ``comfy.k_diffusion.sampling``
and, for ``euler_ancestral`` (noise-prediction and rectified-flow models, two eta / s_noise settings)
and ``ddpm``, on an analytic Gaussian-mixture denoiser (d = 8, 10 steps):

1. runs ComfyUI's sampler and the diffspec sampler with lookahead 1 (adaptive off) from the same
   noise and seed: the largest absolute difference (the same path up to float rounding);
2. runs ComfyUI's sampler and the speculative one (lookahead 4, adaptive) on ``n`` samples from
   different seeds: the two-sample tests of ``diffspec.bench.twosample.same_law`` and the counts.

Run it with ComfyUI's Python and this repository on ``PYTHONPATH``.
"""

import json
import sys
import time
import types
from pathlib import Path

import torch

ARGS = sys.argv[1:]
sys.path.insert(0, ARGS[0])
sys.argv = sys.argv[:1] + ["--cpu"]  # ComfyUI parses the command line on import
import comfy.options  # noqa: E402

comfy.options.enable_args_parsing()
import comfy.k_diffusion.sampling as k_sampling  # noqa: E402
import comfy.model_sampling as model_sampling  # noqa: E402
import comfyui_version  # noqa: E402

from diffspec.bench.twosample import same_law  # noqa: E402
from diffspec.comfyui.sampler import SpeculativeRun, sample_speculative  # noqa: E402


class Mixture:
    """``model(x, sigma_rows) -> E[x0 | x]`` for an equal mixture of N(+-m, 0.25 I), as ComfyUI's samplers call it."""

    def __init__(self, flow: bool) -> None:
        self.flow, self.calls = flow, 0
        self.means = torch.stack([torch.full((8,), 2.0), torch.full((8,), -1.5)]).double()
        sampling = (model_sampling.CONST if flow else model_sampling.EPS)()
        self.inner_model = types.SimpleNamespace(inner_model=types.SimpleNamespace(model_sampling=sampling))

    def __call__(self, x, sigma, **kwargs):
        self.calls += 1
        s = sigma.double().view(-1, 1)
        a = 1 - s if self.flow else torch.ones_like(s)
        var = a**2 * 0.25 + s**2
        logw = torch.stack([-((x.double() - a * m) ** 2).sum(1) / (2 * var[:, 0]) for m in self.means], 1)
        post = torch.stack([m + a * 0.25 / var * (x.double() - a * m) for m in self.means], 1)
        return (logw.softmax(1).unsqueeze(-1) * post).sum(1).float()


def main() -> None:
    out_path = Path(ARGS[1])
    n = int(ARGS[2]) if len(ARGS) > 2 else 2000
    rows = []
    for flow in (False, True):
        sigmas = torch.linspace(1.0, 0.0, 11) if flow else torch.tensor(
            [14.6, 8.0, 5.0, 3.0, 2.0, 1.2, 0.7, 0.4, 0.2, 0.1, 0.0])
        for kind, eta, s_noise in (("euler_ancestral", 1.0, 1.0), ("euler_ancestral", 0.6, 0.8), ("ddpm", 1.0, 1.0)):
            comfy_fn = getattr(k_sampling, f"sample_{kind}")
            kw = {"eta": eta, "s_noise": s_noise} if kind == "euler_ancestral" else {}
            def noise(seed: int, m: int, scale: float = float(sigmas[0])) -> torch.Tensor:
                return torch.randn(m, 8, generator=torch.Generator().manual_seed(seed)) * scale

            model = Mixture(flow)
            ref = comfy_fn(model, noise(3, 64), sigmas, extra_args={"seed": 7}, disable=True, **kw)
            plain = sample_speculative(model, noise(3, 64), sigmas, {"seed": 7}, disable=True, kind=kind,
                                       lookahead=1, adaptive=False, eta=eta, s_noise=s_noise)
            comfy_big = comfy_fn(model, noise(1, n), sigmas, extra_args={"seed": 11}, disable=True, **kw)
            run = SpeculativeRun()
            spec = sample_speculative(Mixture(flow), noise(2, n), sigmas, {"seed": 12}, disable=True, kind=kind,
                                      lookahead=4, eta=eta, s_noise=s_noise, run=run)
            test = same_law(comfy_big, spec)
            one = SpeculativeRun()
            sample_speculative(Mixture(flow), noise(5, 1), torch.linspace(1.0, 0.0, 51) if flow else torch.cat(
                [torch.logspace(1.2, -1.5, 50), torch.zeros(1)]), {"seed": 5}, disable=True, kind=kind, lookahead=4,
                eta=eta, s_noise=s_noise, run=one)
            row = {"model": "flow (CONST)" if flow else "noise-prediction (EPS)", "sampler": kind, "eta": eta,
                   "s_noise": s_noise, "steps": 10, "plain_path_max_abs_diff_vs_comfy": float((ref - plain).abs().max()),
                   "two_sample_vs_comfy": {"n": n, "passed": test["passed"], "energy_p": test["energy"]["p_value"],
                                           "ks_bonferroni_p": test["ks"]["bonferroni_p"]},
                   "batch_n": {"target_calls": run.stats.target_calls, "acceptance": round(run.stats.acceptance_rate, 3),
                               "rows_per_sample": run.stats.target_evals, "padded_rows": run.stats.extra["padded_rows"]},
                   "batch1_50_steps": {"target_calls": one.stats.target_calls,
                                       "acceptance": round(one.stats.acceptance_rate, 3),
                                       "rows_per_sample": one.stats.target_evals}}
            print(json.dumps(row), flush=True)
            rows.append(row)
    out_path.write_text(json.dumps({"suite": "comfyui-sampler-crosscheck", "created": time.strftime("%Y-%m-%dT%H:%M:%S"),
                                    "comfyui": comfyui_version.__version__, "torch": torch.__version__, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
