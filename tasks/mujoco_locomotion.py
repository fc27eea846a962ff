"""HalfCheetah, Ant and Humanoid on the batched MuJoCo backend (gymnasium v5 definitions).

Observations, reward terms, terminations and reset noise follow gymnasium's ``*-v5``
environments with their default arguments; the models are the XML files of the installed
gymnasium package. Differences: actions are normalized to [-1, 1] and mapped onto each
actuator's control range (HalfCheetah and Ant ranges are already [-1, 1]; Humanoid's is
[-0.4, 0.4]), and the cost terms use that physical control, as gymnasium does.

Locomotion has no notion of success: ``info["success"]`` is all False.

Shapes: ``N`` = ``num_envs``; every hook works on ``[N, ...]`` float64 arrays.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import mujoco
import numpy as np
import torch

from embodied.config import ConfigError
from embodied.io_spec import ActionField, IOSpec, ObsField
from embodied.sim.mujoco import MujocoBackendCfg, MujocoVecEnv, gymnasium_asset

_CONVENTIONS = {
    "world_frame": "MuJoCo world, z up",
    "free_joint_velocity": "linear velocity in the world frame, angular velocity in the body frame",
    "quaternion": "(w, x, y, z), body -> world",
    "com_fields": "cinert/cvel/cfrc_ext are MuJoCo's com-based spatial quantities (rotation first)",
}


def _actions(model: mujoco.MjModel, units: str) -> tuple[ActionField, ...]:
    low, high = model.actuator_ctrlrange.T
    mid, half = (low + high) / 2, (high - low) / 2
    # one field per actuator: each carries its own scale/offset into actuator units
    return tuple(
        ActionField(
            name=mujoco.mj_id2name(model, mujoco.mjtObj.mjOBJ_ACTUATOR, i) or f"actuator_{i}",
            size=1,
            units=units,
            scale=float(half[i]),
            offset=float(mid[i]),
            description="actuator control (gear converts it to joint torque)",
        )
        for i in range(model.nu)
    )


def _validate(cfg: object) -> None:
    """Weights and noise scales must be >= 0, ``*_range`` pairs ordered (low <= high)."""
    for name, value in vars(cfg).items():
        if (name.endswith("_weight") or name == "reset_noise_scale") and value < 0:
            raise ConfigError(f"{name} must be >= 0, got {value}")
        if name.endswith("_range") and value[0] > value[1]:
            raise ConfigError(f"{name} must be (low, high) with low <= high, got {value}")


def _free_root_fields(model: mujoco.MjModel) -> tuple[ObsField, ...]:
    """Observation fields of qpos without x, y followed by qvel, for a free-floating root."""
    joints = model.nq - 7
    return (
        ObsField("root_pos_z", 1, "m", "world"),
        ObsField("root_quat_wxyz", 4, "", "body->world"),
        ObsField("joint_pos", joints, "rad"),
        ObsField("root_lin_vel_w", 3, "m/s", "world"),
        ObsField("root_ang_vel_b", 3, "rad/s", "body"),
        ObsField("joint_vel", joints, "rad/s"),
    )


class _Locomotion(MujocoVecEnv):
    """Loads ``xml`` from gymnasium; shared reset noise and IOSpec assembly."""

    xml = ""

    def __init__(self, cfg: object, num_envs: int, device: torch.device | str, seed: int) -> None:
        self.cfg = cfg
        model = mujoco.MjModel.from_xml_path(str(gymnasium_asset(self.xml)))
        self._before = np.zeros((num_envs, 2))
        super().__init__(model, cfg.backend, num_envs, device, seed)  # type: ignore[attr-defined]

    def _noisy_qpos(self, n: int, scale: float) -> np.ndarray:
        """qpos0 + U(-scale, scale), ``[n, nq]``."""
        return self.model.qpos0 + self.rng.uniform(-scale, scale, size=(n, self.model.nq))

    def _spec(self, obs_fields: tuple[ObsField, ...]) -> IOSpec:
        return IOSpec(
            obs_fields=obs_fields,
            action_fields=_actions(self.model, "ctrl"),
            control_period_s=self.dt,
            conventions=_CONVENTIONS,
        )


# --------------------------------------------------------------------------------- HalfCheetah
@dataclass(frozen=True)
class HalfCheetahCfg:
    """HalfCheetah-v5: run forward along +x; never terminates."""

    backend: MujocoBackendCfg = field(default_factory=MujocoBackendCfg)
    forward_reward_weight: float = 1.0
    """Weight of the forward velocity of the root (m/s)."""
    ctrl_cost_weight: float = 0.1
    """Weight of the squared control norm (a cost)."""
    reset_noise_scale: float = 0.1
    """qpos += U(-s, s), qvel += s * N(0, 1) at reset."""

    def __post_init__(self) -> None:
        _validate(self)


class HalfCheetah(_Locomotion):
    """Planar cheetah; observation ``[N, 17]`` = qpos without root x (8) + qvel (9)."""

    xml = "half_cheetah.xml"
    cfg: HalfCheetahCfg

    def obs_dim(self) -> int:
        return self.model.nq - 1 + self.model.nv

    def observe(self) -> np.ndarray:
        return np.concatenate([self.qpos[:, 1:], self.qvel], axis=1, dtype=np.float32)

    def before_step(self) -> None:
        self._before[:, 0] = self.qpos[:, 0]

    def after_step(self, ctrl: np.ndarray) -> tuple[dict[str, np.ndarray], np.ndarray]:
        x_vel = (self.qpos[:, 0] - self._before[:, 0]) / self.dt
        terms = {
            "forward": self.cfg.forward_reward_weight * x_vel,
            "ctrl": -self.cfg.ctrl_cost_weight * np.sum(ctrl**2, axis=1),
        }
        return terms, np.zeros(self.num_envs, dtype=bool)

    def sample_reset_state(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        s = self.cfg.reset_noise_scale
        return self._noisy_qpos(n, s), s * self.rng.standard_normal((n, self.model.nv))

    def io_spec(self) -> IOSpec:
        joints = self.model.nq - 3
        return self._spec(
            (
                ObsField("root_pos_z", 1, "m", "world"),
                ObsField("root_angle_y", 1, "rad", "world"),
                ObsField("joint_pos", joints, "rad"),
                ObsField("root_lin_vel_xz_w", 2, "m/s", "world"),
                ObsField("root_ang_vel_y", 1, "rad/s", "world"),
                ObsField("joint_vel", joints, "rad/s"),
            )
        )


# ----------------------------------------------------------------------------------------- Ant
@dataclass(frozen=True)
class AntCfg:
    """Ant-v5: run forward along +x; terminates when the torso leaves the healthy height range."""

    backend: MujocoBackendCfg = field(default_factory=MujocoBackendCfg)
    forward_reward_weight: float = 1.0
    """Weight of the torso's forward velocity (m/s)."""
    ctrl_cost_weight: float = 0.5
    """Weight of the squared control norm (a cost)."""
    contact_cost_weight: float = 5e-4
    """Weight of the squared, clipped external contact forces (a cost)."""
    healthy_reward: float = 1.0
    """Reward per step while healthy."""
    terminate_when_unhealthy: bool = True
    """End the episode (terminated) when unhealthy."""
    healthy_z_range: tuple[float, float] = (0.2, 1.0)
    """Healthy torso height (m), inclusive; the state must also be finite."""
    contact_force_range: tuple[float, float] = (-1.0, 1.0)
    """Clip range of ``cfrc_ext`` in the observation and the contact cost."""
    reset_noise_scale: float = 0.1
    """qpos += U(-s, s), qvel += s * N(0, 1) at reset."""

    def __post_init__(self) -> None:
        _validate(self)


class Ant(_Locomotion):
    """Quadruped; observation ``[N, 105]`` = qpos without x, y (13) + qvel (14) + cfrc_ext (13 x 6)."""

    xml = "ant.xml"
    cfg: AntCfg
    contact_forces = True
    outputs = ("xpos",)
    main_body = 1  # the torso

    def obs_dim(self) -> int:
        return self.model.nq - 2 + self.model.nv + 6 * (self.model.nbody - 1)

    def _contact(self) -> np.ndarray:
        lo, hi = self.cfg.contact_force_range
        return np.clip(self.out["cfrc_ext"], lo, hi)

    def observe(self) -> np.ndarray:
        n = self.num_envs
        parts = [self.qpos[:, 2:], self.qvel, self._contact()[:, 1:].reshape(n, -1)]
        return np.concatenate(parts, axis=1, dtype=np.float32)

    def before_step(self) -> None:
        # gymnasium reads body positions of the step's last substep, not of the new state
        self._before[:] = self.out["xpos"][:, self.main_body, :2]

    def after_step(self, ctrl: np.ndarray) -> tuple[dict[str, np.ndarray], np.ndarray]:
        cfg = self.cfg
        x_vel = (self.out["xpos"][:, self.main_body, 0] - self._before[:, 0]) / self.dt
        lo, hi = cfg.healthy_z_range
        z = self.qpos[:, 2]
        finite = np.isfinite(self.qpos).all(axis=1) & np.isfinite(self.qvel).all(axis=1)
        healthy = finite & (z >= lo) & (z <= hi)
        contact = self._contact().reshape(self.num_envs, -1)
        terms = {
            "forward": cfg.forward_reward_weight * x_vel,
            "survive": cfg.healthy_reward * healthy,
            "ctrl": -cfg.ctrl_cost_weight * np.sum(ctrl**2, axis=1),
            "contact": -cfg.contact_cost_weight * np.sum(contact**2, axis=1),
        }
        return terms, ~healthy & cfg.terminate_when_unhealthy

    def sample_reset_state(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        s = self.cfg.reset_noise_scale
        return self._noisy_qpos(n, s), s * self.rng.standard_normal((n, self.model.nv))

    def io_spec(self) -> IOSpec:
        lo, hi = self.cfg.contact_force_range
        contact = ObsField(
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

    backend: MujocoBackendCfg = field(default_factory=MujocoBackendCfg)
    forward_reward_weight: float = 1.25
    """Weight of the centre-of-mass forward velocity (m/s)."""
    ctrl_cost_weight: float = 0.1
    """Weight of the squared control norm (a cost)."""
    contact_cost_weight: float = 5e-7
    """Weight of the squared external contact forces (a cost)."""
    contact_cost_max: float = 10.0
    """Upper clip of the contact cost."""
    healthy_reward: float = 5.0
    """Reward per step while healthy."""
    terminate_when_unhealthy: bool = True
    """End the episode (terminated) when unhealthy."""
    healthy_z_range: tuple[float, float] = (1.0, 2.0)
    """Healthy torso height (m), exclusive bounds."""
    reset_noise_scale: float = 1e-2
    """qpos += U(-s, s), qvel += U(-s, s) at reset."""

    def __post_init__(self) -> None:
        _validate(self)


class Humanoid(_Locomotion):
    """Humanoid; observation ``[N, 348]`` = qpos without x, y (22) + qvel (23) + cinert (13 x 10)
    + cvel (13 x 6) + qfrc_actuator without the root (17) + cfrc_ext (13 x 6)."""

    xml = "humanoid.xml"
    cfg: HumanoidCfg
    contact_forces = True
    outputs = ("xipos", "cinert", "cvel", "qfrc_actuator")

    def obs_dim(self) -> int:
        m = self.model
        return m.nq - 2 + m.nv + (m.nbody - 1) * (10 + 6 + 6) + (m.nv - 6)

    def observe(self) -> np.ndarray:
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
        return np.concatenate(parts, axis=1, dtype=np.float32)

    def _mass_center_xy(self) -> np.ndarray:
        mass = self.body_masses()
        com = np.einsum("nb,nbj->nj", mass, self.out["xipos"]) / mass.sum(axis=1, keepdims=True)
        return com[:, :2]

    def before_step(self) -> None:
        self._before[:] = self._mass_center_xy()

    def after_step(self, ctrl: np.ndarray) -> tuple[dict[str, np.ndarray], np.ndarray]:
        cfg = self.cfg
        x_vel = (self._mass_center_xy()[:, 0] - self._before[:, 0]) / self.dt
        lo, hi = cfg.healthy_z_range
        z = self.qpos[:, 2]
        healthy = (z > lo) & (z < hi)
        contact = cfg.contact_cost_weight * np.sum(self.out["cfrc_ext"].reshape(self.num_envs, -1) ** 2, axis=1)
        terms = {
            "forward": cfg.forward_reward_weight * x_vel,
            "survive": cfg.healthy_reward * healthy,
            "ctrl": -cfg.ctrl_cost_weight * np.sum(ctrl**2, axis=1),
            "contact": -np.minimum(contact, cfg.contact_cost_max),
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
                ObsField("body_inertia_com", 10 * bodies, "kg, kg·m, kg·m²", "com-based", description="cinert"),
                ObsField("body_vel_com", 6 * bodies, "rad/s, m/s", "com-based", description="cvel"),
                ObsField("joint_actuator_torque", m.nv - 6, "N·m", description="qfrc_actuator"),
                ObsField("contact_force_com", 6 * bodies, "N·m, N", "com-based", description="cfrc_ext"),
            )
        )
