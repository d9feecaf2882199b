"""Shared helpers of the forecast pipeline tests."""

import contextlib


@contextlib.contextmanager
def record_runs(models, inner):
    """Per named model: for each of its calls, whether ``inner(model)`` (a submodule of its first block) ran, i.e.
    whether the call ran its blocks for real (a forecast step still calls the wrapped block, not its internals)."""
    runs = {name: [] for name in models}
    handles = []
    for name, model in models.items():
        log = runs[name]
        handles.append(model.register_forward_pre_hook(lambda *_, log=log: log.append(False)))
        handles.append(inner(model).register_forward_pre_hook(lambda *_, log=log: log.__setitem__(-1, True)))
    try:
        yield runs
    finally:
        for h in handles:
            h.remove()
