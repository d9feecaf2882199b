"""The loop every speculative AR image sampler shares: first token, rounds until every row is done, counters.

A sampler is a *round* (:class:`Round`): for every batch row at once it drafts, verifies the drafts with one
target call and commits at least one token per unfinished row, updating a :class:`RoundState`. The loop
(:func:`run_rounds`) counts the call, takes the round's one host sync (the smallest and the total commit point)
to stop and to advance the progress bar, and can replay rounds from one CUDA graph. :meth:`RoundState.record`
writes the counters every method reports.

Example:
    >>> from diffspec.ar_image.targets.toy import ToyTableTarget
    >>> session = ToyTableTarget(seed=0).start(class_labels=[0, 1])
    >>> state = RoundState.start(session, 6, {"temperature": 1.0}, torch.Generator().manual_seed(0))
    >>> state.tokens.shape, state.commit.tolist()
    (torch.Size([2, 6]), [1, 1])
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import torch

from ..speculation.sampling import Generators, force, sample, warp
from ..stats import SpecStats

if TYPE_CHECKING:
    from .target import ARSession


def window_forced(session: ARSession, positions: torch.Tensor) -> torch.Tensor | None:
    """Forced token (or -1) at each of ``positions`` (any shape, clipped into the image); None if none."""
    forced = session.forced_tokens()
    if forced is None:
        return None
    forced = forced.to(positions.device)
    return forced[positions.clamp(0, forced.numel() - 1)]


@dataclass
class RoundState:
    """What every round reads and advances, for all batch rows at once (tensors stay on the device).

    Attributes:
        session: the open session (its prefill's row gave token 0).
        num_tokens: image tokens per image.
        tokens: ``(B, S)`` committed tokens, then the drafts (``S >= num_tokens``).
        commit: ``(B,)`` tokens committed per row.
        row_calls: ``(B,)`` target calls while the row had tokens left to commit (prefill included).
        accepted, proposed: drafts accepted, drafts verified inside the image.
        relaxed: a relaxed rule's relaxation summed over the positions it decided, and their count.
        calls: target calls, prefill included.
        graphed: rounds after the first are replayed from one CUDA graph, so every round writes its state
            (``tokens``, ``commit``, a round's own buffers) in place.
    """

    session: ARSession
    num_tokens: int
    tokens: torch.Tensor
    commit: torch.Tensor
    row_calls: torch.Tensor
    accepted: torch.Tensor
    proposed: torch.Tensor
    relaxed: torch.Tensor
    calls: int = 1
    graphed: bool = False

    @classmethod
    def start(cls, session: ARSession, num_tokens: int, sampling: dict[str, Any], generator: Generators,
              bar: Any = None, width: int | None = None, graphed: bool = False) -> RoundState:
        """Draw token 0 of every row from the prefill's row into a ``(B, width)`` buffer (``num_tokens`` wide).

        Args:
            sampling: keyword arguments of :func:`~diffspec.speculation.sampling.warp`.
            generator: ``None``, a generator, or one per batch row.
            bar: a tqdm bar, advanced by the batch size.
        """
        batch, device = session.batch_size, session.first_logits.device
        tokens = torch.zeros(batch, num_tokens if width is None else width, dtype=torch.long, device=device)
        first = window_forced(session, torch.zeros(batch, dtype=torch.long, device=device))
        tokens[:, 0] = sample(force(warp(session.first_logits, **sampling), first), generator)
        if bar is not None:
            bar.update(batch)
        count = torch.zeros((), dtype=torch.long, device=device)
        return cls(session, num_tokens, tokens, torch.ones(batch, dtype=torch.long, device=device),
                   torch.ones(batch, device=device), count, count.clone(), torch.zeros(2, device=device),
                   graphed=graphed)

    @property
    def batch(self) -> int:
        """Batch rows ``B``."""
        return self.tokens.shape[0]

    @property
    def device(self) -> torch.device:
        """Where the state's tensors live."""
        return self.tokens.device

    @property
    def image_tokens(self) -> torch.Tensor:
        """``(B, num_tokens)`` the committed image tokens."""
        return self.tokens[:, : self.num_tokens]

    def advance(self, tokens: torch.Tensor, commit: torch.Tensor) -> None:
        """Take a round's new tokens and commit points (copied into the buffers when ``graphed``)."""
        if self.graphed:
            self.tokens.copy_(tokens)
            self.commit.copy_(commit)
        else:
            self.tokens, self.commit = tokens, commit

    def relaxed_tv(self) -> float:
        """Mean relaxation per decided position (0 if none): the per-token TV a relaxed rule spent."""
        return float(self.relaxed[0] / self.relaxed[1].clamp(min=1))

    def record(self, stats: SpecStats | None) -> None:
        """Add the loop's counters to ``stats`` (one host sync here)."""
        if stats is None:
            return
        n, calls = self.num_tokens, self.calls
        stats.target_calls += calls
        stats.target_evals += calls * self.session.cfg_branches
        stats.accepted += int(self.accepted)
        stats.proposed += int(self.proposed)
        stats.extra.update(iterations=calls - 1, step_compression=n / calls,
                           tokens_per_call=float((n / self.row_calls).mean()))


class Round(Protocol):
    """One speculative round: draft, one verifying target call, accept and commit, on a :class:`RoundState`."""

    def start(self, state: RoundState) -> None:
        """Prepare the first round (first drafts, layouts, buffers); called once, before it."""

    def __call__(self, state: RoundState) -> None:
        """Run one round: every unfinished row commits at least one token (``state.commit`` grows)."""


def write_committed(tokens: torch.Tensor, commit: torch.Tensor, new_commit: torch.Tensor, values: torch.Tensor
                    ) -> torch.Tensor:
    """``tokens`` ``(B, S)`` with positions ``commit <= j < new_commit`` of each row set to ``values[:, j - commit]``.

    Example:
        >>> write_committed(torch.zeros(1, 5, dtype=torch.long), torch.tensor([1]), torch.tensor([3]),
        ...                 torch.tensor([[7, 8, 9]])).tolist()
        [[0, 7, 8, 0, 0]]
    """
    cols = torch.arange(tokens.shape[1], device=tokens.device)
    rel = cols - commit.unsqueeze(1)
    committed = (rel >= 0) & (cols < new_commit.unsqueeze(1))
    return torch.where(committed, values.gather(1, rel.clamp(0, values.shape[1] - 1)), tokens)


def round_progress(commit: torch.Tensor, bar: Any, total: int) -> tuple[int, int]:
    """A round's one host sync: ``(min commit, committed tokens)``; advances ``bar`` from ``total``."""
    done, now = torch.stack([commit.min(), commit.sum()]).tolist()
    if bar is not None:
        bar.update(now - total)
    return done, now


def run_rounds(state: RoundState, one_round: Round, bar: Any = None, generator: Generators = None) -> None:
    """Run ``one_round`` until every row has committed ``state.num_tokens`` tokens.

    Each round is one target call, counted for every row that still had tokens to commit; the round's one host
    sync (:func:`round_progress`) ends the loop. When ``state.graphed``, the first round runs eagerly and every
    later one is replayed from one CUDA graph of it (:func:`capture_round`).

    Args:
        state: from :meth:`RoundState.start` (nothing is run when the image is one token).
        bar: a tqdm bar advanced by the tokens committed each round.
        generator: the round's generators (registered with the graph).
    """
    n = state.num_tokens
    if n <= 1:
        return
    one_round.start(state)

    def step() -> None:
        state.row_calls.add_((state.commit < n).float())
        one_round(state)

    graph, rounds, done, total = None, 0, 1, state.batch
    while done < n:
        if state.graphed and rounds == 1:
            graph = capture_round(step, state.device, generator)
        if graph is None:
            step()
        else:
            graph.replay()
        state.calls += 1
        rounds += 1
        done, total = round_progress(state.commit, bar, total)


def generator_list(generator: Generators) -> list[torch.Generator]:
    """``generator`` as a list (one per row, a single shared one, or none)."""
    if isinstance(generator, (list, tuple)):
        return list(generator)
    return [] if generator is None else [generator]


def capture_round(one_round: Callable[[], None], device: torch.device, generator: Generators) -> Any:
    """A CUDA graph of ``one_round`` (captured, not run) with every generator's state registered, so each
    replay draws fresh numbers as the eager round would."""
    graph = torch.cuda.CUDAGraph()
    gens = generator_list(generator)
    if gens and not hasattr(graph, "register_generator_state"):
        raise RuntimeError(f"cuda_graphs=True with explicit generators needs a PyTorch whose CUDAGraph has "
                           f"register_generator_state (this is {torch.__version__}); pass generator=None")
    for g in dict.fromkeys(gens):  # a generator shared by rows is registered once
        graph.register_generator_state(g)
    torch.cuda.synchronize(device)
    with torch.cuda.graph(graph):
        one_round()
    return graph
