"""Generalized advantage estimation (Schulman et al. 2016) for any on-policy algorithm."""

from __future__ import annotations

import torch


def compute_gae(
    rewards: torch.Tensor,
    values: torch.Tensor,
    dones: torch.Tensor,
    last_values: torch.Tensor,
    gamma: float,
    lam: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalized advantage estimation over a rollout.

    ``rewards``, ``values``, ``dones`` are ``[T, N]`` (``dones`` float: 1 where the episode ended
    at that step, by termination or time-out; time-out rewards already include ``gamma * V(final)``);
    ``last_values [N]`` is ``V`` of the observation after the last step.
    Returns ``(advantages [T, N], returns [T, N])`` with ``returns = advantages + values``.
    """
    steps = rewards.shape[0]
    not_done = 1.0 - dones
    # delta_t = r_t + gamma * V_{t+1} * (1 - done_t) - V_t, computed for all t at once.
    next_values = torch.cat([values[1:], last_values.unsqueeze(0)], dim=0)
    deltas = rewards + gamma * next_values * not_done - values
    decay = gamma * lam * not_done
    advantages = torch.empty_like(rewards)
    running = torch.zeros_like(last_values)
    for t in range(steps - 1, -1, -1):
        running = deltas[t] + decay[t] * running
        advantages[t] = running
    return advantages, advantages + values
