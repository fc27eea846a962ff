"""HalfCheetah, Ant and Humanoid (gymnasium v5 definitions) on the MuJoCo and MuJoCo-Warp backends.

Observations, reward terms, terminations and reset noise follow gymnasium's ``*-v5``
environments with their default arguments; the models are the XML files of the installed
gymnasium package. Differences: actions are normalized to [-1, 1] and mapped onto each
actuator's control range (HalfCheetah and Ant ranges are already [-1, 1]; Humanoid's is
[-0.4, 0.4]), and the cost terms use that physical control, as gymnasium does.

Locomotion has no notion of success: ``info["success"]`` is all False.

Each task's terms (observation, reward, termination, reset noise, IOSpec) are written once, in a
``_*Terms`` mixin, against ``self.xp``: numpy on the MuJoCo backend (float64 views of the C
batch), torch on MuJoCo-Warp (float32 views of warp arrays, zero-copy). Only the operations both
share are used (slicing, arithmetic, ``.sum(axis=)``, ``.clip``, ``.reshape``, ``xp.einsum``,
``xp.isfinite``). One class per backend joins the terms to the backend's base:
``HalfCheetah`` (MuJoCo) and ``HalfCheetahWarp`` (MuJoCo-Warp), and so on. ``cfg.backend.name``
says which one a run uses (``embodied train halfcheetah --backend mjwarp``).

Shapes: ``N`` = ``num_envs``; every hook works on ``[N, ...]`` arrays.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import mujoco
import numpy as np

from embodied.config import ranged
from embodied.io_spec import IOSpec, ObsTerm
from embodied.tasks.mujoco_task import MujocoTaskBackendCfg, MujocoTaskTerms, OnMjwarp, OnMujoco, validate_cfg


def _free_root_fields(model: mujoco.MjModel) -> tuple[ObsTerm, ...]:
    """Observation terms of qpos without x, y followed by qvel, for a free-floating root."""
    joints = model.nq - 7
    return (
        ObsTerm("root_pos_z", 1, "m", "world"),
        ObsTerm("root_quat_wxyz", 4, "", "body->world"),
        ObsTerm("joint_pos", joints, "rad"),
        ObsTerm("root_lin_vel_w", 3, "m/s", "world"),
        ObsTerm("root_ang_vel_b", 3, "rad/s", "body"),
        ObsTerm("joint_vel", joints, "rad/s"),
    )


# --------------------------------------------------------------------------------- HalfCheetah
@dataclass(frozen=True)
class HalfCheetahCfg:
    """HalfCheetah-v5: run forward along +x; never terminates."""

    backend: MujocoTaskBackendCfg = field(default_factory=MujocoTaskBackendCfg)
    forward_reward_weight: float = ranged(1.0, 0.0, 1000.0)
    """Weight of the forward velocity of the root (m/s)."""
    ctrl_cost_weight: float = ranged(0.1, 0.0, 1000.0)
    """Weight of the squared control norm (a cost)."""
    reset_noise_scale: float = ranged(0.1, 0.0, 10.0)
    """qpos += U(-s, s), qvel += s * N(0, 1) at reset."""

    def __post_init__(self) -> None:
        validate_cfg(self)


class _HalfCheetahTerms(MujocoTaskTerms):
    """Planar cheetah; observation ``[N, 17]`` = qpos without root x (8) + qvel (9)."""

    xml = "half_cheetah.xml"
    cfg: HalfCheetahCfg
    _before: Any

    def obs_dim(self) -> int:
        return self.model.nq - 1 + self.model.nv

    def observe(self) -> Any:
        return self.cat([self.qpos[:, 1:], self.qvel])

    def before_step(self) -> None:
        self._before[:, 0] = self.qpos[:, 0]

    def after_step(self, ctrl: Any) -> tuple[dict[str, Any], Any]:
        x_vel = (self.qpos[:, 0] - self._before[:, 0]) / self.dt
        terms = {
            "forward": self.cfg.forward_reward_weight * x_vel,
            "ctrl": -self.cfg.ctrl_cost_weight * (ctrl**2).sum(axis=1),
        }
        return terms, x_vel != x_vel  # all False for finite velocities (never terminates)

    def sample_reset_state(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        s = self.cfg.reset_noise_scale
        return self._noisy_qpos(n, s), s * self.rng.standard_normal((n, self.model.nv))

    def io_spec(self) -> IOSpec:
        joints = self.model.nq - 3
        return self._spec(
            (
                ObsTerm("root_pos_z", 1, "m", "world"),
                ObsTerm("root_angle_y", 1, "rad", "world"),
                ObsTerm("joint_pos", joints, "rad"),
                ObsTerm("root_lin_vel_xz_w", 2, "m/s", "world"),
                ObsTerm("root_ang_vel_y", 1, "rad/s", "world"),
                ObsTerm("joint_vel", joints, "rad/s"),
            )
        )


# ----------------------------------------------------------------------------------------- Ant
@dataclass(frozen=True)
class AntCfg:
    """Ant-v5: run forward along +x; terminates when the torso leaves the healthy height range."""

    backend: MujocoTaskBackendCfg = field(default_factory=MujocoTaskBackendCfg)
    forward_reward_weight: float = ranged(1.0, 0.0, 1000.0)
    """Weight of the torso's forward velocity (m/s)."""
    ctrl_cost_weight: float = ranged(0.5, 0.0, 1000.0)
    """Weight of the squared control norm (a cost)."""
    contact_cost_weight: float = ranged(5e-4, 0.0, 1000.0)
    """Weight of the squared, clipped external contact forces (a cost)."""
    healthy_reward: float = ranged(1.0, 0.0, 1000.0)
    """Reward per step while healthy."""
    terminate_when_unhealthy: bool = True
    """End the episode (terminated) when unhealthy."""
    healthy_z_range: tuple[float, float] = ranged((0.2, 1.0), 0.0, 10.0, "m")
    """Healthy torso height (m), inclusive; the state must also be finite."""
    contact_force_range: tuple[float, float] = ranged((-1.0, 1.0), -10_000.0, 10_000.0)
    """Clip range of ``cfrc_ext`` in the observation and the contact cost."""
    reset_noise_scale: float = ranged(0.1, 0.0, 10.0)
    """qpos += U(-s, s), qvel += s * N(0, 1) at reset."""

    def __post_init__(self) -> None:
        validate_cfg(self)


class _AntTerms(MujocoTaskTerms):
    """Quadruped; observation ``[N, 105]`` = qpos without x, y (13) + qvel (14) + cfrc_ext (13 x 6)."""

    xml = "ant.xml"
    cfg: AntCfg
    contact_forces = True
    outputs: tuple[str, ...] = ("xpos",)
    main_body = 1  # the torso
    _before: Any

    def obs_dim(self) -> int:
        return self.model.nq - 2 + self.model.nv + 6 * (self.model.nbody - 1)

    def _contact(self) -> Any:
        lo, hi = self.cfg.contact_force_range
        return self.out["cfrc_ext"].clip(lo, hi)

    def observe(self) -> Any:
        n = self.num_envs
        return self.cat([self.qpos[:, 2:], self.qvel, self._contact()[:, 1:].reshape(n, -1)])

    def before_step(self) -> None:
        # gymnasium reads body positions of the step's last substep, not of the new state
        self._before[:] = self.out["xpos"][:, self.main_body, :2]

    def after_step(self, ctrl: Any) -> tuple[dict[str, Any], Any]:
        cfg, xp = self.cfg, self.xp
        x_vel = (self.out["xpos"][:, self.main_body, 0] - self._before[:, 0]) / self.dt
        lo, hi = cfg.healthy_z_range
        z = self.qpos[:, 2]
        finite = xp.isfinite(self.qpos).all(axis=1) & xp.isfinite(self.qvel).all(axis=1)
        healthy = finite & (z >= lo) & (z <= hi)
        contact = self._contact().reshape(self.num_envs, -1)
        terms = {
            "forward": cfg.forward_reward_weight * x_vel,
            "survive": cfg.healthy_reward * healthy,
            "ctrl": -cfg.ctrl_cost_weight * (ctrl**2).sum(axis=1),
            "contact": -cfg.contact_cost_weight * (contact**2).sum(axis=1),
        }
        return terms, ~healthy & cfg.terminate_when_unhealthy

    def sample_reset_state(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        s = self.cfg.reset_noise_scale
        return self._noisy_qpos(n, s), s * self.rng.standard_normal((n, self.model.nv))

    def io_spec(self) -> IOSpec:
        lo, hi = self.cfg.contact_force_range
        contact = ObsTerm(
            "contact_force_com",
            6 * (self.model.nbody - 1),
            "N·m, N",
            "com-based",
            description=f"cfrc_ext of bodies 1.. clipped to [{lo}, {hi}]",
        )
        return self._spec((*_free_root_fields(self.model), contact))


# ------------------------------------------------------------------------------------ Humanoid
@dataclass(frozen=True)
class HumanoidCfg:
    """Humanoid-v5: walk forward along +x; terminates when the torso leaves (1, 2) m height."""

    backend: MujocoTaskBackendCfg = field(default_factory=MujocoTaskBackendCfg)
    forward_reward_weight: float = ranged(1.25, 0.0, 1000.0)
    """Weight of the centre-of-mass forward velocity (m/s)."""
    ctrl_cost_weight: float = ranged(0.1, 0.0, 1000.0)
    """Weight of the squared control norm (a cost)."""
    contact_cost_weight: float = ranged(5e-7, 0.0, 1000.0)
    """Weight of the squared external contact forces (a cost)."""
    contact_cost_max: float = ranged(10.0, 0.0, 1e6)
    """Upper clip of the contact cost."""
    healthy_reward: float = ranged(5.0, 0.0, 1000.0)
    """Reward per step while healthy."""
    terminate_when_unhealthy: bool = True
    """End the episode (terminated) when unhealthy."""
    healthy_z_range: tuple[float, float] = ranged((1.0, 2.0), 0.0, 10.0, "m")
    """Healthy torso height (m), exclusive bounds."""
    reset_noise_scale: float = ranged(1e-2, 0.0, 10.0)
    """qpos += U(-s, s), qvel += U(-s, s) at reset."""

    def __post_init__(self) -> None:
        validate_cfg(self)


class _HumanoidTerms(MujocoTaskTerms):
    """Humanoid; observation ``[N, 348]`` = qpos without x, y (22) + qvel (23) + cinert (13 x 10)
    + cvel (13 x 6) + qfrc_actuator without the root (17) + cfrc_ext (13 x 6)."""

    xml = "humanoid.xml"
    cfg: HumanoidCfg
    contact_forces = True
    outputs: tuple[str, ...] = ("xipos", "cinert", "cvel", "qfrc_actuator")
    _before: Any

    def obs_dim(self) -> int:
        m = self.model
        return m.nq - 2 + m.nv + (m.nbody - 1) * (10 + 6 + 6) + (m.nv - 6)

    def observe(self) -> Any:
        n = self.num_envs
        out = self.out
        parts = [
            self.qpos[:, 2:],
            self.qvel,
            out["cinert"][:, 1:].reshape(n, -1),
            out["cvel"][:, 1:].reshape(n, -1),
            out["qfrc_actuator"][:, 6:],
            out["cfrc_ext"][:, 1:].reshape(n, -1),
        ]
        return self.cat(parts)

    def _mass_center_xy(self) -> Any:
        mass = self.body_masses()
        com = self.xp.einsum("nb,nbj->nj", mass, self.out["xipos"]) / mass.sum(axis=1, keepdims=True)
        return com[:, :2]

    def before_step(self) -> None:
        self._before[:] = self._mass_center_xy()

    def after_step(self, ctrl: Any) -> tuple[dict[str, Any], Any]:
        cfg = self.cfg
        x_vel = (self._mass_center_xy()[:, 0] - self._before[:, 0]) / self.dt
        lo, hi = cfg.healthy_z_range
        z = self.qpos[:, 2]
        healthy = (z > lo) & (z < hi)
        contact = cfg.contact_cost_weight * (self.out["cfrc_ext"].reshape(self.num_envs, -1) ** 2).sum(axis=1)
        terms = {
            "forward": cfg.forward_reward_weight * x_vel,
            "survive": cfg.healthy_reward * healthy,
            "ctrl": -cfg.ctrl_cost_weight * (ctrl**2).sum(axis=1),
            "contact": -contact.clip(max=cfg.contact_cost_max),
        }
        return terms, ~healthy & cfg.terminate_when_unhealthy

    def sample_reset_state(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        s = self.cfg.reset_noise_scale
        return self._noisy_qpos(n, s), self.rng.uniform(-s, s, size=(n, self.model.nv))

    def io_spec(self) -> IOSpec:
        m = self.model
        bodies = m.nbody - 1
        return self._spec(
            (
                *_free_root_fields(m),
                ObsTerm("body_inertia_com", 10 * bodies, "kg, kg·m, kg·m²", "com-based", description="cinert"),
                ObsTerm("body_vel_com", 6 * bodies, "rad/s, m/s", "com-based", description="cvel"),
                ObsTerm("joint_actuator_torque", m.nv - 6, "N·m", description="qfrc_actuator"),
                ObsTerm("contact_force_com", 6 * bodies, "N·m, N", "com-based", description="cfrc_ext"),
            )
        )


# ------------------------------------------------------------------------- one class per backend
class HalfCheetah(_HalfCheetahTerms, OnMujoco):
    """HalfCheetah on the MuJoCo backend."""


class HalfCheetahWarp(_HalfCheetahTerms, OnMjwarp):
    """HalfCheetah on the MuJoCo-Warp backend."""


class Ant(_AntTerms, OnMujoco):
    """Ant on the MuJoCo backend."""


class AntWarp(_AntTerms, OnMjwarp):
    """Ant on the MuJoCo-Warp backend."""


class Humanoid(_HumanoidTerms, OnMujoco):
    """Humanoid on the MuJoCo backend."""


class HumanoidWarp(_HumanoidTerms, OnMjwarp):
    """Humanoid on the MuJoCo-Warp backend."""
