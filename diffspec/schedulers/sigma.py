"""Sigma-parameterised ancestral samplers (k-diffusion / ComfyUI) as pure Gaussian transitions.

k-diffusion style samplers walk a decreasing list of noise levels ``sigmas`` (``N + 1`` values, the
last usually 0) and call a denoiser that returns the predicted clean sample ``x0`` directly. The
ancestral ones take each step as ``x' = c_x x + c_x0 x0 + std * z`` with ``z ~ N(0, I)`` and
coefficients that depend on the step only. :class:`SigmaTransition` tabulates them, so the exact
speculative sampler (:class:`~diffspec.schedulers.speculative.SpeculativeSampler`) can evaluate any
row at its own step, exactly as :class:`~diffspec.schedulers.gaussian.GaussianTransition` does for
diffusers' schedulers. The step laws are those of ComfyUI's ``comfy/k_diffusion/sampling.py``:

- ``euler_ancestral`` on noise-prediction models (``x = x0 + sigma * eps``): ``get_ancestral_step``
  gives ``sigma_up = min(s', eta * sqrt(s'^2 (s^2 - s'^2) / s^2))`` and
  ``sigma_down = sqrt(s'^2 - sigma_up^2)``; ``x' = x + (x - x0) / s * (sigma_down - s) +
  s_noise * sigma_up * z``, and ``x' = x0`` when ``sigma_down == 0``.
- ``euler_ancestral`` on flow models (ComfyUI's ``CONST`` sampling, ``x = (1 - sigma) x0 + sigma eps``;
  ``sample_euler_ancestral_RF``): ``sigma_down = s' (1 + (s'/s - 1) eta)``, ``a' = 1 - s'``,
  ``a_d = 1 - sigma_down``; ``x' = (a'/a_d) ((sigma_down/s) x + (1 - sigma_down/s) x0) +
  s_noise * sqrt(s'^2 - sigma_down^2 a'^2 / a_d^2) * z``, and ``x' = x0`` when ``s' == 0``.
- ``ddpm`` (``sample_ddpm``, the DDPM posterior step in the variance-preserving scaling
  ``x / sqrt(1 + s^2)``; ComfyUI applies the same formula whatever the model's sampling type):
  ``abar = 1 / (1 + s^2)``, ``alpha = abar / abar'``, mean
  ``sqrt(1 + s'^2) / sqrt(alpha) * (x / sqrt(1 + s^2) - (1 - alpha) / sqrt(1 - abar) * (x - x0) / s)``,
  std ``sqrt(1 + s'^2) * sqrt((1 - alpha) (1 - abar') / (1 - abar))`` (0 when ``s' == 0``).

Example:
    >>> kernel = SigmaTransition(torch.tensor([14.6, 5.0, 1.0, 0.0]), "euler_ancestral")
    >>> steps, x, x0 = torch.tensor([0, 2]), torch.randn(2, 4), torch.randn(2, 4)
    >>> kernel.mean(x, steps, x0).shape, kernel.std[2].item()
    (torch.Size([2, 4]), 0.0)
"""

from __future__ import annotations

import math

import torch

from .gaussian import stochastic_prefix

KINDS = ("euler_ancestral", "ddpm")
"""The sigma-space ancestral samplers :class:`SigmaTransition` implements (ComfyUI's names)."""


def _check(name: str, value: float, lo: float, hi: float, lo_open: bool = False) -> None:
    if not isinstance(value, (int, float)) or isinstance(value, bool) or math.isnan(value) or not (
            (lo < value if lo_open else lo <= value) and value <= hi):
        raise ValueError(f"{name}={value!r} is out of range: allowed {'(' if lo_open else '['}{lo}, {hi}]")


class SigmaTransition:
    """A k-diffusion ancestral sampler over ``sigmas``, as pure per-row tensor functions.

    The denoiser returns ``x0`` itself, so the model input is the state and the model output is the
    predicted clean sample; the mean is affine in both: ``mean = c_x[i] x + c_x0[i] x0``.

    Args:
        sigmas: ``(N + 1,)`` non-increasing noise levels, all but the last > 0.
        kind: one of :data:`KINDS`.
        flow: the model uses rectified-flow (ComfyUI ``CONST``) sampling; changes ``euler_ancestral``.
        eta: ancestral noise fraction in (0, 1] (``euler_ancestral``; ``ddpm`` has none).
        s_noise: noise multiplier >= 0 (``euler_ancestral``; ``ddpm`` has none).
        device: where the tables live (default: the sigmas' device).

    Attributes:
        sigmas: the noise levels (float32).
        num_steps: ``N``.
        c_x, c_x0, std: ``(N,)`` float32 tables (``std`` is 0 at deterministic steps, e.g. the last).

    Raises:
        ValueError: an unknown kind, out-of-range eta / s_noise, or sigmas that are not a
            non-increasing list with positive values before the last.
    """

    def __init__(self, sigmas: torch.Tensor, kind: str = "euler_ancestral", *, flow: bool = False,
                 eta: float = 1.0, s_noise: float = 1.0, device: str | torch.device | None = None) -> None:
        if kind not in KINDS:
            raise ValueError(f"kind={kind!r} is not supported: allowed {', '.join(KINDS)}")
        _check("eta", eta, 0.0, 1.0, lo_open=True)
        _check("s_noise", s_noise, 0.0, 1e3)
        sigmas = torch.as_tensor(sigmas)
        if sigmas.dim() != 1 or sigmas.numel() < 2:
            raise ValueError(f"sigmas must be a 1-D list of at least 2 noise levels, got shape {tuple(sigmas.shape)}")
        s64 = sigmas.detach().double().cpu()
        if not bool(torch.isfinite(s64).all()) or bool((s64[:-1] <= 0).any()) or bool((s64[1:] > s64[:-1]).any()):
            raise ValueError(f"sigmas must be finite, non-increasing and > 0 before the last, got {s64.tolist()}")
        self.kind, self.flow, self.eta, self.s_noise = kind, bool(flow), float(eta), float(s_noise)
        self.name = f"{kind}{'_RF' if flow and kind == 'euler_ancestral' else ''}"
        self.num_steps = sigmas.numel() - 1
        s, t = s64[:-1], s64[1:]
        if kind == "ddpm":
            c_x, c_x0, std = self._ddpm(s, t)
        elif flow:
            c_x, c_x0, std = self._euler_ancestral_rf(s, t)
        else:
            c_x, c_x0, std = self._euler_ancestral(s, t)
        device = sigmas.device if device is None else device
        self.sigmas = sigmas.detach().float().to(device)
        self.c_x, self.c_x0, self.std = (v.float().to(device) for v in (c_x, c_x0, std))

    # ------------------------------------------------------------------ tables (float64)
    def _euler_ancestral(self, s: torch.Tensor, t: torch.Tensor) -> tuple[torch.Tensor, ...]:
        up = torch.minimum(t, self.eta * (t**2 * (s**2 - t**2) / s**2).clamp_min(0).sqrt())
        down = (t**2 - up**2).clamp_min(0).sqrt()
        final = down == 0  # comfy: x = denoised, no noise
        ratio = torch.where(final, torch.zeros_like(s), down / s)
        return ratio, 1 - ratio, torch.where(final, torch.zeros_like(s), self.s_noise * up)

    def _euler_ancestral_rf(self, s: torch.Tensor, t: torch.Tensor) -> tuple[torch.Tensor, ...]:
        final = t == 0  # comfy: x = denoised
        down = t * (1 + (t / s - 1) * self.eta)
        scale = (1 - t) / (1 - down)
        ratio = down / s
        renoise = (t**2 - down**2 * scale**2).clamp_min(0).sqrt()
        zero = torch.zeros_like(s)
        return (torch.where(final, zero, scale * ratio), torch.where(final, zero + 1, scale * (1 - ratio)),
                torch.where(final, zero, self.s_noise * renoise))

    @staticmethod
    def _ddpm(s: torch.Tensor, t: torch.Tensor) -> tuple[torch.Tensor, ...]:
        abar, abar_next = 1 / (s**2 + 1), 1 / (t**2 + 1)
        alpha = abar / abar_next
        out_scale = (1 + t**2).sqrt()
        k = out_scale / alpha.sqrt()
        g = (1 - alpha) / ((1 - abar).sqrt() * s)  # coefficient of eps = (x - x0) / s
        std = out_scale * ((1 - alpha) * (1 - abar_next) / (1 - abar)).sqrt()
        return k * (1 / (1 + s**2).sqrt() - g), k * g, torch.where(t > 0, std, torch.zeros_like(std))

    # ------------------------------------------------------------------ per-row functions
    @staticmethod
    def _rows(table: torch.Tensor, steps: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
        return table[steps].view(-1, *([1] * (like.dim() - 1)))

    def model_input(self, x: torch.Tensor, steps: torch.Tensor) -> torch.Tensor:
        """The denoiser's input: the state itself (k-diffusion denoisers scale their own input)."""
        return x

    def x0(self, x: torch.Tensor, steps: torch.Tensor, model_output: torch.Tensor) -> torch.Tensor:
        """The predicted clean sample: the denoiser's output itself."""
        return model_output.float()

    history = 0
    """One-state kernel: no multistep history (the ``hist`` arguments are ignored)."""

    def mean(self, x: torch.Tensor, steps: torch.Tensor, model_output: torch.Tensor,
             hist: torch.Tensor | None = None) -> torch.Tensor:
        """The step's mean at each row's step given the denoiser's output there."""
        return self.draft_mean(x, steps, model_output)

    def draft_mean(self, x: torch.Tensor, steps: torch.Tensor, x0: torch.Tensor,
                   hist: torch.Tensor | None = None) -> torch.Tensor:
        """``c_x x + c_x0 x0`` at each row's step (``x0`` may be a frozen one)."""
        return self._rows(self.c_x, steps, x) * x.float() + self._rows(self.c_x0, steps, x) * x0.float()

    def stochastic_steps(self) -> int:
        """Leading steps with ``std > 0`` (speculated); the rest run plainly.

        Raises:
            ValueError: a deterministic step before a stochastic one.
        """
        return stochastic_prefix(self.std, self.name)
