"""GraphedStep: CUDA-graph replays of a LlamaGen session's step match the eager step (GPU), clear error on CPU."""

from __future__ import annotations

import pytest
import torch

from diffspec.ar_image.config import MCSJDConfig
from diffspec.ar_image.jacobi import jacobi_sample
from diffspec.ar_image.targets.cuda_graph import GraphedStep
from diffspec.bench.ar_image_cost import _session, build_cost_model


def test_graphed_step_needs_a_cuda_device():
    with pytest.raises(ValueError, match="needs a CUDA device"):
        GraphedStep(lambda tokens, start: tokens, "cpu")


@pytest.mark.gpu
def test_graphed_step_matches_the_eager_step():
    target = build_cost_model("tiny", 64, "cuda", torch.float32)
    gen = torch.Generator("cuda").manual_seed(0)
    eager, graphed = _session(target, 2, 4.0), _session(target, 2, 4.0)
    step = GraphedStep(graphed.step, "cuda")
    with torch.inference_mode():
        for k, start in ((1, (0, 3)), (5, (1, 7)), (1, (6, 12)), (5, (20, 9)), (5, (30, 40))):
            tokens = torch.randint(target.codebook_size, (2, k), generator=gen, device="cuda")
            where = torch.tensor(start, device="cuda")
            torch.testing.assert_close(step(tokens, where), eager.step(tokens, where), atol=1e-4, rtol=1e-4)
    assert step.captured == 2  # one graph per input shape
    for (ke, ve), (kg, vg) in zip(eager.caches, graphed.caches):
        torch.testing.assert_close(kg, ke, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(vg, ve, atol=1e-5, rtol=1e-5)


@pytest.mark.gpu
def test_jacobi_loop_on_graphed_steps_commits_the_eager_tokens():
    target = build_cost_model("tiny", 64, "cuda", torch.float32)
    config = MCSJDConfig(window=8, top_k=1)  # greedy: the tokens cannot depend on float rounding
    out = []
    for graphs in (False, True):
        session = _session(target, 2, 4.0)
        if graphs:
            session.step = GraphedStep(session.step, "cuda")
        gens = [torch.Generator("cuda").manual_seed(b) for b in range(2)]
        with torch.inference_mode():
            out.append(jacobi_sample(session, target.num_tokens, config.window, config.coupling, config.init,
                                     config.sampling, gens))
    assert torch.equal(out[0], out[1])


def test_graphed_rounds_refuse_what_a_graph_cannot_replay():
    from diffspec.ar_image.targets.toy import ToyTableTarget

    session = ToyTableTarget(seed=0).start(class_labels=[0, 1])
    with pytest.raises(ValueError, match="needs a CUDA session"):
        jacobi_sample(session, 6, 4, "maximal", "uniform", {}, None, cuda_graphs=True)


@pytest.mark.gpu
@pytest.mark.parametrize("coupling", ["maximal", "independent"])
def test_graphed_rounds_commit_the_eager_tokens(coupling):
    """Whole rounds replayed from one CUDA graph draw the same numbers as eager rounds: same tokens, same counts."""
    from diffspec.stats import SpecStats

    target = build_cost_model("tiny", 64, "cuda", torch.float32)
    out, stats = [], []
    for graphs in (False, True):
        session = _session(target, 3, 4.0)
        gens = [torch.Generator("cuda").manual_seed(10 + b) for b in range(3)]
        st = SpecStats(method="mc-sjd")
        with torch.inference_mode():
            out.append(jacobi_sample(session, target.num_tokens, 8, coupling, "repeat", {"temperature": 1.0}, gens,
                                     stats=st, cuda_graphs=graphs))
        stats.append((st.target_calls, st.accepted, st.proposed))
    assert torch.equal(out[0], out[1])
    assert stats[0] == stats[1] and stats[0][0] > 2  # the graph replayed several rounds


@pytest.mark.parametrize(("coupling", "init"), [("maximal", "repeat"), ("maximal", "uniform"), ("independent", "repeat")])
def test_in_place_rounds_match_the_eager_rounds(monkeypatch, coupling, init):
    """The buffers a captured round writes in place (CPU stand-in: "replay" reruns the round) give the tokens and
    counts of the eager loop, which rebinds them; the first round runs before any capture."""
    import diffspec.ar_image.jacobi as jacobi_module
    import diffspec.ar_image.rounds as rounds_module
    from diffspec.stats import SpecStats

    class Replay:
        def __init__(self, one_round):
            self.replay = one_round

    captured = []
    monkeypatch.setattr(jacobi_module, "check_graphable", lambda *a: None)
    monkeypatch.setattr(rounds_module, "capture_round", lambda one_round, *a: captured.append(1) or Replay(one_round))
    target = build_cost_model("tiny", 64, "cpu")
    out, counts = [], []
    for graphs in (False, True):
        st = SpecStats(method="mc-sjd")
        gens = [torch.Generator().manual_seed(10 + b) for b in range(3)]
        out.append(jacobi_sample(_session(target, 3, 4.0), 64, 8, coupling, init, {"temperature": 1.0}, gens,
                                 stats=st, cuda_graphs=graphs))
        counts.append((st.target_calls, st.accepted, st.proposed))
    assert torch.equal(out[0], out[1]) and counts[0] == counts[1]
    assert captured == [1]


def test_only_graph_safe_sessions_are_captured():
    """A session whose cache grows (transformers' DynamicCache) would be replayed against its capture-time state."""
    from types import SimpleNamespace

    from diffspec.ar_image.jacobi import check_graphable
    from diffspec.ar_image.targets.hf_session import HFImageSession
    from diffspec.ar_image.targets.llamagen_session import LlamaGenSession

    assert LlamaGenSession.graph_safe and not HFImageSession.graph_safe
    on_cuda = SimpleNamespace(device=torch.device("cuda"))
    with pytest.raises(ValueError, match="is not graph_safe"):
        check_graphable(SimpleNamespace(first_logits=on_cuda, forced_tokens=lambda: None), "maximal", None)
    session = SimpleNamespace(first_logits=on_cuda, graph_safe=True, forced_tokens=lambda: torch.tensor([-1, 3]))
    with pytest.raises(ValueError, match="forced tokens are on cpu"):
        check_graphable(session, "maximal", None)
    session.forced_tokens = lambda: None
    check_graphable(session, "maximal", None)
    with pytest.raises(ValueError, match="coupling='gumbel'"):
        check_graphable(session, "gumbel", None)
    with pytest.raises(ValueError, match="needs CUDA generators"):
        check_graphable(session, "maximal", [torch.Generator()])
