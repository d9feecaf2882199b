"""Exact speculative sampling of a stochastic diffusion sampler (De Bortoli et al.; the ``coupling`` method).

Per round, for every trajectory at its committed step ``n`` with state ``X``:

1. draft ``L`` steps without the network: ``Y_0 = X``, ``Y_j = a_j + s_j z_j`` with the draft mean
   ``a_j`` built from a quantity frozen at the last target call (``x0`` by default);
2. evaluate the target once on every drafted state ``Y_0 .. Y_{L-1}`` of every trajectory (one
   batched call, per-row timesteps), giving the target means ``b_j``;
3. couple step ``j`` with :func:`~diffspec.kernels.reflection_coupling`, keep the
   accepted prefix and the corrected sample at the first rejection.

Every committed step is an exact draw from the target transition given the committed past, so
the output has the plain sampler's law. The first step runs plainly (it gives the first frozen
quantity); steps whose std is 0 (the last) run plainly at the end. One host read per round
(how many steps each trajectory committed) decides the next round's rows.

Multistep kernels (``kernel.history > 0``, e.g. SDE-DPM-Solver++ 2M) carry the converted model
outputs of the previous steps. Each trajectory keeps its committed history; a draft at depth ``j``
uses the drafted outputs of depths ``< j`` (none verified yet) after the committed ones; the
target mean of row ``j`` uses the target outputs of rows ``< j`` of the same call (the verified
prefix, since row ``j`` only counts if they were all accepted); after the round the history is
the target outputs at the committed states, so a rejection never leaves a drafted output in it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from ..config import CouplingConfig
from ..kernels import reflection_coupling
from ..speculation.coupling import first_rejections
from ..stats import SpecStats
from .gaussian import GaussianTransition

Generators = torch.Generator | list[torch.Generator] | None
"""One generator for the batch, or one per trajectory (diffusers' convention: then each trajectory's
noise comes from its own generator, so a sample does not depend on the batch it ran in)."""


def draw(kind: str, tail: tuple[int, ...], generator: Generators, traj: torch.Tensor, device: torch.device,
         dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """``randn`` (``kind="normal"``) or ``rand`` (``"uniform"``) of shape ``(len(traj), *tail)``.

    Noise is drawn on the generator's device and moved to ``device``, as
    ``diffusers.utils.torch_utils.randn_tensor`` does; with a list of generators, row ``i`` is drawn
    from ``generator[traj[i]]``.
    """
    fn = torch.randn if kind == "normal" else torch.rand
    if isinstance(generator, list) and not len(traj):  # no rows: nothing to draw from any generator
        return torch.empty((0, *tail), device=device, dtype=dtype)
    if not isinstance(generator, list):  # drawn where the generator lives (a CPU one on a GPU run too)
        where = device if generator is None else generator.device
        return fn((len(traj), *tail), generator=generator, device=where, dtype=dtype).to(device)
    rows = [fn((1, *tail), generator=generator[t], device=generator[t].device, dtype=dtype) for t in traj.tolist()]
    return torch.cat(rows).to(device)


Denoise = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
"""``denoise(model_input, steps, trajectories) -> model_output``: the guided network output for rows
at step indices ``steps`` belonging to trajectories ``trajectories`` (for their conditioning)."""


@dataclass
class _Target:
    """What one target call gives at a set of rows (``converted``: the multistep history entry, or None)."""

    output: torch.Tensor
    x0: torch.Tensor
    mean: torch.Tensor
    converted: torch.Tensor | None = None


def push_history(hist: torch.Tensor | None, converted: torch.Tensor | None) -> torch.Tensor | None:
    """``hist`` (``(B, K, ...)``, latest first) with ``converted`` (``(B, ...)``) prepended and the oldest dropped."""
    if hist is None or converted is None:
        return hist
    return torch.cat([converted.unsqueeze(1).to(hist.dtype), hist[:, :-1]], 1)


def chain_history(hist: torch.Tensor, new: torch.Tensor, rows_a: torch.Tensor, at: torch.Tensor) -> torch.Tensor:
    """Histories along drafted chains: ``hist`` ``(A, K, ...)`` at each chain's root, ``new`` ``(A, D, ...)``
    the converted outputs at chain depths ``0 .. D-1``; returns, for each pair ``(rows_a[r], at[r])``, the
    ``K`` outputs before depth ``at[r]`` (latest first): ``(R, K, ...)``. One gather, no loop.

    Example:
        >>> chain_history(torch.zeros(1, 2, 3), torch.ones(1, 4, 3), torch.tensor([0]), torch.tensor([1])).sum()
        tensor(3.)
    """
    k = hist.shape[1]
    seq = torch.cat([hist.flip(1), new.to(hist.dtype)], 1)  # position k + j holds depth j
    idx = k + at.view(-1, 1) - 1 - torch.arange(k, device=at.device).view(1, -1)
    return seq[rows_a.view(-1, 1), idx]


@dataclass
class RoundLog:
    """Per-depth acceptance counters (``accepted[j]`` of ``proposed[j]`` drafts at depth ``j``)."""

    accepted: list[int] = field(default_factory=list)
    proposed: list[int] = field(default_factory=list)

    def add(self, accepted: torch.Tensor, valid: torch.Tensor) -> None:
        acc, val = (accepted & valid).sum(0).tolist(), valid.sum(0).tolist()
        for j, (a, v) in enumerate(zip(acc, val)):
            if j == len(self.accepted):
                self.accepted.append(0)
                self.proposed.append(0)
            self.accepted[j] += a
            self.proposed[j] += v


class SpeculativeSampler:
    """Runs the exact speculative sampler for a batch of trajectories.

    Args:
        kernel: the scheduler's :class:`GaussianTransition`.
        denoise: the guided network (see :data:`Denoise`).
        config: a :class:`CouplingConfig`.
        stats: counters to fill (``target_calls``: sequential network calls; ``target_evals``:
            network rows per trajectory; ``accepted``/``proposed``: coupled drafts).

    Example:
        >>> sampler = SpeculativeSampler(kernel, denoise, CouplingConfig(), SpecStats())  # doctest: +SKIP
        >>> x0 = sampler.sample(torch.randn(4, 4, 16, 16), generator=torch.Generator().manual_seed(0))  # doctest: +SKIP
    """

    def __init__(self, kernel: GaussianTransition, denoise: Denoise, config: CouplingConfig, stats: SpecStats) -> None:
        self.kernel, self.denoise, self.config, self.stats = kernel, denoise, config, stats
        self.log = RoundLog()
        self._rows = 0

    def _target(self, x: torch.Tensor, steps: torch.Tensor, traj: torch.Tensor,
                hist: torch.Tensor | Callable[[torch.Tensor], torch.Tensor] | None = None) -> _Target:
        """One network call at rows ``x``; ``hist`` (multistep kernels): the rows' histories, or a function
        of this call's converted outputs giving them (rows whose past is in the same call)."""
        out = self.denoise(self.kernel.model_input(x, steps), steps, traj)
        self.stats.target_calls += 1
        self._rows += x.shape[0]
        x0 = self.kernel.x0(x, steps, out)
        converted = self.kernel.converted(x, steps, x0) if self.kernel.history else None
        if callable(hist):
            hist = hist(converted)
        return _Target(out, x0, self.kernel.mean(x, steps, out, hist), converted)

    def _draft_mean(self, y: torch.Tensor, steps: torch.Tensor, frozen: torch.Tensor,
                    hist: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The draft mean at ``y`` and the draft's converted output (the next depth's history entry)."""
        if self.config.draft == "increment":
            return y.float() + frozen, None
        if self.config.draft == "output":
            return self._kernel_draft(y, steps, frozen, hist, quantity="output")
        return self._kernel_draft(y, steps, frozen, hist)

    def _kernel_draft(self, y: torch.Tensor, steps: torch.Tensor, value: torch.Tensor, hist: torch.Tensor | None,
                      quantity: str = "x0") -> tuple[torch.Tensor, torch.Tensor | None]:
        """The kernel's mean with a drafted ``x0`` (or network ``output``) in place of the target's."""
        x0 = value if quantity == "x0" else self.kernel.x0(y, steps, value)
        converted = self.kernel.converted(y, steps, x0) if self.kernel.history else None
        mean = self.kernel.draft_mean(y, steps, x0, hist) if quantity == "x0" else self.kernel.mean(y, steps, value, hist)
        return mean, converted

    def _new_history(self, like: torch.Tensor) -> torch.Tensor | None:
        """Zeros ``(B, history, ...)`` (unused before step 0), or None for one-state kernels."""
        k = self.kernel.history
        return torch.zeros((like.shape[0], k, *like.shape[1:]), device=like.device) if k else None

    def _frozen(self, target: _Target, x: torch.Tensor) -> torch.Tensor:
        if self.config.draft == "x0":
            return target.x0
        if self.config.draft == "output":
            return target.output
        return target.mean - x.float()

    def _noise(self, like: torch.Tensor, generator: Generators, traj: torch.Tensor) -> torch.Tensor:
        return draw("normal", tuple(like.shape[1:]), generator, traj, like.device)

    def sample(self, x: torch.Tensor, generator: Generators = None,
               on_progress: Callable[[int], None] | None = None) -> torch.Tensor:
        """Sample from initial noise ``x`` (``(B, ...)``, already scaled by the scheduler's init sigma).

        ``on_progress(k)`` is called after each round with the step every trajectory has reached.
        """
        kernel, batch, device = self.kernel, x.shape[0], x.device
        n_stoch, n_total = kernel.stochastic_steps(), kernel.num_steps
        dtype = x.dtype
        traj_all = torch.arange(batch, device=device)
        self.hist = self._new_history(x)  # committed multistep history per trajectory (None: one-state kernel)
        if n_stoch > 0:  # step 0 plainly: it also gives the first frozen quantity
            steps = torch.zeros(batch, dtype=torch.long, device=device)
            target = self._target(x, steps, traj_all, self.hist)
            self.hist = push_history(self.hist, target.converted)
            frozen = self._frozen(target, x)
            x = (target.mean + self._std(steps, x) * self._noise(x, generator, torch.arange(batch))).to(dtype)
            self.state = x  # the committed states, updated in place each round (read by callbacks)
            n = torch.ones(batch, dtype=torch.long)  # committed step per trajectory, kept on the host
            lookahead = torch.full((batch,), self.config.lookahead, dtype=torch.long)  # per trajectory (host)
            while bool((n < n_stoch).any()):
                self._round(x, n, frozen, n_stoch, lookahead, generator)
                if on_progress is not None:
                    on_progress(int(n.min()))
        x = self._plain_tail(x, n_stoch, n_total, traj_all).to(dtype)
        self._finish(batch)
        return x

    def _finish(self, batch: int) -> None:
        self.stats.target_evals += self._rows / batch
        self.stats.extra["acceptance_by_depth"] = [round(a / p, 4) if p else None
                                                   for a, p in zip(self.log.accepted, self.log.proposed)]
        self.stats.extra["rows_per_call"] = round(self._rows / max(self.stats.target_calls, 1), 3)

    def _std(self, steps: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
        return self.kernel.std.to(like.device)[steps].view(-1, *[1] * (like.dim() - 1))

    def _round(self, x: torch.Tensor, n: torch.Tensor, frozen: torch.Tensor, n_stoch: int, lookahead: torch.Tensor,
               generator: Generators) -> int:
        """One draft/verify round; updates ``x``, ``n``, ``lookahead`` (host) and ``frozen`` in place.

        The bookkeeping (which trajectories, how many drafts, which rows) stays on the host, so the
        round's one device-to-host read is the acceptance pattern.
        """
        dev = x.device
        active = (n < n_stoch).nonzero().flatten()
        lengths = torch.minimum(n_stoch - n[active], lookahead[active])
        depth = int(lengths.max())
        valid = torch.arange(depth).view(1, -1) < lengths.view(-1, 1)  # (A, depth), host
        rows_a, rows_j = valid.nonzero(as_tuple=True)
        active_d, rows_a_d, rows_j_d = active.to(dev), rows_a.to(dev), rows_j.to(dev)
        xa, fa, na = x[active_d], frozen[active_d], n[active].to(dev)
        ha = None if self.hist is None else self.hist[active_d]
        states, noises, means = self._draft(xa, na, fa, depth, generator, active, lengths, ha)
        pick = lambda seq: torch.stack(seq, 1)[rows_a_d, rows_j_d]  # noqa: E731
        y_prev, steps = pick(states[:-1]), na[rows_a_d] + rows_j_d
        chain = None
        if ha is not None:  # row j's history: the committed one, then this call's rows < j (verified if j counts)
            def chain(converted: torch.Tensor) -> torch.Tensor:
                nonlocal chain_new
                chain_new = torch.zeros((len(active), depth, *xa.shape[1:]), device=dev)
                chain_new[rows_a_d, rows_j_d] = converted.float()
                return chain_history(ha, chain_new, rows_a_d, rows_j_d)
        chain_new = None
        target = self._target(y_prev, steps, active_d[rows_a_d], chain)
        uniform = draw("uniform", (), generator, active[rows_a], dev, torch.float64)
        coupled = reflection_coupling(pick(states[1:]), pick(noises), pick(means), target.mean,
                                      self.kernel.std.to(dev)[steps], uniform)
        accepted = torch.zeros_like(valid)
        accepted[rows_a, rows_j] = coupled.accepted.cpu()  # the round's one host read
        committed = first_rejections(accepted, lengths)
        last = (rows_j == (committed - 1)[rows_a]).nonzero().flatten().to(dev)  # row of each new state
        x[active_d] = coupled.sample[last]
        new = _Target(target.output[last], target.x0[last], target.mean[last])
        frozen[active_d] = self._frozen(new, y_prev[last]).to(frozen.dtype)
        if ha is not None:  # target outputs at the committed states: a rejected draft never enters the history
            self.hist[active_d] = self._committed_history(ha, chain_new, committed.to(dev))
        n[active] += committed
        self._count(accepted, valid, committed)
        lookahead[active] = self._next_lookahead(committed, lengths, lookahead[active])

    def _committed_history(self, hist: torch.Tensor, new: torch.Tensor, committed: torch.Tensor) -> torch.Tensor:
        """The history at each trajectory's new committed step (``committed`` rows of ``new`` past the root)."""
        return chain_history(hist, new, torch.arange(len(committed), device=hist.device), committed)

    def _draft(self, x: torch.Tensor, n: torch.Tensor, frozen: torch.Tensor, depth: int, generator: Generators,
               traj: torch.Tensor, lengths: torch.Tensor, hist: torch.Tensor | None = None
               ) -> tuple[list[torch.Tensor], list[torch.Tensor], list[torch.Tensor]]:
        """``depth`` drafted steps from states ``x`` at steps ``n``: the states ``[x, Y_1, ...]``, the noises
        and the draft means (tensor ops over the batch, one iteration per depth). Trajectory ``i`` draws
        noise for its own ``lengths[i]`` steps only (host tensors ``traj``, ``lengths``). ``hist``: the
        committed multistep history at ``x``; deeper drafts use the drafted outputs after it."""
        states, noises, means = [x], [], []
        for j in range(depth):
            steps = (n + j).clamp(max=self.kernel.num_steps - 1)
            a, converted = self._draft_mean(states[-1], steps, frozen, hist)
            hist = push_history(hist, converted)
            live = (lengths > j).nonzero().flatten()
            z = torch.zeros(x.shape, device=x.device, dtype=torch.float32)
            z[live.to(x.device)] = self._noise(x[: len(live)], generator, traj[live])
            states.append((a + self._std(steps, x) * z).to(x.dtype))
            noises.append(z)
            means.append(a)
        return states, noises, means

    def _next_lookahead(self, committed: torch.Tensor, lengths: torch.Tensor, lookahead: torch.Tensor) -> torch.Tensor:
        """Per trajectory, from its own last round only: double after accepting every draft, halve after
        committing less than half of its lookahead (so a trajectory's draws never depend on its batch)."""
        if not self.config.adaptive:
            return lookahead
        grown = torch.clamp(2 * lookahead, max=self.config.max_lookahead)
        shrunk = torch.clamp(lookahead // 2, min=1)
        return torch.where(committed == lengths, grown, torch.where(2 * committed < lookahead, shrunk, lookahead))

    def _count(self, accepted: torch.Tensor, valid: torch.Tensor, committed: torch.Tensor, first: int = 0) -> None:
        kept = valid & (torch.arange(valid.shape[1]).view(1, -1) < committed.view(-1, 1))
        kept[:, :first] = False  # ASD's first step is exact, not a coupled draft
        self.log.add(accepted & kept, kept)
        self.stats.proposed += int(kept.sum())
        self.stats.accepted += int((accepted & kept).sum())

    def _plain_tail(self, x: torch.Tensor, start: int, end: int, traj: torch.Tensor) -> torch.Tensor:
        """The steps with std 0 (and any without speculation), run plainly."""
        for i in range(start, end):
            steps = torch.full((x.shape[0],), i, dtype=torch.long, device=x.device)
            target = self._target(x, steps, traj, self.hist)
            self.hist = push_history(self.hist, target.converted)
            x = target.mean.to(x.dtype)
        return x


def plain_sample(kernel: GaussianTransition, denoise: Denoise, x: torch.Tensor,
                 generator: Generators = None, stats: SpecStats | None = None) -> torch.Tensor:
    """The plain sampler the speculative one is exact against: ``x' = mean + std * z`` at every step.

    Example:
        >>> x = plain_sample(kernel, denoise, torch.randn(4, 4, 16, 16))  # doctest: +SKIP
    """
    traj = torch.arange(x.shape[0], device=x.device)
    k = kernel.history  # multistep solvers: the previous converted outputs, latest first
    hist = torch.zeros((x.shape[0], k, *x.shape[1:]), device=x.device) if k else None
    for i in range(kernel.num_steps):
        steps = torch.full((x.shape[0],), i, dtype=torch.long, device=x.device)
        out = denoise(kernel.model_input(x, steps), steps, traj)
        mean = kernel.mean(x, steps, out, hist)
        if k:
            hist = push_history(hist, kernel.converted(x, steps, kernel.x0(x, steps, out)))
        noise = draw("normal", tuple(x.shape[1:]), generator, torch.arange(x.shape[0]), x.device)
        x = (mean + kernel.std.to(x.device)[steps].view(-1, *[1] * (x.dim() - 1)) * noise).to(x.dtype)
        if stats is not None:
            stats.target_calls += 1
            stats.target_evals += 1
    return x
