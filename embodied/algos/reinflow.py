"""ReinFlow: fine-tune a flow-matching policy with PPO over its noisy denoising chain.

A learnable noise network turns the deterministic Euler sampler into a Markov chain with a
tractable likelihood (Zhang et al. 2025, "ReinFlow"): starting from ``x0 ~ N(0, I)``, each
step ``k = 0 .. K-1`` at ``t_k = k / K`` draws

    x_{k+1} ~ N(mu_k, sigma_k^2),   mu_k = x_k + v(x_k, t_k) / K,
    log sigma_k^2 = squash(noise_net(obs, t_k)) in [log sigma_min^2, log sigma_max^2],

and the chain's log-likelihood is ``log N(x0; 0, I) + sum_k log N(x_{k+1}; mu_k, sigma_k^2)``
divided by ``(K + 1) * F``. Sampling and scoring call the same :meth:`ReinFlow.step_dist`
on the same grid, so the PPO importance ratio is 1 on the first minibatch of every update;
this is asserted (the reference implementation's grids differ, which breaks exactly that).
The objective is PPO's clipped surrogate plus a value loss, an entropy bonus on the noise,
and optionally a behaviour-cloning term pulling the velocity field to the frozen base.

The base enters through ``preload`` (``--base RUN_DIR`` of a ``bc-flow`` run); its flow
architecture must equal ``algo.policy``. The env executes the first action of each chunk
(``policy.exec_steps`` must be 1). Evaluation and exports use the noise-free sampler.

Shapes: ``T`` = steps per rollout, ``N`` = envs, ``D`` = observation size, ``F = H * A``
the flattened chunk, ``K`` = denoising steps, chains ``[B, K+1, F]``.
"""

from __future__ import annotations

import copy
import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from embodied.algo import PreloadSource, Transition
from embodied.algos.ppo import clipped_surrogate_loss, value_loss_fn
from embodied.config import ConfigError, ranged
from embodied.data.gae import compute_gae
from embodied.data.rollout import RolloutStorage, bootstrap_timeouts
from embodied.env import ObsDict, VecEnv, require_box_actions
from embodied.errors import EmbodiedError, NonFiniteError
from embodied.policies.flow import FlowPolicy, FlowPolicyCfg, mlp
from embodied.policies.image_flow import make_flow_policy

RATIO_TOL = 1e-5
"""Largest ``|ratio - 1|`` allowed on the first minibatch of an update (float32 round-off of
recomputing the same chain in a different batch shape; a grid mismatch is orders larger)."""

METRICS = ("policy_loss", "value_loss", "entropy", "bc_loss", "clip_fraction", "sigma")


class RatioCheckError(EmbodiedError):
    """The first-minibatch importance ratio is not 1: sampling and scoring disagree."""


@dataclass(frozen=True)
class ReinFlowCfg:
    """ReinFlow hyperparameters (defaults from the paper's locomotion settings, sped up for CPU)."""

    policy: FlowPolicyCfg = field(default_factory=FlowPolicyCfg)
    """Flow architecture: must equal the base run's ``algo.policy``."""
    sigma_min: float = 0.08
    """Lower bound of the per-step noise std."""
    sigma_max: float = 0.16
    """Upper bound of the per-step noise std."""
    noise_hidden: tuple[int, ...] = (64, 64)
    """Hidden widths of the noise network (observation + time features -> log-variance)."""
    critic_hidden: tuple[int, ...] = (256, 256)
    """Hidden widths of the value network."""
    num_steps_per_env: int = 50
    """Rollout length per env between updates."""
    num_epochs: int = 5
    """Passes over the rollout per update."""
    num_minibatches: int = 4
    """Minibatches per epoch."""
    gamma: float = ranged(0.99, 0.0, 1.0)
    """Discount factor."""
    lam: float = ranged(0.95, 0.0, 1.0)
    """GAE lambda."""
    clip_ratio: float = ranged(0.01, 1e-3, 1.0)
    """PPO clip range of the (per-dimension normalized) likelihood ratio."""
    actor_lr: float = ranged(4.5e-5, 1e-9, 1.0)
    """Adam learning rate of the velocity and noise networks."""
    critic_lr: float = ranged(6.5e-4, 1e-9, 1.0)
    """Adam learning rate of the value network."""
    value_coef: float = ranged(1.0, 0.0, 100.0)
    """Weight of the value loss."""
    entropy_coef: float = ranged(0.0, 0.0, 10.0)
    """Weight of the noise entropy bonus."""
    bc_coef: float = 0.0
    """Weight of ``|v - v_base|^2`` on the visited chain states (0: no regularizer)."""
    critic_warmup_updates: int = 2
    """Updates at the start that train only the value network (the critic starts untrained)."""
    max_grad_norm: float = ranged(1.0, 0.0, 1e6)
    """Global gradient-norm clip per optimizer (<= 0 disables)."""
    reward_scale: float = 1.0
    """Multiplies env rewards before they are stored."""

    def __post_init__(self) -> None:
        if not 0.0 < self.sigma_min <= self.sigma_max:
            raise ConfigError(
                f"algo.sigma_min/sigma_max must satisfy 0 < min <= max, got {self.sigma_min}, {self.sigma_max}"
            )
        for name in ("num_steps_per_env", "num_epochs", "num_minibatches"):
            if getattr(self, name) < 1:
                raise ConfigError(f"algo.{name} must be >= 1, got {getattr(self, name)}")
        for name in ("gamma", "lam"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ConfigError(f"algo.{name} must be in [0, 1], got {getattr(self, name)}")
        for name in ("clip_ratio", "actor_lr", "critic_lr", "reward_scale"):
            if not getattr(self, name) > 0.0:
                raise ConfigError(f"algo.{name} must be > 0, got {getattr(self, name)}")
        for name in ("value_coef", "entropy_coef", "bc_coef", "critic_warmup_updates"):
            if getattr(self, name) < 0:
                raise ConfigError(f"algo.{name} must be >= 0, got {getattr(self, name)}")
        if self.policy.exec_steps != 1:
            raise ConfigError(
                f"algo.policy.exec_steps must be 1 for reinflow (each env step is one chain), got {self.policy.exec_steps}"
            )
        if self.policy.temporal_ensemble:
            raise ConfigError(
                "algo.policy.temporal_ensemble must be false for reinflow: each env step acts one chain's first "
                "action (the one it scores), and the fine-tuned policy is evaluated and exported that way"
            )


class NoiseNet(nn.Module):
    """``log sigma^2 [B, F]`` in ``[log sigma_min^2, log sigma_max^2]`` from obs and time features."""

    def __init__(self, obs_dim: int, embed_dim: int, flat_dim: int, cfg: ReinFlowCfg) -> None:
        super().__init__()
        self.net = mlp([obs_dim + embed_dim, *cfg.noise_hidden, flat_dim], "tanh")
        self.lo = 2.0 * math.log(cfg.sigma_min)
        self.hi = 2.0 * math.log(cfg.sigma_max)

    def forward(self, obs_n: torch.Tensor, t_feat: torch.Tensor) -> torch.Tensor:
        raw = torch.tanh(self.net(torch.cat([obs_n, t_feat], dim=-1)))
        return self.lo + 0.5 * (raw + 1.0) * (self.hi - self.lo)


def gaussian_log_prob(x: torch.Tensor, mean: torch.Tensor, log_var: torch.Tensor) -> torch.Tensor:
    """``sum_j log N(x_j; mean_j, exp(log_var_j))`` over the last dim: ``[B, F] -> [B]``."""
    return (-0.5 * ((x - mean).square() * torch.exp(-log_var) + log_var + math.log(2 * math.pi))).sum(-1)


class ReinFlow:
    """Implements ``Algorithm`` and ``Preloadable`` (base policy only)."""

    def __init__(self, cfg: ReinFlowCfg, env: VecEnv) -> None:
        require_box_actions(env, "reinflow")
        self.cfg = cfg
        self.device = torch.device(env.device)
        self.num_envs = int(env.num_envs)
        self.obs_dim = int(math.prod(env.obs_spec["policy"]))
        self.action_dim = int(env.action_dim)
        pcfg = cfg.policy
        self.policy = make_flow_policy(env.obs_spec, self.action_dim, pcfg).to(self.device)
        self.base = copy.deepcopy(self.policy).requires_grad_(False)
        f = self.policy.flat_dim
        embed = pcfg.time_embed_dim * (2 if pcfg.shortcut else 1)
        # noise net and critic read what the velocity network is conditioned on (``C``): the
        # normalized policy group, or an image-instruction policy's image, text and proprioception features
        self.cond_dim = self.policy.cond_dim
        self.noise = NoiseNet(self.cond_dim, embed, f, cfg).to(self.device)
        self.critic = mlp([self.cond_dim, *cfg.critic_hidden, 1], "tanh").to(self.device)
        self.actor_opt = torch.optim.Adam([*self.policy.parameters(), *self.noise.parameters()], lr=cfg.actor_lr)
        self.critic_opt = torch.optim.Adam(self.critic.parameters(), lr=cfg.critic_lr)
        self.chain_dim = (pcfg.denoise_steps + 1) * f
        self.storage = RolloutStorage(
            cfg.num_steps_per_env, self.num_envs, self.cond_dim, self.cond_dim, self.chain_dim, False, self.device
        )
        self.generator = torch.Generator(device=self.device)
        self.generator.manual_seed(int(torch.randint(0, 2**62, (1,)).item()))
        self.updates = 0
        self._acted = False
        self._preloaded = False

    # ------------------------------------------------------------------------------ base
    def preload(self, source: PreloadSource) -> None:
        """Start from the base run's flow policy (weights and observation normalizer)."""
        base = source.base_policy
        if base is None:
            raise EmbodiedError(f"reinflow fine-tunes a base policy: give --base RUN_DIR (got {source.describe()})")
        if not isinstance(base, FlowPolicy):
            raise EmbodiedError(
                f"reinflow needs a flow-matching base (a bc-flow run), but {source.base_run} holds a "
                f"{type(base).__name__}"
            )
        # how the base executed its chunks is not architecture: reinflow acts one chain per step
        execution = ("temporal_ensemble",)
        diff = [
            f"{f.name}: base {getattr(base.cfg, f.name)!r} vs algo.policy {getattr(self.cfg.policy, f.name)!r}"
            for f in dataclasses.fields(base.cfg)
            if f.name not in execution and getattr(base.cfg, f.name) != getattr(self.cfg.policy, f.name)
        ]
        if diff:
            raise ConfigError(f"--base {source.base_run}: flow architecture differs ({'; '.join(diff)})")
        if type(base) is not type(self.policy):
            raise EmbodiedError(
                f"--base {source.base_run} holds a {type(base).__name__}, this run builds a {type(self.policy).__name__}"
            )
        if (base.obs_dim, base.action_dim) != (self.obs_dim, self.action_dim):
            raise EmbodiedError(
                f"--base {source.base_run} maps {base.obs_dim} -> {base.action_dim}, this task {self.obs_dim} -> {self.action_dim}"
            )
        self.policy.load_state_dict(base.state_dict())
        self.base.load_state_dict(base.state_dict())
        self._preloaded = True

    # ----------------------------------------------------------------------------- chain
    def step_dist(self, obs_n: torch.Tensor, x: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Mean and log-variance ``[B, F]`` of ``x_{k+1}`` given ``x_k`` at ``t_k = k / K``.

        The only place the transition is defined: sampling and scoring both call it.
        """
        mean = x + self.policy.field(x, k, obs_n) / self.cfg.policy.denoise_steps
        t = torch.full((x.shape[0],), k / self.cfg.policy.denoise_steps, device=x.device, dtype=x.dtype)
        log_var = self.noise(obs_n, self.policy.time_features(t))
        return mean, log_var

    @torch.no_grad()
    def sample_chain(self, obs_n: torch.Tensor) -> torch.Tensor:
        """A noisy chain ``[B, K+1, F]`` from ``x0 ~ N(0, I)``."""
        b, f = obs_n.shape[0], self.policy.flat_dim
        x = torch.randn(b, f, generator=self.generator, device=self.device)
        chain = [x]
        for k in range(self.cfg.policy.denoise_steps):
            mean, log_var = self.step_dist(obs_n, x, k)
            noise = torch.randn(b, f, generator=self.generator, device=self.device)
            x = mean + torch.exp(0.5 * log_var) * noise
            chain.append(x)
        return torch.stack(chain, dim=1)

    def chain_log_prob(self, obs_n: torch.Tensor, chain: torch.Tensor) -> torch.Tensor:
        """Exact log-likelihood of chains ``[B, K+1, F]``, divided by ``(K+1) F``: ``[B]``."""
        steps = self.cfg.policy.denoise_steps
        x0 = chain[:, 0]
        logp = gaussian_log_prob(x0, torch.zeros_like(x0), torch.zeros_like(x0))
        for k in range(steps):
            mean, log_var = self.step_dist(obs_n, chain[:, k], k)
            logp = logp + gaussian_log_prob(chain[:, k + 1], mean, log_var)
        return logp / ((steps + 1) * chain.shape[-1])

    def _action(self, chain: torch.Tensor) -> torch.Tensor:
        """First action of the final chunk, clipped: ``[B, A]``."""
        return chain[:, -1, : self.action_dim].clamp(-1.0, 1.0)

    # --------------------------------------------------------------------------- rollout
    @torch.no_grad()
    def act(self, obs: ObsDict) -> torch.Tensor:
        st = self.storage
        if not self._preloaded:
            raise EmbodiedError("reinflow starts from a base policy: train with --base RUN_DIR (a bc-flow run)")
        if st.cursor >= st.steps:
            raise EmbodiedError("ReinFlow.act called on a full rollout: call update() first")
        obs_n = self.policy.condition(obs)  # acting is no_grad: encoders stay as the base trained them
        chain = self.sample_chain(obs_n)
        c = st.cursor
        st.actor_obs[c] = obs_n
        st.actions[c] = chain.reshape(chain.shape[0], -1)
        st.log_probs[c] = self.chain_log_prob(obs_n, chain)
        st.values[c] = self.critic(obs_n).squeeze(-1)
        self._acted = True
        return self._action(chain)

    @torch.no_grad()
    def _value_of(self, obs: ObsDict) -> torch.Tensor:
        return self.critic(self.policy.condition(obs)).squeeze(-1)

    @torch.no_grad()
    def observe(self, transition: Transition) -> None:
        if not self._acted:
            raise EmbodiedError("ReinFlow.observe called without a preceding act()")
        st, cfg = self.storage, self.cfg
        reward, done = bootstrap_timeouts(
            transition.reward.to(torch.float32) * cfg.reward_scale,
            transition.terminated,
            transition.truncated,
            cfg.gamma,
            lambda idx: self._value_of({group: rows[idx] for group, rows in transition.final_obs.items()}),
        )
        self._acted = False
        st.record_outcome(reward, done, lambda: self._value_of(transition.next_obs))

    def ready_to_update(self) -> bool:
        return self.storage.cursor >= self.storage.steps

    # ---------------------------------------------------------------------------- update
    def update(self) -> dict[str, float]:
        st, cfg = self.storage, self.cfg
        if not self.ready_to_update():
            raise EmbodiedError(f"ReinFlow.update called with {st.cursor}/{st.steps} rollout steps stored")
        advantages, returns = compute_gae(st.rewards, st.values, st.dones, st.last_values, cfg.gamma, cfg.lam)
        advantages = (advantages - advantages.mean()) / (advantages.std() + 1e-8)
        b = st.steps * self.num_envs
        obs_all = st.actor_obs.reshape(b, -1)
        chains = st.actions.reshape(b, cfg.policy.denoise_steps + 1, -1)
        logp_old_all = st.log_probs.reshape(b)
        value_old_all = st.values.reshape(b)
        adv_all, ret_all = advantages.reshape(b), returns.reshape(b)
        mb = b // cfg.num_minibatches
        train_actor = self.updates >= cfg.critic_warmup_updates
        stats = torch.zeros(cfg.num_epochs * cfg.num_minibatches, len(METRICS))
        i = 0
        for epoch in range(cfg.num_epochs):
            perm = torch.randperm(b, generator=self.generator, device=self.device)
            for m in range(cfg.num_minibatches):
                idx = perm[m * mb : (m + 1) * mb]
                obs_n, chain = obs_all[idx], chains[idx]
                logp = self.chain_log_prob(obs_n, chain)
                surrogate, ratio = clipped_surrogate_loss(logp, logp_old_all[idx], adv_all[idx], cfg.clip_ratio)
                if epoch == 0 and m == 0:
                    check_first_ratio(ratio, self.updates)
                value = self.critic(obs_n).squeeze(-1)
                value_loss = value_loss_fn(value, value_old_all[idx], ret_all[idx], None)
                log_var = self._mean_log_var(obs_n, chain)
                entropy = 0.5 * (log_var + math.log(2 * math.pi * math.e))
                bc = self._bc_loss(obs_n, chain) if cfg.bc_coef > 0.0 else torch.zeros((), device=self.device)
                actor_loss = surrogate - cfg.entropy_coef * entropy + cfg.bc_coef * bc
                self.critic_opt.zero_grad(set_to_none=True)
                self.actor_opt.zero_grad(set_to_none=True)
                loss = cfg.value_coef * value_loss + (actor_loss if train_actor else 0.0 * actor_loss)
                loss.backward()
                if cfg.max_grad_norm > 0.0:
                    nn.utils.clip_grad_norm_(self.critic.parameters(), cfg.max_grad_norm)
                    nn.utils.clip_grad_norm_([*self.policy.parameters(), *self.noise.parameters()], cfg.max_grad_norm)
                self.critic_opt.step()
                if train_actor:
                    self.actor_opt.step()
                with torch.no_grad():
                    clip_fraction = ((ratio - 1.0).abs() > cfg.clip_ratio).float().mean()
                    sigma = torch.exp(0.5 * log_var)
                    stats[i] = torch.stack([surrogate, value_loss, entropy, bc, clip_fraction, sigma]).detach().cpu()
                i += 1
        st.cursor = 0
        self.updates += 1
        metrics = dict(zip(METRICS, stats.mean(dim=0).tolist(), strict=True))
        metrics["actor_trained"] = float(train_actor)
        bad = [k for k, v in metrics.items() if not math.isfinite(v)]
        if bad:
            raise NonFiniteError(f"ReinFlow update produced non-finite {', '.join(bad)}")
        return metrics

    def _mean_log_var(self, obs_n: torch.Tensor, chain: torch.Tensor) -> torch.Tensor:
        total = torch.zeros((), device=self.device)
        for k in range(self.cfg.policy.denoise_steps):
            _, log_var = self.step_dist(obs_n, chain[:, k], k)
            total = total + log_var.mean()
        return total / self.cfg.policy.denoise_steps

    def _bc_loss(self, obs_n: torch.Tensor, chain: torch.Tensor) -> torch.Tensor:
        """Mean ``|v(x_k, t_k) - v_base(x_k, t_k)|^2`` over the visited chain states."""
        total = torch.zeros((), device=self.device)
        for k in range(self.cfg.policy.denoise_steps):
            with torch.no_grad():
                target = self.base.field(chain[:, k], k, obs_n)
            total = total + (self.policy.field(chain[:, k], k, obs_n) - target).square().mean()
        return total / self.cfg.policy.denoise_steps

    # ------------------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict[str, Any]:
        return {
            "policy": self.policy.state_dict(),
            "base": self.base.state_dict(),
            "noise": self.noise.state_dict(),
            "critic": self.critic.state_dict(),
            "actor_opt": self.actor_opt.state_dict(),
            "critic_opt": self.critic_opt.state_dict(),
            "generator": self.generator.get_state(),
            "updates": self.updates,
            **self.storage.checkpoint(self._acted),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.policy.load_state_dict(state["policy"])
        self.base.load_state_dict(state["base"])
        self.noise.load_state_dict(state["noise"])
        self.critic.load_state_dict(state["critic"])
        self.actor_opt.load_state_dict(state["actor_opt"])
        self.critic_opt.load_state_dict(state["critic_opt"])
        self.generator.set_state(state["generator"].cpu())
        self.updates = int(state["updates"])
        self._acted = self.storage.restore(state)
        self._preloaded = True


def check_first_ratio(ratio: torch.Tensor, update: int) -> None:
    """Raise :class:`RatioCheckError` unless every ratio ``[B]`` is 1 within :data:`RATIO_TOL`."""
    worst = float((ratio.detach() - 1.0).abs().max())
    if not worst <= RATIO_TOL:
        raise RatioCheckError(
            f"ReinFlow update {update}: importance ratio on the first minibatch is off 1 by {worst:.3g} "
            f"(> {RATIO_TOL:g}); the chain was scored differently from how it was sampled"
        )
