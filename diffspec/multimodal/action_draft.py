"""Training-free action drafts for ``relaxed-action``: the previous action, or a Kalman extrapolation.

Both work on continuous actions ``history`` (B, H, n_dof) (oldest first) and return the next
action's draft (B, n_dof); the caller re-bins it with its
:class:`~diffspec.multimodal.action_map.ActionTokenMap`. Without history the draft is the
centre of the range (zero action in normalised units).

Example:
    >>> import torch
    >>> h = torch.tensor([[[0.0], [0.1], [0.2]]])
    >>> previous_draft(h).tolist()
    [[0.20000000298023224]]
    >>> round(float(kalman_draft(h, process_noise=1e-3, measurement_noise=1e-6)), 3)
    0.3
"""

from __future__ import annotations

import torch


def previous_draft(history: torch.Tensor) -> torch.Tensor:
    """The last action of each row (zeros without history)."""
    if history.shape[1] == 0:
        return history.new_zeros(history.shape[0], history.shape[2])
    return history[:, -1]


def kalman_draft(history: torch.Tensor, *, process_noise: float, measurement_noise: float,
                 context: int = 10) -> torch.Tensor:
    """Constant-velocity Kalman filter per row and DoF over the last ``context`` actions, one step ahead.

    State ``[x, v]`` with ``x' = x + v``, white-acceleration process noise ``q * [[1/4, 1/2], [1/2, 1]]``
    and measurement noise ``r`` on ``x``. The filter starts at the oldest action with zero velocity
    and a broad velocity prior, so two actions give linear extrapolation ``2 a_t - a_{t-1}``, longer
    histories a smoothed slope. The loop runs over the (at most ``context``) time steps only; rows
    and DoFs are batched.

    Args:
        history: (B, H, n_dof) past actions, oldest first.
        process_noise: ``q``.
        measurement_noise: ``r``.
        context: number of most recent actions used.

    Returns:
        (B, n_dof) the predicted next action.
    """
    h = history[:, -context:].float()
    if h.shape[1] < 2:
        return previous_draft(h)
    q, r = process_noise, measurement_noise
    x, v = h[:, 0].clone(), torch.zeros_like(h[:, 0])
    p00, p01, p11 = torch.full_like(x, r), torch.zeros_like(x), torch.ones_like(x)
    for t in range(1, h.shape[1]):
        # predict: P = F P F^T + Q
        x = x + v
        p00, p01, p11 = p00 + 2 * p01 + p11 + q / 4, p01 + p11 + q / 2, p11 + q
        # update with z = h[:, t]
        s = p00 + r
        k0, k1 = p00 / s, p01 / s
        y = h[:, t] - x
        x, v = x + k0 * y, v + k1 * y
        p00, p01, p11 = (1 - k0) * p00, (1 - k0) * p01, p11 - k1 * p01
    return x + v
