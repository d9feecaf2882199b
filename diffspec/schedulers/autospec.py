"""Autospeculative decoding (ASD, Hu et al. 2025): exact parallel DDPM sampling by exchangeability.

In the stochastic-localization view of DDPM, ``theta' = theta + eta x0_hat(theta) + sqrt(eta) xi``:
given the present state, the future increments are exchangeable, so the law of the next increment
is a draft for each of the following ones. Per round, from a root ``X`` whose ``x0`` prediction is
known exactly:

1. draw ``L`` steps with that ``x0`` frozen (the first one is an exact step, always kept);
2. evaluate the network on the drafted states ``Y_1 .. Y_L`` in one batched call;
3. couple steps ``2 .. L`` with the reflection maximal coupling; keep the accepted prefix and the
   corrected step at the first rejection.

If every step was kept, the last row's ``x0`` is the next root's; after a rejection the corrected
state is evaluated at the start of the next round (one more call, batched over the trajectories
that need it). With a DDPM kernel the frozen-``x0`` mean is the scheduler's own affine mean, so the
first step is exact. The same holds for the multistep SDE-DPM-Solver(++) kernels (mean affine in
``x0`` and the history of converted outputs, see
:class:`~diffspec.schedulers.speculative.SpeculativeSampler` for how the history is carried), which
are accepted too: exactness comes from the coupling, the exchangeability argument only explains
why the draft is good for DDPM.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from ..config import AutospecConfig
from ..kernels import reflection_coupling
from ..speculation.coupling import first_rejections
from ..stats import SpecStats
from .gaussian import GaussianTransition
from .speculative import Denoise, Generators, SpeculativeSampler, chain_history, draw

ASD_SCHEDULERS = ("DDPMScheduler", "DPMSolverMultistepScheduler")
"""Kernels whose mean with the root's exact ``x0`` frozen is the target mean (the first step is exact)."""


class AutospecSampler(SpeculativeSampler):
    """ASD on a DDPM (or multistep SDE-DPM-Solver) :class:`GaussianTransition` (see the module docstring).

    Raises:
        ValueError: a kernel other than those of :data:`ASD_SCHEDULERS`.
    """

    def __init__(self, kernel: GaussianTransition, denoise: Denoise, config: AutospecConfig, stats: SpecStats) -> None:
        if kernel.name not in ASD_SCHEDULERS:
            raise ValueError(f"method 'autospec' (ASD) needs one of {', '.join(ASD_SCHEDULERS)}; the scheduler is "
                             f"{kernel.name}. Use DDPMScheduler, or method='coupling' for the others")
        super().__init__(kernel, denoise, config, stats)  # type: ignore[arg-type]

    def _draft_mean(self, y: torch.Tensor, steps: torch.Tensor, frozen: torch.Tensor,
                    hist: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        return self._kernel_draft(y, steps, frozen, hist)

    def sample(self, x: torch.Tensor, generator: Generators = None,
               on_progress: Callable[[int], None] | None = None) -> torch.Tensor:
        kernel, batch, dtype = self.kernel, x.shape[0], x.dtype
        n_stoch = kernel.stochastic_steps()
        traj_all = torch.arange(batch, device=x.device)
        n = torch.zeros(batch, dtype=torch.long)  # committed step per trajectory (host)
        frozen = torch.zeros_like(x, dtype=torch.float32)
        fresh = torch.zeros(batch, dtype=torch.bool)  # frozen holds x0 at the current root (host)
        lookahead = torch.full((batch,), self.config.lookahead, dtype=torch.long)  # per trajectory (host)
        self.state = x  # the committed states, updated in place each round (read by callbacks)
        self.hist = self._new_history(x)  # committed multistep history (None: one-state kernel)
        while bool((n < n_stoch).any()):
            stale = ((n < n_stoch) & ~fresh).nonzero().flatten()
            if stale.numel():  # roots not evaluated yet (start, or a corrected state): one batched call
                rows = stale.to(x.device)
                hist = None if self.hist is None else self.hist[rows]
                frozen[rows] = self._target(x[rows], n[stale].to(x.device), rows, hist).x0.float()
                fresh[stale] = True
            self._asd_round(x, n, frozen, fresh, n_stoch, lookahead, generator)
            if on_progress is not None:
                on_progress(int(n.min()))
        x = self._plain_tail(x, n_stoch, kernel.num_steps, traj_all).to(dtype)
        self._finish(batch)
        return x

    def _asd_round(self, x: torch.Tensor, n: torch.Tensor, frozen: torch.Tensor, fresh: torch.Tensor, n_stoch: int,
                   lookahead: torch.Tensor, generator: Generators) -> None:
        dev = x.device
        active = (n < n_stoch).nonzero().flatten()
        lengths = torch.minimum(n_stoch - n[active], lookahead[active])
        depth = int(lengths.max())
        active_d, na = active.to(dev), n[active].to(dev)
        ha = None if self.hist is None else self.hist[active_d]
        states, noises, means = self._draft(x[active_d], na, frozen[active_d], depth, generator, active, lengths, ha)
        # rows Y_j (j = 1 .. length) at step n + j: they verify step j + 1 and give the next root's x0
        cols = torch.arange(depth).view(1, -1)
        evaluated = (cols < lengths.view(-1, 1)) & (n[active].view(-1, 1) + cols + 1 < self.kernel.num_steps)
        ea, ej = evaluated.nonzero(as_tuple=True)
        ea_d, ej_d = ea.to(dev), ej.to(dev)
        ys = torch.stack(states[1:], 1)[ea_d, ej_d]
        chain, seq = None, {}
        if ha is not None:  # depth 0: the root's exact output; depth j + 1: row (a, j) of this call
            root = self.kernel.converted(x[active_d], na, frozen[active_d])

            def chain(converted: torch.Tensor) -> torch.Tensor:
                seq["new"] = torch.zeros((len(active), depth + 1, *x.shape[1:]), device=dev)
                seq["new"][:, 0] = root
                seq["new"][ea_d, ej_d + 1] = converted.float()
                return chain_history(ha, seq["new"], ea_d, ej_d + 1)
        target = self._target(ys, na[ea_d] + ej_d + 1, active_d[ea_d], chain)
        # couple step j + 1 (column j >= 1) against the target mean at Y_j (evaluated row (a, j - 1))
        checked = evaluated[:, :-1] & (cols[:, 1:] < lengths.view(-1, 1))  # (A, depth - 1): step column j + 1
        ca, cj = checked.nonzero(as_tuple=True)
        row_of = torch.full((len(active), depth), -1, dtype=torch.long)
        row_of[ea, ej] = torch.arange(len(ea))
        src = row_of[ca, cj].to(dev)
        ca_d, cj_d = ca.to(dev), (cj + 1).to(dev)
        pick = lambda seq: torch.stack(seq, 1)[ca_d, cj_d]  # noqa: E731
        steps = na[ca_d] + cj_d
        uniform = draw("uniform", (), generator, active[ca], dev, torch.float64)
        coupled = reflection_coupling(pick(states[1:]), pick(noises), pick(means), target.mean[src],
                                      self.kernel.std.to(dev)[steps], uniform)
        valid = cols < lengths.view(-1, 1)
        accepted = valid.clone()  # column 0 (the exact first step) is always kept
        accepted[ca, cj + 1] = coupled.accepted.cpu()  # the round's one host read
        committed = first_rejections(accepted, lengths)
        samples = torch.stack(states[1:], 1)  # accepted columns keep their drafts
        samples[ca_d, cj_d] = coupled.sample
        a_idx = torch.arange(len(active))
        x[active_d] = samples[a_idx.to(dev), (committed - 1).to(dev)]
        kept_all = accepted[a_idx, committed - 1]  # the last committed step was a kept draft
        next_row = row_of[a_idx, committed - 1]
        reuse = kept_all & (next_row >= 0)
        if bool(reuse.any()):
            frozen[active_d[reuse.to(dev)]] = target.x0[next_row[reuse].to(dev)].float()
        fresh[active] = reuse
        if ha is not None:  # target outputs at the committed states only
            self.hist[active_d] = self._committed_history(ha, seq["new"], committed.to(dev))
        n[active] += committed
        self._count(accepted, valid, committed, first=1)
        lookahead[active] = self._next_lookahead(committed, lengths, lookahead[active])
