"""Offline stand-ins for the parts of ComfyUI the diffspec nodes meet.

- :class:`FakeModelPatcher`: ``clone()`` deep-copies ``model_options`` and copies the wrapper lists,
  ``set_model_patch_replace`` and ``add_wrapper_with_key`` behave as ComfyUI's and are recorded.
- :class:`ToyFlux`: a Flux-like diffusion model (double blocks take/return img and txt, single blocks
  the concatenated stream, updating their inputs in place like ComfyUI's Flux blocks) whose forward
  looks up ``transformer_options["patches_replace"]["dit"]`` the way ComfyUI's Flux does; :class:`DiffusersToy` runs the same blocks as a diffusers-style
  transformer (``hidden_states`` / ``encoder_hidden_states`` / ``timestep``) for parity tests.
- :func:`sample`: a CFG Euler sampler shaped like ``CFGGuider``: ``OUTER_SAMPLE`` wrappers around the
  run, ``sample_sigmas`` / ``sigmas`` / ``uuids`` / ``cond_or_uncond`` in ``transformer_options``,
  ``APPLY_MODEL`` wrappers around each model call.
"""

from __future__ import annotations

import copy
import math
import uuid
from collections.abc import Callable
from typing import Any

import torch
from torch import nn


class Executor:
    """ComfyUI's ``WrapperExecutor`` contract: ``wrapper(executor, *args)``; ``executor(*args)`` calls the next."""

    def __init__(self, original: Callable, wrappers: list[Callable], idx: int = 0) -> None:
        self.original, self.wrappers, self.idx = original, wrappers, idx

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return Executor(self.original, self.wrappers, self.idx + 1).execute(*args, **kwargs)

    def execute(self, *args: Any, **kwargs: Any) -> Any:
        if self.idx == len(self.wrappers):
            return self.original(*args, **kwargs)
        return self.wrappers[self.idx](self, *args, **kwargs)


def all_wrappers(wrappers: dict, wrapper_type: str) -> list[Callable]:
    return [w for ws in wrappers.get(wrapper_type, {}).values() for w in ws]


class FakeModelPatcher:
    """The ModelPatcher surface the nodes use, recording what they install."""

    def __init__(self, model: FakeBaseModel) -> None:
        self.model = model
        self.model_options: dict[str, Any] = {"transformer_options": {}}
        self.wrappers: dict[str, dict[str, list]] = {}
        self.replace_calls: list[tuple] = []

    def clone(self) -> FakeModelPatcher:
        n = FakeModelPatcher(self.model)
        n.model_options = copy.deepcopy(self.model_options)
        n.wrappers = {k: {k1: list(w1) for k1, w1 in w.items()} for k, w in self.wrappers.items()}
        return n

    def set_model_patch_replace(self, patch: Callable, name: str, block_name: str, number: int,
                                transformer_index: int | None = None) -> None:
        to = dict(self.model_options["transformer_options"])  # ComfyUI copies the dicts on the way down
        to["patches_replace"] = {k: dict(v) for k, v in to.get("patches_replace", {}).items()}
        to["patches_replace"].setdefault(name, {})[(block_name, number)] = patch
        self.model_options["transformer_options"] = to
        self.replace_calls.append((name, block_name, number))

    def add_wrapper_with_key(self, wrapper_type: str, key: str, wrapper: Callable) -> None:
        self.wrappers.setdefault(wrapper_type, {}).setdefault(key, []).append(wrapper)

    def remove_wrappers_with_key(self, wrapper_type: str, key: str) -> None:
        self.wrappers.get(wrapper_type, {}).pop(key, None)


class FakeBaseModel:
    """``BaseModel.apply_model`` with its ``APPLY_MODEL`` wrappers; returns the diffusion model's output."""

    def __init__(self, diffusion_model: nn.Module) -> None:
        self.diffusion_model = diffusion_model

    def apply_model(self, x, t, c_concat=None, c_crossattn=None, control=None, transformer_options={}, **kwargs):  # noqa: B006
        wrappers = all_wrappers(transformer_options.get("wrappers", {}), "apply_model")
        return Executor(self._apply_model, wrappers).execute(x, t, c_concat, c_crossattn, control,
                                                              transformer_options, **kwargs)

    def _apply_model(self, x, t, c_concat=None, c_crossattn=None, control=None, transformer_options={}, **kwargs):  # noqa: B006
        return self.diffusion_model(x, t, c_crossattn, transformer_options=transformer_options)


# ----------------------------------------------------------------------------- toy Flux
def _embed_time(t: torch.Tensor, dim: int) -> torch.Tensor:
    half = dim // 2
    freqs = torch.exp(-math.log(1000.0) * torch.arange(half, dtype=torch.float32) / half)
    args = (t.float() * 1000)[:, None] * freqs[None]
    return torch.cat([torch.cos(args), torch.sin(args)], -1)


class ToyDouble(nn.Module):
    """Two streams, modulated by ``vec``, mixed through a joint token average.

    ``inplace=True`` adds the updates into the input tensors, as ComfyUI's Flux blocks do
    (``img += ...``); diffusers' blocks return new tensors (``inplace=False``). Same values.
    """

    def __init__(self, d: int) -> None:
        super().__init__()
        self.mod = nn.Linear(d, 2 * d)
        self.mix = nn.Linear(d, d)
        self.img_mlp = nn.Sequential(nn.Linear(d, 2 * d), nn.GELU(), nn.Linear(2 * d, d))
        self.txt_mlp = nn.Sequential(nn.Linear(d, 2 * d), nn.GELU(), nn.Linear(2 * d, d))

    def forward(self, img: torch.Tensor, txt: torch.Tensor, vec: torch.Tensor,
                inplace: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        shift, scale = self.mod(vec)[:, None].chunk(2, -1)
        mixed = self.mix(torch.cat([txt, img], 1)).mean(1, keepdim=True)
        if inplace:
            img += mixed
            txt += mixed
            img += self.img_mlp(img * (1 + scale) + shift)
            txt += self.txt_mlp(txt)
            return img, txt
        img, txt = img + mixed, txt + mixed
        return img + self.img_mlp(img * (1 + scale) + shift), txt + self.txt_mlp(txt)


class ToySingle(nn.Module):
    """One (concatenated) stream; ``inplace`` as in :class:`ToyDouble`."""

    def __init__(self, d: int) -> None:
        super().__init__()
        self.mod = nn.Linear(d, d)
        self.mix = nn.Linear(d, d)
        self.mlp = nn.Sequential(nn.Linear(d, 2 * d), nn.GELU(), nn.Linear(2 * d, d))

    def forward(self, x: torch.Tensor, vec: torch.Tensor, inplace: bool = False) -> torch.Tensor:
        update = self.mlp(x * (1 + self.mod(vec)[:, None])) + self.mix(x).mean(1, keepdim=True)
        if inplace:
            x += update
            return x
        return x + update


class ToyFlux(nn.Module):
    """Flux-shaped ComfyUI diffusion model: ``forward(x, timestep, context, transformer_options)``."""

    def __init__(self, channels: int = 4, d: int = 32, context_dim: int = 16, depth: int = 2,
                 depth_single: int = 3, seed: int = 0) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.d = d
        self.img_in = nn.Linear(channels, d)
        self.txt_in = nn.Linear(context_dim, d)
        self.time_in = nn.Sequential(nn.Linear(d, d), nn.SiLU(), nn.Linear(d, d))
        self.double_blocks = nn.ModuleList(ToyDouble(d) for _ in range(depth))
        self.single_blocks = nn.ModuleList(ToySingle(d) for _ in range(depth_single))
        self.final = nn.Linear(d, channels)
        self.control = None  # timestep -> {"input": [...], "output": [...]}: ControlNet residuals, as Flux adds them

    def embed(self, x: torch.Tensor, timestep: torch.Tensor, context: torch.Tensor):
        img = self.img_in(x.flatten(2).transpose(1, 2))
        return img, self.txt_in(context), self.time_in(_embed_time(timestep, self.d))

    def unembed(self, img: torch.Tensor, shape: torch.Size) -> torch.Tensor:
        return self.final(img).transpose(1, 2).reshape(shape)

    def forward(self, x, timestep, context, transformer_options={}):  # noqa: B006 (ComfyUI's signature)
        img, txt, vec = self.embed(x, timestep, context)
        control = self.control(timestep) if self.control is not None else {"input": [], "output": []}
        replace = transformer_options.get("patches_replace", {}).get("dit", {})
        for i, block in enumerate(self.double_blocks):
            if ("double_block", i) in replace:
                def block_wrap(args, block=block):
                    out = {}
                    out["img"], out["txt"] = block(img=args["img"], txt=args["txt"], vec=args["vec"], inplace=True)
                    return out

                out = replace[("double_block", i)]({"img": img, "txt": txt, "vec": vec,
                                                    "transformer_options": transformer_options},
                                                   {"original_block": block_wrap})
                txt, img = out["txt"], out["img"]
            else:
                img, txt = block(img=img, txt=txt, vec=vec, inplace=True)
            if i < len(control["input"]):
                img += control["input"][i]  # in place, as ComfyUI's Flux adds its ControlNet's residuals
        joint = torch.cat((txt, img), 1)
        for i, block in enumerate(self.single_blocks):
            if ("single_block", i) in replace:
                def single_wrap(args, block=block):
                    return {"img": block(args["img"], vec=args["vec"], inplace=True)}

                joint = replace[("single_block", i)]({"img": joint, "vec": vec, "transformer_options": transformer_options},
                                                     {"original_block": single_wrap})["img"]
            else:
                joint = block(joint, vec=vec, inplace=True)
            if i < len(control["output"]):
                joint[:, txt.shape[1]:] += control["output"][i]
        return self.unembed(joint[:, txt.shape[1]:], x.shape)


class DiffusersDouble(nn.Module):
    """A :class:`ToyDouble` with diffusers' argument names, returning ``(encoder, hidden)`` like Flux."""

    def __init__(self, inner: ToyDouble) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, hidden_states, encoder_hidden_states, temb):
        img, txt = self.inner(img=hidden_states, txt=encoder_hidden_states, vec=temb)
        return txt, img


class DiffusersSingle(nn.Module):
    def __init__(self, inner: ToySingle) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, hidden_states, temb):
        return self.inner(hidden_states, vec=temb)


class DiffusersToy(nn.Module):
    """The same weights as a diffusers-style transformer (for :class:`~diffspec.forecast.hooks.ForecastHooks`)."""

    def __init__(self, flux: ToyFlux) -> None:
        super().__init__()
        self.transformer_blocks = nn.ModuleList(DiffusersDouble(b) for b in flux.double_blocks)
        self.single_transformer_blocks = nn.ModuleList(DiffusersSingle(b) for b in flux.single_blocks)
        object.__setattr__(self, "flux", flux)  # not a child: only the two block lists are

    def forward(self, hidden_states, encoder_hidden_states, timestep):
        img, txt, vec = self.flux.embed(hidden_states, timestep, encoder_hidden_states)
        for block in self.transformer_blocks:
            txt, img = block(hidden_states=img, encoder_hidden_states=txt, temb=vec)
        joint = torch.cat((txt, img), 1)
        for block in self.single_transformer_blocks:
            joint = block(hidden_states=joint, temb=vec)
        return self.flux.unembed(joint[:, txt.shape[1]:], hidden_states.shape)


# ----------------------------------------------------------------------------- sampling
def euler_cfg(call: Callable, x0: torch.Tensor, sigmas: torch.Tensor, contexts: list[torch.Tensor],
              cfg: float = 2.0, on_step: Callable[[int], None] | None = None) -> torch.Tensor:
    """CFG Euler over ``sigmas``; ``call(x_batch, t_batch, context_batch)`` sees [cond, uncond] rows."""
    x = x0
    with torch.no_grad():
        for i in range(len(sigmas) - 1):
            if on_step:
                on_step(i)
            n = len(contexts)
            v = call(x.repeat(n, 1, 1, 1), sigmas[i].repeat(n), torch.cat(contexts))
            v = v[1:2] + cfg * (v[0:1] - v[1:2]) if n == 2 else v
            x = x + (sigmas[i + 1] - sigmas[i]) * v
    return x


def sample(patcher: FakeModelPatcher, x0: torch.Tensor, sigmas: torch.Tensor, contexts: list[torch.Tensor], *,
           batched: bool = True, on_step: Callable[[int], None] | None = None) -> torch.Tensor:
    """Sample like ComfyUI's ``CFGGuider.sample``: model_options cloned, the patcher's wrappers merged in,
    ``OUTER_SAMPLE`` wrappers around the run and fresh cond ``uuids`` per run."""
    model_options = copy.copy(patcher.model_options)
    to = model_options["transformer_options"] = dict(model_options["transformer_options"])
    wrappers = {k: {k1: list(w1) for k1, w1 in w.items()} for k, w in patcher.wrappers.items()}
    to["wrappers"] = wrappers
    model = patcher.model
    uuids = [uuid.uuid4() for _ in contexts]

    def outer_sample(noise, latent_image, sampler, sigmas, denoise_mask=None, callback=None, disable_pbar=False,
                     seed=None):
        run_options = dict(to, sample_sigmas=sigmas)

        def call(x, t, context):
            if batched:
                options = dict(run_options, cond_or_uncond=list(range(len(contexts))), uuids=uuids, sigmas=t[:1])
                return model.apply_model(x, t, None, context, None, options)
            outs = []
            for j in range(len(contexts)):  # one call per cond, as when conds cannot be batched
                options = dict(run_options, cond_or_uncond=[j], uuids=[uuids[j]], sigmas=t[:1])
                outs.append(model.apply_model(x[j:j + 1], t[j:j + 1], None, context[j:j + 1], None, options))
            return torch.cat(outs)

        return euler_cfg(call, noise, sigmas, contexts, on_step=on_step)

    return Executor(outer_sample, all_wrappers(wrappers, "outer_sample")).execute(x0, x0, None, sigmas)


def make_inputs(seed: int = 1, steps: int = 16) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]:
    """A latent (1, 4, 4, 4), flow sigmas 1 -> 0 and [cond, uncond] contexts (1, 8, 16)."""
    g = torch.Generator().manual_seed(seed)
    x0 = torch.randn(1, 4, 4, 4, generator=g)
    cond = 2 * torch.randn(1, 8, 16, generator=g)
    return x0, torch.linspace(1.0, 0.0, steps + 1), [cond, torch.zeros_like(cond)]


def toy_patcher(seed: int = 0, **kwargs: Any) -> FakeModelPatcher:
    return FakeModelPatcher(FakeBaseModel(ToyFlux(seed=seed, **kwargs).eval()))


# ----------------------------------------------------------------------------- SAMPLER contract
class FakeKSAMPLER:
    """``comfy.samplers.KSAMPLER``'s surface: the function and the options it is called with."""

    def __init__(self, sampler_function: Callable, extra_options: dict | None = None,
                 inpaint_options: dict | None = None) -> None:
        self.sampler_function = sampler_function
        self.extra_options = extra_options or {}
        self.inpaint_options = inpaint_options or {}

    def run(self, model: Callable, noise: torch.Tensor, sigmas: torch.Tensor, seed: int,
            callback: Callable | None = None, denoise_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Call the function as ``KSAMPLER.sample`` does (noise already scaled)."""
        extra_args = {"model_options": {}, "seed": seed, "denoise_mask": denoise_mask}
        return self.sampler_function(model, noise, sigmas, extra_args=extra_args, callback=callback, disable=True,
                                     **self.extra_options)


def fake_comfy_modules() -> dict[str, Any]:
    """``sys.modules`` entries for ``comfy`` and ``comfy.samplers`` (use with ``mock.patch.dict``)."""
    import types

    comfy = types.ModuleType("comfy")
    samplers = types.ModuleType("comfy.samplers")
    samplers.KSAMPLER = FakeKSAMPLER
    comfy.samplers = samplers
    return {"comfy": comfy, "comfy.samplers": samplers}


class EPS:
    """Stands for ComfyUI's noise-prediction sampling type (``x = x0 + sigma * eps``)."""


class CONST:
    """Stands for ComfyUI's rectified-flow sampling type (``x = (1 - sigma) x0 + sigma * eps``)."""


class MixtureDenoiser:
    """ComfyUI's sampler-side model (``model(x, sigma_rows, **extra_args) -> x0``) for Gaussian-mixture data.

    The data are an equal mixture of ``N(m_k, tau^2 I)``; the denoiser returns the exact posterior mean
    ``E[x0 | x]`` at each row's sigma, for noise-prediction (``x = x0 + s eps``) or flow
    (``x = (1 - s) x0 + s eps``) noising. ``model.inner_model.inner_model.model_sampling`` is an
    :class:`EPS` or :class:`CONST`, where ComfyUI's samplers look. Counts calls and rows.
    """

    def __init__(self, flow: bool = False, dim: int = 8, tau: float = 0.5, offset: float = 0.0) -> None:
        self.flow, self.tau, self.offset = flow, tau, offset
        self.means = torch.stack([torch.full((dim,), 2.0), torch.full((dim,), -1.5)]).double()
        sampling = CONST() if flow else EPS()
        self.inner_model = type("Guider", (), {})()
        self.inner_model.inner_model = type("BaseModel", (), {"model_sampling": sampling})()
        self.calls, self.rows, self.sigma_rows = 0, 0, []

    def __call__(self, x: torch.Tensor, sigma: torch.Tensor, **extra_args: Any) -> torch.Tensor:
        self.calls += 1
        self.rows += x.shape[0]
        self.sigma_rows.append(sigma.clone())
        s = sigma.double().view(-1, 1)
        a = 1 - s if self.flow else torch.ones_like(s)
        flat = x.double().flatten(1)
        var = a**2 * self.tau**2 + s**2
        logw = torch.stack([-((flat - a * m) ** 2).sum(1) / (2 * var[:, 0]) for m in self.means], 1)
        post = torch.stack([m + a * self.tau**2 / var * (flat - a * m) for m in self.means], 1)
        x0 = (logw.softmax(1).unsqueeze(-1) * post).sum(1) + self.offset
        return x0.view(x.shape).to(x.dtype)
