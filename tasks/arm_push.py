"""Arm-push: a planar 3-link arm pushes a puck-shaped block to a goal (batched MuJoCo).

Model: ``sim/assets/arm_push.xml`` (top-down, gravity off, the block slides on damped x/y
joints). Actions ``[N, 3]`` in [-1, 1] are joint-velocity targets scaled to each servo's
speed limit (rad/s). Observations are in the arm's base frame (base at the world origin,
x forward, z up; frames agree, but the fields are named ``_b`` because the base is the
reference a real arm would report in). Success: the block centre within ``success_radius_m``
of the goal; the episode then terminates. Rewards: ``sparse`` gives 1 on the success step
only; ``dense`` adds shaping on fingertip-to-block and block-to-goal distances.

The terms are written once against ``self.xp`` (numpy on MuJoCo, torch on MuJoCo-Warp), like
``tasks/mujoco_locomotion.py``: ``ArmPush`` (MuJoCo, default) and ``ArmPushWarp`` (MuJoCo-Warp,
``embodied train arm-push --backend mjwarp``).

Shapes: ``N`` = ``num_envs``; qpos layout ``[shoulder, elbow, wrist, block_x, block_y,
goal_x, goal_y]``, qvel the same.
"""

from __future__ import annotations

import importlib.resources
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import mujoco
import numpy as np

from embodied.config import ConfigError, ranged
from embodied.io_spec import ActionField, IOSpec, ObsTerm, obs_fields, terms_dim
from embodied.sim.mujoco_model import load_mjcf
from embodied.tasks.mujoco_task import MujocoTaskBackendCfg, MujocoTaskTerms, OnMjwarp, OnMujoco

ASSET = Path(str(importlib.resources.files("embodied.sim") / "assets" / "arm_push.xml"))
LINK_LENGTHS_M = (0.30, 0.25, 0.10)
"""Base-to-elbow, elbow-to-wrist, wrist-to-fingertip (must match the MJCF)."""
BLOCK_RADIUS_M = 0.03
FINGERTIP_RADIUS_M = 0.015
HOME_QPOS = (-0.6, 2.0, 1.2)
"""Arm joint angles at reset (rad): the fingertip tucked near (0.13, 0.07), away from blocks."""

OBS_TERMS: tuple[ObsTerm, ...] = (
    ObsTerm("joint_pos", 3, "rad"),
    ObsTerm("joint_vel", 3, "rad/s"),
    ObsTerm("fingertip_pos_b", 2, "m", "base"),
    ObsTerm("block_pos_b", 2, "m", "base"),
    ObsTerm("block_vel_b", 2, "m/s", "base"),
    ObsTerm("goal_pos_b", 2, "m", "base"),
    ObsTerm("block_to_goal_b", 2, "m", "base"),
    ObsTerm("fingertip_to_block_b", 2, "m", "base"),
)
"""The policy observation in order (:meth:`_ArmPushTerms.observe` concatenates them so)."""


def fingertip_pos(q: np.ndarray) -> np.ndarray:
    """Planar forward kinematics: joint angles ``[..., 3]`` -> fingertip ``(x, y)`` ``[..., 2]``."""
    return _fingertip(np, q, np.asarray(LINK_LENGTHS_M))


def _fingertip(xp: Any, q: Any, lengths: Any) -> Any:
    """:func:`fingertip_pos` on numpy or torch arrays (``xp`` the module, ``lengths`` ``[3]`` alike)."""
    angles = q.cumsum(-1)
    return xp.stack([(lengths * xp.cos(angles)).sum(-1), (lengths * xp.sin(angles)).sum(-1)], -1)


def _norm(x: Any) -> Any:
    """Row norms ``[N]`` of ``x`` ``[N, k]``, numpy or torch."""
    return ((x * x).sum(1)) ** 0.5


def fingertip_jacobian(q: np.ndarray) -> np.ndarray:
    """``d tip / d q``: ``[..., 2, 3]`` for joint angles ``[..., 3]``."""
    angles = np.cumsum(q, axis=-1)
    lengths = np.asarray(LINK_LENGTHS_M)
    dx = -lengths * np.sin(angles)  # contribution of each link to d x / d (its absolute angle)
    dy = lengths * np.cos(angles)
    # joint j moves every link from j on: reverse cumulative sums
    jx = np.flip(np.cumsum(np.flip(dx, -1), -1), -1)
    jy = np.flip(np.cumsum(np.flip(dy, -1), -1), -1)
    return np.stack([jx, jy], axis=-2)


@dataclass(frozen=True)
class ArmPushCfg:
    """Arm-push: push the block to within ``success_radius_m`` of the goal."""

    backend: MujocoTaskBackendCfg = field(
        default_factory=lambda: MujocoTaskBackendCfg(frame_skip=5, max_episode_steps=100)
    )
    """Simulator backend (``mujoco`` or ``mjwarp``) and its options."""
    reward: Literal["sparse", "dense"] = "sparse"
    """``sparse``: 1 on the success step, else 0. ``dense``: adds distance shaping (see the weights)."""
    success_radius_m: float = ranged(0.03, 1e-3, 0.5, "m")
    """Block centre to goal distance that counts as solved (m)."""
    reach_weight: float = ranged(0.5, 0.0, 1000.0)
    """Dense only: weight of ``-|fingertip - block|`` per step (m)."""
    push_weight: float = ranged(1.0, 0.0, 1000.0)
    """Dense only: weight of ``-|block - goal|`` per step (m)."""
    success_reward: float = ranged(1.0, 0.0, 1000.0)
    """Reward on the step the block reaches the goal (both variants)."""
    block_x_range_m: tuple[float, float] = ranged((0.30, 0.45), -1.5, 1.5, "m")
    """Initial block x in the base frame (m), uniform."""
    block_y_range_m: tuple[float, float] = ranged((-0.15, 0.15), -1.5, 1.5, "m")
    """Initial block y (m), uniform."""
    goal_x_range_m: tuple[float, float] = ranged((0.28, 0.50), -1.5, 1.5, "m")
    """Goal x (m), uniform."""
    goal_y_range_m: tuple[float, float] = ranged((-0.20, 0.20), -1.5, 1.5, "m")
    """Goal y (m), uniform."""
    goal_distance_range_m: tuple[float, float] = ranged((0.08, 0.22), 0.0, 3.0, "m")
    """Initial block-to-goal distance (m): goals outside are redrawn."""
    home_noise_rad: float = ranged(0.05, 0.0, 0.5, "rad")
    """Arm joints start at ``HOME_QPOS + U(-s, s)``."""

    def __post_init__(self) -> None:
        if self.reward not in ("sparse", "dense"):
            raise ConfigError(f"env.reward must be 'sparse' or 'dense', got {self.reward!r}")
        for name in ("success_radius_m",):
            if not getattr(self, name) > 0.0:
                raise ConfigError(f"env.{name} must be > 0, got {getattr(self, name)}")
        for name in ("reach_weight", "push_weight", "success_reward", "home_noise_rad"):
            if getattr(self, name) < 0.0:
                raise ConfigError(f"env.{name} must be >= 0, got {getattr(self, name)}")
        for name in ("block_x_range_m", "block_y_range_m", "goal_x_range_m", "goal_y_range_m", "goal_distance_range_m"):
            lo, hi = getattr(self, name)
            if lo > hi:
                raise ConfigError(f"env.{name} must be (low, high) with low <= high, got {(lo, hi)}")
        if self.goal_distance_range_m[1] <= self.success_radius_m:
            raise ConfigError("env.goal_distance_range_m must reach beyond env.success_radius_m")


class _ArmPushTerms(MujocoTaskTerms):
    """Observation ``[N, 18]``: joint pos (3), joint vel (3), fingertip (2), block (2), block
    velocity (2), goal (2), block->goal (2), fingertip->block (2); all in the base frame."""

    cfg: ArmPushCfg
    _lengths: Any

    def load_model(self) -> mujoco.MjModel:
        return load_mjcf(ASSET)

    # -------------------------------------------------------------------------- state views
    @property
    def joint_pos(self) -> Any:
        return self.qpos[:, 0:3]

    @property
    def block_pos(self) -> Any:
        return self.qpos[:, 3:5]

    @property
    def goal_pos(self) -> Any:
        return self.qpos[:, 5:7]

    def _tip(self) -> Any:
        if not hasattr(self, "_lengths"):
            self._lengths = self.asarray(np.asarray(LINK_LENGTHS_M))
        return _fingertip(self.xp, self.joint_pos, self._lengths)

    def _block_goal_dist(self) -> Any:
        return _norm(self.block_pos - self.goal_pos)

    # ---------------------------------------------------------------------------- task hooks
    def obs_dim(self) -> int:
        return terms_dim(OBS_TERMS)

    def observe(self) -> Any:
        tip = self._tip()
        block, goal = self.block_pos, self.goal_pos
        parts = [self.joint_pos, self.qvel[:, 0:3], tip, block, self.qvel[:, 3:5], goal, goal - block, block - tip]
        return self.cat(parts)

    def before_step(self) -> None:
        pass

    def after_step(self, ctrl: Any) -> tuple[dict[str, Any], Any]:
        cfg = self.cfg
        solved = self.success()
        terms = {"success": cfg.success_reward * solved}
        if cfg.reward == "dense":
            terms["reach"] = -cfg.reach_weight * _norm(self._tip() - self.block_pos)
            terms["push"] = -cfg.push_weight * self._block_goal_dist()
        return terms, solved

    def success(self) -> Any:
        return self._block_goal_dist() < self.cfg.success_radius_m

    def sample_reset_state(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        cfg, rng = self.cfg, self.rng
        qpos = np.zeros((n, self.model.nq))
        qpos[:, 0:3] = np.asarray(HOME_QPOS) + rng.uniform(-cfg.home_noise_rad, cfg.home_noise_rad, (n, 3))
        qpos[:, 3] = rng.uniform(*cfg.block_x_range_m, n)
        qpos[:, 4] = rng.uniform(*cfg.block_y_range_m, n)
        lo, hi = cfg.goal_distance_range_m
        todo = np.arange(n)
        # rejection sampling: redraw only the goals outside the distance band (a few rounds)
        while len(todo):
            qpos[todo, 5] = rng.uniform(*cfg.goal_x_range_m, len(todo))
            qpos[todo, 6] = rng.uniform(*cfg.goal_y_range_m, len(todo))
            dist = np.linalg.norm(qpos[todo, 5:7] - qpos[todo, 3:5], axis=1)
            todo = todo[(dist < lo) | (dist > hi)]
        return qpos, np.zeros((n, self.model.nv))

    def io_spec(self) -> IOSpec:
        names = ("shoulder", "elbow", "wrist")
        low, high = self.model.actuator_ctrlrange.T
        actions = tuple(
            ActionField(
                name=f"{name}_vel_target",
                size=1,
                units="rad/s",
                scale=float((high[i] - low[i]) / 2),
                offset=float((high[i] + low[i]) / 2),
                description="joint velocity servo target",
            )
            for i, name in enumerate(names)
        )
        return IOSpec(
            obs_fields=obs_fields(OBS_TERMS),
            action_fields=actions,
            control_period_s=self.dt,
            conventions={"base_frame": "arm base at the world origin, x forward, z up (planar task: x, y only)"},
        )


class ArmPush(_ArmPushTerms, OnMujoco):
    """Arm-push on the MuJoCo backend."""


class ArmPushWarp(_ArmPushTerms, OnMjwarp):
    """Arm-push on the MuJoCo-Warp backend."""
