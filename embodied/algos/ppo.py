"""Proximal Policy Optimization with the features of RSL-RL's implementation.

GAE, clipped surrogate and clipped value loss, entropy bonus, adaptive-KL learning rate,
gradient-norm clipping, running observation normalization (separate actor/critic groups),
asymmetric actor-critic, minibatches reshuffled every epoch, and bootstrapping on time-outs
from the true final observation.

Shapes: ``T`` = ``num_steps_per_env``, ``N`` = ``num_envs``, ``B = T * N`` samples per update,
``D``/``C`` = actor/critic observation sizes, ``A`` = action size.

In multi-process training (:mod:`embodied.distributed`) each rank holds the rollout of its own
envs; gradients and the KL of each minibatch are averaged over the ranks and advantages are
normalized with the moments of all rollouts, so the ranks together take the steps one process
with all the envs would take, and their networks stay identical.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

import torch

from embodied import distributed
from embodied.algo import Transition
from embodied.algos.common import check_image_encoder, image_input_shape, resolve_init_action_mean
from embodied.config import ConfigError, ranged
from embodied.data.gae import compute_gae
from embodied.data.rollout import RolloutStorage, bootstrap_timeouts
from embodied.env import ObsDict, VecEnv, require_box_actions
from embodied.errors import EmbodiedError, NonFiniteError
from embodied.policies.actor_critic import ActorCritic
from embodied.precision import Bf16Setting, resolve_bf16

METRIC_NAMES: tuple[str, ...] = ("policy_loss", "value_loss", "entropy", "approx_kl", "clip_fraction")
"""Per-minibatch metrics, averaged over one ``update``."""


@dataclass(frozen=True)
class PPOCfg:
    """PPO hyperparameters (defaults follow RSL-RL except where tuned for fast CPU runs)."""

    num_steps_per_env: int = 32
    """Rollout length per env between updates (the batch is ``num_steps_per_env * num_envs``)."""
    num_epochs: int = 4
    """Passes over the rollout per update."""
    num_minibatches: int = 4
    """Minibatches per epoch (samples are reshuffled every epoch)."""
    gamma: float = ranged(0.99, 0.0, 1.0)
    """Discount factor."""
    lam: float = ranged(0.95, 0.0, 1.0)
    """GAE lambda."""
    clip_ratio: float = ranged(0.2, 1e-3, 1.0)
    """Surrogate clip range for the probability ratio (also the value-loss clip range)."""
    clip_value_loss: bool = True
    """Clip value predictions to ``old ± clip_ratio`` and take the larger loss (RSL-RL)."""
    reward_scale: float = 1.0
    """Multiplies env rewards before they are stored: keeps returns (and so the value loss and its
    share of the clipped gradient norm) near unit scale when rewards are large per step."""
    value_coef: float = ranged(1.0, 0.0, 100.0)
    """Weight of the value loss."""
    entropy_coef: float = ranged(0.01, 0.0, 10.0)
    """Weight of the entropy bonus."""
    learning_rate: float = ranged(1e-3, 1e-9, 1.0)
    """Initial Adam learning rate (shared by actor and critic)."""
    schedule: Literal["adaptive", "fixed"] = "adaptive"
    """``adaptive``: scale the learning rate by ``kl_lr_factor`` per minibatch to track ``desired_kl``."""
    desired_kl: float = ranged(0.01, 1e-6, 10.0)
    """KL target: above 2x the rate shrinks, below 1/2 it grows."""
    kl_lr_factor: float = ranged(1.5, 1.0, 100.0)
    """Multiplicative step of the adaptive learning rate."""
    lr_min: float = ranged(1e-5, 1e-9, 1.0)
    """Lower bound of the adaptive learning rate."""
    lr_max: float = ranged(1e-2, 1e-9, 1.0)
    """Upper bound of the adaptive learning rate."""
    lr_cooldown: float = 0.0
    """Final fraction of training (in [0, 1)) over which the learning rate's upper bound falls
    linearly from ``lr_max`` to ``lr_min``; 0 keeps ``lr_max`` to the end. The adaptive schedule
    alone keeps taking steps of ``desired_kl`` to the last update, so the final policy is one
    sample of a still-moving one; a cooldown lets it settle. The fraction is of the current
    ``trainer.total_env_steps``: ``--resume`` with a larger budget moves the cooldown to the new end."""
    max_grad_norm: float = ranged(1.0, 0.0, 1e6)
    """Global gradient-norm clip (<= 0 disables)."""
    normalize_advantage: bool = True
    """Normalize advantages to zero mean, unit std over the whole rollout."""
    actor_hidden: tuple[int, ...] = (64, 64)
    """Hidden widths of the actor's mean network."""
    critic_hidden: tuple[int, ...] = (64, 64)
    """Hidden widths of the critic."""
    activation: Literal["tanh", "elu", "relu"] = "tanh"
    """Hidden activation of both networks."""
    init_std: float = ranged(1.0, 1e-4, 10.0)
    """Initial action standard deviation (state-independent, learned as log-std)."""
    init_action_mean: tuple[float, ...] | str | None = None
    """Initial mean action: a tuple of ``action_dim`` values, or the name of a key of the env's
    ``io_spec().extra`` that holds one (e.g. ``hover_action``), or null for the default init."""
    actor_output_gain: float | None = None
    """Orthogonal-init gain of the actor's output layer; small (e.g. 0.01) makes the initial
    mean almost exactly ``init_action_mean`` everywhere. Null keeps PyTorch's default init."""
    normalize_obs: bool = True
    """Running mean/std normalization of actor and critic observations."""
    encoder: Literal["mlp", "cnn"] = "mlp"
    """``cnn``: the actor (and a critic without a privileged group) also reads the env's camera
    images (``obs["image"]``, ``env.backend.camera``) through a small CNN whose features join the
    normalized ``policy`` vector; ``mlp`` reads the vector only."""
    image_features: int = 64
    """With ``encoder: cnn``: width of the CNN's output features."""
    obs_clip: float = ranged(10.0, 0.1, 1e6, "standard deviations")
    """Normalized observations are clipped to ``± obs_clip``."""
    bf16: Bf16Setting = False
    """bfloat16 autocast of the networks' forward and backward in the update: ``true``, ``false``
    or ``auto`` (on exactly where the device computes bf16 natively: CUDA, or a CPU with AVX-512
    BF16 / AMX; elsewhere it is emulated and slower). Log-probabilities, ratios, losses, the KL and
    the optimizer stay float32, and the rollout's actions are sampled in float32, so only the
    update's matmuls round. The decision is logged."""

    def __post_init__(self) -> None:
        positive_ints = ("num_steps_per_env", "num_epochs", "num_minibatches")
        for name in positive_ints:
            if getattr(self, name) < 1:
                raise ConfigError(f"PPOCfg.{name} must be >= 1, got {getattr(self, name)}")
        for name in ("gamma", "lam"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ConfigError(f"PPOCfg.{name} must be in [0, 1], got {getattr(self, name)}")
        for name in ("clip_ratio", "learning_rate", "desired_kl", "init_std", "obs_clip", "lr_min", "reward_scale"):
            if not getattr(self, name) > 0.0:
                raise ConfigError(f"PPOCfg.{name} must be > 0, got {getattr(self, name)}")
        for name in ("value_coef", "entropy_coef"):
            if getattr(self, name) < 0.0:
                raise ConfigError(f"PPOCfg.{name} must be >= 0, got {getattr(self, name)}")
        if not 0.0 <= self.lr_cooldown < 1.0:
            raise ConfigError(f"PPOCfg.lr_cooldown must be in [0, 1), got {self.lr_cooldown}")
        if self.kl_lr_factor <= 1.0:
            raise ConfigError(f"PPOCfg.kl_lr_factor must be > 1, got {self.kl_lr_factor}")
        if not self.lr_min <= self.learning_rate <= self.lr_max:
            raise ConfigError(
                f"PPOCfg.learning_rate {self.learning_rate} must lie in [lr_min, lr_max] = "
                f"[{self.lr_min}, {self.lr_max}]"
            )
        check_image_encoder(self.encoder, self.image_features, "PPOCfg")
        if any(w < 1 for w in self.actor_hidden + self.critic_hidden):
            raise ConfigError("PPOCfg.actor_hidden / critic_hidden widths must be >= 1")
        if self.actor_output_gain is not None and self.actor_output_gain < 0.0:
            raise ConfigError(f"PPOCfg.actor_output_gain must be >= 0, got {self.actor_output_gain}")
        if isinstance(self.init_action_mean, tuple) and not all(-1.0 <= v <= 1.0 for v in self.init_action_mean):
            raise ConfigError(f"PPOCfg.init_action_mean values must lie in [-1, 1], got {self.init_action_mean}")


def gaussian_kl(
    mean_old: torch.Tensor, log_std_old: torch.Tensor, mean_new: torch.Tensor, log_std_new: torch.Tensor
) -> torch.Tensor:
    """Mean over the batch of ``KL(old || new)`` of diagonal Gaussians; means ``[B, A]``, log-stds ``[A]``."""
    var_ratio = torch.exp(2.0 * (log_std_old - log_std_new))
    mean_term = (mean_old - mean_new).square() * torch.exp(-2.0 * log_std_new)
    per_dim = log_std_new - log_std_old + 0.5 * (var_ratio + mean_term) - 0.5
    return per_dim.sum(dim=-1).mean()


def clipped_surrogate_loss(
    logp: torch.Tensor, logp_old: torch.Tensor, advantages: torch.Tensor, clip_ratio: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """PPO's clipped surrogate ``-mean(min(r A, clip(r, 1 ± eps) A))`` and the ratio ``r [B]``.

    All inputs ``[B]``; gradients vanish where the ratio is already past the clip in the
    direction the advantage favours.
    """
    ratio = torch.exp(logp - logp_old)
    clipped = ratio.clamp(1.0 - clip_ratio, 1.0 + clip_ratio)
    return torch.max(-advantages * ratio, -advantages * clipped).mean(), ratio


def value_loss_fn(
    value: torch.Tensor, value_old: torch.Tensor, returns: torch.Tensor, clip: float | None
) -> torch.Tensor:
    """Mean squared value error ``[B] -> scalar``; with ``clip``, the larger of the plain and the
    clipped (``value_old ± clip``) error, as in RSL-RL."""
    error = (value - returns).square()
    if clip is None:
        return error.mean()
    value_clipped = value_old + (value - value_old).clamp(-clip, clip)
    return torch.max(error, (value_clipped - returns).square()).mean()


def cooled_lr_max(cfg: PPOCfg, progress: float) -> float:
    """The learning rate's upper bound at ``progress`` (``env_steps / total_env_steps``): ``lr_max``
    until the last ``lr_cooldown`` of training, then linearly down to ``lr_min`` at the end."""
    if cfg.lr_cooldown <= 0.0:
        return cfg.lr_max
    into_cooldown = (progress - (1.0 - cfg.lr_cooldown)) / cfg.lr_cooldown
    weight = min(max(into_cooldown, 0.0), 1.0)
    return cfg.lr_max + weight * (cfg.lr_min - cfg.lr_max)


def adapt_learning_rate(lr: torch.Tensor, kl: torch.Tensor, cfg: PPOCfg, lr_max: float | None = None) -> None:
    """In-place adaptive-KL step on the 0-d tensor ``lr`` (no host sync, so no ``.item()``);
    ``lr_max``: the current upper bound (default ``cfg.lr_max``; :func:`cooled_lr_max`)."""
    factor = torch.where(
        kl > 2.0 * cfg.desired_kl,
        1.0 / cfg.kl_lr_factor,
        torch.where(kl < 0.5 * cfg.desired_kl, cfg.kl_lr_factor, 1.0),
    )
    lr.mul_(factor).clamp_(cfg.lr_min, cfg.lr_max if lr_max is None else lr_max)


class PPO:
    """PPO on a :class:`VecEnv`; implements the ``Algorithm`` protocol.

    The trainer calls ``act(obs)`` then ``observe(transition)`` once per env step; after
    ``num_steps_per_env`` steps ``ready_to_update()`` is true and ``update()`` trains on the rollout.
    """

    multi_process = True
    """Trains correctly in several processes (see the module docstring)."""

    def __init__(self, cfg: PPOCfg, env: VecEnv) -> None:
        # the Gaussian actor outputs [-1, 1] boxes; a discrete env would receive float indices
        require_box_actions(env, "PPO")
        self.cfg = cfg
        self.device = torch.device(env.device)
        self.num_envs = int(env.num_envs)
        if "policy" not in env.obs_spec:
            raise EmbodiedError(f"PPO needs an observation group 'policy'; the env has {sorted(env.obs_spec)}")
        actor_dim = _flat_dim(env.obs_spec["policy"])
        separate_critic = "critic" in env.obs_spec
        critic_dim = _flat_dim(env.obs_spec["critic"]) if separate_critic else actor_dim
        self.action_dim = int(env.action_dim)
        batch = cfg.num_steps_per_env * self.num_envs
        if batch < cfg.num_minibatches:
            raise ConfigError(
                f"PPOCfg.num_minibatches={cfg.num_minibatches} exceeds the rollout size "
                f"num_steps_per_env * num_envs = {batch}"
            )
        image_shape = image_input_shape(env, cfg.encoder, "PPO")
        self.policy = ActorCritic(
            actor_dim,
            critic_dim,
            self.action_dim,
            actor_hidden=cfg.actor_hidden,
            critic_hidden=cfg.critic_hidden,
            activation=cfg.activation,
            init_std=cfg.init_std,
            init_action_mean=resolve_init_action_mean(cfg.init_action_mean, env),
            actor_output_gain=cfg.actor_output_gain,
            normalize_obs=cfg.normalize_obs,
            obs_clip=cfg.obs_clip,
            separate_critic_obs=separate_critic,
            image_shape=image_shape,
            image_features=cfg.image_features,
        ).to(self.device)
        # The learning rate is a 0-d tensor so the adaptive schedule never syncs with the host;
        # fused Adam accepts it on CPU and CUDA.
        self.lr = torch.tensor(cfg.learning_rate, device=self.device)
        self.optimizer = torch.optim.Adam(self.policy.parameters(), lr=self.lr, fused=True)
        self.use_bf16 = resolve_bf16(cfg.bf16, self.device)
        self.storage = RolloutStorage(
            cfg.num_steps_per_env,
            self.num_envs,
            self.policy.actor_input_dim,
            critic_dim,
            self.action_dim,
            separate_critic,
            self.device,
        )
        # A private generator (seeded from the global one, which the trainer seeds) makes action
        # noise and minibatch shuffling part of this object's state, so a resume is bit-exact.
        self.generator = torch.Generator(device=self.device)
        self.generator.manual_seed(int(torch.randint(0, 2**62, (1,)).item()))
        self._acted = False
        self.lr_cap = cfg.lr_max
        """The learning rate's current upper bound (:meth:`set_training_progress`)."""
        self.world = distributed.current()
        """The training processes this rank averages with (None: a single process)."""

    # --- rollout --------------------------------------------------------------------------

    @torch.no_grad()
    def act(self, obs: ObsDict) -> torch.Tensor:
        """Sample exploration actions ``[N, A]`` (clipped to [-1, 1]) and record the step's inputs."""
        st = self.storage
        if st.cursor >= st.steps:
            raise EmbodiedError("PPO.act called on a full rollout: call update() first")
        pi = self.policy
        actor_raw = obs["policy"]
        critic_raw = obs["critic"] if st.separate_critic else None
        pi.update_normalizers(actor_raw, critic_raw)
        actor_in = pi.actor_input(obs)
        features = pi.encode(actor_in)
        critic_in = pi.normalize_critic(critic_raw) if critic_raw is not None else features
        mean = pi.mean_net(features)
        noise = torch.randn(mean.shape, generator=self.generator, device=self.device, dtype=mean.dtype)
        sample = mean + torch.exp(pi.log_std) * noise
        c = st.cursor
        st.actor_obs[c] = actor_in
        if st.separate_critic:
            st.critic_obs[c] = critic_in
        st.actions[c] = sample
        st.means[c] = mean
        st.log_probs[c] = pi.log_prob(sample, mean)
        st.values[c] = pi.value(critic_in)
        self._acted = True
        return sample.clamp(-1.0, 1.0)

    @torch.no_grad()
    def _value_of(self, obs: ObsDict) -> torch.Tensor:
        """``V [N]`` of raw observations, normalized with the current statistics (no update)."""
        return self.policy.value_of(obs)

    @torch.no_grad()
    def observe(self, transition: Transition) -> None:
        """Store reward and episode ends of the step started by the last ``act``."""
        if not self._acted:
            raise EmbodiedError("PPO.observe called without a preceding act()")
        st = self.storage
        cfg = self.cfg
        reward, done = bootstrap_timeouts(
            transition.reward.to(torch.float32) * cfg.reward_scale,
            transition.terminated,
            transition.truncated,
            cfg.gamma,
            lambda idx: self._value_of({k: v.index_select(0, idx) for k, v in transition.final_obs.items()}),
        )
        self._acted = False
        st.record_outcome(reward, done, lambda: self._value_of(transition.next_obs))

    def ready_to_update(self) -> bool:
        return self.storage.cursor >= self.storage.steps

    def set_training_progress(self, fraction: float) -> None:
        """Lower the learning rate's cap during the cooldown (:attr:`PPOCfg.lr_cooldown`); the
        trainer calls it before each rollout (:class:`embodied.env.TrainingCurriculum`)."""
        self.lr_cap = cooled_lr_max(self.cfg, fraction)
        if self.cfg.schedule == "fixed":
            self.lr.fill_(min(self.cfg.learning_rate, self.lr_cap))
        else:
            self.lr.clamp_(max=self.lr_cap)

    # --- update ---------------------------------------------------------------------------

    def update(self) -> dict[str, float]:
        """Train on the full rollout; return averaged minibatch metrics and schedule state."""
        st = self.storage
        cfg = self.cfg
        if not self.ready_to_update():
            raise EmbodiedError(f"PPO.update called with {st.cursor}/{st.steps} rollout steps stored")
        pi = self.policy
        advantages, returns = compute_gae(st.rewards, st.values, st.dones, st.last_values, cfg.gamma, cfg.lam)
        explained_variance = _explained_variance(st.values, returns)
        if cfg.normalize_advantage:
            mean, std = _moments(advantages) if self.world is None else _moments_across_ranks(advantages)
            advantages = (advantages - mean) / (std + 1e-8)

        # One flat [B, F] table: each epoch reshuffles it with a single gather, and minibatches
        # are contiguous row slices (views), which keeps per-minibatch Python work minimal.
        columns = [st.actor_obs]
        if st.separate_critic:
            columns.append(st.critic_obs)
        columns += [
            st.actions,
            st.means,
            st.log_probs.unsqueeze(-1),
            st.values.unsqueeze(-1),
            advantages.unsqueeze(-1),
            returns.unsqueeze(-1),
        ]
        widths = [col.shape[-1] for col in columns]
        table = torch.cat(columns, dim=-1).reshape(-1, sum(widths))
        batch = table.shape[0]
        mb_size = batch // cfg.num_minibatches
        log_std_old = pi.log_std.detach().clone()
        params = list(pi.parameters())
        num_mb = cfg.num_epochs * cfg.num_minibatches
        stats = torch.zeros(num_mb, len(METRIC_NAMES), device=self.device)

        i = 0
        for _ in range(cfg.num_epochs):
            perm = torch.randperm(batch, generator=self.generator, device=self.device)
            shuffled = table.index_select(0, perm)
            for m in range(cfg.num_minibatches):
                mb = shuffled[m * mb_size : (m + 1) * mb_size]
                parts = torch.split(mb, widths, dim=-1)
                actor_in = parts[0]
                critic_in, rest = (parts[1], parts[2:]) if st.separate_critic else (parts[0], parts[1:])
                actions, mean_old, logp_old, value_old, adv, ret = rest
                logp_old, value_old, adv, ret = (x.squeeze(-1) for x in (logp_old, value_old, adv, ret))

                with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.use_bf16):
                    features = pi.encode(actor_in)
                    mean = pi.mean_net(features)
                    value = pi.value(critic_in if st.separate_critic else features)
                # log-probabilities, losses and the KL in float32 (exp of a bf16 difference is coarse)
                mean, value = mean.float(), value.float()
                logp = pi.log_prob(actions, mean)
                entropy = pi.entropy()

                with torch.no_grad():
                    kl = gaussian_kl(mean_old, log_std_old, mean, pi.log_std)

                surrogate, ratio = clipped_surrogate_loss(logp, logp_old, adv, cfg.clip_ratio)
                value_clip = cfg.clip_ratio if cfg.clip_value_loss else None
                value_loss = value_loss_fn(value, value_old, ret, value_clip)
                loss = surrogate + cfg.value_coef * value_loss - cfg.entropy_coef * entropy

                self.optimizer.zero_grad(set_to_none=True)
                loss.backward()
                if self.world is not None:
                    # the minibatch of all ranks: mean gradient and mean KL (equal minibatch sizes)
                    kl = kl.reshape(1)
                    distributed.average_([*(p.grad for p in params if p.grad is not None), kl])
                    kl = kl.reshape(())
                if cfg.schedule == "adaptive":
                    # the rate only matters at optimizer.step(), so adapting after backward is the same
                    adapt_learning_rate(self.lr, kl, cfg, self.lr_cap)
                if cfg.max_grad_norm > 0.0:
                    torch.nn.utils.clip_grad_norm_(params, cfg.max_grad_norm, foreach=True)
                self.optimizer.step()

                with torch.no_grad():
                    clip_fraction = ((ratio - 1.0).abs() > cfg.clip_ratio).float().mean()
                    stats[i] = torch.stack([surrogate, value_loss, entropy, kl, clip_fraction])
                i += 1

        st.cursor = 0
        # The only host transfer of the update: all metrics at once.
        extra = torch.stack([self.lr, torch.exp(pi.log_std.detach()).mean(), explained_variance])
        values = torch.cat([stats.mean(dim=0), extra.to(stats.dtype)]).tolist()
        metrics = dict(zip((*METRIC_NAMES, "learning_rate", "action_std", "explained_variance"), values))
        bad = [k for k, v in metrics.items() if k != "explained_variance" and not math.isfinite(v)]
        if bad:
            raise NonFiniteError(f"PPO update produced non-finite {', '.join(bad)}: {metrics}")
        return metrics

    # --- checkpoints ----------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """Networks, normalizers, optimizer, learning rate, RNG, rollout cursor and contents."""
        # A mid-rollout checkpoint needs the partial rollout; a fresh one (cursor 0) does not.
        return {
            "policy": self.policy.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "lr": self.lr.detach().clone(),
            "generator": self.generator.get_state(),
            **self.storage.checkpoint(self._acted),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.policy.load_state_dict(state["policy"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.lr.copy_(state["lr"])
        # Optimizer.load_state_dict replaces the param group's lr with the saved tensor; point
        # it back at our tensor so the adaptive schedule keeps steering the optimizer.
        for group in self.optimizer.param_groups:
            group["lr"] = self.lr
        self.generator.set_state(state["generator"].cpu())  # generator states are CPU byte tensors
        self._acted = self.storage.restore(state)


def _flat_dim(shape: tuple[int, ...]) -> int:
    return int(math.prod(shape))


def _moments(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean and (unbiased) standard deviation of all entries of ``x``, 0-d tensors."""
    return x.mean(), x.std()


def _moments_across_ranks(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`_moments` of the union of every rank's ``x`` (one all-reduce of count, sum, sum²)."""
    flat = x.reshape(-1).to(torch.float64)
    sums = distributed.sum_(torch.stack([flat.new_tensor(float(flat.numel())), flat.sum(), flat.square().sum()]))
    count, total, total_sq = sums[0], sums[1], sums[2]
    mean = total / count
    var = (total_sq - count * mean.square()).clamp_min(0.0) / (count - 1.0).clamp_min(1.0)
    return mean.to(x.dtype), var.sqrt().to(x.dtype)


def _explained_variance(values: torch.Tensor, returns: torch.Tensor) -> torch.Tensor:
    """``1 - Var(returns - values) / Var(returns)`` over the rollout, a 0-d tensor (nan if the
    returns are constant; computed on device so the update needs no extra host sync)."""
    var_returns = returns.var()
    return 1.0 - (returns - values).var() / torch.where(var_returns > 0, var_returns, torch.nan)
