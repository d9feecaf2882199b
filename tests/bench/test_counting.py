import torch

from diffspec import SpeculativePipeline
from diffspec.bench.counting import ComputeCounter


def test_counter_sees_full_calls_for_baseline_and_only_full_steps_for_taylor(tiny_dit_pipe):
    pipe = tiny_dit_pipe
    with ComputeCounter(pipe.transformer) as counter:
        pipe(class_labels=[0], num_inference_steps=12, generator=torch.Generator().manual_seed(0))
    full = counter.max_units()
    assert len(counter.per_call) == 12 and counter.full_calls(full) == 12 and counter.evals(full) == 12.0

    spec = SpeculativePipeline.from_pipe(pipe, method="taylor", interval=3, warmup=2)
    with ComputeCounter(pipe.transformer) as counter:
        spec(class_labels=[0], num_inference_steps=12, generator=torch.Generator().manual_seed(0))
    assert len(counter.per_call) == 12  # the transformer is still called every step...
    assert counter.full_calls(full) == spec.stats.full_steps < 12  # ...but its blocks run only on full steps
    assert counter.evals(full) == spec.stats.full_steps
    assert set(counter.per_call) == {0, full}
