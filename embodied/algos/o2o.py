"""Offline-to-online RL: Cal-QL pretraining on a dataset, then SAC fine-tuning in the env.

Phases (``phase`` in checkpoints and the ``algo/phase`` metric: 0 offline, 1 warm-up, 2 online):

1. **offline** (``offline_steps`` gradient steps, ``offline_updates_per_step`` of them per
   trainer step). Batches come from the dataset only (``--dataset PATH``). The critic loss is
   SAC's soft TD loss plus ``cql_alpha`` times the Cal-QL penalty (:func:`calql_penalty`): a
   soft maximum of Q over uniform actions and policy actions at ``s`` and ``s'`` (importance
   weighted), minus Q of the dataset action; the Q-values of policy actions are first clipped
   from below by the dataset's Monte-Carlo return of ``s`` (Cal-QL; ``calql_bound=false``
   gives plain CQL). The Bellman target has no entropy bonus unless ``backup_entropy``.
   The actor and temperature follow SAC. The env still runs the current policy (so training
   curves show it), but those transitions are not stored.
2. **online** (``online_mode``):
   ``rlpd``: every batch is half dataset, half online replay (RLPD's symmetric sampling), the
   conservative penalty is dropped; ``wsrl``: the dataset is dropped, the first
   ``wsrl_warmup_steps`` transitions are collected by the pretrained policy with no update
   (warm-up, phase 1), then SAC on online data only.

With ``encoder: cnn`` the dataset must carry camera images (``embodied collect ... --images``):
offline batches then hold them like the online replay, and the encoder learns from both.

Actor, critic ensemble (LayerNorm, min over a random pair of target critics), temperature and
replay are SAC's (:class:`~embodied.algos.sac.SAC`); observation statistics are frozen to the
dataset's, so the pretrained networks see the same inputs online.

Shapes: ``B`` = batch, ``N`` = ``cql_num_actions``, ``E`` = critics, ``A`` = action size.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import torch

from embodied.algo import PreloadSource
from embodied.algos.offpolicy import TrainBatch
from embodied.algos.sac import SAC, SACCfg
from embodied.config import ConfigError, ranged
from embodied.data.demos import load_dataset
from embodied.data.offline import OfflineTransitions, symmetric_sample
from embodied.data.replay import ReplayBatch
from embodied.env import IMAGE_GROUP, VecEnv
from embodied.errors import EmbodiedError

PHASES = ("offline", "warmup", "online")
"""Phase names; their index is the ``algo/phase`` metric."""


@dataclass(frozen=True)
class O2OCfg(SACCfg):
    """Cal-QL offline pretraining, then RLPD- or WSRL-style online SAC (defaults: Cal-QL / RLPD)."""

    num_critics: int = 10
    critic_layer_norm: bool = True
    actor_q: Literal["min", "mean"] = "mean"
    actor_lr: float = ranged(1e-4, 1e-9, 1.0)
    learning_starts: int = 0
    init_alpha: float = ranged(0.1, 1e-9, 1e3)
    backup_entropy: bool = False
    """Add SAC's entropy bonus ``-alpha log pi`` to the Bellman target. Off (Cal-QL's default):
    Q then estimates the return alone, the quantity the Monte-Carlo bound is a bound of; with
    sparse 0/1 rewards the bonus would otherwise swamp the reward."""
    online_mode: Literal["rlpd", "wsrl"] = "rlpd"
    """Online phase: ``rlpd`` (half of every batch from the dataset) or ``wsrl`` (dataset dropped,
    warm-up collected by the pretrained policy, then online data only)."""
    offline_steps: int = 20_000
    """Gradient steps of the offline phase."""
    offline_updates_per_step: int = 100
    """Offline gradient steps per trainer step (the offline phase lasts
    ``offline_steps / offline_updates_per_step`` env steps per env)."""
    cql_alpha: float = ranged(1.0, 0.0, 1e4)
    """Weight of the conservative penalty in the offline critic loss (0: plain SAC offline)."""
    cql_num_actions: int = 10
    """Uniform and policy actions sampled per state for the penalty's soft maximum."""
    cql_temperature: float = ranged(1.0, 1e-6, 1e3)
    """Temperature of the penalty's soft maximum (logsumexp)."""
    calql_bound: bool = True
    """Clip the pushed-down policy Q-values from below by the dataset's Monte-Carlo return (Cal-QL);
    false: plain CQL."""
    online_cql_alpha: float = ranged(0.0, 0.0, 1e4)
    """``rlpd``: weight of the conservative penalty online as well (Cal-QL's own fine-tuning keeps
    it; RLPD has none: 0). Online rows have no Monte-Carlo return, so their bound is off."""
    offline_fraction: float = ranged(0.5, 0.0, 1.0)
    """``rlpd``: share of every online batch drawn from the dataset."""
    wsrl_warmup_steps: int = 5_000
    """``wsrl``: transitions (summed over envs) the pretrained policy collects before online updates."""

    def __post_init__(self) -> None:
        super().__post_init__()
        check_offline_phase(self, "o2o")
        checks = [
            (0.0 <= self.offline_fraction < 1.0, f"offline_fraction must be in [0, 1), got {self.offline_fraction}"),
            (self.wsrl_warmup_steps >= 0, f"wsrl_warmup_steps must be >= 0, got {self.wsrl_warmup_steps}"),
            (self.online_mode in ("rlpd", "wsrl"), f"online_mode must be rlpd or wsrl, got {self.online_mode!r}"),
            # the dataset's rows are one-step transitions; n-step windows would mix two kinds of target
            (self.n_step == 1, f"n_step must be 1 for o2o, got {self.n_step}"),
        ]
        raise_first_failed(checks)


def raise_first_failed(checks: list[tuple[bool, str]]) -> None:
    """Raise :class:`ConfigError` ``algo.<message>`` for the first ``(ok, message)`` not ok."""
    for ok, message in checks:
        if not ok:
            raise ConfigError(f"algo.{message}")


def check_offline_phase(cfg: Any, algo: str) -> None:
    """The settings of the offline phase and the conservative penalty (``o2o`` and ``o2o-residual``)."""
    raise_first_failed(
        [
            (cfg.offline_steps >= 1, f"offline_steps must be >= 1, got {cfg.offline_steps}"),
            (cfg.offline_updates_per_step >= 1, "offline_updates_per_step must be >= 1"),
            (cfg.cql_alpha >= 0.0, f"cql_alpha must be >= 0, got {cfg.cql_alpha}"),
            (cfg.online_cql_alpha >= 0.0, f"online_cql_alpha must be >= 0, got {cfg.online_cql_alpha}"),
            (cfg.cql_num_actions >= 1, f"cql_num_actions must be >= 1, got {cfg.cql_num_actions}"),
            (cfg.cql_temperature > 0.0, f"cql_temperature must be > 0, got {cfg.cql_temperature}"),
            # the conservative penalty acts on scalar Q-values
            (cfg.num_atoms == 0, f"num_atoms must be 0 (scalar critics) for {algo}, got {cfg.num_atoms}"),
        ]
    )


def add_penalty(
    loss: torch.Tensor, metrics: dict[str, torch.Tensor], weight: float, penalty: Callable[[], torch.Tensor]
) -> torch.Tensor:
    """``loss + weight * sum(penalty())`` (summed over critics like the TD loss), the penalty's
    mean in ``metrics["cql_penalty"]``; ``loss`` itself when ``weight`` is 0 (nothing computed)."""
    if weight <= 0.0:
        return loss
    value = penalty()  # [E]
    metrics["cql_penalty"] = value.detach().mean()
    return loss + weight * value.sum()


def calql_penalty(
    q_data: torch.Tensor,
    q_rand: torch.Tensor,
    q_pi: torch.Tensor,
    logp_pi: torch.Tensor,
    q_next_pi: torch.Tensor,
    logp_next_pi: torch.Tensor,
    action_dim: int,
    temperature: float = 1.0,
    mc_return: torch.Tensor | None = None,
) -> torch.Tensor:
    """Conservative penalty per critic ``[E]``, averaged over the batch.

    ``T * logsumexp([Q(s, a_u) - log U, Q(s, a_pi) - log pi(a_pi|s), Q(s, a') - log pi(a'|s')] / T)
    - Q(s, a_data)`` with ``a_u`` uniform on [-1, 1]^A (density ``U = 2^-A``), ``a_pi ~ pi(s)``,
    ``a' ~ pi(s')`` (CQL's importance-sampled soft maximum). With ``mc_return [B]`` the policy
    actions' Q-values are first raised to at least it (Cal-QL).

    ``q_data [E, B]``; ``q_rand``, ``q_pi``, ``q_next_pi`` ``[E, B, N]``; ``logp_pi``,
    ``logp_next_pi`` ``[B, N]``.
    """
    if mc_return is not None:
        bound = mc_return[None, :, None]
        q_pi = torch.maximum(q_pi, bound)
        q_next_pi = torch.maximum(q_next_pi, bound)
    log_uniform = -action_dim * math.log(2.0)
    stacked = torch.cat([q_rand - log_uniform, q_pi - logp_pi[None], q_next_pi - logp_next_pi[None]], dim=-1)
    soft_max = temperature * torch.logsumexp(stacked / temperature, dim=-1)  # [E, B]
    return (soft_max - q_data).mean(dim=-1)


class O2O(SAC):
    """Offline-to-online SAC (see module docstring); ``Preloadable`` with ``--dataset``."""

    multi_process = False
    """Not checked in several processes (the dataset batches are not split over ranks)."""

    cfg: O2OCfg

    def __init__(self, cfg: O2OCfg, env: VecEnv) -> None:
        super().__init__(cfg, env)
        self.phase = "offline"
        self.offline_updates = 0
        """Offline gradient steps done."""
        self.offline: OfflineTransitions | None = None
        # Statistics come from the dataset; online updates would shift the pretrained networks' inputs.
        self.track_obs_stats = False

    # ----------------------------------------------------------------- data
    def preload(self, source: PreloadSource) -> None:
        """Load the dataset, freeze observation statistics to it and build its transitions."""
        if source.base_policy is not None:
            raise EmbodiedError(
                f"o2o learns its own actor from the dataset and takes no base policy ({source.describe()}); "
                "to fine-tune a pretrained policy offline-to-online use --algo o2o-residual --base RUN_DIR --dataset PATH"
            )
        if source.dataset is None:
            raise EmbodiedError(
                f"o2o pretrains on a dataset: give --dataset PATH (it cannot start from {source.describe()})"
            )
        if self.critic_group != "policy":
            raise EmbodiedError(
                f"o2o: the task has a privileged {self.critic_group!r} observation group, which datasets "
                "do not record; use a task whose critics read the 'policy' group"
            )
        demos = load_dataset(source.dataset, obs_dim=self.obs_dim, action_dim=self.action_dim)
        norm = self.policy.obs_norm
        if norm is not None:
            with torch.no_grad():
                norm.mean.copy_(torch.as_tensor(demos.obs.mean(0), dtype=torch.float64))
                norm.var.copy_(torch.as_tensor(demos.obs.var(0), dtype=torch.float64))
                norm.count.fill_(float(len(demos.obs)))
        seed = int(torch.randint(0, 2**31 - 1, (1,)).item())
        images = self.images is not None
        if images and demos.images is not None and tuple(demos.images.shape[1:]) != self.obs_spec[IMAGE_GROUP]:
            raise EmbodiedError(
                f"o2o: the dataset's images are {tuple(demos.images.shape[1:])}, the env's camera gives "
                f"{self.obs_spec[IMAGE_GROUP]} (env.backend.image_size_px)"
            )
        # with images, a dataset without them is refused there, naming the key and `--images`
        self.offline = OfflineTransitions(demos, self.cfg.gamma, self.device, seed=seed, images=images)

    def _require_offline(self) -> OfflineTransitions:
        if self.offline is None:
            raise EmbodiedError("o2o has no dataset: train with --dataset PATH (embodied collect writes one)")
        return self.offline

    def sample_batch(self) -> ReplayBatch:
        cfg = self.cfg
        if self.phase == "offline":
            return self._require_offline().sample(cfg.batch_size)
        if cfg.online_mode == "rlpd":
            return symmetric_sample(self.replay, self._require_offline(), cfg.batch_size, cfg.offline_fraction)
        return self.replay.sample(cfg.batch_size)

    # ----------------------------------------------------------------- schedule
    def observe(self, transition: Any) -> None:
        """Offline phase: nothing is stored. Online: SAC's replay (and the warm-up count)."""
        if self.phase == "offline":
            return
        super().observe(transition)
        if self.phase == "warmup" and self.env_steps >= self.cfg.wsrl_warmup_steps:
            self.phase = "online"

    def ready_to_update(self) -> bool:
        if self.phase == "offline":
            return True
        if self.phase == "warmup":
            return False
        return super().ready_to_update()

    def update(self, num_steps: int | None = None) -> dict[str, float]:
        """Offline: up to ``offline_updates_per_step`` Cal-QL steps; online: SAC's update."""
        if self.phase != "offline":
            return super().update(num_steps) | {"phase": float(PHASES.index(self.phase))}
        self._require_offline()
        steps = min(self.cfg.offline_updates_per_step, self.cfg.offline_steps - self.offline_updates)
        metrics = super().update(steps)
        self.offline_updates += steps
        metrics |= {"phase": 0.0, "offline_updates": float(self.offline_updates)}
        if self.offline_updates >= self.cfg.offline_steps:
            self.phase = "warmup" if self.cfg.online_mode == "wsrl" and self.cfg.wsrl_warmup_steps > 0 else "online"
            if self.cfg.online_mode == "wsrl":
                self.offline = None  # WSRL drops the offline data
        return metrics

    # ----------------------------------------------------------------- losses
    def critic_loss(self, batch: TrainBatch) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        backup_alpha = self.alpha if self.cfg.backup_entropy else torch.zeros((), device=self.device)
        loss, q_mean = self._critic_loss(batch, backup_alpha, self._subset())
        metrics = {"q_mean": q_mean}
        weight = self.cfg.cql_alpha if self.phase == "offline" else self.cfg.online_cql_alpha
        return add_penalty(loss, metrics, weight, lambda: self._conservative_penalty(batch)), metrics

    def _conservative_penalty(self, batch: TrainBatch) -> torch.Tensor:
        """:func:`calql_penalty` on ``batch`` ``[E]`` (gradients reach the critics only)."""
        cfg, n = self.cfg, self.cfg.cql_num_actions
        size = batch.action.shape[0]
        with torch.no_grad(), self.autocast():
            a_pi, logp_pi = self.policy.sample(batch.actor_obs.repeat_interleave(n, 0))
            a_next, logp_next = self.policy.sample(batch.next_actor_obs.repeat_interleave(n, 0))
        a_rand = torch.rand_like(a_pi) * 2.0 - 1.0
        obs = batch.critic_obs.repeat_interleave(n, 0)
        with self.autocast():
            q = self.critic.q(torch.cat([obs, obs, obs]), torch.cat([a_rand, a_pi.float(), a_next.float()]))
            q_data = self.critic.q(batch.critic_obs, batch.action)  # [E, B]
        q_rand, q_pi, q_next = q.reshape(q.shape[0], 3, size, n).unbind(1)
        return calql_penalty(
            q_data,
            q_rand,
            q_pi,
            logp_pi.float().reshape(size, n),
            q_next,
            logp_next.float().reshape(size, n),
            self.action_dim,
            cfg.cql_temperature,
            mc_return=batch.mc_return if cfg.calql_bound else None,
        )

    # ----------------------------------------------------------------- checkpoints
    def state_dict(self) -> dict[str, Any]:
        """SAC's state plus the phase, the offline step count and the dataset sampler's RNG
        (the dataset itself is reloaded by ``preload`` on resume)."""
        return {
            **super().state_dict(),
            "phase": self.phase,
            "offline_updates": self.offline_updates,
            "offline_generator": None if self.offline is None else self.offline.generator.get_state(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.phase = str(state["phase"])
        self.offline_updates = int(state["offline_updates"])
        if self.phase != "offline" and self.cfg.online_mode == "wsrl":
            self.offline = None
        if self.offline is not None and state["offline_generator"] is not None:
            self.offline.generator.set_state(state["offline_generator"].cpu())
