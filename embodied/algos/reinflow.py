"""ReinFlow: fine-tune a flow-matching policy with PPO over its noisy denoising chain.

A learnable noise network turns the deterministic Euler sampler into a Markov chain with a
tractable likelihood (Zhang et al. 2025, "ReinFlow"): starting from ``x0 ~ N(0, I)``, each
step ``k = 0 .. K-1`` at ``t_k = k / K`` draws

    x_{k+1} ~ N(mu_k, sigma_k^2),   mu_k = x_k + v(x_k, t_k) / K,
    log sigma_k^2 = squash(noise_net(obs, t_k)) in [log sigma_min^2, log sigma_max^2],

and the chain's log-likelihood is ``log N(x0; 0, I) + sum_k log N(x_{k+1}; mu_k, sigma_k^2)``
divided by ``(K + 1) * F``. Only the entries ``algo.noisy_entries`` names get noise (by default
the task's actions: a VLA's padding slots step deterministically); the likelihood is that of the
noisy entries, and ``F`` counts them. Sampling and scoring call the same :meth:`ReinFlow.step_dist`
on the same grid, so the PPO importance ratio is 1 on the first minibatch of every update;
this is asserted (the reference implementation's grids differ, which breaks exactly that).
The objective is PPO's clipped surrogate plus a value loss, an entropy bonus on the noise,
and optionally a behaviour-cloning term pulling the velocity field to the frozen base. With
``--dataset``, every actor step also takes a flow-matching loss on demonstrated chunks
(:mod:`embodied.algos.flow_demos`, weight ``demo_coef``).

The algorithm sees the policy only through a :class:`~embodied.algos.flow_chain.FlowChain`, so
the same loop fine-tunes this project's flow policies (``--base RUN_DIR`` of a ``bc-flow`` run,
whose flow architecture must equal ``algo.policy``) and a pretrained flow-matching VLA's action
expert (``--base lerobot:PATH`` of a SmolVLA checkpoint, :mod:`embodied.policies.smolvla_chain`;
which of its parts train is ``algo.vla``). The chain's conditioning (a flow policy's normalized
observation, a VLA backbone's key/value cache) is computed once per observation when acting and
stored with the rollout: the ``K`` steps and every epoch reuse it.

Chunks run as the base runs them: each chain's chunk drives ``exec_steps`` env steps (its first
``exec_steps`` actions, shared by all envs), and those steps are one PPO transition whose reward
is their discounted sum (cut at an episode's end; the next chain then starts mid-episode of the
new one) and whose discount is ``gamma ** exec_steps``. ``num_steps_per_env`` counts chains.
A blended (temporal-ensemble) base is refused: its action is no single chain's. Evaluation and
exports use the noise-free sampler (a VLA: LeRobot's own sampler).

Memory: ``algo.micro_batch`` splits each minibatch into micro-batches whose gradients accumulate
before one optimizer step, so a large policy trains with a bounded activation footprint.

Shapes: ``T`` = chains per rollout, ``N`` = envs, ``C`` = chain feature size, ``F`` the
flattened chain state, ``F_noisy`` its noisy entries, ``K`` = denoising steps, chains ``[B, K+1, F]``.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
from torch import nn

from embodied.algo import PreloadSource, Transition
from embodied.algos.flow_chain import (
    Cond,
    FlowChain,
    PolicyFlowChain,
    cat_conds,
    cond_rows,
    index_cond,
)
from embodied.algos.flow_demos import FlowDemos, load_flow_demos
from embodied.algos.ppo import clipped_surrogate_loss, value_loss_fn
from embodied.config import ConfigError, ranged
from embodied.data.gae import compute_gae
from embodied.data.rollout import RolloutStorage, bootstrap_timeouts
from embodied.env import ObsDict, VecEnv, require_box_actions
from embodied.errors import EmbodiedError, NonFiniteError
from embodied.policies.flow import FlowPolicy, FlowPolicyCfg, action_entry_mask, mlp
from embodied.policies.image_flow import make_flow_policy
from embodied.precision import Bf16Setting

RATIO_TOL = 1e-5
"""Largest ``|ratio - 1|`` allowed on the first minibatch of an update (float32 round-off of
recomputing the same chain in a different batch shape; a grid mismatch is orders larger)."""

NOISY_ENTRIES = ("all", "actions", "executed")
"""The values of ``algo.noisy_entries``."""

METRICS = ("policy_loss", "value_loss", "entropy", "bc_loss", "clip_fraction", "sigma", "demo_loss")


class RatioCheckError(EmbodiedError):
    """The first-minibatch importance ratio is not 1: sampling and scoring disagree."""


@dataclass(frozen=True)
class VLAFineTuneCfg:
    """What of a pretrained VLA (``--base lerobot:PATH``) ReinFlow trains, and how it batches."""

    train: Literal["expert", "last_layers", "lora"] = "expert"
    """``expert``: the whole action expert (its transformer and the action/time projections);
    ``last_layers``: only its last ``last_layers`` transformer layers and the action output
    projection; ``lora``: low-rank adapters on every linear layer of the expert's transformer
    layers (attention q/k/v/o and MLP gate/up/down projections), the expert itself frozen; they
    are merged into the weights when the policy leaves the trainer (eval, export). The
    vision-language backbone is always frozen."""
    last_layers: int = 1
    """Expert layers trained with ``train: last_layers``."""
    lora_rank: int = 8
    """Rank ``r`` of the adapters with ``train: lora`` (``r * (in + out)`` parameters per layer)."""
    lora_alpha: float | None = None
    """Adapter scale numerator with ``train: lora``: the update is ``(alpha / r) B A`` (None: ``alpha = r``,
    scale 1)."""
    backbone_micro_batch: int = 8
    """Observations per backbone forward when acting (bounds the backbone's activation memory)."""
    bf16: Bf16Setting = "auto"
    """bfloat16 autocast of the frozen backbone's forward (``auto``: where the device computes bf16
    natively, :mod:`embodied.precision`). The expert's chain stays float32, so the chain's
    likelihood is exact and the first importance ratio is 1."""
    feature_dim: int = 64
    """Size of the fixed projection of the pooled backbone features that the critic and the noise
    network read (beside the state)."""

    def __post_init__(self) -> None:
        for name in ("last_layers", "lora_rank", "backbone_micro_batch", "feature_dim"):
            if getattr(self, name) < 1:
                raise ConfigError(f"algo.vla.{name} must be >= 1, got {getattr(self, name)}")
        if self.train not in ("expert", "last_layers", "lora"):
            raise ConfigError(f"algo.vla.train must be 'expert', 'last_layers' or 'lora', got {self.train!r}")
        if self.lora_alpha is not None and not (math.isfinite(self.lora_alpha) and self.lora_alpha > 0.0):
            raise ConfigError(
                f"algo.vla.lora_alpha must be a number > 0 (or null: equal to lora_rank), got {self.lora_alpha!r}"
            )


@dataclass(frozen=True)
class ReinFlowCfg:
    """ReinFlow hyperparameters (defaults from the paper's locomotion settings, sped up for CPU)."""

    policy: FlowPolicyCfg = field(default_factory=FlowPolicyCfg)
    """Flow architecture: must equal the base run's ``algo.policy`` (ignored for a LeRobot base)."""
    vla: VLAFineTuneCfg = field(default_factory=VLAFineTuneCfg)
    """A pretrained VLA base (``--base lerobot:PATH``): what trains and how it batches."""
    sigma_min: float = 0.08
    """Lower bound of the per-step noise std."""
    sigma_max: float = 0.16
    """Upper bound of the per-step noise std."""
    noisy_entries: Literal["all", "actions", "executed"] = "actions"
    """Which entries of the chain state get the learned noise (the rest step deterministically, so
    they add nothing to the likelihood): ``all``; ``actions``: the task's action entries of every
    chunk position, not the padding slots a VLA's chain carries (``max_action_dim`` > the task's
    action size; for this project's flow policies the same as ``all``); ``executed``: only the
    action entries of the ``exec_steps`` positions the env runs. Noise elsewhere changes the
    likelihood ratio without changing what the env sees, which only adds variance to PPO."""
    noise_hidden: tuple[int, ...] = (64, 64)
    """Hidden widths of the noise network (observation + time features -> log-variance)."""
    critic_hidden: tuple[int, ...] = (256, 256)
    """Hidden widths of the value network."""
    num_steps_per_env: int = 50
    """Chains per env between updates (each drives ``exec_steps`` env steps)."""
    num_epochs: int = 5
    """Passes over the rollout per update."""
    num_minibatches: int = 4
    """Minibatches per epoch."""
    micro_batch: int = 0
    """Rows per gradient micro-batch: a minibatch's gradients accumulate over micro-batches of
    this size before one optimizer step (0: the whole minibatch at once)."""
    gamma: float = ranged(0.99, 0.0, 1.0)
    """Discount factor per env step."""
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
    demo_coef: float = ranged(1.0, 0.0, 100.0)
    """Weight of the flow-matching loss on ``--dataset`` demonstrations in every actor step
    (ignored without a dataset; with one it must be > 0)."""
    demo_batch: int = 64
    """Demonstration steps per actor optimizer step (with ``--dataset``)."""
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
        for name in ("num_steps_per_env", "num_epochs", "num_minibatches", "demo_batch"):
            if getattr(self, name) < 1:
                raise ConfigError(f"algo.{name} must be >= 1, got {getattr(self, name)}")
        for name in ("gamma", "lam"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ConfigError(f"algo.{name} must be in [0, 1], got {getattr(self, name)}")
        for name in ("clip_ratio", "actor_lr", "critic_lr", "reward_scale"):
            if not getattr(self, name) > 0.0:
                raise ConfigError(f"algo.{name} must be > 0, got {getattr(self, name)}")
        for name in ("value_coef", "entropy_coef", "bc_coef", "demo_coef", "critic_warmup_updates", "micro_batch"):
            if getattr(self, name) < 0:
                raise ConfigError(f"algo.{name} must be >= 0, got {getattr(self, name)}")
        if self.noisy_entries not in NOISY_ENTRIES:
            raise ConfigError(f"algo.noisy_entries must be one of {NOISY_ENTRIES}, got {self.noisy_entries!r}")
        if self.policy.temporal_ensemble:
            raise ConfigError(
                "algo.policy.temporal_ensemble must be false for reinflow: an action blended from several "
                "chains is no single chain's, so no likelihood scores it"
            )


class NoiseNet(nn.Module):
    """``log sigma^2 [B, F_noisy]`` (the noisy entries of the chain state) in ``[log sigma_min^2, log sigma_max^2]`` from chain and time features."""

    def __init__(self, obs_dim: int, embed_dim: int, noisy_dim: int, cfg: ReinFlowCfg) -> None:
        super().__init__()
        self.net = mlp([obs_dim + embed_dim, *cfg.noise_hidden, noisy_dim], "tanh")
        self.lo = 2.0 * math.log(cfg.sigma_min)
        self.hi = 2.0 * math.log(cfg.sigma_max)

    def forward(self, obs_n: torch.Tensor, t_feat: torch.Tensor) -> torch.Tensor:
        raw = torch.tanh(self.net(torch.cat([obs_n, t_feat], dim=-1)))
        return self.lo + 0.5 * (raw + 1.0) * (self.hi - self.lo)


def gaussian_log_prob(x: torch.Tensor, mean: torch.Tensor, log_var: torch.Tensor) -> torch.Tensor:
    """``sum_j log N(x_j; mean_j, exp(log_var_j))`` over the last dim: ``[B, F] -> [B]``."""
    return (-0.5 * ((x - mean).square() * torch.exp(-log_var) + log_var + math.log(2 * math.pi))).sum(-1)


class ReinFlow:
    """Implements ``Algorithm`` and ``Preloadable`` (``--base`` required, ``--dataset`` optional)."""

    base_outside_checkpoint = True
    """Every rebuild preloads ``trainer.base_run`` first (a VLA's frozen backbone is never copied
    into the checkpoint); the checkpoint then restores the fine-tuned weights."""

    def __init__(self, cfg: ReinFlowCfg, env: VecEnv) -> None:
        require_box_actions(env, "reinflow")
        self.cfg = cfg
        self.device = torch.device(env.device)
        self.num_envs = int(env.num_envs)
        self.obs_dim = int(math.prod(env.obs_spec["policy"]))
        self.action_dim = int(env.action_dim)
        self.obs_spec = dict(env.obs_spec)
        self.generator = torch.Generator(device=self.device)
        self.generator.manual_seed(int(torch.randint(0, 2**62, (1,)).item()))
        self.updates = 0
        self._acted = False
        self._preloaded = False
        self._merged = False
        self.demos: FlowDemos | None = None
        """``--dataset`` demonstrations, in the chain's state space (None without)."""
        self._build(PolicyFlowChain(make_flow_policy(env.obs_spec, self.action_dim, cfg.policy).to(self.device)))

    def _build(self, chain: FlowChain) -> None:
        """Noise network, critic, optimizers and rollout storage for ``chain``."""
        cfg = self.cfg
        self.chain = chain
        # a FlowPolicy, or the LeRobotPolicy of a VLA base (typed loosely: callers use either's API)
        self.policy: Any = chain.policy
        self.exec_steps = chain.chunk_spec.exec_steps
        self.noisy = noisy_entries(chain, cfg.noisy_entries).to(self.device)
        """Indices ``[F_noisy]`` of the chain-state entries that get noise (``algo.noisy_entries``)."""
        self.noise = NoiseNet(chain.feature_dim, chain.time_dim, len(self.noisy), cfg).to(self.device)
        self.critic = mlp([chain.feature_dim, *cfg.critic_hidden, 1], "tanh").to(self.device)
        self.actor_opt = torch.optim.Adam([*chain.trainable_parameters(), *self.noise.parameters()], lr=cfg.actor_lr)
        self.critic_opt = torch.optim.Adam(self.critic.parameters(), lr=cfg.critic_lr)
        self.chain_dim = (chain.denoise_steps + 1) * chain.flat_dim
        self.storage = RolloutStorage(
            cfg.num_steps_per_env,
            self.num_envs,
            chain.feature_dim,
            chain.feature_dim,
            self.chain_dim,
            False,
            self.device,
        )
        self._conds: list[Cond | None] = [None] * cfg.num_steps_per_env
        self._chunk: torch.Tensor | None = None
        """The chunk ``[N, H, A]`` being executed and how many of its actions ran."""
        self._chunk_step = 0
        self._macro_reward = torch.zeros(self.num_envs, device=self.device)
        self._macro_done = torch.zeros(self.num_envs, device=self.device)
        self._macro_discount = 1.0

    # ------------------------------------------------------------------------------ base
    def preload(self, source: PreloadSource) -> None:
        """Start from the base policy: a bc-flow run's flow policy, or a LeRobot flow-matching VLA."""
        base = source.base_policy
        if base is None:
            raise EmbodiedError(f"reinflow fine-tunes a base policy: give --base RUN_DIR (got {source.describe()})")
        if not isinstance(base, FlowPolicy):
            from embodied.policies.smolvla_chain import is_smolvla_base, smolvla_chain

            if not is_smolvla_base(base):
                raise EmbodiedError(
                    f"reinflow needs a flow-matching base (a bc-flow run, or lerobot:PATH of a SmolVLA), but "
                    f"{source.base_run} holds a {type(base).__name__}"
                )
            if self.cfg.bc_coef > 0.0:
                raise ConfigError(
                    "algo.bc_coef > 0 keeps a frozen copy of the base's velocity field; for a VLA base that is a "
                    "second action expert in memory, which is not supported: set algo.bc_coef=0"
                )
            self._build(smolvla_chain(base, self.cfg.vla, self.device))
            self._load_demos(source)
            self._preloaded = True
            return
        # how the base executed its chunks is not architecture: reinflow acts one chain per chunk
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
        assert isinstance(self.chain, PolicyFlowChain)
        self.chain.policy.load_state_dict(base.state_dict())
        self.chain.base.load_state_dict(base.state_dict())
        self._load_demos(source)
        self._preloaded = True

    def _load_demos(self, source: PreloadSource) -> None:
        """``--dataset``: the demonstrations the actor's flow-matching term reads (after the chain is built)."""
        if source.dataset is None:
            return
        if self.cfg.demo_coef <= 0.0:
            raise ConfigError(
                f"--dataset {source.dataset} is given but algo.demo_coef=0, so reinflow would not use it: "
                "set algo.demo_coef > 0 or drop --dataset"
            )
        self.demos = load_flow_demos(source.dataset, self.chain, self.obs_spec, self.action_dim, self.device)

    def merge_adapters(self) -> None:
        """Fold a VLA chain's LoRA adapters (``algo.vla.train: lora``) into its weights, so the policy
        is the plain pretrained architecture again (no-op otherwise). For a policy leaving training
        (:func:`embodied.training.run.load_run`: eval, export); this algorithm then no longer trains
        or checkpoints."""
        merge = getattr(self.chain, "merge_adapters", None)
        if callable(merge) and merge():
            self._merged = True

    def _check_not_merged(self, what: str) -> None:
        if self._merged:
            raise EmbodiedError(f"ReinFlow.{what}: the LoRA adapters were merged into the policy; nothing trains now")

    # ----------------------------------------------------------------------------- chain
    def step_dist(self, cond: Cond, x: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Mean ``[B, F]`` of ``x_{k+1}`` given ``x_k`` at grid step ``k``, and the log-variance
        ``[B, F_noisy]`` of its noisy entries (:attr:`noisy`; the others equal the mean).

        The only place the transition is defined: sampling and scoring both call it.
        """
        mean = self.chain.step_mean(cond, x, k)
        log_var = self.noise(self.chain.features(cond), self.chain.time_features(k, x.shape[0]))
        return mean, log_var

    @torch.no_grad()
    def sample_chain(self, cond: Cond) -> torch.Tensor:
        """A noisy chain ``[B, K+1, F]`` from ``x0 ~ N(0, I)``."""
        b, f = cond_rows(cond), self.chain.flat_dim
        x = torch.randn(b, f, generator=self.generator, device=self.device)
        chain = [x]
        for k in range(self.chain.denoise_steps):
            mean, log_var = self.step_dist(cond, x, k)
            noise = torch.randn(b, len(self.noisy), generator=self.generator, device=self.device)
            x = mean.clone()
            x[:, self.noisy] += torch.exp(0.5 * log_var) * noise
            chain.append(x)
        return torch.stack(chain, dim=1)

    def chain_log_prob(self, cond: Cond, chain: torch.Tensor) -> torch.Tensor:
        """Exact log-likelihood of chains ``[B, K+1, F]`` in their noisy entries (the rest are
        deterministic given the previous state), divided by ``(K+1) F_noisy``: ``[B]``."""
        steps, idx = self.chain.denoise_steps, self.noisy
        x0 = chain[:, 0, idx]
        logp = gaussian_log_prob(x0, torch.zeros_like(x0), torch.zeros_like(x0))
        for k in range(steps):
            mean, log_var = self.step_dist(cond, chain[:, k], k)
            logp = logp + gaussian_log_prob(chain[:, k + 1, idx], mean[:, idx], log_var)
        return logp / ((steps + 1) * len(idx))

    # --------------------------------------------------------------------------- rollout
    @torch.no_grad()
    def act(self, obs: ObsDict) -> torch.Tensor:
        if not self._preloaded:
            raise EmbodiedError("reinflow starts from a base policy: train with --base RUN_DIR (a bc-flow run)")
        if self._chunk is not None and self._chunk_step < self.exec_steps:
            action = self._chunk[:, self._chunk_step]
            self._chunk_step += 1
            self._acted = True
            return action
        st = self.storage
        if st.cursor >= st.steps:
            raise EmbodiedError("ReinFlow.act called on a full rollout: call update() first")
        cond = self.chain.encode(obs)  # once per observation: the K steps and every epoch reuse it
        chain = self.sample_chain(cond)
        c = st.cursor
        features = self.chain.features(cond)
        self._conds[c] = cond
        st.actor_obs[c] = features
        st.actions[c] = chain.reshape(chain.shape[0], -1)
        st.log_probs[c] = self.chain_log_prob(cond, chain)
        st.values[c] = self.critic(features).squeeze(-1)
        self._chunk = self.chain.actions(chain[:, -1])
        self._chunk_step = 1
        self._acted = True
        return self._chunk[:, 0]

    @torch.no_grad()
    def _value_of(self, obs: ObsDict) -> torch.Tensor:
        return self.critic(self.chain.features(self.chain.encode(obs))).squeeze(-1)

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
        # one PPO transition per chunk: the discounted rewards of its env steps, cut where an episode ended
        alive = 1.0 - self._macro_done
        self._macro_reward += self._macro_discount * alive * reward
        self._macro_done = torch.maximum(self._macro_done, done)
        self._macro_discount *= cfg.gamma
        if self._chunk_step < self.exec_steps:
            return
        st.record_outcome(
            self._macro_reward.clone(), self._macro_done.clone(), lambda: self._value_of(transition.next_obs)
        )
        self._macro_reward.zero_()
        self._macro_done.zero_()
        self._macro_discount = 1.0

    def ready_to_update(self) -> bool:
        return self.storage.cursor >= self.storage.steps

    # ---------------------------------------------------------------------------- update
    def update(self) -> dict[str, float]:
        self._check_not_merged("update")
        st, cfg = self.storage, self.cfg
        if not self.ready_to_update():
            raise EmbodiedError(f"ReinFlow.update called with {st.cursor}/{st.steps} rollout steps stored")
        gamma = cfg.gamma**self.exec_steps
        advantages, returns = compute_gae(st.rewards, st.values, st.dones, st.last_values, gamma, cfg.lam)
        spread = advantages.std() if advantages.numel() > 1 else torch.ones((), device=self.device)
        advantages = (advantages - advantages.mean()) / (spread + 1e-8)
        b = st.steps * self.num_envs
        # rows in (step, env) order, as the stored tensors reshape
        cond_all = cat_conds([c for c in self._conds if c is not None])
        if cond_rows(cond_all) != b:
            raise EmbodiedError(f"ReinFlow.update: {cond_rows(cond_all)} stored conditionings for {b} rollout rows")
        feat_all = st.actor_obs.reshape(b, -1)
        chains = st.actions.reshape(b, self.chain.denoise_steps + 1, -1)
        logp_old_all = st.log_probs.reshape(b)
        value_old_all = st.values.reshape(b)
        adv_all, ret_all = advantages.reshape(b), returns.reshape(b)
        mb = b // cfg.num_minibatches
        micro = cfg.micro_batch if 0 < cfg.micro_batch < mb else mb
        train_actor = self.updates >= cfg.critic_warmup_updates
        stats = torch.zeros(cfg.num_epochs * cfg.num_minibatches, len(METRICS))
        i = 0
        for epoch in range(cfg.num_epochs):
            perm = torch.randperm(b, generator=self.generator, device=self.device)
            for m in range(cfg.num_minibatches):
                idx_mb = perm[m * mb : (m + 1) * mb]
                self.critic_opt.zero_grad(set_to_none=True)
                self.actor_opt.zero_grad(set_to_none=True)
                row = torch.zeros(len(METRICS))
                for start in range(0, mb, micro):
                    idx = idx_mb[start : start + micro]
                    share = len(idx) / mb  # gradients of the micro-batches add up to the minibatch's
                    cond, chain, feat = index_cond(cond_all, idx), chains[idx], feat_all[idx]
                    logp = self.chain_log_prob(cond, chain)
                    surrogate, ratio = clipped_surrogate_loss(logp, logp_old_all[idx], adv_all[idx], cfg.clip_ratio)
                    if epoch == 0 and m == 0:
                        check_first_ratio(ratio, self.updates)
                    value = self.critic(feat).squeeze(-1)
                    value_loss = value_loss_fn(value, value_old_all[idx], ret_all[idx], None)
                    log_var = self._mean_log_var(cond, chain)
                    entropy = 0.5 * (log_var + math.log(2 * math.pi * math.e))
                    bc = self._bc_loss(cond, chain) if cfg.bc_coef > 0.0 else torch.zeros((), device=self.device)
                    actor_loss = surrogate - cfg.entropy_coef * entropy + cfg.bc_coef * bc
                    loss = cfg.value_coef * value_loss + (actor_loss if train_actor else 0.0 * actor_loss)
                    (loss * share).backward()
                    with torch.no_grad():
                        clip_fraction = ((ratio - 1.0).abs() > cfg.clip_ratio).float().mean()
                        sigma = torch.exp(0.5 * log_var)
                        parts = [surrogate, value_loss, entropy, bc, clip_fraction, sigma]
                        row[: len(parts)] += share * torch.stack(parts).detach().cpu()
                if train_actor and self.demos is not None:
                    row[-1] = self._demo_backward(self.demos, micro)
                if cfg.max_grad_norm > 0.0:
                    nn.utils.clip_grad_norm_(self.critic.parameters(), cfg.max_grad_norm)
                    nn.utils.clip_grad_norm_(
                        [*self.chain.trainable_parameters(), *self.noise.parameters()], cfg.max_grad_norm
                    )
                self.critic_opt.step()
                if train_actor:
                    self.actor_opt.step()
                stats[i] = row
                i += 1
        st.cursor = 0
        self._conds = [None] * st.steps
        self.updates += 1
        metrics = dict(zip(METRICS, stats.mean(dim=0).tolist(), strict=True))
        metrics["actor_trained"] = float(train_actor)
        bad = [k for k, v in metrics.items() if not math.isfinite(v)]
        if bad:
            raise NonFiniteError(f"ReinFlow update produced non-finite {', '.join(bad)}")
        return metrics

    def _demo_backward(self, demos: FlowDemos, micro: int) -> float:
        """Accumulate ``demo_coef`` times the demonstrations' flow-matching loss on ``demo_batch``
        random steps into the actor's gradients, ``micro`` rows at a time; returns the loss."""
        cfg = self.cfg
        rows = demos.draw(cfg.demo_batch, self.generator)
        total = 0.0
        for start in range(0, len(rows), micro):
            part = rows[start : start + micro]
            share = len(part) / len(rows)
            loss = demos.loss(self.chain, part, self.generator)
            (cfg.demo_coef * share * loss).backward()
            total += share * float(loss.detach())
        return total

    def _mean_log_var(self, cond: Cond, chain: torch.Tensor) -> torch.Tensor:
        total = torch.zeros((), device=self.device)
        feat = self.chain.features(cond)
        for k in range(self.chain.denoise_steps):
            total = total + self.noise(feat, self.chain.time_features(k, chain.shape[0])).mean()
        return total / self.chain.denoise_steps

    def _bc_loss(self, cond: Cond, chain: torch.Tensor) -> torch.Tensor:
        """Mean ``|v(x_k, t_k) - v_base(x_k, t_k)|^2`` over the visited chain states (through the
        Euler means, which differ from the velocities by the constant ``x_k`` and the step size)."""
        total = torch.zeros((), device=self.device)
        scale = float(self.chain.denoise_steps)
        for k in range(self.chain.denoise_steps):
            with torch.no_grad():
                target = self.chain.base_step_mean(cond, chain[:, k], k)
            total = total + ((self.chain.step_mean(cond, chain[:, k], k) - target) * scale).square().mean()
        return total / self.chain.denoise_steps

    # ------------------------------------------------------------------------ checkpoints
    def _trainable_state(self) -> dict[str, torch.Tensor]:
        """The policy's trained tensors (a flow policy: all of it; a VLA: its trained expert parts,
        or its LoRA adapters with ``algo.vla.train: lora``)."""
        state = self.policy.state_dict(keep_vars=True)
        if isinstance(self.policy, FlowPolicy):
            return {k: v.detach() for k, v in state.items()}
        trained = {id(p) for p in self.chain.trainable_parameters()}
        out: dict[str, torch.Tensor] = {}
        for name, value in state.items():  # a module registered under two names is saved once
            if id(value) in trained:
                trained.discard(id(value))
                out[name] = value.detach()
        return out

    def state_dict(self) -> dict[str, Any]:
        self._check_not_merged("state_dict")
        conds = [c for c in self._conds if c is not None]
        state: dict[str, Any] = {
            "policy": self._trainable_state(),
            "noise": self.noise.state_dict(),
            "critic": self.critic.state_dict(),
            "actor_opt": self.actor_opt.state_dict(),
            "critic_opt": self.critic_opt.state_dict(),
            "generator": self.generator.get_state(),
            "updates": self.updates,
            "conds": [{k: v.detach().clone() for k, v in c.items()} for c in conds],
            "chunk": None if self._chunk is None else self._chunk.clone(),
            "chunk_step": self._chunk_step,
            "macro": (self._macro_reward.clone(), self._macro_done.clone(), self._macro_discount),
            **self.storage.checkpoint(self._acted),
        }
        if isinstance(self.chain, PolicyFlowChain):
            state["base"] = self.chain.base.state_dict()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        missing = set(self._trainable_state()) - set(state["policy"])
        if missing:
            raise EmbodiedError(
                f"reinflow checkpoint lacks {len(missing)} trained tensors of this policy (e.g. {sorted(missing)[0]}); "
                "it was written with another algo.vla.train setting"
            )
        self.policy.load_state_dict(state["policy"], strict=isinstance(self.policy, FlowPolicy))
        if isinstance(self.chain, PolicyFlowChain) and "base" in state:
            self.chain.base.load_state_dict(state["base"])
        try:
            self.noise.load_state_dict(state["noise"])
        except RuntimeError as exc:
            raise EmbodiedError(
                f"reinflow checkpoint's noise network does not fit this chain's {len(self.noisy)} noisy entries "
                f"(algo.noisy_entries={self.cfg.noisy_entries!r}; a checkpoint written before that setting existed "
                f"noised every entry, as algo.noisy_entries=all does): {exc}"
            ) from exc
        self.critic.load_state_dict(state["critic"])
        self.actor_opt.load_state_dict(state["actor_opt"])
        self.critic_opt.load_state_dict(state["critic_opt"])
        self.generator.set_state(state["generator"].cpu())
        self.updates = int(state["updates"])
        self._acted = self.storage.restore(state)
        conds = list(state.get("conds", []))
        self._conds = [*conds, *([None] * (self.storage.steps - len(conds)))]
        self._chunk = state.get("chunk")
        self._chunk_step = int(state.get("chunk_step", 0))
        if "macro" in state:
            reward, done, discount = state["macro"]
            self._macro_reward.copy_(reward)
            self._macro_done.copy_(done)
            self._macro_discount = float(discount)
        self._preloaded = True


def noisy_entries(chain: FlowChain, which: str) -> torch.Tensor:
    """Indices ``[F_noisy]`` into the flat chain state ``[H * P]`` (position-major: ``H`` chunk
    positions of ``P`` action slots, the first ``A`` of them the task's actions) that get noise,
    for ``algo.noisy_entries`` = ``which`` (one of :data:`NOISY_ENTRIES`, checked by
    :class:`ReinFlowCfg`)."""
    chunk, slots, action_dim = chain.chunk_spec.length, chain.slots, chain.action_dim
    if chunk * slots != chain.flat_dim or not 1 <= action_dim <= slots:
        raise EmbodiedError(
            f"a chain of {chain.flat_dim} entries is not {chunk} positions x {slots} slots holding {action_dim} actions"
        )
    if which == "all":
        return torch.arange(chain.flat_dim)
    positions = chain.chunk_spec.exec_steps if which == "executed" else None
    return action_entry_mask(chunk, slots, action_dim, positions).nonzero().squeeze(-1)


def check_first_ratio(ratio: torch.Tensor, update: int) -> None:
    """Raise :class:`RatioCheckError` unless every ratio ``[B]`` is 1 within :data:`RATIO_TOL`."""
    worst = float((ratio.detach() - 1.0).abs().max())
    if not worst <= RATIO_TOL:
        raise RatioCheckError(
            f"ReinFlow update {update}: importance ratio on the first minibatch is off 1 by {worst:.3g} "
            f"(> {RATIO_TOL:g}); the chain was scored differently from how it was sampled"
        )
