"""Offline-to-online fine-tuning of a pretrained policy: Cal-QL pretraining of a residual on it,
then online RL with the demonstrations mixed into every batch.

``embodied train TASK --algo o2o-residual --base RUN_DIR --dataset PATH``. ``o2o`` learns its
own squashed-Gaussian actor from the dataset; this variant fine-tunes a policy that is already
trained, for example an image-instruction ``bc-flow`` run (camera, instruction, flow head), which has no
Gaussian to sample and score. The acting policy is residual RL's (``algos/residual.py``:
``a = clip(a_base + scale * tanh(MLP(obs_n, a_base)), ±1)`` on the frozen base, starting exactly
at it), and the schedule is ``o2o``'s:

1. **offline** (``offline_steps`` gradient steps, ``offline_updates_per_step`` per trainer step):
   batches from the dataset only. The critic loss is the TD loss plus ``cql_alpha`` times the
   Cal-QL penalty (:func:`embodied.algos.o2o.calql_penalty`). Its "policy actions" are the
   combined action plus Gaussian noise of std ``cql_policy_std`` (the deterministic residual has
   no density of its own; this one is exact), and their Q-values are clipped from below by the
   dataset's Monte-Carlo return (``calql_bound``). The residual trains on the same batches (unless
   ``offline_actor`` is off: then the online phase starts from the base itself). The env runs the
   current policy, but those steps are not stored.
2. **online**: residual RL as in ``algos/residual.py``: each batch draws ``demo_fraction`` of its
   rows from the dataset (RLPD's symmetric sampling at 0.5), the first ``learning_starts`` env
   steps are collected by the offline policy before any update (the warm start), and the penalty
   weight becomes ``online_cql_alpha`` (0: none; online rows have no Monte-Carlo return, so the
   penalty then has no bound). With ``online_critic_warmup_updates`` the first online steps train
   the critic alone, so the residual acts as the offline one until the critic has seen online rows.

Checkpoints hold the phase and offline step count besides residual RL's state; the base and the
dataset are loaded again from ``trainer.base_run`` and ``trainer.dataset``.

Shapes: ``B`` = batch, ``N`` = ``cql_num_actions``, ``E`` = critics, ``A`` = action size.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

import torch

from embodied.algo import PreloadSource, Transition
from embodied.algos.o2o import PHASES, add_penalty, calql_penalty, check_offline_phase, raise_first_failed
from embodied.algos.offpolicy import TrainBatch
from embodied.algos.residual import Residual, ResidualCfg
from embodied.config import ranged
from embodied.data.demos import Demonstrations
from embodied.data.offline import mc_returns
from embodied.data.replay import ReplayBatch
from embodied.errors import EmbodiedError

MC_GROUP = "mc_return"
"""Demonstration buffer group holding each step's Monte-Carlo return ``[1]``."""


@dataclass(frozen=True)
class ResidualO2OCfg(ResidualCfg):
    """Residual RL's settings plus the offline phase (Cal-QL defaults as in ``o2o``)."""

    offline_steps: int = 5_000
    """Gradient steps of the offline phase (dataset only)."""
    offline_updates_per_step: int = 50
    """Offline gradient steps per trainer step (the env meanwhile runs the current policy)."""
    cql_alpha: float = ranged(5.0, 0.0, 1e4)
    """Weight of the conservative penalty offline."""
    online_cql_alpha: float = ranged(0.0, 0.0, 1e4)
    """Weight of the penalty online (0: none, as in RLPD)."""
    cql_num_actions: int = 10
    """Policy and uniform actions per state in the penalty's soft maximum."""
    cql_temperature: float = ranged(1.0, 1e-6, 1e3)
    cql_policy_std: float = ranged(0.2, 1e-6, 10.0)
    """Std of the Gaussian around the combined action that the penalty samples as policy actions."""
    calql_bound: bool = True
    """Clip the policy actions' Q-values from below by the dataset's Monte-Carlo return (Cal-QL)."""
    offline_actor: bool = True
    """Whether the residual trains in the offline phase. ``false``: only the critic does, so the
    online phase starts from the base itself (residual exactly 0) with a critic fitted to the
    dataset, instead of from a residual that only the offline critic has judged."""
    critic_warmup_updates: int = 0
    """Critic-only steps before the residual's first step; the offline phase already trained the
    critic (residual RL's default, 1,000, is for a critic that starts untrained online)."""
    online_critic_warmup_updates: int = 0
    """Critic-only steps at the start of the online phase: the residual stays the offline one while
    the critic re-fits to the online rows (its offline values are those of the dataset's returns)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        check_offline_phase(self, "o2o-residual")
        raise_first_failed(
            [
                (self.cql_policy_std > 0.0, f"cql_policy_std must be > 0, got {self.cql_policy_std}"),
                (
                    self.online_critic_warmup_updates >= 0,
                    f"online_critic_warmup_updates must be >= 0, got {self.online_critic_warmup_updates}",
                ),
            ]
        )


class ResidualO2O(Residual):
    """Implements ``Algorithm`` and ``Preloadable`` (``--base`` and ``--dataset`` both required)."""

    cfg: ResidualO2OCfg

    def __init__(self, cfg: ResidualO2OCfg, env: Any) -> None:
        super().__init__(cfg, env)
        self.phase = "offline"
        self.offline_updates = 0
        """Offline gradient steps done."""
        self.online_start_update = 0
        """``num_updates`` when the online phase began (its critic warm-up counts from here)."""

    # ------------------------------------------------------------------------- data
    def preload(self, source: PreloadSource) -> None:
        """The base from ``--base`` (required) and the dataset from ``--dataset`` (required to train;
        a run rebuilt for eval or export loads the base alone)."""
        if source.base_policy is None:
            raise EmbodiedError(
                "o2o-residual fine-tunes a pretrained policy on a dataset: give --base RUN_DIR and --dataset PATH "
                f"(got {source.describe() or 'neither'})"
            )
        super().preload(source)

    def demo_row_groups(self, demos: Demonstrations) -> dict[str, torch.Tensor]:
        """Each demonstration step's Monte-Carlo return (the Cal-QL bound)."""
        returns = mc_returns(demos.rewards, demos.episode_index, demos.terminations, self.cfg.gamma)
        return {MC_GROUP: torch.as_tensor(returns, dtype=torch.float32)[:, None]}

    def sample_batch(self) -> ReplayBatch:
        """Offline: dataset rows with their returns; online: residual RL's mixed batch."""
        if self.phase != "offline":
            return super().sample_batch()
        if self.demos is None:
            raise EmbodiedError("o2o-residual pretrains on a dataset: train with --base RUN_DIR --dataset PATH")
        raw = self.demos.sample(self.local_batch_size)
        obs = dict(raw.obs)
        mc_return = obs.pop(MC_GROUP)[:, 0]
        next_obs = {k: v for k, v in raw.next_obs.items() if k != MC_GROUP}
        return dataclasses.replace(raw, obs=obs, next_obs=next_obs, mc_return=mc_return)

    # ------------------------------------------------------------------------- schedule
    def observe(self, transition: Transition) -> None:
        """Offline: nothing is stored (the base's plan still advances in :meth:`act`)."""
        if self.phase == "offline":
            self._base_now = self._base_next = None
            return
        super().observe(transition)

    def ready_to_update(self) -> bool:
        return True if self.phase == "offline" else super().ready_to_update()

    def update(self, num_steps: int | None = None) -> dict[str, float]:
        """Offline: up to ``offline_updates_per_step`` Cal-QL steps; online: residual RL's update."""
        if self.phase != "offline":
            return super().update(num_steps) | {"phase": float(PHASES.index(self.phase))}
        steps = min(self.cfg.offline_updates_per_step, self.cfg.offline_steps - self.offline_updates)
        metrics = super().update(steps)
        self.offline_updates += steps
        if self.offline_updates >= self.cfg.offline_steps:
            # Online updates wait until learning_starts steps are stored (nothing was stored
            # offline): the offline policy collects them first, the warm start.
            self.phase = "online"
            self.online_start_update = self.num_updates
        return metrics | {"phase": 0.0, "offline_updates": float(self.offline_updates)}

    def actor_update_due(self) -> bool:
        """Not offline with ``offline_actor`` off, nor during the first ``online_critic_warmup_updates``
        online steps."""
        if self.phase == "offline" and not self.cfg.offline_actor:
            return False
        if (
            self.phase == "online"
            and self.num_updates - self.online_start_update <= self.cfg.online_critic_warmup_updates
        ):
            return False
        return super().actor_update_due()

    # ------------------------------------------------------------------------- losses
    def critic_loss(self, batch: TrainBatch) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        loss, metrics = super().critic_loss(batch)
        weight = self.cfg.cql_alpha if self.phase == "offline" else self.cfg.online_cql_alpha
        return add_penalty(loss, metrics, weight, lambda: self._conservative_penalty(batch)), metrics

    def _noisy_policy_actions(self, actor_obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(actions [B * N, A], log density [B, N])``: the combined action of each row plus
        Gaussian noise of std ``cql_policy_std``, ``N`` draws per row."""
        cfg, n = self.cfg, self.cfg.cql_num_actions
        with torch.no_grad():
            mean = self.policy(actor_obs.repeat_interleave(n, 0)).float()
        noise = torch.randn_like(mean)
        std = cfg.cql_policy_std
        logp = (-0.5 * noise.square() - math.log(std) - 0.5 * math.log(2.0 * math.pi)).sum(-1)
        return (mean + std * noise).clamp(-1.0, 1.0), logp.reshape(actor_obs.shape[0], n)

    def _conservative_penalty(self, batch: TrainBatch) -> torch.Tensor:
        """:func:`calql_penalty` on ``batch`` ``[E]`` (gradients reach the critics only)."""
        cfg, n = self.cfg, self.cfg.cql_num_actions
        size = batch.action.shape[0]
        a_pi, logp_pi = self._noisy_policy_actions(batch.actor_obs)
        a_next, logp_next = self._noisy_policy_actions(batch.next_actor_obs)
        a_rand = torch.rand_like(a_pi) * 2.0 - 1.0
        obs = batch.critic_obs.repeat_interleave(n, 0)
        with self.autocast():
            q = self.critic.q(torch.cat([obs, obs, obs]), torch.cat([a_rand, a_pi, a_next]))
            q_data = self.critic.q(batch.critic_obs, batch.action)  # [E, B]
        q_rand, q_pi, q_next = q.float().reshape(q.shape[0], 3, size, n).unbind(1)
        bound = batch.mc_return if cfg.calql_bound and self.phase == "offline" else None
        return calql_penalty(
            q_data.float(), q_rand, q_pi, logp_pi, q_next, logp_next, self.action_dim, cfg.cql_temperature, bound
        )

    # ------------------------------------------------------------------------- checkpoints
    def state_dict(self) -> dict[str, Any]:
        return {
            **super().state_dict(),
            "phase": self.phase,
            "offline_updates": self.offline_updates,
            "online_start_update": self.online_start_update,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.phase = str(state["phase"])
        self.offline_updates = int(state["offline_updates"])
        # Checkpoints written before the online warm-up existed switched after the offline steps.
        self.online_start_update = int(state.get("online_start_update", self.offline_updates))
