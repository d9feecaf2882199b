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
from .speculative import Denoise, Generators, SpeculativeSampler, _Target, chain_history, draw

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
        """One round from fresh roots; updates ``x``, ``n``, ``frozen``, ``fresh``, ``lookahead`` in place.

        Column ``j`` of the round is drafted state ``Y_{j+1}`` at step ``n + j + 1``. It is evaluated
        where that step is stochastic: it verifies column ``j + 1`` or, if every step was kept, gives
        the next root's ``x0``. A round with no such state (one step left, or a lookahead of 1 at the
        last stochastic step) makes no call and draws no uniform.
        """
        dev = x.device
        active = (n < n_stoch).nonzero().flatten()
        lengths = torch.minimum(n_stoch - n[active], lookahead[active])
        depth = int(lengths.max())
        active_d, na = active.to(dev), n[active].to(dev)
        ha = None if self.hist is None else self.hist[active_d]
        states, noises, means = self._draft(x[active_d], na, frozen[active_d], depth, generator, active, lengths, ha)
        cols = torch.arange(depth).view(1, -1)
        valid = cols < lengths.view(-1, 1)
        evaluated = valid & (n[active].view(-1, 1) + cols + 1 < n_stoch)
        ea, ej = evaluated.nonzero(as_tuple=True)
        row_of = torch.full((len(active), depth), -1, dtype=torch.long)
        row_of[ea, ej] = torch.arange(len(ea))
        target, chain_new = self._evaluate(states, x[active_d], na, frozen[active_d], active_d, ha, (ea, ej), depth)
        accepted = valid.clone()  # column 0 (the exact first step) is always kept
        samples = torch.stack(states[1:], 1)  # accepted columns keep their drafts
        checked = evaluated[:, :-1] & valid[:, 1:]  # column j + 1 is coupled against the target at Y_{j+1}
        if target is not None and bool(checked.any()):
            ca, cj = checked.nonzero(as_tuple=True)
            ca_d, cj_d = ca.to(dev), (cj + 1).to(dev)
            pick = lambda seq: torch.stack(seq, 1)[ca_d, cj_d]  # noqa: E731
            uniform = draw("uniform", (), generator, active[ca], dev, torch.float64)
            coupled = reflection_coupling(pick(states[1:]), pick(noises), pick(means),
                                          target.mean[row_of[ca, cj].to(dev)],
                                          self.kernel.std.to(dev)[na[ca_d] + cj_d], uniform)
            accepted[ca, cj + 1] = coupled.accepted.cpu()  # the round's one host read
            samples[ca_d, cj_d] = coupled.sample
        committed = first_rejections(accepted, lengths)
        a_idx = torch.arange(len(active))
        x[active_d] = samples[a_idx.to(dev), (committed - 1).to(dev)]
        next_row = row_of[a_idx, committed - 1]
        reuse = accepted[a_idx, committed - 1] & (next_row >= 0)  # the last committed step was a kept draft
        if target is not None and bool(reuse.any()):
            frozen[active_d[reuse.to(dev)]] = target.x0[next_row[reuse].to(dev)].float()
        fresh[active] = reuse
        if ha is not None:  # target outputs at the committed states only
            self.hist[active_d] = self._committed_history(ha, chain_new, committed.to(dev))
        n[active] += committed
        self._count(accepted, valid, committed, first=1)
        lookahead[active] = self._next_lookahead(committed, lengths, lookahead[active])

    def _evaluate(self, states: list[torch.Tensor], root: torch.Tensor, n: torch.Tensor, x0: torch.Tensor,
                  traj: torch.Tensor, hist: torch.Tensor | None, rows: tuple[torch.Tensor, torch.Tensor], depth: int
                  ) -> tuple[_Target | None, torch.Tensor | None]:
        """One target call on the drafted states at ``rows`` (``(a, j)``: ``Y_{j+1}`` of chain ``a``), or
        none (``None``) when there are no rows. With a multistep kernel also the converted outputs along
        each chain, ``(A, depth + 1, ...)``: the root's at depth 0, row ``(a, j)``'s at depth ``j + 1``."""
        dev = root.device
        ea, ej = (r.to(dev) for r in rows)
        chain_new, chain = None, None
        if hist is not None:
            chain_new = torch.zeros((len(root), depth + 1, *root.shape[1:]), device=dev)
            chain_new[:, 0] = self.kernel.converted(root, n, x0)

            def chain(converted: torch.Tensor) -> torch.Tensor:
                chain_new[ea, ej + 1] = converted.float()
                return chain_history(hist, chain_new, ea, ej + 1)
        if not len(ea):
            return None, chain_new
        ys = torch.stack(states[1:], 1)[ea, ej]
        return self._target(ys, n[ea] + ej + 1, traj[ea], chain), chain_new
