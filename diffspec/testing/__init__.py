"""Tiny random-weight models of every supported family, built from configs, offline: what tests and benchmarks run on.

Speed does not depend on weight values, so the benchmarks time real-size configs with random weights;
quality is measured on the trained reference models of :mod:`diffspec.models`. Nothing here is
downloaded and nothing is imported by the library below the benchmarks and the CLI.

- :mod:`.random_transformers`: diffusers transformers by name (``tiny-*`` for tests, ``dit-xl-2-256``,
  ``flux-1024`` ... at real size), the call that feeds each one and its timesteps; a FLUX ControlNet.
- :mod:`.transformer_spec`, :mod:`.families`: what a named transformer is, and one module per newer family.
- :mod:`.tiny_pipelines`: whole pipelines by name (``tiny-wan``, ``tiny-flux-random`` ...), saved as local folders
  that ``diffspec generate`` loads like real checkpoints; builders in :mod:`.video_pipelines`,
  :mod:`.image_pipelines` (also a class-conditional ``DiTPipeline``) and their shared :mod:`.pipeline_parts`.

Example:
    >>> from diffspec.testing.random_transformers import build_transformer, make_call, timesteps_for
    >>> model = build_transformer("tiny-flux-random")
    >>> latents, call = make_call("tiny-flux-random")
    >>> call(model, latents, timesteps_for("tiny-flux-random", 4)[0]).shape == latents.shape
    True
"""
