"""GraphedStep: CUDA-graph replays of a LlamaGen session's step match the eager step (GPU), clear error on CPU."""

from __future__ import annotations

import pytest
import torch

from diffspec.ar_image.config import MCSJDConfig
from diffspec.ar_image.cuda_graph import GraphedStep
from diffspec.ar_image.jacobi import jacobi_sample
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
