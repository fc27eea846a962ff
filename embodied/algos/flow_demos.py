"""Demonstrations in ReinFlow's update: a flow-matching loss on ``--dataset`` action chunks.

A sparse-reward task gives PPO a signal only in the episodes the policy already solves; a base
that solves few of them barely moves (docs/benchmarks/lerobot-rl.md). With ``--dataset``,
every actor optimizer step of ReinFlow also takes the conditional flow-matching loss of the
chain on a random batch of demonstration steps, next to the clipped surrogate: the velocity field
keeps being pulled toward the demonstrated chunks while PPO moves it toward higher return.

The loss is written on the chain's own Euler grid through :class:`~embodied.algos.flow_chain.FlowChain`
only, so it is the same for this project's flow policies and a VLA's action expert: at grid step
``k`` (fraction ``s = k / K`` of the way from noise to data), with ``x0 ~ N(0, I)`` and ``a`` the
demonstrated chunk in the chain's state space, ``x_s = (1 - s) x0 + s a``, and the straight path's
Euler step is ``x_s + (a - x0) / K``. The loss is the weighted mean squared error between ``K``
times the chain's step displacement ``step_mean(x_s, k) - x_s`` and the path's velocity
``a - x0``: the flow-matching loss in velocity units, whatever the direction of the policy's own
time variable (SmolVLA's runs from 1 to 0). One grid step ``k`` is drawn per call, so a call runs
the velocity field once; the caller splits a batch into micro-batches (``algo.micro_batch``) to
bound the activation memory of a large expert.

The demonstrations' conditioning is computed per batch (no gradient), not stored: a VLA backbone's
key/value cache of thousands of frames would not fit.

Shapes: ``M`` = demonstration steps, ``B`` = demo batch, ``F`` = the flattened chain state,
``H`` = chunk length, ``A`` = action size.
"""

from __future__ import annotations

from pathlib import Path

import torch

from embodied.algos.flow_chain import FlowChain
from embodied.data.demos import load_dataset
from embodied.env import IMAGE_GROUP, ObsDict
from embodied.errors import EmbodiedError


class FlowDemos:
    """The demonstration steps of a dataset, as observations and chain-space action chunks."""

    def __init__(self, obs: ObsDict, chunks: torch.Tensor, chain: FlowChain) -> None:
        """``obs``: the groups the chain encodes, ``[M, ...]`` each; ``chunks`` ``[M, H, A]`` in [-1, 1]."""
        self.obs = obs
        self.target, self.weight = chain.demo_chain_state(chunks)
        """``[M, F]``: each step's chunk in the chain's state space, and the weight of each entry
        (0 on entries that are not actions, such as a VLA's padded action slots)."""

    @property
    def steps(self) -> int:
        return int(self.target.shape[0])

    def draw(self, batch: int, generator: torch.Generator) -> torch.Tensor:
        """``batch`` random demonstration rows ``[B]`` (with replacement)."""
        return torch.randint(self.steps, (batch,), generator=generator, device=self.target.device)

    def loss(self, chain: FlowChain, rows: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        """The flow-matching loss (scalar, differentiable in the chain's trainable parameters) on
        demonstration ``rows`` ``[B]``, at one grid step and start noise drawn with ``generator``."""
        device = self.target.device
        cond = chain.encode({group: value[rows] for group, value in self.obs.items()})
        target, weight = self.target[rows], self.weight[rows]
        k = int(torch.randint(chain.denoise_steps, (1,), generator=generator, device=device))
        s = k / chain.denoise_steps
        x0 = torch.randn(target.shape, generator=generator, device=device)
        x_s = (1.0 - s) * x0 + s * target
        velocity = (chain.step_mean(cond, x_s, k) - x_s) * chain.denoise_steps
        error = (velocity - (target - x0)).square() * weight
        return error.sum() / weight.sum().clamp_min(1.0)


def load_flow_demos(
    path: Path, chain: FlowChain, obs_spec: dict[str, tuple[int, ...]], action_dim: int, device: torch.device
) -> FlowDemos:
    """Read ``--dataset`` for ReinFlow: the observation groups the task's policy reads (``policy``,
    and camera images where the task has them) and each step's next ``H`` actions (past an
    episode's end its last action repeats)."""
    obs_dim = int(torch.Size(obs_spec["policy"]).numel())
    demos = load_dataset(path, obs_dim=obs_dim, action_dim=action_dim)
    # the policy reads "policy" and the camera; "critic" (privileged) it never reads
    unrecorded = sorted(set(obs_spec) - {"policy", IMAGE_GROUP, "critic"})
    if unrecorded:
        raise EmbodiedError(
            f"reinflow --dataset {path}: the policy also reads observation groups {unrecorded}, which a dataset "
            "does not record; train without --dataset"
        )
    obs: ObsDict = {"policy": torch.as_tensor(demos.obs, dtype=torch.float32, device=device)}
    if IMAGE_GROUP in obs_spec:
        obs[IMAGE_GROUP] = torch.as_tensor(demos.camera_images(obs_spec[IMAGE_GROUP], "reinflow"), device=device)
    chunks = torch.as_tensor(demos.action_chunks(chain.chunk_spec.length), dtype=torch.float32, device=device)
    return FlowDemos(obs, chunks.clamp(-1.0, 1.0), chain)
