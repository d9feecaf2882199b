"""``tiny-vla``: a tiny trained action model (Llama causal LM, OpenVLA-style action tokens).

The task ("reach"): a point at ``pos`` in ``[-1, 1]^3`` moves toward a ``goal``. The observation is
a compact state encoding, ``[BOS, pos_x, pos_y, pos_z, goal_x, goal_y, goal_z]`` with every
coordinate quantised to ``LEVELS`` ids; the model answers with 7 action tokens (the last 256 ids of
its vocabulary, 256 bins over [-1, 1] per DoF, OpenVLA's order). The expert action, a function of the
quantised observation: translation ``clip(2 * (goal - pos))``, rotation
``clip(-1.5 * (goal - pos)[y, z, x])`` and gripper ``+1`` while ``|goal - pos| > 0.2`` else ``-1``;
the point then moves by ``0.05 * translation``, so consecutive actions are smooth (a geometric
approach) and drafts from the previous action or a Kalman extrapolation are good.

Example:
    >>> from diffspec.models.tiny_vla import load_tiny_vla, sample_episodes, encode_observation
    >>> model, amap = load_tiny_vla()  # doctest: +SKIP
    >>> states, actions = sample_episodes(2, 10, seed=0)
    >>> encode_observation(states).shape
    torch.Size([2, 10, 7])
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from ..multimodal.action_map import ActionTokenMap

WEIGHTS = Path(__file__).resolve().parent.parent / "weights" / "tiny-vla"
PAD, BOS, EOS = 0, 1, 2
LEVELS = 128
"""Quantisation levels of each observed coordinate (ids ``STATE0 .. STATE0 + LEVELS - 1``)."""
STATE0 = 3
N_BINS, N_DOF = 256, 7
VOCAB = STATE0 + LEVELS + N_BINS
DT, GAIN, ROT_GAIN, GRIP_RADIUS = 0.05, 2.0, 1.5, 0.2
SUCCESS_RADIUS = 0.1
"""A closed-loop episode succeeds when it ends within this distance of its goal."""
PROMPT_LEN = 7


def action_map() -> ActionTokenMap:
    """The tiny VLA's action tokens: the last 256 ids, 7 DoF over [-1, 1], OpenVLA's order."""
    return ActionTokenMap(vocab_size=VOCAB, n_bins=N_BINS, n_dof=N_DOF)


def tiny_vla_config(hidden: int = 128, layers: int = 3) -> Any:
    """The ``LlamaConfig`` of the tiny VLA (tied embeddings, ~0.5 M parameters)."""
    from transformers import LlamaConfig

    return LlamaConfig(vocab_size=VOCAB, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                       num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=32,
                       tie_word_embeddings=True, pad_token_id=PAD, bos_token_id=BOS, eos_token_id=EOS)


def build_tiny_vla(seed: int = 0, **kwargs: Any) -> Any:
    """A random-weight tiny VLA (``LlamaForCausalLM``) in eval mode."""
    from transformers import LlamaForCausalLM

    torch.manual_seed(seed)
    return LlamaForCausalLM(tiny_vla_config(**kwargs)).eval()


def quantize(x: torch.Tensor) -> torch.Tensor:
    """Coordinates in [-1, 1] -> levels ``0 .. LEVELS - 1``."""
    return torch.round((x.clamp(-1, 1) + 1) / 2 * (LEVELS - 1)).long()


def dequantize(q: torch.Tensor) -> torch.Tensor:
    """Levels -> coordinates."""
    return q.float() / (LEVELS - 1) * 2 - 1


def expert_action(states: torch.Tensor) -> torch.Tensor:
    """(..., 6) states ``[pos, goal]`` -> (..., 7) expert actions (computed from the quantised state)."""
    s = dequantize(quantize(states))
    delta = s[..., 3:] - s[..., :3]
    move = (GAIN * delta).clamp(-1, 1)
    rot = (-ROT_GAIN * delta[..., [1, 2, 0]]).clamp(-1, 1)
    grip = torch.where(delta.norm(dim=-1, keepdim=True) > GRIP_RADIUS, 1.0, -1.0)
    return torch.cat([move, rot, grip], dim=-1)


def sample_episodes(n: int, steps: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Expert rollouts: states (n, steps, 6) and actions (n, steps, 7), batched over episodes.

    Start positions are uniform in [-1, 1]^3 and goals in [-0.8, 0.8]^3 (seeded).
    """
    g = torch.Generator().manual_seed(seed)
    pos = torch.rand(n, 3, generator=g) * 2 - 1
    goal = torch.rand(n, 3, generator=g) * 1.6 - 0.8
    return rollout(expert_action, torch.cat([pos, goal], dim=-1), steps)


def step_states(states: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
    """One simulation step: (..., 6) states ``[pos, goal]`` moved by (..., 7) actions' translation."""
    pos = (states[..., :3] + DT * actions[..., :3]).clamp(-1, 1)
    return torch.cat([pos, states[..., 3:]], dim=-1)


def rollout(policy: Any, start: torch.Tensor, steps: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Closed loop: ``policy`` ((n, 6) states -> (n, 7) actions) drives (n, 6) ``start`` states for
    ``steps`` steps; returns the visited states (n, steps, 6) and the actions (n, steps, 7).

    Example:
        >>> states, actions = rollout(expert_action, torch.tensor([[0.5, 0.5, 0.5, 0.0, 0.0, 0.0]]), 40)
        >>> float(final_distance(states, actions)[0]) < 0.1
        True
    """
    s, states, actions = start, [], []
    for _ in range(steps):  # time steps of the simulation (rows batched)
        a = policy(s)
        states.append(s)
        actions.append(a)
        s = step_states(s, a)
    return torch.stack(states, 1), torch.stack(actions, 1)


def final_distance(states: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
    """Distance to the goal after the last action of each rollout: (n,)."""
    last = step_states(states[:, -1], actions[:, -1])
    return (last[..., 3:] - last[..., :3]).norm(dim=-1)


def encode_observation(states: torch.Tensor) -> torch.Tensor:
    """(..., 6) states -> (..., 7) prompt ids ``[BOS, 6 quantised coordinates]``."""
    ids = quantize(states) + STATE0
    return torch.cat([torch.full_like(ids[..., :1], BOS), ids], dim=-1)


def load_tiny_vla(path: str | Path | None = None, *, device: Any = None) -> tuple[Any, ActionTokenMap]:
    """The shipped trained tiny VLA (or a ``save_pretrained`` folder) and its action map (the folder's
    ``action_map.json`` when it has one, else :func:`action_map`).

    Raises:
        ValueError: the folder has no ``config.json``.
    """
    from transformers import LlamaForCausalLM

    folder = Path(path) if path is not None else WEIGHTS
    if not (folder / "config.json").is_file():
        raise ValueError(f"{folder} is not a tiny-vla folder (no config.json); train one with scripts/train_tiny_vla.py")
    model = LlamaForCausalLM.from_pretrained(folder).eval()
    model.generation_config.pad_token_id = PAD
    if device is not None:
        model = model.to(device)
    amap = ActionTokenMap.from_pretrained(folder) or action_map()
    amap.check_model(model)
    return model, amap
