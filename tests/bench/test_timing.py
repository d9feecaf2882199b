import pytest
import torch

from diffspec.bench.timing import Arm, latency_summary, machine_info, time_arms


def test_time_arms_interleaves_rotates_and_wraps_each_run_in_enable_disable():
    log: list[str] = []

    def make(name: str) -> Arm:
        return Arm(name, run=lambda seeds, n=name: log.append(f"run:{n}") or torch.zeros(1),
                   enable=lambda n=name: log.append(f"on:{n}"), disable=lambda n=name: log.append(f"off:{n}"))

    arms = [make("a"), make("b"), make("c")]
    time_arms(arms, [0], device="cpu", repeats=3, warmup=1, show_progress=False)
    assert all(len(a.times) == 3 for a in arms)
    timed = [e for e in log if e.startswith("run:")][3:]  # after one warmup run each
    assert timed == ["run:a", "run:b", "run:c", "run:b", "run:c", "run:a", "run:c", "run:a", "run:b"]
    for i in range(0, len(log), 3):  # every run sits between its own enable and disable
        on, run, off = log[i : i + 3]
        assert on[3:] == run[4:] == off[4:]


def test_latency_summary_and_machine_block():
    s = latency_summary([3.0, 1.0, 2.0])
    assert s == {"median": 2.0, "min": 1.0, "max": 3.0, "n": 3}
    with pytest.raises(ValueError):
        latency_summary([])
    m = machine_info("cpu")
    assert m["device_type"] == "cpu" and m["torch"] == torch.__version__ and "diffusers" in m
