"""Fixed-size on-policy rollout storage shared by on-policy algorithms (PPO, ReinFlow).

Shapes: ``T`` = steps per rollout, ``N`` = num_envs, ``D``/``C`` = actor/critic observation
sizes, ``A`` = the size of what the algorithm stores as its "action" (for a denoising chain,
the flattened chain).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch


class RolloutStorage:
    """Fixed-size on-policy storage of ``T`` vectorized steps (normalized observations)."""

    def __init__(
        self,
        steps: int,
        num_envs: int,
        actor_dim: int,
        critic_dim: int,
        action_dim: int,
        separate_critic: bool,
        device: torch.device,
    ) -> None:
        def zeros(*shape: int) -> torch.Tensor:
            return torch.zeros(*shape, device=device)

        self.steps = steps
        self.actor_obs = zeros(steps, num_envs, actor_dim)
        # Without a privileged group the critic input is the actor input: store it once.
        self.critic_obs = zeros(steps, num_envs, critic_dim) if separate_critic else self.actor_obs
        self.separate_critic = separate_critic
        self.actions = zeros(steps, num_envs, action_dim)  # unclipped Gaussian samples
        self.means = zeros(steps, num_envs, action_dim)
        self.log_probs = zeros(steps, num_envs)
        self.values = zeros(steps, num_envs)
        self.rewards = zeros(steps, num_envs)
        self.dones = zeros(steps, num_envs)
        self.last_values = zeros(num_envs)
        self.cursor = 0

    def tensors(self) -> dict[str, torch.Tensor]:
        """Every stored tensor by name (for checkpoints)."""
        out = {
            "actor_obs": self.actor_obs,
            "actions": self.actions,
            "means": self.means,
            "log_probs": self.log_probs,
            "values": self.values,
            "rewards": self.rewards,
            "dones": self.dones,
            "last_values": self.last_values,
        }
        if self.separate_critic:
            out["critic_obs"] = self.critic_obs
        return out

    def record_outcome(self, reward: torch.Tensor, done: torch.Tensor, next_values: Callable[[], torch.Tensor]) -> None:
        """Store the current step's ``reward [N]`` and ``done [N]`` and advance; when that fills
        the rollout, store ``next_values() [N]``, the value of the observation after it."""
        c = self.cursor
        self.rewards[c] = reward
        self.dones[c] = done
        self.cursor = c + 1
        if self.cursor == self.steps:
            self.last_values.copy_(next_values())

    def checkpoint(self, acted: bool) -> dict[str, Any]:
        """``cursor``, ``acted`` (a step was acted but not yet observed) and, mid-rollout only,
        copies of every stored tensor: the storage's part of an algorithm's ``state_dict``."""
        partial = self.cursor > 0 or acted
        return {
            "cursor": self.cursor,
            "acted": acted,
            "storage": {k: v.detach().clone() for k, v in self.tensors().items()} if partial else {},
        }

    def restore(self, state: dict[str, Any]) -> bool:
        """Load what :meth:`checkpoint` wrote; returns its ``acted`` flag."""
        self.cursor = int(state["cursor"])
        for name, tensor in state["storage"].items():
            getattr(self, name).copy_(tensor)
        return bool(state["acted"])


def bootstrap_timeouts(
    reward: torch.Tensor,
    terminated: torch.Tensor,
    truncated: torch.Tensor,
    gamma: float,
    final_values: Callable[[torch.Tensor], torch.Tensor],
) -> tuple[torch.Tensor, torch.Tensor]:
    """Fold time-outs into the reward: ``(reward [N], done [N] float)``.

    A time-out is not a terminal state, so where ``truncated`` (and not ``terminated``) the
    reward gains ``gamma * V(final observation)``; ``final_values(idx [k]) -> [k]`` evaluates
    the value of those envs' true final observations. Every ended episode counts as done for GAE.
    """
    terminated = terminated.bool()
    truncated = truncated.bool() & ~terminated
    if gamma > 0.0 and bool(truncated.any()):
        idx = truncated.nonzero().squeeze(1)
        reward = reward.index_add(0, idx, gamma * final_values(idx))
    return reward, (terminated | truncated).to(torch.float32)
