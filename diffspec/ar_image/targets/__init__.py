"""AR image targets: the models the ``ar_image`` algorithms drive, each behind the
:class:`~diffspec.ar_image.target.ARImageTarget` session protocol.

- LlamaGen (own implementation with the official key layout): ``llamagen*`` (GPT, config, VQ tokenizer,
  loading, the static-KV-cache session); ``patch_vq`` is the tokenizer of the shipped ``tiny-ar`` model;
- transformers models, unmodified: ``janus`` (Janus / Janus-Pro), ``emu3``, over ``hf_session``;
- ``toy``: a second-order table model with a known joint law, for exactness tests;
- ``cuda_graph``: CUDA-graph replay of a session's ``step``.
"""
