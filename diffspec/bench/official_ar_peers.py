"""Loading the official SJD and SCD (MC-SJD) code as benchmark peers of diffspec's ``sjd`` / ``mc-sjd``.

The official code is never part of diffspec: the caller points at local checkouts of
https://github.com/tyshiwo1/Accelerating-T2I-AR-with-SJD (its LlamaGen path: ``llamagen/llamagen.py``,
``llamagen/llamagen_solver.py``, ``scheduler/jacobi_iteration_lumina_mgpt.py``) and
https://github.com/junhyukso/SCD (``lumina1/scheduler/jacobi_iteration_lumina_mgpt_SCDMC.py``, the
MC-SJD scheduler, a drop-in for SJD's ``renew_sampler``: same class patching, same
``_init_new_params`` fields). The SCD peer is SJD's official LlamaGen solver with SCD's official
MC scheduler, both unmodified. The official files need the transformers they pin (4.47/4.48:
``LogitsWarper``, ``DynamicCache.key_cache``); put such a copy first on ``sys.path`` (see
``scripts/ar_image_official_peers.py``).

The diffspec LlamaGen GPT uses the official parameter names, so the tiny model is handed over key
for key (:func:`to_official_state`) into the official ``Transformer`` built with the same
dimensions, and the two models' logits are compared before anything is timed. The timed run is
:func:`diffspec.bench.official_ar_run.run_official_peers`.

Example:
    >>> found = peer_checkouts(None, None, env={})
    >>> found["skipped"]["sjd-official"].startswith("no SJD checkout")
    True
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.machinery
import importlib.util
import io
import os
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

SJD_ENV = "DIFFSPEC_SJD_REPO"
SCD_ENV = "DIFFSPEC_SCD_REPO"
SJD_FILES = ("llamagen/llamagen.py", "llamagen/llamagen_solver.py", "scheduler/jacobi_iteration_lumina_mgpt.py")
SCD_FILES = ("lumina1/scheduler/jacobi_iteration_lumina_mgpt_SCDMC.py", "lumina1/scheduler/logit_processor_3dim.py")
CPU_SHIMS = [
    "torch.cuda.Event / torch.cuda.synchronize replaced by a perf_counter stand-in and a no-op: the official "
    "_sample loops (SJD scheduler/jacobi_iteration_lumina_mgpt.py, SCD jacobi_iteration_lumina_mgpt_SCDMC.py) "
    "time themselves with CUDA events (count_time = True, hard-coded); only installed when CUDA is absent",
]


def official_llamagen_keys(config: Any) -> set[str]:
    """Parameter names of the official LlamaGen ``Transformer`` (``llamagen/llamagen.py``) for ``config``.

    Derived state the official code keeps outside its weights (``freqs_cis``, KV caches, causal
    masks) is not included.
    """
    if config.model_type == "c2i":
        keys = {"cls_embedding.embedding_table.weight"}
    elif config.model_type == "t2i":
        keys = {"cls_embedding.cap_proj.fc1.weight", "cls_embedding.cap_proj.fc2.weight",
                "cls_embedding.uncond_embedding"}
    else:
        raise ValueError(f"model_type={config.model_type!r} is not supported; choose 'c2i' or 't2i'")
    keys |= {"tok_embeddings.weight", "norm.weight", "output.weight"}
    for i in range(config.n_layer):
        keys |= {f"layers.{i}.{name}" for name in (
            "attention.wqkv.weight", "attention.wo.weight", "attention_norm.weight", "ffn_norm.weight",
            "feed_forward.w1.weight", "feed_forward.w2.weight", "feed_forward.w3.weight")}
    return keys


def _check_keys(state: Mapping[str, torch.Tensor], expected: set[str], what: str) -> None:
    missing, unexpected = sorted(expected - set(state)), sorted(set(state) - expected)
    if missing or unexpected:
        raise ValueError(f"{what}: missing keys {missing[:8]}, unexpected keys {unexpected[:8]}")


def to_official_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """A diffspec :class:`~diffspec.ar_image.targets.llamagen.LlamaGenTransformer`'s weights in the official layout.

    The official names are diffspec's names (diffspec reads official checkpoints key for key);
    this checks the set is exactly the official one and returns detached CPU copies.

    Raises:
        ValueError: a key is missing or extra (listed).
    """
    state = {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}
    _check_keys(state, official_llamagen_keys(model.config), "diffspec -> official LlamaGen")
    return state


def from_official_state(state: Mapping[str, torch.Tensor], config: Any) -> dict[str, torch.Tensor]:
    """Inverse of :func:`to_official_state`: an official state dict (derived entries dropped) for diffspec."""
    from ..ar_image.targets.llamagen_load import _DERIVED

    kept = {k: v for k, v in state.items() if not _DERIVED.search(k)}
    _check_keys(kept, official_llamagen_keys(config), "official LlamaGen -> diffspec")
    return dict(kept)


def official_model_args(config: Any) -> dict[str, Any]:
    """Keyword arguments of the official ``ModelArgs`` reproducing a diffspec ``LlamaGenConfig`` (eval: no dropout)."""
    if config.grid_rows not in (None, int(config.block_size ** 0.5)):
        raise ValueError(f"grid_rows={config.grid_rows}: the official code only has square grids")
    names = ("dim", "n_layer", "n_head", "n_kv_head", "multiple_of", "ffn_dim_multiplier", "rope_base", "norm_eps",
             "num_classes", "caption_dim", "class_dropout_prob", "model_type", "vocab_size", "cls_token_num",
             "block_size")
    args = {n: getattr(config, n) for n in names}
    args.update(token_dropout_p=0.0, attn_dropout_p=0.0, resid_dropout_p=0.0, ffn_dropout_p=0.0, drop_path_rate=0.0)
    return args


def _commit(path: Path, given: str | None) -> str:
    if given:
        return given
    try:
        out = subprocess.run(["git", "-C", str(path), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10)
        return out.stdout.strip() if out.returncode == 0 else "unknown (not a git work tree; pass --*-commit)"
    except OSError:
        return "unknown (git not available)"


def peer_checkouts(sjd_repo: str | None, scd_repo: str | None, *, env: Mapping[str, str] | None = None,
                   sjd_commit: str | None = None, scd_commit: str | None = None) -> dict[str, Any]:
    """Resolve the official checkouts (arguments, else ``DIFFSPEC_SJD_REPO`` / ``DIFFSPEC_SCD_REPO``).

    Returns ``{"sjd": path | None, "scd": path | None, "commits": {...}, "skipped": {arm: reason}}``;
    an arm is skipped when its checkout is absent or lacks a file it needs (SCD also needs SJD's
    LlamaGen solver).
    """
    env = os.environ if env is None else env
    found: dict[str, Any] = {"sjd": None, "scd": None, "commits": {}, "skipped": {}}
    for key, given, var, files, commit in (("sjd", sjd_repo, SJD_ENV, SJD_FILES, sjd_commit),
                                           ("scd", scd_repo, SCD_ENV, SCD_FILES, scd_commit)):
        raw = given or env.get(var)
        arm = "sjd-official" if key == "sjd" else "scd-official"
        if not raw:
            found["skipped"][arm] = f"no {key.upper()} checkout (pass --{key}-repo or set {var})"
            continue
        path = Path(raw).expanduser().resolve()
        absent = [f for f in files if not (path / f).is_file()]
        if absent:
            found["skipped"][arm] = f"{path} lacks {', '.join(absent)}"
            continue
        found[key] = path
        found["commits"][key] = _commit(path, commit)
    if found["scd"] is not None and found["sjd"] is None:
        found["skipped"]["scd-official"] = "the SCD peer runs on SJD's official LlamaGen solver: no SJD checkout"
        found["scd"] = None
    return found


class _CpuEvent:
    """Stand-in for ``torch.cuda.Event(enable_timing=True)`` on a CPU-only machine."""

    def __init__(self, enable_timing: bool = False, **_: Any) -> None:
        self.t = 0.0

    def record(self, stream: Any = None) -> None:
        self.t = time.perf_counter()

    def elapsed_time(self, end: _CpuEvent) -> float:
        return (end.t - self.t) * 1000.0


def install_cpu_shims() -> list[str]:
    """Install :data:`CPU_SHIMS` when CUDA is absent; returns the shims installed."""
    if torch.cuda.is_available():
        return []
    torch.cuda.Event = _CpuEvent  # type: ignore[misc,assignment]
    torch.cuda.synchronize = lambda *a, **k: None  # type: ignore[assignment]
    return list(CPU_SHIMS)


def import_official(sjd: Path, scd: Path | None) -> dict[str, Any]:
    """Import the official modules: SJD's packages from its root, SCD's scheduler as package ``scd_scheduler``.

    Both repositories name their package ``scheduler``; SCD's is loaded under another name so that
    both run in one process (its relative imports resolve inside its own folder).
    """
    import transformers

    if str(sjd) not in sys.path:
        sys.path.insert(0, str(sjd))
    llamagen = importlib.import_module("llamagen.llamagen")
    solver = importlib.import_module("llamagen.llamagen_solver")
    sjd_sched = importlib.import_module("scheduler.jacobi_iteration_lumina_mgpt")
    mods = {"ModelArgs": llamagen.ModelArgs, "Transformer": llamagen.Transformer, "solver": solver,
            "sjd_renew_sampler": sjd_sched.renew_sampler, "transformers": transformers.__version__}
    if scd is not None:
        if "scd_scheduler" not in sys.modules:
            spec = importlib.machinery.ModuleSpec("scd_scheduler", None, is_package=True)
            spec.submodule_search_locations = [str(scd / "lumina1" / "scheduler")]
            sys.modules["scd_scheduler"] = importlib.util.module_from_spec(spec)
        mods["scd_renew_sampler"] = importlib.import_module(
            "scd_scheduler.jacobi_iteration_lumina_mgpt_SCDMC").renew_sampler
    return mods


def jacobi_params(window: int, num_tokens: int, guidance: float, top_k: int) -> dict[str, Any]:
    """``_init_new_params`` fields as the official LlamaGen driver (``test_llamagen.py``) sets them.

    ``jacobi_loop_interval_r``: the driver uses ``N - L - 2``; ``N - L`` is the largest value with
    which the official loop stays inside the image (it sizes the next window from the length before
    the current commit, so a window may reach ``L - 1`` tokens past ``r``); larger values index
    past the rotary table. The last ``L`` tokens are therefore decoded one per call.
    """
    if not 1 <= window < num_tokens - 1:
        raise ValueError(f"window={window} is out of range for the official code on {num_tokens} tokens; "
                         f"must be in [1, {num_tokens - 2}]")
    return {"jacobi_loop_interval_l": 1, "jacobi_loop_interval_r": num_tokens - window,
            "max_num_new_tokens": window, "guidance_scale": guidance, "seed": 0,
            "multi_token_init_scheme": "repeat_horizon", "do_cfg": True, "image_top_k": top_k, "text_top_k": 10,
            "prefix_token_sampler_scheme": "speculative_jacobi"}


class OfficialArm:
    """One official generator: the official GPT with the tiny weights, patched as the official driver does.

    ``scheduler=None`` gives the official plain AR loop (``llamagen_solver.generate``).
    """

    def __init__(self, mods: dict[str, Any], config: Any, state: Mapping[str, torch.Tensor], *, scheduler: str | None,
                 window: int, guidance: float, top_k: int, device: torch.device | str = "cpu") -> None:
        self.solver_mod, self.guidance, self.top_k = mods["solver"], guidance, top_k
        self.num_tokens = config.block_size
        self.params = jacobi_params(window, self.num_tokens, guidance, top_k) if scheduler else None
        gpt = mods["Transformer"](mods["ModelArgs"](**official_model_args(config)))
        params = self.params or jacobi_params(1, self.num_tokens, guidance, top_k)
        gpt.__class__ = self.solver_mod.renew_llamagen(gpt.__class__)
        gpt._init_new_params(**params)
        if scheduler:
            gpt.__class__ = mods[f"{scheduler}_renew_sampler"](gpt.__class__)
            gpt.img_vocab = torch.arange(config.vocab_size)  # the documented non-Chameleon branch
            gpt._init_new_params(**params, use_chameleon_tokenizer=False)
        gpt.load_state_dict(dict(state), strict=True)
        self.device = torch.device(device)
        if scheduler:
            gpt.img_vocab = gpt.img_vocab.to(self.device)
        self.model = gpt.to(self.device).eval()
        self.calls = 0
        inner = gpt.inference

        def counted(*args: Any, **kwargs: Any) -> torch.Tensor:
            self.calls += 1
            return inner(*args, **kwargs)

        gpt.inference = counted  # every official forward (prefill included) goes through inference()
        self.runner = self.solver_mod.LlamaGenSolver(model=gpt, image_top_k=top_k, image_top_p=1.0)
        self.log = ""

    def __call__(self, label: int, seed: int) -> torch.Tensor:
        """One image (batch 1): ``(1, N)`` tokens; ``self.calls`` = target calls (prefill = 1)."""
        self.calls = 0
        torch.manual_seed(seed)
        cond = torch.tensor([label], device=self.device)  # the official loops run on cond.device
        kwargs = {"cfg_scale": self.guidance, "temperature": 1.0, "top_k": self.top_k, "top_p": 1.0,
                  "sample_logits": True}
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):  # the official loop prints its own timing every image
            if self.params is None:
                out = self.solver_mod.generate(self.model, cond, self.num_tokens, **kwargs)
            else:
                self.model.seed = seed  # the official _sample re-seeds from self.seed
                out = self.runner.generate(cond, self.num_tokens, **kwargs)
        self.log = buf.getvalue()
        return out.long()


def logits_match(official: Any, model: torch.nn.Module, *, seed: int = 0, batch: int = 4) -> dict[str, Any]:
    """Teacher-forced logits of the official GPT (its KV-cache path) vs diffspec's, same tokens and classes."""
    cfg = model.config
    device = next(model.parameters()).device
    gen = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, cfg.vocab_size, (batch, cfg.block_size), generator=gen).to(device)
    labels = torch.arange(batch) % (cfg.num_classes + 1)  # the null class included
    labels[-1] = cfg.num_classes
    labels = labels.to(device)
    with torch.no_grad():
        ref = model(tokens, labels)
        with torch.device(device):  # as the official generate() does: caches on the model's device
            official.setup_caches(max_batch_size=batch, max_seq_length=cfg.block_size + cfg.cls_token_num,
                                  dtype=torch.float32)
        first = official.inference(None, labels, torch.arange(cfg.cls_token_num, device=device))
        rest = official.inference(tokens[:, :-1], None,
                                  torch.arange(cfg.cls_token_num, cfg.cls_token_num + cfg.block_size - 1, device=device))
        got = torch.cat([first[:, -1:], rest], 1)
    diff = float((got - ref).abs().max())
    return {"max_abs_diff": diff, "allclose_atol_1e-4": bool(torch.allclose(got, ref, atol=1e-4, rtol=1e-4)),
            "rows": int(ref.shape[0] * ref.shape[1])}
