"""Fused kernels for the hot non-model steps, each with its torch reference (fallback and test oracle).

Every entry point takes ``backend=None`` (auto: Triton on CUDA when triton imports and
``DIFFSPEC_KERNELS`` is not ``"0"``, else the torch reference), ``"torch"`` or ``"triton"``; see
:mod:`diffspec.kernels.dispatch`. This package imports nothing else from diffspec, and triton
only when a kernel runs.

Example:
    >>> import torch
    >>> from diffspec import kernels
    >>> kernels.forecast([torch.zeros(1, 2), torch.ones(1, 2)], [-1.0, 2.0]).tolist()
    [[2.0, 2.0]]
"""

from .accept import inverse_cdf, rejection_sample, speculative_accept, warp_reference
from .anchors import AnchorRing, forecast, l1_error
from .coupling import Coupled, reflection_coupling
from .dispatch import use_triton
from .tolerance import beta_tolerance, bin_tolerance

__all__ = ["AnchorRing", "Coupled", "beta_tolerance", "bin_tolerance", "forecast", "inverse_cdf", "l1_error", "reflection_coupling", "rejection_sample",
           "speculative_accept", "use_triton", "warp_reference"]
