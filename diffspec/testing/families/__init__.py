"""Tiny random-weight configs of the newer diffusers transformers (FLUX.2, Qwen-Image, ...).

One module per family. Each defines ``FAMILIES`` (family name -> :class:`~diffspec.testing.transformer_spec.Family`:
its diffusers class, a ``make_call`` building latents and conditioning the way its pipeline does, its
timestep units) and ``SPECS`` (model name -> :class:`~diffspec.testing.transformer_spec.TransformerSpec`);
:mod:`diffspec.testing.random_transformers` merges them with the first ten families.
"""

from __future__ import annotations

import importlib
import pkgutil

from ..transformer_spec import Family, TransformerSpec

RECENT_SPECS: dict[str, TransformerSpec] = {}
RECENT_FAMILIES: dict[str, Family] = {}
for _info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
    _module = importlib.import_module(f"{__name__}.{_info.name}")
    RECENT_FAMILIES.update(_module.FAMILIES)
    RECENT_SPECS.update(_module.SPECS)
