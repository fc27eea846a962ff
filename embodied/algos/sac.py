"""Soft actor-critic with automatic temperature, critic ensembles and optional C51 critics.

Critic target: ``r_n + discount * (min_{e in S} Q'_e(s', a') - alpha * log pi(a'|s'))`` with
``a' ~ pi(s')`` and ``S`` a random subset of ``critic_subset`` target critics (all of them for
twin critics; 2 of 10 in RLPD/REDQ-style ensembles). With ``num_atoms > 0`` the critics are
C51 and the soft target distribution is projected onto the support, the subset member with the
smallest projected mean chosen per sample (FastSAC: add ``critic_layer_norm``). The actor
minimizes ``alpha * log pi(a|s) - Q(s, a)`` (``Q`` = min or mean over the critics, see
``actor_q``); the temperature ``alpha`` is tuned so the policy entropy tracks
``target_entropy`` (default ``-action_dim``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

import torch

from embodied import distributed
from embodied.algos.offpolicy import OffPolicyBase, OffPolicyCfg, TrainBatch
from embodied.config import ConfigError, ranged
from embodied.env import ObsDict, VecEnv
from embodied.policies.image_actor import ImageActor
from embodied.policies.squashed_gaussian import SquashedGaussianActor


@dataclass(frozen=True)
class SACCfg(OffPolicyCfg):
    """SAC defaults (Haarnoja et al.); ensemble and C51 options for RLPD and FastSAC setups."""

    policy_frequency: int = 1
    critic_subset: int = 2
    """Target critics the Bellman target takes the min over (a fresh random subset per step)."""
    actor_q: Literal["min", "mean"] = "min"
    """How the actor reduces the critics' Q-values: ``min`` (SAC) or ``mean`` (RLPD/REDQ)."""
    init_alpha: float = ranged(1.0, 1e-9, 1e3)
    """Initial entropy temperature."""
    autotune_alpha: bool = True
    """Tune alpha towards ``target_entropy``; False keeps ``init_alpha``."""
    target_entropy: float | None = None
    """Target policy entropy in nats; None: ``-action_dim``."""
    alpha_lr: float = ranged(3e-4, 1e-9, 1.0)
    """Learning rate of log(alpha)."""
    log_std_min: float = ranged(-5.0, -20.0, 10.0)
    """Lower bound of the actor's pre-squash log std."""
    log_std_max: float = ranged(2.0, -20.0, 10.0)
    """Upper bound of the actor's pre-squash log std."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 1 <= self.critic_subset <= self.num_critics:
            raise ConfigError(
                f"algo.critic_subset must be in [1, num_critics={self.num_critics}], got {self.critic_subset}"
            )
        if self.init_alpha <= 0 or self.alpha_lr <= 0:
            raise ConfigError("algo.init_alpha and algo.alpha_lr must be > 0")
        if not self.log_std_min < self.log_std_max:
            raise ConfigError(f"algo.log_std_min must be < log_std_max, got {self.log_std_min}, {self.log_std_max}")


class SAC(OffPolicyBase):
    """SAC for a continuous-action VecEnv (see module docstring)."""

    multi_process = True
    """Trains correctly in several processes (:mod:`embodied.algos.offpolicy`)."""

    cfg: SACCfg
    policy: SquashedGaussianActor | ImageActor

    def __init__(self, cfg: SACCfg, env: VecEnv) -> None:
        super().__init__(cfg, env, "sac")
        head = SquashedGaussianActor(
            self.actor_input_dim,
            self.action_dim,
            hidden=cfg.actor_hidden,
            activation_name=cfg.activation,
            log_std_min=cfg.log_std_min,
            log_std_max=cfg.log_std_max,
            normalize_obs=cfg.normalize_obs and self.images is None,  # an ImageActor normalizes
            obs_clip=cfg.obs_clip,
            init_action_mean=self.init_action_mean,
        ).to(self.device)
        self.policy = self.with_images(head)
        self.actor_opt = self.adamw(self.actor_parameters(), cfg.actor_lr)
        self.build_critics()
        self.log_alpha = torch.tensor(math.log(cfg.init_alpha), device=self.device, requires_grad=True)
        self.alpha_opt = torch.optim.Adam([self.log_alpha], lr=cfg.alpha_lr)
        self.target_entropy = float(-self.action_dim if cfg.target_entropy is None else cfg.target_entropy)
        self._critic_loss = self.maybe_compile(self._critic_loss_eager)
        self._actor_loss = self.maybe_compile(self._actor_loss_eager)

    @property
    def alpha(self) -> torch.Tensor:
        """Current temperature (a detached scalar tensor)."""
        return self.log_alpha.detach().exp()

    @torch.no_grad()
    def act(self, obs: ObsDict) -> torch.Tensor:
        """Exploration actions ``[N, A]``: policy samples (uniform during ``random_steps``)."""
        if self.in_random_phase():
            return self.random_actions()
        return self.policy.act(obs, deterministic=False)

    def critic_loss(self, batch: TrainBatch) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        loss, q_mean = self._critic_loss(batch, self.alpha, self._subset())
        return loss, {"q_mean": q_mean}

    def actor_loss(self, batch: TrainBatch) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        loss, entropy = self._actor_loss(batch, self.alpha)
        return loss, {"entropy": entropy, "alpha": self.alpha}

    def after_actor_step(self, actor_metrics: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Move log(alpha) so the policy entropy approaches ``target_entropy``."""
        if not self.cfg.autotune_alpha:
            return {}
        # d/d log_alpha of -log_alpha * (entropy_target - entropy) averaged over the batch.
        alpha_loss = self.log_alpha * (actor_metrics["entropy"] - self.target_entropy)
        self.alpha_opt.zero_grad(set_to_none=True)
        alpha_loss.backward()
        if self.world is not None:
            distributed.average_gradients([self.log_alpha])  # the entropy of every rank's batch
        self.alpha_opt.step()
        return {"alpha_loss": alpha_loss.detach()}

    def _subset(self) -> list[int]:
        """Indices of the target critics the min is taken over (all, or a fresh random subset)."""
        return self.critic_index(self.cfg.critic_subset)

    def _critic_loss_eager(
        self, batch: TrainBatch, alpha: torch.Tensor, subset: list[int]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(loss, mean Q)`` against the soft clipped target over ``subset``."""
        with torch.no_grad(), self.autocast():
            next_action, next_logp = self.policy.sample(batch.next_actor_obs)
            next_out = self.critic_target(batch.next_critic_obs, next_action, subset)
        target = self.critic.td_target(next_out, batch.reward, batch.discount, bonus=-alpha * next_logp.float())
        with self.autocast():
            out = self.critic(batch.critic_obs, batch.action)
        return self.critic.loss(out, target), self.critic.q_from_output(out.detach()).mean()

    def _actor_loss_eager(self, batch: TrainBatch, alpha: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(mean(alpha log pi - Q), entropy estimate -mean(log pi))``."""
        with self.autocast():
            action, logp = self.policy.sample(batch.actor_obs)
            q = self.critic.q(batch.critic_obs, action)  # [E, B]
        q_pi = q.min(dim=0).values if self.cfg.actor_q == "min" else q.mean(dim=0)
        logp = logp.float()
        return (alpha * logp - q_pi).mean(), -logp.detach().mean()

    def state_dict(self) -> dict[str, Any]:
        return {
            "log_alpha": self.log_alpha.detach().clone(),
            "alpha_opt": self.alpha_opt.state_dict(),
            **self.base_state(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        with torch.no_grad():
            self.log_alpha.copy_(state["log_alpha"])
        self.alpha_opt.load_state_dict(state["alpha_opt"])
        self.load_base_state(state)
