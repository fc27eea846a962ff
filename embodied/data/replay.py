"""Device-resident replay buffer for vectorized environments, with n-step returns.

Storage is one ring per env, laid out ``[capacity_per_env, num_envs, ...]`` so a vectorized
step is a single row write. Every row keeps the observation groups (``policy`` and, when the
task has one, ``critic``; camera images where the learner reads them, kept as uint8), the action, reward, ``terminated``/``truncated`` flags and the true
successor observation (``final_obs`` of the transition: equal to the next observation except
where an episode ended, where it is the observation the episode ended on). Keeping the
successor per row costs a second copy of the observations but makes truncation exact: n-step
windows cut at a time-out bootstrap from the stored successor, not from the next episode's
first observation.

n-step targets are computed when sampling, so ``n_step`` and ``gamma`` can be read off the
buffer without rewriting rows. For a window starting at ``t`` the buffer returns

    reward_n   = sum_{k=0}^{m} gamma^k r_{t+k}
    discount_n = gamma^{m+1} * (1 - terminated_{t+m})
    next_obs_n = successor_{t+m}

where ``m`` is the first ``k < n`` with ``terminated | truncated`` at ``t+k`` (or ``n-1``): a
termination cuts the return without bootstrap, a truncation cuts it and bootstraps.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from embodied.env import ObsDict
from embodied.errors import EmbodiedError

log = logging.getLogger(__name__)

MEMORY_FRACTION = 0.8
"""Refuse buffers larger than this fraction of the free memory of their device."""


@dataclass
class ReplayBatch:
    """A sampled minibatch. ``B`` = batch size.

    ``obs``/``next_obs``: ObsDicts of ``[B, dim]``; ``action [B, A]``; ``reward [B]`` (n-step
    discounted sum); ``discount [B]`` (``gamma^(steps) * (1 - terminated)``: the factor on the
    bootstrap value, zero after a true termination); ``steps [B]`` (int, rewards summed);
    ``mc_return [B]``: the Monte-Carlo return from each row where the source knows it
    (offline data, ``embodied/data/offline.py``), else None.
    """

    obs: ObsDict
    action: torch.Tensor
    reward: torch.Tensor
    discount: torch.Tensor
    next_obs: ObsDict
    steps: torch.Tensor
    mc_return: torch.Tensor | None = None


def cat_batches(first: ReplayBatch, second: ReplayBatch) -> ReplayBatch:
    """One batch of ``B1 + B2`` rows: ``first``'s rows, then ``second``'s (same groups and sizes)."""
    return ReplayBatch(
        obs={k: torch.cat([first.obs[k], second.obs[k]]) for k in first.obs},
        action=torch.cat([first.action, second.action]),
        reward=torch.cat([first.reward, second.reward]),
        discount=torch.cat([first.discount, second.discount]),
        next_obs={k: torch.cat([first.next_obs[k], second.next_obs[k]]) for k in first.next_obs},
        steps=torch.cat([first.steps, second.steps]),
    )


def available_memory_bytes(device: torch.device) -> int:
    """Free memory of ``device`` in bytes: CUDA's free memory, else the host's available RAM."""
    if device.type == "cuda":
        free, _total = torch.cuda.mem_get_info(device)
        return int(free)
    try:
        # SC_AVPHYS_PAGES counts free pages only (page cache excluded); on Linux MemAvailable is
        # the better estimate because the kernel drops cache on demand.
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return int(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))


def replay_bytes(
    capacity_per_env: int,
    num_envs: int,
    obs_spec: Mapping[str, tuple[int, ...]],
    action_dim: int,
    uint8_groups: Collection[str] = (),
) -> int:
    """Bytes a :class:`ReplayBuffer` of these dimensions allocates (float32 storage, one byte per
    value for the ``uint8_groups``)."""
    obs_bytes = sum(int(torch.Size(shape).numel()) * (1 if k in uint8_groups else 4) for k, shape in obs_spec.items())
    # obs + successor obs + action + reward (float32) + terminated + truncated (bool)
    per_row = 2 * obs_bytes + 4 * (action_dim + 1) + 2
    return capacity_per_env * num_envs * per_row


class ReplayBuffer:
    """Ring storage ``[capacity_per_env, num_envs, ...]`` on ``device`` with n-step sampling.

    All envs are written together (one row per vectorized step), so every env holds the same
    number of rows; sampling draws ``(env, row)`` pairs uniformly among rows whose n-step window
    is fully written.

    ``state_dict(include_contents=True)`` (checkpoint option ``save_replay``, on by default) saves
    the written rows with the cursor and the sampling RNG, so a resumed run continues exactly;
    without contents a resumed run starts with an empty buffer and refills it during its warm-up
    (for buffers too large to write at every checkpoint).
    """

    def __init__(
        self,
        num_envs: int,
        capacity_per_env: int,
        obs_spec: Mapping[str, tuple[int, ...]],
        action_dim: int,
        device: torch.device | str = "cpu",
        n_step: int = 1,
        gamma: float = 0.99,
        seed: int = 0,
        uint8_groups: Collection[str] = (),
    ) -> None:
        """``uint8_groups``: observation groups stored as uint8 (camera images, 0..255: a quarter of
        float32's memory); sampled rows of them stay uint8."""
        if num_envs < 1 or capacity_per_env < 1:
            raise EmbodiedError(
                f"replay buffer needs num_envs >= 1 and capacity >= 1, got {num_envs}, {capacity_per_env}"
            )
        if not 1 <= n_step <= capacity_per_env:
            raise EmbodiedError(f"replay n_step must be in [1, capacity_per_env={capacity_per_env}], got {n_step}")
        self.num_envs = num_envs
        self.capacity = capacity_per_env
        self.obs_spec = {k: tuple(v) for k, v in obs_spec.items()}
        self.action_dim = action_dim
        self.device = torch.device(device)
        self.n_step = n_step
        self.gamma = gamma
        unknown = set(uint8_groups) - set(self.obs_spec)
        if unknown:
            raise EmbodiedError(
                f"replay uint8 groups {sorted(unknown)} are not observation groups {sorted(self.obs_spec)}"
            )
        self.dtypes = {k: torch.uint8 if k in uint8_groups else torch.float32 for k in self.obs_spec}
        """Storage dtype of each observation group."""
        need = replay_bytes(capacity_per_env, num_envs, self.obs_spec, action_dim, uint8_groups)
        free = available_memory_bytes(self.device)
        if need > MEMORY_FRACTION * free:
            raise EmbodiedError(
                f"replay buffer of {capacity_per_env} rows x {num_envs} envs needs {need / 2**30:.2f} GiB on "
                f"{self.device}, but only {free / 2**30:.2f} GiB is free (limit {MEMORY_FRACTION:.0%}); "
                f"lower algo.buffer_size_per_env (at most ~{int(MEMORY_FRACTION * free / need * capacity_per_env)}) "
                "or num_envs"
            )
        log.debug("replay buffer: %.1f MiB on %s", need / 2**20, self.device)
        rows = (capacity_per_env, num_envs)
        dev = self.device
        self.obs = {k: torch.zeros((*rows, *s), dtype=self.dtypes[k], device=dev) for k, s in self.obs_spec.items()}
        self.next_obs = {
            k: torch.zeros((*rows, *s), dtype=self.dtypes[k], device=dev) for k, s in self.obs_spec.items()
        }
        self.action = torch.zeros((*rows, action_dim), device=dev)
        self.reward = torch.zeros(rows, device=dev)
        self.terminated = torch.zeros(rows, dtype=torch.bool, device=dev)
        self.truncated = torch.zeros(rows, dtype=torch.bool, device=dev)
        self.cursor = 0
        """Row the next write goes to."""
        self.size = 0
        """Rows written so far, at most ``capacity``."""
        self.generator = torch.Generator(device=self.device)
        self.generator.manual_seed(seed)
        self._offsets = torch.arange(n_step, device=self.device)
        self._powers = gamma ** torch.arange(n_step + 1, device=self.device, dtype=torch.float32)

    def __len__(self) -> int:
        """Transitions stored over all envs."""
        return self.size * self.num_envs

    @property
    def num_sampleable(self) -> int:
        """Rows per env whose n-step window is fully written."""
        return max(self.size - self.n_step + 1, 0)

    def add(
        self,
        obs: ObsDict,
        action: torch.Tensor,
        reward: torch.Tensor,
        terminated: torch.Tensor,
        truncated: torch.Tensor,
        final_obs: ObsDict,
    ) -> None:
        """Write one vectorized step: ObsDicts of ``[N, dim]``, ``action [N, A]``, the rest ``[N]``.

        ``final_obs`` is the true successor of ``obs`` (the transition's ``final_obs``).
        """
        row = self.cursor
        for key in self.obs_spec:
            self.obs[key][row] = obs[key]
            self.next_obs[key][row] = final_obs[key]
        self.action[row] = action
        self.reward[row] = reward
        self.terminated[row] = terminated
        self.truncated[row] = truncated
        self.cursor = (row + 1) % self.capacity
        self.size = min(self.size + 1, self.capacity)

    def sample(self, batch_size: int) -> ReplayBatch:
        """``batch_size`` uniformly drawn ``(env, row)`` pairs with their n-step targets."""
        valid = self.num_sampleable
        if valid == 0:
            raise EmbodiedError(
                f"replay buffer has {self.size} rows per env, needs at least n_step={self.n_step} to sample"
            )
        oldest = (self.cursor - self.size) % self.capacity
        offset = torch.randint(0, valid, (batch_size,), device=self.device, generator=self.generator)
        env = torch.randint(0, self.num_envs, (batch_size,), device=self.device, generator=self.generator)
        start = (oldest + offset) % self.capacity
        if self.n_step == 1:
            ended_at = start
            reward = self.reward[start, env]
            steps = torch.ones(batch_size, dtype=torch.long, device=self.device)
        else:
            rows = (start[:, None] + self._offsets) % self.capacity  # [B, n]
            envs = env[:, None].expand_as(rows)
            done = (self.terminated[rows, envs] | self.truncated[rows, envs]).float()  # [B, n]
            # alive[k] = 1 while no episode end happened strictly before step k of the window.
            alive = torch.cumprod(torch.cat([torch.ones_like(done[:, :1]), 1.0 - done[:, :-1]], dim=1), dim=1)
            reward = (self.reward[rows, envs] * alive * self._powers[:-1]).sum(dim=1)
            steps = alive.sum(dim=1).long()  # 1..n
            ended_at = rows.gather(1, (steps - 1)[:, None]).squeeze(1)
        not_term = (~self.terminated[ended_at, env]).float()
        discount = self._powers[steps] * not_term
        return ReplayBatch(
            obs={k: v[start, env] for k, v in self.obs.items()},
            action=self.action[start, env],
            reward=reward,
            discount=discount,
            next_obs={k: v[ended_at, env] for k, v in self.next_obs.items()},
            steps=steps,
        )

    def state_dict(self, include_contents: bool = False) -> dict[str, Any]:
        """Cursor and RNG; the rows too when ``include_contents`` (see class docstring)."""
        state: dict[str, Any] = {
            "cursor": self.cursor,
            "size": self.size,
            "generator": self.generator.get_state(),
            "capacity": self.capacity,
            "num_envs": self.num_envs,
        }
        if include_contents:
            # Until the ring wraps, rows [0, size) are the written ones: save only those. A slice
            # is a view, and torch.save writes a view's whole storage (gigabytes of empty rows
            # with camera images), so a partly filled ring saves copies of its rows; a full one
            # saves the storage itself (a copy would double its memory).
            n = self.size

            def rows(tensor: torch.Tensor) -> torch.Tensor:
                return tensor if n == self.capacity else tensor[:n].clone()

            state["contents"] = {
                "obs": {k: rows(v) for k, v in self.obs.items()},
                "next_obs": {k: rows(v) for k, v in self.next_obs.items()},
                "action": rows(self.action),
                "reward": rows(self.reward),
                "terminated": rows(self.terminated),
                "truncated": rows(self.truncated),
            }
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore; without saved contents the buffer restarts empty (cursor 0, size 0)."""
        if state["capacity"] != self.capacity or state["num_envs"] != self.num_envs:
            raise EmbodiedError(
                f"replay checkpoint has {state['capacity']} rows x {state['num_envs']} envs, "
                f"this buffer {self.capacity} x {self.num_envs}"
            )
        self.generator.set_state(state["generator"].cpu())  # generator states are CPU byte tensors
        contents = state.get("contents")
        if contents is None:
            self.cursor, self.size = 0, 0
            return
        n = int(state["size"])
        for key in self.obs_spec:
            self.obs[key][:n].copy_(contents["obs"][key])
            self.next_obs[key][:n].copy_(contents["next_obs"][key])
        for name in ("action", "reward", "terminated", "truncated"):
            getattr(self, name)[:n].copy_(contents[name])
        self.cursor, self.size = int(state["cursor"]), n
