"""Residual RL on a frozen base policy (ResFiT / Policy Decorator style), learned off-policy.

``embodied train TASK --algo residual --base RUN_DIR [--dataset PATH]``. The base (any
trained policy: an MLP actor, a ``bc-flow`` policy running action chunks) stays frozen and acts
as it was trained: a chunked base runs ``exec_steps`` actions of each chunk before planning
again, while the residual corrects every single step. The acting policy is
``policies/residual.py``: ``a = clip(a_base + residual_scale * tanh(MLP(obs_n, a_base)), ±1)``,
whose last layer starts at zero, so training starts exactly at the base.

The learner is FastTD3's (``algos/fasttd3.py``, through the shared off-policy base): a critic
ensemble (``num_critics``, LayerNorm) whose Bellman target takes the min over a random subset
of ``critic_subset`` target critics, n-step returns, target-policy smoothing, and an actor that
maximizes the critics' mean Q of the combined action. Additions here:

- every replay row also stores the base's action at its observation and at its successor
  (observation group ``base_action``), so the target action ``a' = clip(b' + s r(s', b'))``
  uses what the base really did (a chunked base's ``b'`` depends on its plan, not only ``s'``);
- ``--dataset``: demonstrations go into a second buffer and each batch draws
  ``demo_fraction`` of its rows from it;
- ``critic_warmup_updates``: critic-only gradient steps before the actor's first step, so the
  residual does not chase an untrained critic away from the base.

Checkpoints hold the residual, critics and replay, not the base: the base is loaded again from
``trainer.base_run`` whenever the run is rebuilt (resume, eval, export), so that run must stay.

Shapes: ``N`` = num_envs, ``D`` = observation size, ``A`` = action size, ``M`` = demo steps.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from embodied.algo import Policy, PreloadSource, Transition
from embodied.algos.fasttd3 import FastTD3, FastTD3Cfg
from embodied.algos.offpolicy import TrainBatch
from embodied.config import ConfigError, ranged
from embodied.data.demos import Demonstrations, load_dataset
from embodied.data.replay import ReplayBatch, ReplayBuffer, cat_batches
from embodied.env import IMAGE_GROUP, ObsDict, VecEnv
from embodied.errors import EmbodiedError
from embodied.policies.residual import ResidualPolicy, fresh_base_action

BASE_GROUP = "base_action"
"""Replay observation group holding the base's action ``[A]`` at that observation."""
DEMO_BASE_BATCH = 64
"""Demonstration observations per call of the base when labelling them with its actions."""


@dataclass(frozen=True)
class ResidualCfg(FastTD3Cfg):
    """Residual TD3 defaults after ResFiT (scalar critics, 10-critic ensemble, min of a random pair)."""

    residual_scale: float = ranged(0.2, 0.0, 10.0)
    """Largest change the residual makes to each base action component (actions are in [-1, 1])."""
    demo_fraction: float = ranged(0.5, 0.0, 1.0)
    """Share of each batch drawn from the ``--dataset`` demonstrations (ignored without one)."""
    critic_warmup_updates: int = 1_000
    """Critic gradient steps before the first actor (residual) step."""
    n_step: int = 3
    batch_size: int = 256
    updates_per_step: int = 4
    learning_starts: int = 2_000
    tau: float = ranged(0.005, 1e-6, 1.0)
    actor_hidden: tuple[int, ...] = (256, 256)
    critic_hidden: tuple[int, ...] = (256, 256)
    num_critics: int = 10
    critic_subset: int = 2
    critic_layer_norm: bool = True
    num_atoms: int = 0
    weight_decay: float = ranged(0.0, 0.0, 10.0)
    std_min: float = ranged(0.05, 0.0, 10.0)
    """Smallest per-env exploration noise std on the combined action."""
    std_max: float = ranged(0.2, 0.0, 10.0)
    """Largest per-env exploration noise std on the combined action."""
    policy_noise: float = ranged(0.1, 0.0, 10.0)
    noise_clip: float = ranged(0.2, 0.0, 10.0)

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 0.0 < self.residual_scale <= 2.0:
            raise ConfigError(f"algo.residual_scale must be in (0, 2], got {self.residual_scale}")
        if not 0.0 <= self.demo_fraction < 1.0:
            raise ConfigError(f"algo.demo_fraction must be in [0, 1), got {self.demo_fraction}")
        if self.critic_warmup_updates < 0:
            raise ConfigError(f"algo.critic_warmup_updates must be >= 0, got {self.critic_warmup_updates}")
        if self.random_steps:
            raise ConfigError("algo.random_steps must be 0 for residual RL (uniform actions would replace the base)")
        if self.encoder != "mlp":
            # the residual reads the policy vector and the base's action; a base that needs the
            # camera sees it through its own encoder
            raise ConfigError(f"algo.encoder must be mlp for residual RL, got {self.encoder!r}")


class Residual(FastTD3):
    """Implements ``Algorithm`` and ``Preloadable`` (``--base`` required, ``--dataset`` optional)."""

    cfg: ResidualCfg
    policy: ResidualPolicy  # type: ignore[assignment]
    base_outside_checkpoint = True
    """The base is not in the checkpoint: rebuilding the run preloads ``trainer.base_run`` again."""
    multi_process = False
    """Not checked in several processes (the frozen base and demonstration batches are per process)."""

    def __init__(self, cfg: ResidualCfg, env: VecEnv) -> None:
        super().__init__(cfg, env)
        # FastTD3 built a plain actor; the residual policy replaces it (same optimizer settings).
        self.policy = ResidualPolicy(
            self.obs_dim,
            self.action_dim,
            cfg.residual_scale,
            hidden=cfg.actor_hidden,
            activation=cfg.activation,
            normalize_obs=cfg.normalize_obs,
            obs_clip=cfg.obs_clip,
        ).to(self.device)
        self.actor_opt = self.adamw(self.policy.parameters(), cfg.actor_lr)
        self.demos: ReplayBuffer | None = None
        self._train_base: Policy | None = None
        """A copy of the base for training rollouts: a chunked base's plan is state, and
        evaluations (which use ``policy.base``) must not advance it."""
        self._base_fn: Callable[[ObsDict], torch.Tensor] | None = None
        """The base's stateless ``obs -> action`` (a fresh plan's first action) for successors
        its plan never saw: final observations of ended episodes, demonstrations."""
        self._base_now: torch.Tensor | None = None  # [N, A] base action at the obs just acted on
        self._base_next: torch.Tensor | None = None  # [N, A] base action at the next obs

    def replay_obs_spec(self) -> dict[str, tuple[int, ...]]:
        # camera images stay out of replay: the residual reads the policy group and the base's
        # action, which is stored (BASE_GROUP) where the base saw the images
        kept = {group: shape for group, shape in self.obs_spec.items() if group != IMAGE_GROUP}
        return {**kept, BASE_GROUP: (self.action_dim,)}

    # ------------------------------------------------------------------------- preload
    def preload(self, source: PreloadSource) -> None:
        """Take the frozen base from ``--base``; put ``--dataset`` demonstrations in their buffer."""
        base = source.base_policy
        if base is None:
            raise EmbodiedError(
                f"residual RL corrects a trained base policy: give --base RUN_DIR (got {source.describe()})"
            )
        base_fn = fresh_base_action(base)
        with torch.no_grad():
            probe = base_fn(self._probe_obs(2))
        if tuple(probe.shape) != (2, self.action_dim):
            raise EmbodiedError(
                f"--base {source.base_run}: its policy maps {self.obs_dim} observations to {tuple(probe.shape[1:])} "
                f"actions, this task needs {self.action_dim}"
            )
        self.policy.set_base(base)
        self._train_base = copy.deepcopy(base)
        self._base_fn = base_fn
        if source.dataset is not None:
            self.demos = self._demo_buffer(source)

    def demo_row_groups(self, demos: Demonstrations) -> dict[str, torch.Tensor]:
        """Hook: extra observation groups ``[M, k]`` stored with every demonstration step (none here)."""
        return {}

    @torch.no_grad()
    def _demo_buffer(self, source: PreloadSource) -> ReplayBuffer:
        """All demonstration steps as one env's consecutive rows (episodes end with their flags)."""
        assert source.dataset is not None and self._base_fn is not None
        demos = load_dataset(source.dataset, obs_dim=self.obs_dim, action_dim=self.action_dim)
        extra = {k: v.to(self.device, torch.float32) for k, v in self.demo_row_groups(demos).items()}
        assert demos.next_obs is not None and demos.terminations is not None and demos.truncations is not None
        dev = self.device
        obs = torch.as_tensor(demos.obs, device=dev)
        next_obs = torch.as_tensor(demos.next_obs, device=dev)
        now: ObsDict = {"policy": obs}
        succ: ObsDict = {"policy": next_obs}
        if IMAGE_GROUP in self.env_obs_spec:  # the base sees the camera: its actions need the demos' images
            if demos.images is None or demos.next_images is None:
                raise EmbodiedError(
                    f"residual --dataset {source.dataset}: the base sees camera images, which this dataset does "
                    "not hold; record it with `embodied collect ... --images` or train without --dataset"
                )
            now[IMAGE_GROUP] = torch.as_tensor(demos.images, device=dev)
            succ[IMAGE_GROUP] = torch.as_tensor(demos.next_images, device=dev)
        base_now, base_next = self._base_in_batches(now), self._base_in_batches(succ)
        action = torch.as_tensor(demos.actions, device=dev)
        reward = torch.as_tensor(demos.rewards, device=dev, dtype=torch.float32)
        term = torch.as_tensor(demos.terminations, device=dev)
        # the last step of every episode ends it: a dataset's time limit may differ from ours
        last = torch.as_tensor(demos.step_index[1:] == 0, device=dev)
        trunc = torch.as_tensor(demos.truncations, device=dev) | torch.cat([last, last.new_ones(1)])
        buffer = self.new_replay(1, len(obs), {k: tuple(v.shape[1:]) for k, v in extra.items()})
        for t in range(len(obs)):  # one row per step; M is thousands, not millions
            rows = {k: v[t : t + 1] for k, v in extra.items()}
            buffer.add(
                {"policy": obs[t : t + 1], BASE_GROUP: base_now[t : t + 1], **rows},
                action[t : t + 1],
                reward[t : t + 1],
                term[t : t + 1],
                trunc[t : t + 1] & ~term[t : t + 1],
                {"policy": next_obs[t : t + 1], BASE_GROUP: base_next[t : t + 1], **rows},
            )
        if self.policy.obs_norm is not None:
            self.policy.obs_norm.update(obs)
        return buffer

    def _base_in_batches(self, obs: ObsDict) -> torch.Tensor:
        """The base's fresh-plan actions ``[M, A]`` for demonstration observations, computed
        :data:`DEMO_BASE_BATCH` rows at a time (a VLA base's backbone would not fit all at once)."""
        assert self._base_fn is not None
        rows = int(obs["policy"].shape[0])
        parts = [
            self._base_fn({k: v[i : i + DEMO_BASE_BATCH] for k, v in obs.items()})
            for i in range(0, rows, DEMO_BASE_BATCH)
        ]
        return torch.cat(parts) if parts else torch.zeros(0, self.action_dim, device=self.device)

    # --------------------------------------------------------------------------- acting
    def _probe_obs(self, batch: int) -> ObsDict:
        """Zero observations ``[batch, ...]`` of the groups a base reads (images uint8)."""
        return {
            group: torch.zeros(
                batch, *shape, device=self.device, dtype=torch.uint8 if group == IMAGE_GROUP else torch.float32
            )
            for group, shape in self.env_obs_spec.items()
            if group in ("policy", IMAGE_GROUP)
        }

    def _require_base(self) -> tuple[Policy, Callable[[ObsDict], torch.Tensor]]:
        if self._train_base is None or self._base_fn is None:
            raise EmbodiedError("residual RL needs a base policy: train with --algo residual --base RUN_DIR")
        return self._train_base, self._base_fn

    @torch.no_grad()
    def act(self, obs: ObsDict) -> torch.Tensor:
        """Combined actions ``[N, A]`` plus per-env Gaussian exploration noise."""
        base, _ = self._require_base()
        base_action = self._base_next if self._base_next is not None else base.act(obs, deterministic=True)
        self._base_now, self._base_next = base_action, None
        action = self.policy.combine(obs["policy"], base_action)
        return (action + torch.randn_like(action) * self.noise_std).clamp(-1.0, 1.0)

    def observe(self, transition: Transition) -> None:
        """Store the step with the base's actions at its observation and at its successor."""
        base, base_fn = self._require_base()
        if self._base_now is None:
            raise EmbodiedError("residual: observe() before act(): the base action of this step is unknown")
        with torch.no_grad():
            # The base's next action, from the observation the trainer acts on next (its plan moves on).
            self._base_next = base.act(transition.next_obs, deterministic=True)
            done = transition.terminated | transition.truncated
            successor = self._base_next
            if bool(done.any()):
                # an ended episode's successor is its final observation, which the plan never saw
                successor = torch.where(done[:, None], base_fn(transition.final_obs), successor)
        super().observe(
            dataclasses.replace(
                transition,
                obs={**without_images(transition.obs), BASE_GROUP: self._base_now},
                next_obs=without_images(transition.next_obs),
                final_obs={**without_images(transition.final_obs), BASE_GROUP: successor},
            )
        )

    # ------------------------------------------------------------------------- learning
    def sample_batch(self) -> ReplayBatch:
        """``batch_size`` rows: ``demo_fraction`` of them demonstrations when a dataset is loaded."""
        size = self.local_batch_size
        n_demo = round(size * self.cfg.demo_fraction) if self.demos is not None else 0
        if self.demos is None or n_demo == 0:
            return self.replay.sample(size)
        return cat_batches(self.replay.sample(size - n_demo), self.demos.sample(n_demo))

    def actor_update_due(self) -> bool:
        return self.num_updates > self.cfg.critic_warmup_updates and super().actor_update_due()

    def prepare(self, batch: ReplayBatch) -> TrainBatch:
        """The shared normalized batch, the actor's inputs extended by the base actions."""
        out = super().prepare(batch)
        out.actor_obs = torch.cat([out.actor_obs, batch.obs[BASE_GROUP]], dim=-1)
        out.next_actor_obs = torch.cat([out.next_actor_obs, batch.next_obs[BASE_GROUP]], dim=-1)
        return out

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self._base_now = self._base_next = None  # a chunked base plans anew after a restore


def without_images(obs: ObsDict) -> ObsDict:
    """``obs`` less its camera group (replay keeps what the residual reads)."""
    return {group: rows for group, rows in obs.items() if group != IMAGE_GROUP}
