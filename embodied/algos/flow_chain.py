"""What ReinFlow fine-tunes: a ``K``-step Euler chain of flattened action chunks.

:class:`FlowChain` is the one interface between the ReinFlow algorithm
(:mod:`embodied.algos.reinflow`) and a flow-matching policy, so one algorithm (and one trainer)
fine-tunes this project's flow policies and a pretrained VLA's action expert alike:

- :meth:`FlowChain.encode` turns an observation batch into the chain's conditioning, a
  :data:`Cond` (a dict of tensors, batch first): the normalized observation of a flow policy, or a
  VLA backbone's key/value cache of images, instruction and state. It runs once per observation
  (at acting time, no gradient) and is stored with the rollout, so the ``K`` denoising steps and
  every PPO epoch reuse it;
- :meth:`FlowChain.step_mean` is the deterministic Euler step ``x_k -> x_k + dt v(x_k, t_k)``;
  ReinFlow adds the learned noise around it, so the chain's log-likelihood is exact;
- :meth:`FlowChain.features` is a small vector ``[B, C]`` of the conditioning that the noise
  network and the critic read;
- :meth:`FlowChain.actions` maps the chain's last state to the action chunk ``[B, H, A]`` in
  [-1, 1], which the env executes as the policy's :attr:`FlowChain.chunk_spec` says;
  :meth:`FlowChain.demo_chain_state` is its inverse, for demonstrated chunks
  (:mod:`embodied.algos.flow_demos`).

:class:`PolicyFlowChain` is the chain of :class:`embodied.policies.flow.FlowPolicy` (and the
image + instruction flow policy built on it); ``embodied.policies.smolvla_chain`` is SmolVLA's.

Shapes: ``B`` = batch, ``F`` = the flattened chain state (chunk x action slots), ``C`` = feature
size, ``E`` = time-feature size, ``H`` = chunk length, ``A`` = action size.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator, Sequence
from typing import Protocol

import torch
from torch import nn

from embodied.action_chunks import ChunkSpec
from embodied.env import ObsDict
from embodied.policies.flow import FlowPolicy

Cond = dict[str, torch.Tensor]
"""A chain's conditioning for a batch: every tensor has the batch as its first dimension."""


def cat_conds(conds: Sequence[Cond]) -> Cond:
    """The conditionings of several batches as one (concatenated along the batch)."""
    keys = list(conds[0])
    return {k: torch.cat([c[k] for c in conds], dim=0) for k in keys}


def index_cond(cond: Cond, idx: torch.Tensor | slice) -> Cond:
    """The rows ``idx`` of a conditioning."""
    return {k: v[idx] for k, v in cond.items()}


def cond_rows(cond: Cond) -> int:
    """The batch size of a conditioning."""
    return int(next(iter(cond.values())).shape[0])


class FlowChain(Protocol):
    """A flow-matching policy seen as the chain ReinFlow scores (see the module docstring)."""

    @property
    def policy(self) -> nn.Module:
        """The policy being fine-tuned (what the run evaluates, checkpoints and exports)."""
        ...

    flat_dim: int
    """``F = H * P``: the size of one chain state (position-major)."""
    slots: int
    """``P``: action slots per chunk position; the first ``action_dim`` are the task's actions, the
    rest padding (a VLA pads to its ``max_action_dim``)."""
    action_dim: int
    """``A``: the task's action size."""
    denoise_steps: int
    """``K``: Euler steps per chain."""
    feature_dim: int
    """``C``: the size of :meth:`features`."""
    time_dim: int
    """``E``: the size of :meth:`time_features`."""
    chunk_spec: ChunkSpec
    """How the env executes the chunks (length, actions per chain)."""

    def encode(self, obs: ObsDict) -> Cond:
        """The conditioning of observations ``[B, ...]`` (no gradient; run once per observation)."""
        ...

    def features(self, cond: Cond) -> torch.Tensor:
        """``[B, C]``: what the noise network and the critic read."""
        ...

    def time_features(self, k: int, batch: int) -> torch.Tensor:
        """``[B, E]`` features of grid step ``k`` (for the noise network)."""
        ...

    def step_mean(self, cond: Cond, x: torch.Tensor, k: int) -> torch.Tensor:
        """``x_k + dt v(x_k, t_k)`` ``[B, F]``: the noise-free Euler step ``k`` of the trained policy."""
        ...

    def base_step_mean(self, cond: Cond, x: torch.Tensor, k: int) -> torch.Tensor:
        """The same step of the frozen base (the behaviour-cloning regularizer's target)."""
        ...

    def actions(self, x_final: torch.Tensor) -> torch.Tensor:
        """The chunk ``[B, H, A]`` in [-1, 1] for the chain's last state ``[B, F]``."""
        ...

    def demo_chain_state(self, chunks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The chain state ``[B, F]`` whose :meth:`actions` are the chunks ``[B, H, A]`` (in [-1, 1]),
        and a weight ``[B, F]`` per entry: 1 where it is an action, 0 where it is not (padding)."""
        ...

    def trainable_parameters(self) -> Iterator[nn.Parameter]:
        """The parameters the actor optimizer trains."""
        ...


class PolicyFlowChain:
    """The chain of a :class:`FlowPolicy` (grid ``t_k = k / K``, ``x_{k+1} = x_k + v / K``)."""

    def __init__(self, policy: FlowPolicy, base: FlowPolicy | None = None) -> None:
        self.policy = policy
        self.base = base if base is not None else copy.deepcopy(policy).requires_grad_(False)
        cfg = policy.cfg
        self.flat_dim = policy.flat_dim
        self.denoise_steps = cfg.denoise_steps
        self.feature_dim = policy.cond_dim
        self.time_dim = cfg.time_embed_dim * (2 if cfg.shortcut else 1)
        self.chunk_spec = ChunkSpec(cfg.chunk, cfg.exec_steps)
        self.action_dim = policy.action_dim
        self.slots = policy.action_dim

    def encode(self, obs: ObsDict) -> Cond:
        with torch.no_grad():
            return {"obs_n": self.policy.condition(obs)}

    def features(self, cond: Cond) -> torch.Tensor:
        return cond["obs_n"]

    def time_features(self, k: int, batch: int) -> torch.Tensor:
        device = self.policy.obs_mean.device
        t = torch.full((batch,), k / self.denoise_steps, device=device)
        return self.policy.time_features(t)

    def step_mean(self, cond: Cond, x: torch.Tensor, k: int) -> torch.Tensor:
        return x + self.policy.field(x, k, cond["obs_n"]) / self.denoise_steps

    def base_step_mean(self, cond: Cond, x: torch.Tensor, k: int) -> torch.Tensor:
        return x + self.base.field(x, k, cond["obs_n"]) / self.denoise_steps

    def actions(self, x_final: torch.Tensor) -> torch.Tensor:
        return x_final.clamp(-1.0, 1.0).reshape(-1, self.policy.cfg.chunk, self.action_dim)

    def demo_chain_state(self, chunks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        flat = chunks.reshape(chunks.shape[0], -1)
        return flat, torch.ones_like(flat)

    def trainable_parameters(self) -> Iterator[nn.Parameter]:
        return self.policy.parameters()
