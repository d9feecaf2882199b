"""Under --compile, graphs that arm switches need are compiled before the timed rounds (never timed)."""

import torch

from diffspec.bench import compiled, timing
from diffspec.bench.timing import Arm, time_arms


def _arms(compiles_on_switch_back: bool):
    """Two arms on one fake 'compiled model': arm ``a`` compiles once more the first time it runs after ``b``."""
    state = {"graphs": 0, "last": None, "seen_after_b": False, "warm": set()}

    def runner(name):
        def run(seeds):
            if name == "a" and state["last"] == "b" and not state["seen_after_b"] and compiles_on_switch_back:
                state["graphs"] += 1
                state["seen_after_b"] = True
            if name not in state["warm"]:
                state["graphs"] += 1
                state["warm"].add(name)
            state["last"] = name
            return torch.zeros(1)
        return run

    return [Arm("a", runner("a")), Arm("b", runner("b"))], state


def test_switch_graphs_are_settled_before_timing(monkeypatch):
    arms, state = _arms(compiles_on_switch_back=True)
    monkeypatch.setattr(compiled, "graphs_compiled", lambda: state["graphs"])
    time_arms(arms, [0], device="cpu", repeats=3, warmup=1, show_progress=False, count_compiles=True)
    a, b = (arm.stats["compiled_graphs"] for arm in arms)
    assert a == {"warmup": 1, "after_warmup": 0, "settle": 1, "timing_valid": True}
    assert b["after_warmup"] == 0 and b["timing_valid"]


def test_a_graph_compiled_while_timed_is_flagged(monkeypatch):
    arms, state = _arms(compiles_on_switch_back=False)
    calls = {"n": 0}

    def graphs():  # a graph appears on every read once the timed rounds start: settling cannot absorb it
        calls["n"] += 1
        return state["graphs"] + (calls["n"] if calls["n"] > 12 else 0)

    monkeypatch.setattr(compiled, "graphs_compiled", graphs)
    monkeypatch.setattr(timing, "SETTLE_ROUNDS", 1)
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        time_arms(arms, [0], device="cpu", repeats=2, warmup=1, show_progress=False, count_compiles=True)
    assert any(not arm.stats["compiled_graphs"]["timing_valid"] for arm in arms)
    assert any("its time includes compilation" in str(w.message) for w in caught)
