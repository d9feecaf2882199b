"""torch.compile with forecasting: regional (block) and whole-model compile match eager, compile
nothing new in a second generation, break no graph, and detaching leaves the compiled model intact.

Dynamo-level behaviour (graph breaks, guards, recompiles) does not depend on the backend, so these
tests use ``backend="eager"``; one slow test runs inductor.
"""

import math

import pytest
import torch
import torch._dynamo
from torch._dynamo.utils import counters
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from diffspec import SpeculativePipeline
from diffspec.config import ForecastConfig, SpecaConfig
from diffspec.forecast.compile import compile_blocks
from diffspec.forecast.hooks import ForecastHooks
from diffspec.stats import SpecStats
from diffspec.testing.random_transformers import build_transformer, make_call, timesteps_for

STEPS = 12
TOL = dict(rtol=1e-4, atol=1e-4)


def _config(method):
    """``taylor`` / ``speca``, with a ``-module`` suffix at module granularity."""
    method, _, module = method.partition("-")
    extra = {"granularity": "module"} if module else {}
    if method == "taylor":
        return ForecastConfig(**extra)
    # every draft checked; rows diverge (some rejected and recomputed alone, verifier on a row subset)
    tau0 = 0.01 if module else 0.05  # module forecasts are closer: a tighter threshold still rejects some rows
    return SpecaConfig(tau0=tau0, beta=0.5, tau_min=tau0 / 4, k_min=0, k_max=6, **extra)


def _setup(name, method, steps=STEPS):
    model = build_transformer(name)
    x0, call = make_call(name, batch=2, seed=3)
    x0 = torch.cat([x0[:1], 4 * x0[1:]])  # rows that take different paths under speca
    ts = timesteps_for(name, steps)

    def generate(m):
        x = x0.clone()
        with torch.no_grad():
            for t in ts:
                x = x - 0.05 * call(m, x, t)
        return x

    def hooked(m):
        stats = SpecStats()
        return ForecastHooks(m, _config(method), stats, num_steps_fn=lambda: steps), stats

    return model, generate, hooked


@pytest.fixture(autouse=True)
def _fresh_dynamo(fresh_dynamo):
    """Every test starts and ends with an empty dynamo cache and counters (tests/conftest.py)."""


def _warm_then_repeat(generate, m):
    """A warmup generation (no graph break, no code recompiled up to dynamo's limit, e.g. once per
    block), then a second one that must compile nothing."""
    counters.clear()
    with torch._dynamo.config.patch(fail_on_recompile_limit_hit=True):
        first = generate(m)
    assert not counters["graph_break"], dict(counters["graph_break"])
    assert counters["stats"]["unique_graphs"] > 0  # something was compiled
    counters.clear()
    with torch._dynamo.config.patch(error_on_recompile=True):
        second = generate(m)
    assert counters["stats"]["unique_graphs"] == 0 and not counters["graph_break"]
    return first, second


def _check_paths(method, stats):
    assert stats.forecast_steps > 0
    if method.startswith("speca"):  # the verifier ran, rejected some rows and accepted others
        assert stats.extra["checks"] > stats.extra["rejections"] > 0


@pytest.mark.parametrize(("name", "method", "order"), [
    ("tiny-dit-random", "taylor", "before"),
    ("tiny-dit-random", "speca", "after"),
    ("tiny-flux-random", "taylor", "after"),
    ("tiny-flux-random", "speca", "before"),
    ("tiny-dit-random", "taylor-module", "before"),
    ("tiny-dit-random", "speca-module", "after"),
    ("tiny-flux-random", "taylor-module", "after"),
    ("tiny-flux-random", "speca-module", "before"),
])
def test_regional_compile_matches_eager_without_recompiles(name, method, order):
    """Blocks compiled before or after attaching (DiT: compile_blocks; Flux: compile_repeated_blocks).
    At module granularity the forecast submodules are compiled instead of the blocks."""
    model, generate, hooked = _setup(name, method)
    baseline = generate(model)
    hooks, _ = hooked(model)
    hooks.attach()
    eager = generate(model)
    hooks.detach()

    def compile_regions():
        if name == "tiny-flux-random":  # declares _repeated_blocks: diffusers' own regional compile
            model.compile_repeated_blocks(backend="eager")
        else:  # DiT declares none
            assert compile_blocks(model, backend="eager") == 3

    if order == "before":
        compile_regions()
    hooks, stats = hooked(model)
    hooks.attach()
    if order == "after":
        compile_regions()
    first, second = _warm_then_repeat(generate, model)
    torch.testing.assert_close(first, eager, **TOL)
    assert torch.equal(second, first)
    _check_paths(method, stats)

    hooks.detach()  # the blocks are compiled as before, not wrapped
    blocks = list(model.transformer_blocks) + list(getattr(model, "single_transformer_blocks", []))
    assert all(b._compiled_call_impl is not None and "forward" not in b.__dict__ for b in blocks)
    torch.testing.assert_close(generate(model), baseline, **TOL)


class _CountingBackend:
    """An eager backend that counts the compiled graphs run."""

    def __init__(self):
        self.runs = 0

    def __call__(self, gm, example_inputs):
        def run(*args):
            self.runs += 1
            return gm.forward(*args)

        return run


@pytest.mark.parametrize(("method", "how"), [("taylor", "module.compile"), ("speca", "torch.compile")])
def test_whole_model_compile_matches_eager_without_recompiles(method, how):
    """The forward hooks run eagerly around the compiled forward: every transformer pass (the
    rows ``speca`` recomputes included) is one compiled graph, with no graph break.
    ``module.compile()`` after attaching; ``torch.compile(module)`` before (the pipeline then
    holds the OptimizedModule and forecasting is attached to it)."""
    model, generate, hooked = _setup("tiny-dit-random", method)
    baseline = generate(model)
    hooks, _ = hooked(model)
    hooks.attach()
    eager = generate(model)
    hooks.detach()

    backend = _CountingBackend()
    target = model if how == "module.compile" else torch.compile(model, backend=backend)
    hooks, stats = hooked(target)
    hooks.attach()
    if how == "module.compile":
        model.compile(backend=backend)
    passes, runs = 0, 0

    def generate_counted(m):
        nonlocal passes, runs
        before = stats.target_calls + stats.draft_calls, backend.runs
        out = generate(m)
        passes, runs = stats.target_calls + stats.draft_calls - before[0], backend.runs - before[1]
        return out

    first, second = _warm_then_repeat(generate_counted, target)
    assert runs == passes  # in the second generation: one compiled graph per transformer pass
    assert passes == STEPS if method == "taylor" else passes > STEPS  # speca recomputed some rows
    torch.testing.assert_close(first, eager, **TOL)
    assert torch.equal(second, first)
    _check_paths(method, stats)

    hooks.detach()
    torch.testing.assert_close(generate(target), baseline, **TOL)


@pytest.mark.parametrize("granularity", ["block", "module"])
def test_pipeline_compile_and_disable(tiny_dit_pipe, granularity):
    def run(pipe):
        g = [torch.Generator().manual_seed(i) for i in range(2)]
        return pipe(class_labels=[0, 1], num_inference_steps=8, generator=g, output_type="pt").images

    baseline = run(tiny_dit_pipe)
    spec = SpeculativePipeline.from_pipe(tiny_dit_pipe, method="taylor", granularity=granularity)
    eager = run(spec)
    assert spec.compile(backend="eager") is spec
    first, second = _warm_then_repeat(run, spec)
    torch.testing.assert_close(first, eager, **TOL)
    assert torch.equal(second, first) and spec.stats.forecast_steps > 0
    spec.disable()
    blocks = tiny_dit_pipe.transformer.transformer_blocks
    assert all(b._compiled_call_impl is not None and "forward" not in b.__dict__ for b in blocks)
    torch.testing.assert_close(run(tiny_dit_pipe), baseline, **TOL)


class _CountReads(TorchFunctionMode):
    """Counts Python-level reads of tensor values to the host (``.item()``, ``.tolist()``, ``bool()``...)."""

    READS = (torch.Tensor.item, torch.Tensor.tolist, torch.Tensor.__bool__, torch.Tensor.__float__,
             torch.Tensor.__int__, torch.Tensor.__index__, torch.Tensor.numpy, torch.Tensor.nonzero)

    def __init__(self):
        super().__init__()
        self.reads = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func in self.READS:
            self.reads.append(func.__name__)
        return func(*args, **(kwargs or {}))


class _CountScalars(TorchDispatchMode):
    """Counts scalar reads below Python (``aten._local_scalar_dense``: item, bool, float, int)."""

    def __init__(self):
        super().__init__()
        self.n = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten._local_scalar_dense.default:
            self.n += 1
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("method", ["taylor", "speca"])
def test_host_reads_per_step(method):
    """taylor: the timestep read only. speca: plus the verifier's per-row errors on a draft step."""
    name = "tiny-flux-random"
    model, _, hooked = _setup(name, method)
    x, call = make_call(name, batch=2, seed=3)
    x = torch.cat([x[:1], 4 * x[1:]])
    hooks, stats = hooked(model)
    hooks.attach()
    per_call = []
    with torch.no_grad():
        for t in timesteps_for(name, STEPS):
            drafts = stats.draft_calls
            reads, scalars = _CountReads(), _CountScalars()
            with reads, scalars:
                y = call(model, x, t)
            x = x - 0.05 * y
            per_call.append((stats.draft_calls > drafts, reads.reads, scalars.n))
    for drafted, reads, scalars in per_call:
        expected = ["item", "tolist"] if drafted and method == "speca" else ["item"]
        assert reads == expected and scalars == 1, per_call
    assert any(d for d, _, _ in per_call) and not math.isnan(x.sum().item())


def test_cfg_branch_calls_share_one_timestep_read():
    """A pipeline that calls the transformer once per CFG branch with one ``timestep``: one read per step."""
    model, _, hooked = _setup("tiny-dit-random", "taylor")
    hooks, stats = hooked(model)
    hooks.attach()
    x = torch.randn(1, 4, 8, 8, generator=torch.Generator().manual_seed(0))
    reads = []
    with torch.no_grad():
        for t in timesteps_for("tiny-dit-random", STEPS):
            timestep = t.reshape(1)
            counter = _CountReads()
            with counter:
                cond = model(x, timestep=timestep, class_labels=torch.tensor([1]), return_dict=False)[0][:, :4]
                uncond = model(x, timestep=timestep, class_labels=torch.tensor([2]), return_dict=False)[0][:, :4]
            reads.append(len(counter.reads))
            x = x - 0.05 * (uncond + 2.0 * (cond - uncond))
    assert reads == [1] * STEPS
    assert stats.forecast_steps == 2 * 7 and hooks.tracker.branch == 1  # steps 3-6 and 8-10, both branches


@pytest.mark.slow
def test_regional_inductor_matches_eager():
    steps = 6
    model, generate, hooked = _setup("tiny-dit-random", "taylor", steps)
    hooks, _ = hooked(model)
    hooks.attach()
    eager = generate(model)
    compile_blocks(model)  # inductor
    first, second = _warm_then_repeat(generate, model)
    torch.testing.assert_close(first, eager, **TOL)
    torch.testing.assert_close(second, first, **TOL)
