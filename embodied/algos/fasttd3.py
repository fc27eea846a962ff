"""FastTD3: TD3 with C51 twin critics, many parallel envs, large batches and n-step returns.

Per gradient step: sample ``batch_size`` n-step transitions; the target action is the current
actor's plus clipped Gaussian smoothing noise; each target critic's distribution of
``r + discount * Z(s', a')`` is projected onto the support and, per sample, the projection with
the smaller mean is the target (clipped double Q); both critics minimize cross-entropy to it.
With ``critic_subset = k > 0`` the target is the min over a fresh random subset of ``k`` of the
target critics (an ensemble with the min of a random pair, as in REDQ/RLPD/ResFiT).
Every ``policy_frequency`` critic steps the actor maximizes the critics' mean Q. Target critics
track the critics with Polyak factor ``tau``; there is no target actor.

Exploration: every env draws its own noise scale ``std ~ U[std_min, std_max]`` and redraws it
when its episode ends, so one batch of envs explores at many scales at once.
With ``num_atoms = 0`` the critics are scalar and this is plain TD3 (without a target actor).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from embodied.algos.offpolicy import OffPolicyBase, OffPolicyCfg, TrainBatch
from embodied.config import ConfigError, ranged
from embodied.env import ObsDict, VecEnv
from embodied.policies.deterministic import DeterministicActor
from embodied.policies.image_actor import ImageActor


@dataclass(frozen=True)
class FastTD3Cfg(OffPolicyCfg):
    """FastTD3 defaults follow the reference implementation (GPU scale); configs scale them down."""

    n_step: int = 3
    batch_size: int = 32_768
    updates_per_step: int = 2
    learning_starts: int = 10_000
    tau: float = ranged(0.1, 1e-6, 1.0)
    actor_hidden: tuple[int, ...] = (512, 256, 128)
    critic_hidden: tuple[int, ...] = (1024, 512, 256)
    num_atoms: int = 101
    weight_decay: float = ranged(0.1, 0.0, 10.0)
    std_min: float = ranged(0.001, 0.0, 10.0)
    """Smallest per-env exploration noise std (actions are in [-1, 1])."""
    std_max: float = ranged(0.4, 0.0, 10.0)
    """Largest per-env exploration noise std."""
    policy_noise: float = ranged(0.001, 0.0, 10.0)
    """Std of the target-policy smoothing noise."""
    noise_clip: float = ranged(0.5, 0.0, 10.0)
    """Clip of the target-policy smoothing noise."""
    actor_out_init_std: float = ranged(0.01, 0.0, 10.0)
    """Std of the actor's last-layer initial weights."""
    critic_subset: int = 0
    """Target critics the Bellman target takes the min over, a fresh random subset per step
    (0: all ``num_critics``, clipped double Q)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 0.0 <= self.std_min <= self.std_max:
            raise ConfigError(
                f"algo.std_min/std_max must satisfy 0 <= std_min <= std_max, got {self.std_min}, {self.std_max}"
            )
        if self.policy_noise < 0 or self.noise_clip < 0:
            raise ConfigError("algo.policy_noise and algo.noise_clip must be >= 0")
        if not 0 <= self.critic_subset <= self.num_critics:
            raise ConfigError(
                f"algo.critic_subset must be in [0, num_critics={self.num_critics}] (0: all), got {self.critic_subset}"
            )


class FastTD3(OffPolicyBase):
    """FastTD3 for a continuous-action VecEnv (see module docstring)."""

    multi_process = True
    """Trains correctly in several processes (:mod:`embodied.algos.offpolicy`)."""

    cfg: FastTD3Cfg
    policy: DeterministicActor | ImageActor

    def __init__(self, cfg: FastTD3Cfg, env: VecEnv) -> None:
        super().__init__(cfg, env, "fasttd3")
        head = DeterministicActor(
            self.actor_input_dim,
            self.action_dim,
            hidden=cfg.actor_hidden,
            activation=cfg.activation,
            normalize_obs=cfg.normalize_obs and self.images is None,  # an ImageActor normalizes
            obs_clip=cfg.obs_clip,
            out_init_std=cfg.actor_out_init_std,
            init_action_mean=self.init_action_mean,
        ).to(self.device)
        self.policy = self.with_images(head)
        self.actor_opt = self.adamw(self.actor_parameters(), cfg.actor_lr)
        self.build_critics()
        self.noise_std = self._draw_std(self.num_envs)  # [N, 1]
        self._critic_loss = self.maybe_compile(self._critic_loss_eager)
        self._actor_loss = self.maybe_compile(self._actor_loss_eager)

    def _draw_std(self, n: int) -> torch.Tensor:
        """``[n, 1]`` noise scales ~ U[std_min, std_max]."""
        lo, hi = self.cfg.std_min, self.cfg.std_max
        return lo + (hi - lo) * torch.rand(n, 1, device=self.device)

    @torch.no_grad()
    def act(self, obs: ObsDict) -> torch.Tensor:
        """Exploration actions ``[N, A]``: actor + per-env Gaussian noise (uniform at the start)."""
        if self.in_random_phase():
            return self.random_actions()
        return self.policy.act(obs, deterministic=False, noise_std=self.noise_std)

    def on_episode_end(self, done: torch.Tensor) -> None:
        self.noise_std = torch.where(done[:, None], self._draw_std(self.num_envs), self.noise_std)

    def critic_loss(self, batch: TrainBatch) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        loss, q_mean = self._critic_loss(batch, self.critic_index(self.cfg.critic_subset))
        return loss, {"q_mean": q_mean}

    def actor_loss(self, batch: TrainBatch) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        return self._actor_loss(batch), {}

    def _critic_loss_eager(self, batch: TrainBatch, subset: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """``(loss, mean Q)``: cross-entropy (C51) or MSE to the clipped target over ``subset``."""
        with torch.no_grad(), self.autocast():
            next_action = self.policy(batch.next_actor_obs)
            noise = torch.randn_like(next_action) * self.cfg.policy_noise
            next_action = (next_action + noise.clamp(-self.cfg.noise_clip, self.cfg.noise_clip)).clamp(-1.0, 1.0)
            next_out = self.critic_target(batch.next_critic_obs, next_action, subset)
        target = self.critic.td_target(next_out, batch.reward, batch.discount)
        with self.autocast():
            out = self.critic(batch.critic_obs, batch.action)
        return self.critic.loss(out, target), self.critic.q_from_output(out.detach()).mean()

    def _actor_loss_eager(self, batch: TrainBatch) -> torch.Tensor:
        """``-mean Q`` over critics and batch of the actor's actions."""
        with self.autocast():
            action = self.policy(batch.actor_obs)
            q = self.critic.q(batch.critic_obs, action)  # [E, B]
        return -q.mean()

    def state_dict(self) -> dict[str, Any]:
        return {"noise_std": self.noise_std, **self.base_state()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.noise_std = state["noise_std"].to(self.device)
        self.load_base_state(state)
