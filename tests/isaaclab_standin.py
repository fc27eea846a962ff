"""A stand-in for an Isaac Lab ``ManagerBasedRLEnv`` that runs in the core environment, for the
adapter's tests there.

Isaac Lab 3 needs Python 3.12 and its own environment (``.venv-isaaclab``, built by
``scripts/setup_isaaclab.sh``), so the core environment (Python 3.11) cannot import it. There the
adapter (``sim/isaaclab.py``) is unit-tested against this model; ``tests/test_isaaclab_real.py``
runs the same checks against the real Isaac Lab 3.0 (kit-less, Newton on warp's CPU device) in
``.venv-isaaclab``. The behaviours modelled here are the ones that test checked there:

  - ``reset(seed=None) -> (obs, extras)``; ``step(action) -> (obs, reward, terminated,
    time_outs, extras)``; every value a torch tensor ``[N, ...]`` on ``device``;
  - ``obs`` is a dict of observation groups: ``policy`` ``[N, 3]`` and ``critic`` ``[N, 4]``
    (privileged: also the hidden drag coefficient);
  - auto-reset inside ``step``: the returned ``obs`` of an ended env is already its reset
    observation; with ``compute_final_obs=True`` the pre-reset groups are in
    ``extras["final_obs"]`` (all rows), otherwise they are lost;
  - time-outs when the episode length reaches ``max_episode_length``, returned as the fourth
    value and (as RSL-RL's wrapper does) in ``extras["time_outs"]``; a termination term that
    fires on the same step stays in ``terminated``;
  - the terminated, time-out and reward tensors are the same objects every step, overwritten in
    place (Isaac Lab's ``reset_terminated``, ``reset_time_outs``, reward buffer);
  - ``num_envs``, ``device``, ``step_dt``, ``max_episode_length``, ``single_action_space``
    (a gymnasium Box: unbounded by default, as Isaac Lab's Cartpole tasks declare), and a
    gymnasium-style ``unwrapped``.

Its limits: one physics (a 1-D point mass pushed towards the origin), no managers, no
``extras["log"]`` episode sums, no rendering, no Isaac Sim app, no events or curriculum, no
``DirectRLEnv``-specific members (the adapter uses none).

Dynamics: ``x' = v``, ``v' = force - drag * v``, ``force = 2 * action`` (an action term with
scale 2), explicit Euler at ``step_dt``. Reward ``1 - |x|`` per step; terminated when
``|x| > 2``; reset draws ``x, v ~ U(-1, 1)``.
"""

from __future__ import annotations

from typing import Any

import gymnasium
import numpy as np
import torch


class StandInRLEnv:
    """``N`` point masses behind Isaac Lab's ``ManagerBasedRLEnv`` interface (see module docstring)."""

    def __init__(
        self,
        num_envs: int,
        device: str = "cpu",
        max_episode_length: int = 50,
        compute_final_obs: bool = True,
        bounded_actions: bool = False,
        seed: int = 0,
    ) -> None:
        self.num_envs = num_envs
        self.device = device
        self.step_dt = 0.05
        self.max_episode_length = max_episode_length
        self.compute_final_obs = compute_final_obs
        bound = 3.0 if bounded_actions else np.inf
        self.single_action_space = gymnasium.spaces.Box(-bound, bound, shape=(1,), dtype=np.float32)
        self.gen = torch.Generator().manual_seed(seed)
        self.x = torch.zeros(num_envs, device=device)
        self.v = torch.zeros(num_envs, device=device)
        self.drag = torch.full((num_envs,), 0.5, device=device)
        self.episode_length_buf = torch.zeros(num_envs, dtype=torch.long, device=device)
        self.reset_terminated = torch.zeros(num_envs, dtype=torch.bool, device=device)
        self.reset_time_outs = torch.zeros(num_envs, dtype=torch.bool, device=device)
        self.reward_buf = torch.zeros(num_envs, device=device)
        self.received_actions: list[torch.Tensor] = []
        self.closed = False

    @property
    def unwrapped(self) -> StandInRLEnv:
        return self

    def _uniform(self, n: int) -> torch.Tensor:
        return (torch.rand(n, generator=self.gen) * 2 - 1).to(self.device)

    def _reset_idx(self, ids: torch.Tensor) -> None:
        self.x[ids] = self._uniform(len(ids))
        self.v[ids] = self._uniform(len(ids))
        self.episode_length_buf[ids] = 0

    def _obs(self) -> dict[str, torch.Tensor]:
        progress = self.episode_length_buf.float() / self.max_episode_length
        policy = torch.stack([self.x, self.v, progress], dim=1)
        return {"policy": policy, "critic": torch.cat([policy, self.drag.unsqueeze(1)], dim=1)}

    def reset(self, seed: int | None = None, options: Any = None) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        if seed is not None:
            self.gen.manual_seed(seed)
        self._reset_idx(torch.arange(self.num_envs, device=self.device))
        return self._obs(), {}

    def step(
        self, action: torch.Tensor
    ) -> tuple[dict[str, torch.Tensor], torch.Tensor, torch.Tensor, torch.Tensor, dict[str, Any]]:
        assert isinstance(action, torch.Tensor) and action.shape == (self.num_envs, 1)
        assert str(action.device) == str(torch.device(self.device))
        self.received_actions.append(action.clone())
        force = 2.0 * action[:, 0]
        self.v = self.v + self.step_dt * (force - self.drag * self.v)
        self.x = self.x + self.step_dt * self.v
        self.episode_length_buf += 1
        # written in place, as Isaac Lab does with its buffers
        self.reward_buf[:] = 1.0 - self.x.abs()
        self.reset_terminated[:] = self.x.abs() > 2.0
        self.reset_time_outs[:] = self.episode_length_buf >= self.max_episode_length
        reward, terminated, time_outs = self.reward_buf, self.reset_terminated, self.reset_time_outs
        extras: dict[str, Any] = {"time_outs": time_outs}
        done = torch.nonzero(terminated | time_outs).flatten()
        if len(done):
            if self.compute_final_obs:
                extras["final_obs"] = {k: v.clone() for k, v in self._obs().items()}
            self._reset_idx(done)
        return self._obs(), reward, terminated, time_outs, extras

    def close(self) -> None:
        self.closed = True


def make_standin(cfg: Any, num_envs: int, device: torch.device, seed: int) -> StandInRLEnv:
    """An ``IsaacLabCfg.factory`` building the stand-in (the registry path, without Isaac Sim)."""
    return StandInRLEnv(num_envs, device=str(device), seed=seed)
