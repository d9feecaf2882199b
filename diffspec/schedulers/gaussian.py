"""Stochastic diffusers schedulers as pure Gaussian transitions ``x' ~ N(mean_i(x, out), std_i^2 I)``.

``scheduler.step()`` keeps hidden state (``_step_index``) and draws its own noise, so it cannot be
evaluated at several steps at once or replayed with chosen noise. :class:`GaussianTransition`
reads the scheduler's tables once and gives, for any batch of rows each at its own step index,
the model input scaling, the predicted clean sample ``x0``, the transition mean and its standard
deviation, with no state. It is what exact speculative samplers verify against.

Supported (the transition must be Gaussian with a std that depends on the step only):
``DDPMScheduler`` (``fixed_small``, ``fixed_small_log``, ``fixed_large`` variance),
``DDIMScheduler`` with ``eta > 0``, ``EulerAncestralDiscreteScheduler`` and the flow-matching /
DPM-Solver SDE schedulers of :mod:`~diffspec.schedulers.gaussian_sde`
(``FlowMatchEulerDiscreteScheduler(stochastic_sampling=True)``, ``LTXEulerAncestralRFScheduler``,
``sde-dpmsolver(++)``, multistep also at ``solver_order`` 2 and 3).

Multistep solvers carry a history: the mean at step ``i`` also depends on the converted model
outputs ``m`` (:meth:`GaussianTransition.converted`) of the previous ``history`` steps, passed as
``hist`` (``(B, history, ...)``, latest first). Given that history the step is Gaussian with a
step-only std, so exact speculation still applies as long as each verified step gets the
history of its own (verified) past.

Example:
    >>> from diffusers import DDPMScheduler
    >>> kernel = GaussianTransition(DDPMScheduler(), num_inference_steps=50)
    >>> steps = torch.tensor([0, 10])
    >>> x, eps = torch.randn(2, 4, 8, 8), torch.randn(2, 4, 8, 8)
    >>> mean, std = kernel.mean(x, steps, eps), kernel.std[steps]
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

import torch

from .gaussian_sde import SDE_SCHEDULERS, SDE_SUPPORTED, DeterministicScheduler, sde_tables

SUPPORTED = ("DDPMScheduler", "DDIMScheduler (eta > 0)", "EulerAncestralDiscreteScheduler", *SDE_SUPPORTED)
DDPM_VARIANCES = ("fixed_small", "fixed_small_log", "fixed_large")


def _deterministic_error(scheduler: Any, detail: str) -> ValueError:
    return ValueError(
        f"{type(scheduler).__name__}{detail} is deterministic or not Gaussian with a fixed std: exact speculative "
        f"sampling needs a stochastic sampler. Supported: {', '.join(SUPPORTED)}. E.g. "
        "pipe.scheduler = DDPMScheduler.from_config(pipe.scheduler.config)"
    )


class GaussianTransition:
    """The transition of a stochastic scheduler at ``num_inference_steps``, as pure tensor functions.

    Args:
        scheduler: a diffusers scheduler (copied; the original is not touched).
        num_inference_steps: the sampler's number of steps.
        eta: DDIM's noise level (the sampler's, since DDIM takes it per call); ignored otherwise.
        device: where the tables live.
        mu: the resolution shift of flow-matching schedulers with ``use_dynamic_shifting``
            (passed to ``set_timesteps`` as the pipeline does).
        sigmas: a sigma schedule the pipeline passes to ``set_timesteps`` in place of the number of
            steps (``FluxPipeline``); ``num_inference_steps`` must be its length.

    Attributes:
        timesteps: ``(N,)`` the model timestep of each step index.
        std: ``(N,)`` float32, the transition's standard deviation (0 at deterministic steps,
            typically the last).
        history: how many previous converted model outputs the mean needs (``solver_order - 1``
            for a multistep DPM-Solver, else 0).

    Raises:
        ValueError: a deterministic or unsupported scheduler, naming the supported ones.
    """

    def __init__(self, scheduler: Any, num_inference_steps: int, *, eta: float = 1.0,
                 device: str | torch.device = "cpu", mu: float | None = None,
                 sigmas: Sequence[float] | None = None) -> None:
        name = type(scheduler).__name__
        config = scheduler.config
        prediction = config.get("prediction_type", "epsilon")
        if prediction not in ("epsilon", "sample", "v_prediction") and name not in SDE_SCHEDULERS:
            raise ValueError(f"prediction_type={prediction!r} is not supported; use epsilon, sample or v_prediction")
        self.scheduler = copy.deepcopy(scheduler)
        custom: dict[str, Any] = {} if mu is None else {"mu": mu}
        if sigmas is None:
            self.scheduler.set_timesteps(num_inference_steps, device="cpu", **custom)
        elif len(sigmas) != num_inference_steps:
            raise ValueError(f"{len(sigmas)} sigmas for {num_inference_steps} steps")
        else:
            self.scheduler.set_timesteps(sigmas=sigmas, device="cpu", **custom)
        self.name, self.prediction, self.eta = name, prediction, eta
        self.num_steps = num_inference_steps
        self.timesteps = self.scheduler.timesteps.clone()
        if name == "DDPMScheduler":
            self._ddpm_tables(config)
        elif name == "DDIMScheduler":
            if not eta > 0:
                raise _deterministic_error(scheduler, f" with eta={eta}")
            self._ddim_tables(config)
        elif name == "EulerAncestralDiscreteScheduler":
            if prediction == "sample":
                raise ValueError("EulerAncestralDiscreteScheduler does not support prediction_type='sample'")
            self._euler_tables()
        elif name in SDE_SCHEDULERS:
            try:
                for key, table in sde_tables(self.scheduler).items():
                    setattr(self, key, table)
            except DeterministicScheduler as err:
                raise _deterministic_error(scheduler, f" with {err}" if str(err) != name else "") from None
        else:
            raise _deterministic_error(scheduler, "")
        self.timesteps = self.timesteps.to(device)
        self.history = self.c_hist.shape[1] - 1 if hasattr(self, "c_hist") else 0
        for key in ("std", "a_t", "c_x0", "c_x", "c_eps", "sigma", "in_scale", "k_x", "k_out", "k_div", "u_x", "u_x0",
                    "c_hist"):
            if hasattr(self, key):
                setattr(self, key, getattr(self, key).to(device))

    # ------------------------------------------------------------------ tables
    def _alphas(self, t: torch.Tensor) -> torch.Tensor:
        return self.scheduler.alphas_cumprod[t.long()]

    def _ddpm_tables(self, config: Any) -> None:
        variance_type = config.get("variance_type", "fixed_small")
        if variance_type not in DDPM_VARIANCES:
            raise ValueError(f"DDPMScheduler variance_type={variance_type!r}: the std depends on the model output; "
                             f"exact speculation supports {', '.join(DDPM_VARIANCES)}")
        s = self.scheduler
        prev = torch.stack([torch.as_tensor(s.previous_timestep(t)) for t in self.timesteps])
        a_t = self._alphas(self.timesteps)
        a_prev = torch.where(prev >= 0, s.alphas_cumprod[prev.clamp_min(0).long()], s.one)
        cur_alpha = a_t / a_prev
        cur_beta = 1 - cur_alpha
        self.a_t = a_t
        self.c_x0 = a_prev**0.5 * cur_beta / (1 - a_t)
        self.c_x = cur_alpha**0.5 * (1 - a_prev) / (1 - a_t)
        small = torch.clamp((1 - a_prev) / (1 - a_t) * cur_beta, min=1e-20)
        var = cur_beta if variance_type == "fixed_large" else small
        self.std = torch.where(self.timesteps > 0, var**0.5, torch.zeros_like(var)).float()

    def _ddim_tables(self, config: Any) -> None:
        s = self.scheduler
        prev = self.timesteps - config.num_train_timesteps // self.num_steps
        a_t = self._alphas(self.timesteps)
        a_prev = torch.where(prev >= 0, s.alphas_cumprod[prev.clamp_min(0).long()], s.final_alpha_cumprod)
        variance = (1 - a_prev) / (1 - a_t) * (1 - a_t / a_prev)
        std = self.eta * variance**0.5
        self.a_t = a_t
        self.c_x0 = a_prev**0.5
        self.c_eps = (1 - a_prev - std**2) ** 0.5
        self.std = std.float()

    def _euler_tables(self) -> None:
        sig = self.scheduler.sigmas.float()
        sigma, sigma_to = sig[:-1], sig[1:]
        sigma_up = (sigma_to**2 * (sigma**2 - sigma_to**2) / sigma**2) ** 0.5
        sigma_down = (sigma_to**2 - sigma_up**2) ** 0.5
        self.sigma = sigma
        self.c_x = sigma_down / sigma  # mean = x + (x - x0) / sigma * (sigma_down - sigma)
        self.in_scale = 1 / (sigma**2 + 1) ** 0.5
        self.std = sigma_up.float()

    # ------------------------------------------------------------------ per-row functions
    @staticmethod
    def _rows(table: torch.Tensor, steps: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
        return table[steps].view(-1, *([1] * (like.dim() - 1)))

    def model_input(self, x: torch.Tensor, steps: torch.Tensor) -> torch.Tensor:
        """``scheduler.scale_model_input`` at each row's step."""
        if self.name == "EulerAncestralDiscreteScheduler":
            return x / (self._rows(self.sigma, steps, x) ** 2 + 1) ** 0.5
        return x

    def x0(self, x: torch.Tensor, steps: torch.Tensor, model_output: torch.Tensor) -> torch.Tensor:
        """The predicted clean sample, clipped or thresholded as the scheduler does."""
        if hasattr(self, "k_out"):  # the SDE schedulers: x0 linear in (x, output)
            x0 = self._rows(self.k_x, steps, x) * x.float() + self._rows(self.k_out, steps, x) * model_output.float()
            if hasattr(self, "k_div"):
                x0 = x0 / self._rows(self.k_div, steps, x)
            return self.scheduler._threshold_sample(x0) if self.scheduler.config.get("thresholding", False) else x0
        if self.name == "EulerAncestralDiscreteScheduler":
            sigma = self._rows(self.sigma, steps, x)
            x = x.float()
            if self.prediction == "epsilon":
                return x - sigma * model_output
            return model_output * (-sigma / (sigma**2 + 1) ** 0.5) + x / (sigma**2 + 1)
        a = self._rows(self.a_t, steps, x)
        if self.prediction == "epsilon":
            x0 = (x - (1 - a) ** 0.5 * model_output) / a**0.5
        elif self.prediction == "sample":
            x0 = model_output
        else:
            x0 = a**0.5 * x - (1 - a) ** 0.5 * model_output
        config = self.scheduler.config
        if config.get("thresholding", False):
            return self.scheduler._threshold_sample(x0)
        if config.get("clip_sample", False):
            return x0.clamp(-config.clip_sample_range, config.clip_sample_range)
        return x0

    def _eps(self, x: torch.Tensor, steps: torch.Tensor, model_output: torch.Tensor) -> torch.Tensor:
        a = self._rows(self.a_t, steps, x)
        if self.prediction == "epsilon":
            return model_output
        if self.prediction == "sample":
            return (x - a**0.5 * model_output) / (1 - a) ** 0.5
        return a**0.5 * model_output + (1 - a) ** 0.5 * x

    def mean(self, x: torch.Tensor, steps: torch.Tensor, model_output: torch.Tensor,
             hist: torch.Tensor | None = None) -> torch.Tensor:
        """The target's transition mean at each row's step (what ``scheduler.step`` adds noise to).

        ``hist``: ``(B, history, ...)`` the previous converted outputs (latest first) where
        :attr:`history` > 0 (rows at early steps ignore the entries before step 0)."""
        x0 = self.x0(x, steps, model_output)
        if self.name == "DDIMScheduler":
            return self._rows(self.c_x0, steps, x) * x0 + self._rows(self.c_eps, steps, x) * self._eps(
                x, steps, model_output)
        return self.draft_mean(x, steps, x0, hist)

    def draft_mean(self, x: torch.Tensor, steps: torch.Tensor, x0: torch.Tensor,
                   hist: torch.Tensor | None = None) -> torch.Tensor:
        """The transition mean with a given (e.g. frozen) ``x0``: affine in ``x``, ``x0`` (and ``hist``)."""
        if self.name == "EulerAncestralDiscreteScheduler":
            c = self._rows(self.c_x, steps, x)
            return c * x.float() + (1 - c) * x0
        if self.name == "DDIMScheduler":
            a = self._rows(self.a_t, steps, x)
            eps = (x - a**0.5 * x0) / (1 - a) ** 0.5
            return self._rows(self.c_x0, steps, x) * x0 + self._rows(self.c_eps, steps, x) * eps
        mean = self._rows(self.c_x0, steps, x) * x0 + self._rows(self.c_x, steps, x) * x
        if not self.history:
            return mean
        if hist is None or hist.shape[:2] != (x.shape[0], self.history):
            raise ValueError(f"{self.name}(solver_order={self.history + 1}): hist must be (batch, {self.history}, ...) "
                             f"the previous converted outputs; got {None if hist is None else tuple(hist.shape)}")
        w = self.c_hist[steps].view(*self.c_hist[steps].shape, *([1] * (x.dim() - 1)))  # (B, history + 1, 1...)
        terms = torch.cat([self.converted(x, steps, x0).unsqueeze(1), hist.float()], 1)
        return mean + (w * terms).sum(1)

    def converted(self, x: torch.Tensor, steps: torch.Tensor, x0: torch.Tensor) -> torch.Tensor:
        """The multistep solver's stored model output at these rows (``x0``, or ``eps`` for ``sde-dpmsolver``):
        what the next steps' ``hist`` holds. Only for kernels with :attr:`history` > 0."""
        return self._rows(self.u_x, steps, x) * x.float() + self._rows(self.u_x0, steps, x) * x0.float()

    def stochastic_steps(self) -> int:
        """Leading steps with ``std > 0`` (speculated); the rest run plainly.

        Raises:
            ValueError: a deterministic step before a stochastic one.
        """
        return stochastic_prefix(self.std, self.name)


def stochastic_prefix(std: torch.Tensor, name: str) -> int:
    """Leading steps of a std table with ``std > 0``; ``ValueError`` if a deterministic step comes before a
    stochastic one (``name`` names the sampler in the message).

    Example:
        >>> stochastic_prefix(torch.tensor([0.5, 0.2, 0.0]), "toy")
        2
    """
    positive = (std > 0).tolist()
    n = positive.index(False) if False in positive else len(positive)
    if any(positive[n:]):
        raise ValueError(f"{name}: step {n} is deterministic but later steps are not; cannot speculate")
    return n
