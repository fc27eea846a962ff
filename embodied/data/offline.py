"""Offline transitions for off-policy learning: a dataset as sampleable rows, Monte-Carlo
returns, and the symmetric (half offline, half online) batches of RLPD.

A demonstration dataset (``embodied/data/demos.py``) becomes one-step transitions ``(s, a, r,
gamma * (1 - terminated), s')`` on the device, each row with its discounted Monte-Carlo return
``G_t = r_t + gamma * G_{t+1}`` from the dataset's own episode. Cal-QL clips the Q-values it
pushes down from below by ``G_t``. An episode cut by its time limit has an unknown tail; it is
taken as 0, which keeps ``G_t`` a lower bound of the behaviour policy's value wherever the
rewards after the cut cannot be negative (the sparse success reward of ``arm-push``).

Shapes: ``M`` = dataset steps, ``D`` = observation size, ``A`` = action size, ``B`` = batch.
"""

from __future__ import annotations

import numpy as np
import torch

from embodied.data.demos import Demonstrations
from embodied.data.replay import ReplayBatch, ReplayBuffer
from embodied.env import IMAGE_GROUP
from embodied.errors import EmbodiedError


def mc_returns(rewards: np.ndarray, episode_index: np.ndarray, terminations: np.ndarray, gamma: float) -> np.ndarray:
    """Discounted return-to-go ``[M]`` of every step (float64), episodes laid out back to back.

    ``rewards [M]``, ``episode_index [M]`` (equal for the steps of one episode, in order),
    ``terminations [M]`` bool. The return restarts at each episode's last step: after a
    termination nothing follows; after a time-limit cut the unknown tail counts as 0.
    """
    m = len(rewards)
    if not (len(episode_index) == len(terminations) == m):
        raise ValueError(
            f"rewards, episode_index and terminations must have one row per step, got {m}, "
            f"{len(episode_index)}, {len(terminations)}"
        )
    out = np.empty(m, dtype=np.float64)
    following = 0.0
    for t in range(m - 1, -1, -1):
        last_of_episode = t == m - 1 or episode_index[t + 1] != episode_index[t]
        if last_of_episode or terminations[t]:
            following = 0.0
        following = float(rewards[t]) + gamma * following
        out[t] = following
    return out


class OfflineTransitions:
    """A dataset's steps as device tensors, sampled uniformly into :class:`ReplayBatch` rows.

    Observations are stored raw under the group ``policy`` (normalized when a batch is prepared,
    like replay rows); with ``images`` the dataset's camera images ``[M, H, W, 3]`` too, as uint8
    under the group ``image``. ``sample`` fills ``mc_return``.
    """

    def __init__(
        self, demos: Demonstrations, gamma: float, device: torch.device | str, seed: int = 0, images: bool = False
    ) -> None:
        """``images``: also sample the dataset's camera images (it must have them: a named error)."""
        self.device = torch.device(device)
        self.images: torch.Tensor | None = None  # [M, H, W, 3] uint8
        self.next_images: torch.Tensor | None = None  # [M, H, W, 3] uint8
        if images:
            if demos.images is None or demos.next_images is None:
                raise EmbodiedError(
                    f"algo.encoder=cnn reads camera images, but the dataset has none (observation key "
                    f"{IMAGE_GROUP!r}): record it with `embodied collect ... --images --camera NAME`"
                )
            self.images = torch.as_tensor(demos.images, dtype=torch.uint8, device=self.device)
            self.next_images = torch.as_tensor(demos.next_images, dtype=torch.uint8, device=self.device)

        def put(x: np.ndarray) -> torch.Tensor:
            return torch.as_tensor(np.ascontiguousarray(x), dtype=torch.float32, device=self.device)

        self.obs = put(demos.obs)  # [M, D]
        self.next_obs = put(demos.next_obs)  # [M, D]
        self.action = put(demos.actions)  # [M, A]
        self.reward = put(demos.rewards)  # [M]
        self.discount = gamma * (1.0 - put(demos.terminations.astype(np.float32)))  # [M]
        self.mc_return = put(mc_returns(demos.rewards, demos.episode_index, demos.terminations, gamma))  # [M]
        self.generator = torch.Generator(device=self.device)
        self.generator.manual_seed(seed)

    def __len__(self) -> int:
        return int(self.action.shape[0])

    def sample(self, batch_size: int) -> ReplayBatch:
        """``batch_size`` uniformly drawn one-step rows with their Monte-Carlo returns."""
        idx = torch.randint(0, len(self), (batch_size,), device=self.device, generator=self.generator)
        obs, next_obs = {"policy": self.obs[idx]}, {"policy": self.next_obs[idx]}
        if self.images is not None and self.next_images is not None:
            obs[IMAGE_GROUP], next_obs[IMAGE_GROUP] = self.images[idx], self.next_images[idx]
        return ReplayBatch(
            obs=obs,
            action=self.action[idx],
            reward=self.reward[idx],
            discount=self.discount[idx],
            next_obs=next_obs,
            steps=torch.ones(batch_size, dtype=torch.long, device=self.device),
            mc_return=self.mc_return[idx],
        )


def concat_batches(parts: list[ReplayBatch]) -> ReplayBatch:
    """Rows of ``parts`` stacked in order; ``mc_return`` when any part has it, ``-inf`` (no known
    bound) on the rows of parts without it.

    Every part must hold the same observation groups (a named error otherwise).
    """
    groups = set(parts[0].obs)
    for part in parts[1:]:
        if set(part.obs) != groups:
            raise EmbodiedError(
                f"cannot mix batches with observation groups {sorted(groups)} and {sorted(part.obs)}: "
                "offline data holds the 'policy' group, and 'image' where the learner reads images"
            )
    has_mc = any(p.mc_return is not None for p in parts)

    def mc(part: ReplayBatch) -> torch.Tensor:
        known = part.mc_return
        return torch.full_like(part.reward, -torch.inf) if known is None else known

    return ReplayBatch(
        obs={g: torch.cat([p.obs[g] for p in parts]) for g in groups},
        action=torch.cat([p.action for p in parts]),
        reward=torch.cat([p.reward for p in parts]),
        discount=torch.cat([p.discount for p in parts]),
        next_obs={g: torch.cat([p.next_obs[g] for p in parts]) for g in groups},
        steps=torch.cat([p.steps for p in parts]),
        mc_return=torch.cat([mc(p) for p in parts]) if has_mc else None,
    )


def symmetric_sample(
    online: ReplayBuffer, offline: OfflineTransitions, batch_size: int, offline_fraction: float = 0.5
) -> ReplayBatch:
    """RLPD's symmetric sampling: ``round(batch_size * offline_fraction)`` offline rows first,
    then the rest from the online replay buffer (``[B, ...]`` in that order)."""
    if not 0.0 <= offline_fraction <= 1.0:
        raise ValueError(f"offline_fraction must be in [0, 1], got {offline_fraction}")
    n_offline = round(batch_size * offline_fraction)
    parts = []
    if n_offline > 0:
        parts.append(offline.sample(n_offline))
    if batch_size - n_offline > 0:
        parts.append(online.sample(batch_size - n_offline))
    return concat_batches(parts)
