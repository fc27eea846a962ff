"""What FastTD3 and SAC share: config fields, replay storage, observation groups, warm-up.

Observation groups: the actor reads ``policy``; critics read ``critic`` when the task provides
privileged observations (asymmetric actor-critic), else ``policy``. Raw observations go into
the replay buffer; normalization uses the current running statistics when a batch is sampled.
With ``encoder: cnn`` both also read the camera images (``"image"``, kept as uint8 in the
replay) through an encoder the critic loss trains (:mod:`embodied.algos.offpolicy_images`).

In multi-process training (:mod:`embodied.distributed`) each rank keeps the replay of its own
envs and samples ``batch_size / ranks`` of each batch from it; gradients are averaged over the
ranks before clipping, and the counts the config gives "summed over envs" (``learning_starts``,
``random_steps``) count the envs of every rank, so the schedule is that of one process with all
the envs.
"""

from __future__ import annotations

import contextlib
import copy
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

import torch
from torch import nn

from embodied import distributed
from embodied.algo import Transition
from embodied.algos.common import check_image_encoder, image_input_shape, resolve_init_action_mean
from embodied.algos.offpolicy_images import ImageFeatures
from embodied.config import ConfigError, ranged
from embodied.data.replay import ReplayBatch, ReplayBuffer
from embodied.env import IMAGE_GROUP, VecEnv, require_box_actions
from embodied.errors import EmbodiedError
from embodied.normalizer import RunningNormalizer
from embodied.policies.deterministic import DeterministicActor
from embodied.policies.distributional import CriticEnsemble
from embodied.policies.image_actor import ImageActor
from embodied.policies.squashed_gaussian import SquashedGaussianActor
from embodied.precision import Bf16Setting, resolve_bf16

log = logging.getLogger(__name__)

ActorHead = TypeVar("ActorHead", SquashedGaussianActor, DeterministicActor)
"""The actor network of an off-policy learner (SAC's or TD3's)."""


@dataclass(frozen=True)
class OffPolicyCfg:
    """Replay, schedule and speed options common to the off-policy algorithms."""

    gamma: float = ranged(0.99, 0.0, 1.0)
    """Discount factor per env step."""
    n_step: int = 1
    """Rewards summed before bootstrapping (cut at episode ends)."""
    buffer_size_per_env: int = 10_000
    """Replay rows per parallel env (total capacity = this x num_envs)."""
    batch_size: int = 256
    """Transitions per gradient step (summed over envs)."""
    updates_per_step: int = 1
    """Gradient steps per vectorized env step once learning has started."""
    policy_frequency: int = 2
    """Actor (and temperature) update every this many critic updates."""
    learning_starts: int = 1_000
    """Transitions (summed over envs) collected before the first gradient step."""
    random_steps: int = 0
    """Transitions (summed over envs) with uniformly random actions at the start."""
    tau: float = ranged(0.005, 1e-6, 1.0)
    """Polyak factor of the target critics (1 = copy every update)."""
    actor_hidden: tuple[int, ...] = (256, 256)
    """Hidden layer widths of the actor."""
    critic_hidden: tuple[int, ...] = (256, 256)
    """Hidden layer widths of each critic."""
    activation: str = "relu"
    """Hidden activation of actor and critics (relu, elu, tanh)."""
    num_critics: int = 2
    """Critics in the ensemble (2 = clipped double Q)."""
    critic_layer_norm: bool = False
    """LayerNorm after every hidden layer of the critics."""
    num_atoms: int = 0
    """C51 atoms of a distributional critic (0: scalar critics)."""
    v_min: float = -10.0
    """Lowest return on the C51 support."""
    v_max: float = 10.0
    """Highest return on the C51 support."""
    actor_lr: float = ranged(3e-4, 1e-9, 1.0)
    """Actor learning rate."""
    critic_lr: float = ranged(3e-4, 1e-9, 1.0)
    """Critic learning rate."""
    weight_decay: float = ranged(0.0, 0.0, 10.0)
    """AdamW weight decay of actor and critics."""
    max_grad_norm: float = ranged(0.0, 0.0, 1e6)
    """Clip gradient norms to this value (0: no clipping)."""
    normalize_obs: bool = True
    """Running mean/std normalization of observations (folded into the exported policy)."""
    obs_clip: float = ranged(10.0, 0.1, 1e6, "standard deviations")
    """Clip normalized observations to ±this."""
    init_action_mean: tuple[float, ...] | str | None = None
    """Initial (pre-noise) action of the actor: ``action_dim`` values, or the name of a key of
    the env's ``io_spec().extra`` that holds one (e.g. ``hover_action``); null: 0."""
    bf16: Bf16Setting = False
    """bfloat16 autocast in the gradient steps: ``true``, ``false`` or ``auto`` (on exactly where the
    device computes bf16 natively: CUDA, or a CPU with AVX-512 BF16 / AMX, where it is ~1.4x per
    SAC update at batch 256; elsewhere it is emulated and ~10x slower). The decision is logged."""
    compile: bool = False
    """``torch.compile`` the gradient steps (cold compile costs tens of seconds)."""
    save_replay: bool = True
    """Put the written replay rows into checkpoints so ``--resume`` continues exactly; turn it off
    for buffers of gigabytes (a resumed run then refills the buffer during a new warm-up)."""
    encoder: Literal["mlp", "cnn"] = "mlp"
    """``cnn``: actor and critics also read the env's camera images (``obs["image"]``,
    ``env.backend.camera``) through a small CNN trained by the critic loss (DrQ); the replay keeps
    the images as uint8. ``mlp`` reads the observation vectors only."""
    image_features: int = 64
    """With ``encoder: cnn``: width of the CNN's output features."""
    image_shift_px: int = 4
    """With ``encoder: cnn``: random-shift augmentation of batch images, at most this many pixels
    along each axis (edges replicated; 0: no augmentation)."""

    def __post_init__(self) -> None:
        checks = [
            (0.0 < self.gamma <= 1.0, f"gamma must be in (0, 1], got {self.gamma}"),
            (self.n_step >= 1, f"n_step must be >= 1, got {self.n_step}"),
            (self.buffer_size_per_env >= self.n_step, "buffer_size_per_env must be >= n_step"),
            (self.batch_size >= 1, f"batch_size must be >= 1, got {self.batch_size}"),
            (self.updates_per_step >= 1, f"updates_per_step must be >= 1, got {self.updates_per_step}"),
            (self.policy_frequency >= 1, f"policy_frequency must be >= 1, got {self.policy_frequency}"),
            (self.learning_starts >= 0 and self.random_steps >= 0, "learning_starts/random_steps must be >= 0"),
            (0.0 < self.tau <= 1.0, f"tau must be in (0, 1], got {self.tau}"),
            (self.num_critics >= 1, f"num_critics must be >= 1, got {self.num_critics}"),
            (self.num_atoms == 0 or self.num_atoms >= 2, f"num_atoms must be 0 or >= 2, got {self.num_atoms}"),
            (self.num_atoms == 0 or self.v_min < self.v_max, f"v_min must be < v_max, got {self.v_min}, {self.v_max}"),
            (self.actor_lr > 0 and self.critic_lr > 0, "learning rates must be > 0"),
            (self.weight_decay >= 0 and self.max_grad_norm >= 0, "weight_decay/max_grad_norm must be >= 0"),
            (len(self.actor_hidden) >= 1 and len(self.critic_hidden) >= 1, "hidden layer lists must not be empty"),
            (self.image_shift_px >= 0, f"image_shift_px must be >= 0, got {self.image_shift_px}"),
        ]
        for ok, message in checks:
            if not ok:
                raise ConfigError(f"algo.{message}")
        check_image_encoder(self.encoder, self.image_features, "algo")


@dataclass
class TrainBatch:
    """A replay batch ready for the losses: normalized observations. ``B`` = batch size.

    ``actor_obs``/``next_actor_obs`` ``[B, D]``, ``critic_obs``/``next_critic_obs`` ``[B, C]``
    (the same tensors when critics read the policy group), ``action [B, A]``, n-step
    ``reward [B]`` and bootstrap ``discount [B]``.
    """

    actor_obs: torch.Tensor
    next_actor_obs: torch.Tensor
    critic_obs: torch.Tensor
    next_critic_obs: torch.Tensor
    action: torch.Tensor
    reward: torch.Tensor
    discount: torch.Tensor
    mc_return: torch.Tensor | None = None
    """``[B]`` Monte-Carlo return of each row where the batch source knows it (offline data), else None."""


def soft_update(target: nn.Module, source: nn.Module, tau: float) -> None:
    """``target <- (1 - tau) * target + tau * source`` for every parameter (in place)."""
    with torch.no_grad():
        t_params: list[torch.Tensor] = list(target.parameters())
        s_params: list[torch.Tensor] = list(source.parameters())
        torch._foreach_lerp_(t_params, s_params, tau)


def optimize(
    opt: torch.optim.Optimizer,
    loss: torch.Tensor,
    params: Iterable[nn.Parameter],
    max_norm: float,
    world: distributed.World | None = None,
) -> None:
    """One optimizer step on ``loss``, clipping the gradient norm of ``params`` when ``max_norm > 0``;
    with a ``world``, the gradients are first averaged over its ranks."""
    params = list(params)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    if world is not None:
        distributed.average_gradients(params)
    if max_norm > 0:
        nn.utils.clip_grad_norm_(params, max_norm)
    opt.step()


class OffPolicyBase:
    """Replay buffer, observation groups, normalizer updates and the update schedule.

    Subclasses build ``policy`` (an actor with ``obs_norm`` and ``normalize``), ``critic``,
    ``critic_target`` and the two optimizers, and implement :meth:`critic_loss` and
    :meth:`actor_loss`; :meth:`update` runs the shared schedule.
    """

    cfg: OffPolicyCfg
    policy: Any
    critic: CriticEnsemble
    critic_target: CriticEnsemble
    actor_opt: torch.optim.Optimizer
    critic_opt: torch.optim.Optimizer

    def __init__(self, cfg: OffPolicyCfg, env: VecEnv, algo_name: str) -> None:
        require_box_actions(env, algo_name)
        self.cfg = cfg
        self.device = torch.device(env.device)
        self.use_bf16 = resolve_bf16(cfg.bf16, self.device)
        self.num_envs = int(env.num_envs)
        self.action_dim = int(env.action_dim)
        self.env_obs_spec = {k: tuple(v) for k, v in env.obs_spec.items()}
        """Every observation group of the env, camera images included (a frozen base may read them)."""
        image_shape = image_input_shape(env, cfg.encoder, algo_name)
        # without the CNN, camera images (a RenderingEnv's "image" group) stay out of the replay,
        # which keeps its rows small
        self.obs_spec = {k: v for k, v in self.env_obs_spec.items() if k != IMAGE_GROUP or image_shape is not None}
        """The observation groups this learner reads (and its replay stores)."""
        if "policy" not in self.obs_spec:
            raise EmbodiedError(f"{algo_name}: env has no 'policy' observation group (has {list(self.obs_spec)})")
        self.obs_dim = int(torch.Size(self.obs_spec["policy"]).numel())
        self.critic_group = "critic" if "critic" in self.obs_spec else "policy"
        self.critic_obs_dim = int(torch.Size(self.obs_spec[self.critic_group]).numel())
        self.images: ImageFeatures | None = None
        """Encoder, target encoder and augmentation with ``encoder: cnn``, else None."""
        if image_shape is not None:
            self.images = ImageFeatures(image_shape, cfg.image_features, cfg.image_shift_px, self.device)
        features = 0 if self.images is None else self.images.features
        self.actor_input_dim = self.obs_dim + features
        """Inputs of the actor head: the policy vector, then the image features (with a CNN)."""
        self.critic_input_dim = self.critic_obs_dim + features
        """Observation inputs of each critic: its vector group, then the image features (with a CNN)."""
        self.init_action_mean = resolve_init_action_mean(cfg.init_action_mean, env)
        self.world = distributed.current()
        """The training processes this rank averages gradients with (None: a single process)."""
        self.total_envs = self.num_envs * distributed.size()
        """Envs of all ranks together (``num_envs`` is this rank's share)."""
        self.local_batch_size = distributed.split_evenly(cfg.batch_size, "algo.batch_size")
        """Transitions this rank samples per gradient step (``batch_size`` over all ranks)."""
        self.track_obs_stats = True
        """Merge observed states into the running normalizers (off: statistics frozen, e.g. to a dataset's)."""
        self.env_steps = 0
        """Transitions observed so far (summed over the envs of all ranks)."""
        self.num_updates = 0
        """Critic gradient steps so far."""
        self.replay = self.new_replay(self.num_envs, cfg.buffer_size_per_env)
        # A separate normalizer only for a privileged critic group; otherwise critics share
        # the actor's statistics (merged once per step).
        self.critic_norm: RunningNormalizer | None = None
        if cfg.normalize_obs and self.critic_group != "policy":
            self.critic_norm = RunningNormalizer(self.critic_obs_dim, clip=cfg.obs_clip).to(self.device)

    def replay_obs_spec(self) -> dict[str, tuple[int, ...]]:
        """Hook: the observation groups a replay row stores (default: the env's groups)."""
        return self.obs_spec

    def new_replay(
        self, num_envs: int, capacity_per_env: int, extra_groups: dict[str, tuple[int, ...]] | None = None
    ) -> ReplayBuffer:
        """A replay buffer with the config's n-step settings and :meth:`replay_obs_spec` groups
        (plus ``extra_groups``: float rows a particular buffer carries, e.g. demonstrations' returns)."""
        seed = int(torch.randint(0, 2**31 - 1, (1,)).item())  # derived from the run's global seed
        return ReplayBuffer(
            num_envs,
            capacity_per_env,
            self.replay_obs_spec() | (extra_groups or {}),
            self.action_dim,
            device=self.device,
            n_step=self.cfg.n_step,
            gamma=self.cfg.gamma,
            seed=seed,
            uint8_groups=[group for group in self.replay_obs_spec() if group == IMAGE_GROUP],
        )

    def with_images(self, head: ActorHead) -> ActorHead | ImageActor:
        """The learner's policy from an actor ``head`` built over ``actor_input_dim`` inputs: the head
        itself, or with a CNN an :class:`ImageActor` around it (the head then must not normalize)."""
        if self.images is None:
            return head
        return ImageActor(head, self.images.encoder, self.obs_dim, self.cfg.normalize_obs, self.cfg.obs_clip).to(
            self.device
        )

    def actor_parameters(self) -> list[nn.Parameter]:
        """What the actor's optimizer moves (never the image encoder, which the critic loss trains)."""
        if isinstance(self.policy, ImageActor):
            return self.policy.head_parameters()
        return list(self.policy.parameters())

    def critic_parameters(self) -> list[nn.Parameter]:
        """What the critics' optimizer moves: the critics, and the image encoder with a CNN."""
        encoder = [] if self.images is None else list(self.images.encoder.parameters())
        return list(self.critic.parameters()) + encoder

    def build_critics(self) -> None:
        """Critic ensemble, its target copy and its AdamW optimizer, from the config."""
        cfg = self.cfg
        self.critic = CriticEnsemble(
            self.critic_input_dim,
            self.action_dim,
            cfg.critic_hidden,
            num_critics=cfg.num_critics,
            num_atoms=cfg.num_atoms,
            v_min=cfg.v_min,
            v_max=cfg.v_max,
            layer_norm=cfg.critic_layer_norm,
            act=cfg.activation,
        ).to(self.device)
        self.critic_target = copy.deepcopy(self.critic).requires_grad_(False)
        self.critic_opt = self.adamw(self.critic_parameters(), cfg.critic_lr)

    def maybe_compile(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        """``torch.compile(fn)`` when the config asks for it, else ``fn``."""
        return torch.compile(fn) if self.cfg.compile else fn

    # --- observation handling -------------------------------------------------------------

    @torch.no_grad()
    def prepare(self, batch: ReplayBatch) -> TrainBatch:
        """Normalize a sampled batch once for all losses of a gradient step."""
        size = batch.action.shape[0]

        def both(group: str) -> torch.Tensor:  # [2B, dim]: obs rows, then successor rows
            return torch.cat([batch.obs[group].reshape(size, -1), batch.next_obs[group].reshape(size, -1)])

        actor_in = self.policy.normalize(both("policy"))
        if self.critic_group == "policy":
            critic_in = actor_in
        else:
            critic_in = both(self.critic_group)
            critic_in = critic_in if self.critic_norm is None else self.critic_norm(critic_in)
        return TrainBatch(
            actor_obs=actor_in[:size],
            next_actor_obs=actor_in[size:],
            critic_obs=critic_in[:size],
            next_critic_obs=critic_in[size:],
            action=batch.action,
            reward=batch.reward,
            discount=batch.discount,
            mc_return=batch.mc_return,
        )

    def adamw(self, params: Iterable[nn.Parameter], lr: float) -> torch.optim.AdamW:
        """AdamW with the config's weight decay; the fused kernel where the device supports it."""
        params = list(params)
        try:
            return torch.optim.AdamW(params, lr=lr, weight_decay=self.cfg.weight_decay, fused=True)
        except (RuntimeError, ValueError):  # older torch / device without a fused kernel
            return torch.optim.AdamW(params, lr=lr, weight_decay=self.cfg.weight_decay)

    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        return torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.use_bf16)

    # --- Algorithm protocol pieces --------------------------------------------------------

    def in_random_phase(self) -> bool:
        return self.env_steps < self.cfg.random_steps

    def random_actions(self) -> torch.Tensor:
        """Uniform actions ``[N, A]`` in [-1, 1] for the initial random phase."""
        return torch.rand(self.num_envs, self.action_dim, device=self.device) * 2.0 - 1.0

    def observe(self, transition: Transition) -> None:
        """Store the step and merge its observations into the running statistics."""
        if self.policy.obs_norm is not None and self.track_obs_stats:
            self.policy.obs_norm.update(transition.obs["policy"].reshape(self.num_envs, -1))
        if self.critic_norm is not None and self.track_obs_stats:
            self.critic_norm.update(transition.obs[self.critic_group].reshape(self.num_envs, -1))
        self.replay.add(
            transition.obs,
            transition.action,
            transition.reward,
            transition.terminated,
            transition.truncated,
            transition.final_obs,
        )
        self.env_steps += self.total_envs
        self.on_episode_end(transition.terminated | transition.truncated)

    def on_episode_end(self, done: torch.Tensor) -> None:
        """Hook: ``done [N]`` bool marks envs whose episode ended this step."""

    def ready_to_update(self) -> bool:
        # Counting the buffer (not only env_steps) makes a run resumed without replay contents
        # refill ``learning_starts`` transitions before its next gradient step.
        warm = min(self.cfg.learning_starts, self.replay.capacity * self.total_envs)
        stored = len(self.replay) * (self.total_envs // self.num_envs)  # every rank stores alike
        return self.env_steps >= self.cfg.learning_starts and stored >= warm and self.replay.num_sampleable > 0

    def sample_batch(self) -> ReplayBatch:
        """Hook: the raw batch of one gradient step (here: this rank's share of ``batch_size`` rows of
        the replay buffer)."""
        return self.replay.sample(self.local_batch_size)

    def update(self, num_steps: int | None = None) -> dict[str, float]:
        """``num_steps`` (default ``updates_per_step``) critic steps, an actor step every
        ``policy_frequency``; mean metrics."""
        sums: dict[str, torch.Tensor] = {}
        counts: dict[str, int] = {}
        for _ in range(self.cfg.updates_per_step if num_steps is None else num_steps):
            self.num_updates += 1
            raw = self.sample_batch()
            batch = self.prepare(raw)
            if self.images is not None:
                with self.autocast():
                    batch = self.images.encode(batch, raw)
            loss, metrics = self.critic_loss(batch)
            optimize(self.critic_opt, loss, self.critic_parameters(), self.cfg.max_grad_norm, self.world)
            metrics["critic_loss"] = loss
            if self.actor_update_due():
                if self.images is not None:
                    batch = self.images.for_actor(batch)
                # Freezing the critic skips its weight gradients, which the actor loss never uses.
                self.critic.requires_grad_(False)
                try:
                    actor_loss, actor_metrics = self.actor_loss(batch)
                finally:
                    self.critic.requires_grad_(True)
                optimize(self.actor_opt, actor_loss, self.actor_parameters(), self.cfg.max_grad_norm, self.world)
                metrics |= actor_metrics | self.after_actor_step(actor_metrics)
                metrics["actor_loss"] = actor_loss
            soft_update(self.critic_target, self.critic, self.cfg.tau)
            if self.images is not None:
                soft_update(self.images.target, self.images.encoder, self.cfg.tau)
            # Metrics stay tensors until the end: one device sync per update(), not per step.
            for key, value in metrics.items():
                sums[key] = sums[key] + value.detach() if key in sums else value.detach()
                counts[key] = counts.get(key, 0) + 1
        return {key: float(value) / counts[key] for key, value in sums.items()}

    def actor_update_due(self) -> bool:
        """Hook: whether this gradient step also updates the actor (every ``policy_frequency``)."""
        return self.num_updates % self.cfg.policy_frequency == 0

    def critic_index(self, subset: int) -> list[int]:
        """Indices of the target critics a Bellman target takes the min over: all of them when
        ``subset`` is 0 or ``num_critics``, else a fresh random subset of that size."""
        n = self.cfg.num_critics
        return list(range(n)) if subset in (0, n) else torch.randperm(n)[:subset].tolist()

    def critic_loss(self, batch: TrainBatch) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Loss of all critics on ``batch`` and extra metrics."""
        raise NotImplementedError

    def actor_loss(self, batch: TrainBatch) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Actor loss on ``batch`` and extra metrics (critics are frozen meanwhile)."""
        raise NotImplementedError

    def after_actor_step(self, actor_metrics: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Hook after each actor step (SAC tunes its temperature here)."""
        return {}

    def base_state(self) -> dict[str, Any]:
        """Networks, optimizers, counters and replay cursor (subclasses add their own parts)."""
        return {
            "actor": self.policy.state_dict(),
            "critic": self.critic.state_dict(),
            "critic_target": self.critic_target.state_dict(),
            "actor_opt": self.actor_opt.state_dict(),
            "critic_opt": self.critic_opt.state_dict(),
            "env_steps": self.env_steps,
            "num_updates": self.num_updates,
            "critic_norm": None if self.critic_norm is None else self.critic_norm.state_dict(),
            "replay": self.replay.state_dict(include_contents=self.cfg.save_replay),
            "images": None if self.images is None else self.images.state_dict(),
        }

    def load_base_state(self, state: dict[str, Any]) -> None:
        self.policy.load_state_dict(state["actor"])
        self.critic.load_state_dict(state["critic"])
        self.critic_target.load_state_dict(state["critic_target"])
        self.actor_opt.load_state_dict(state["actor_opt"])
        self.critic_opt.load_state_dict(state["critic_opt"])
        self.env_steps = int(state["env_steps"])
        self.num_updates = int(state["num_updates"])
        if self.critic_norm is not None:
            self.critic_norm.load_state_dict(state["critic_norm"])
        self.replay.load_state_dict(state["replay"])
        if self.images is not None:
            self.images.load_state_dict(state["images"])
