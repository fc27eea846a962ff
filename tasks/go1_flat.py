"""``go1-flat``: a Unitree Go1 class quadruped tracks a commanded base velocity on flat ground.

Model: ``sim/assets/go1.xml`` (written here from Unitree's published parameters; sources in its
header and docs/backends.md). Every joint is a PD position servo; an action ``a`` in [-1, 1]
commands the joint angle ``q_stand + action_scale * a`` around the standing pose (the model's
``home`` keyframe), and the servo's torque is clipped to the motor's effort limit.

The objective follows the legged_gym / RSL-RL velocity-tracking recipe (Rudin et al., 2021):
each episode draws a command ``(v_x, v_y, yaw_rate)`` from the configured ranges (default: walk
forward at 0-1 m/s); the reward is an exponential tracking kernel on the body-frame planar
velocity and yaw rate, minus the usual regularizers (vertical speed, roll/pitch rates, tilt,
squared joint torques, action rate), every term multiplied by the control period so that a
return sums over seconds, not steps. An episode ends (terminated) when the trunk or a hip
touches the ground (contact force above ``termination_contact_force_n``), or the state is
not finite; it is truncated after ``backend.max_episode_steps`` (1,000 steps = 20 s).

The terms are written once against ``self.xp`` and run on both MuJoCo backends, like
``tasks/mujoco_locomotion.py``: ``Go1Flat`` (MuJoCo, default) and ``Go1FlatWarp`` (MuJoCo-Warp);
``embodied train go1-flat --backend mjwarp`` picks the second.

Shapes: ``N`` = ``num_envs``; every hook works on ``[N, ...]`` arrays.
"""

from __future__ import annotations

import importlib.resources
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import mujoco
import numpy as np
import torch

from embodied.config import ConfigError, ranged
from embodied.io_spec import IOSpec, ObsTerm, terms_dim
from embodied.sim.mujoco_model import load_mjcf
from embodied.tasks.mujoco_task import (
    MujocoTaskBackendCfg,
    MujocoTaskTerms,
    OnMjwarp,
    OnMujoco,
    actuator_fields,
    validate_cfg,
)

JOINTS = 12
"""Actuated joints: hip, thigh, calf of the legs FR, FL, RR, RL (the model's actuator order)."""

OBS_TERMS: tuple[ObsTerm, ...] = (
    ObsTerm("base_lin_vel_b", 3, "m/s", "body", "trunk linear velocity"),
    ObsTerm("base_ang_vel_b", 3, "rad/s", "body", "trunk angular velocity (gyro)"),
    ObsTerm("gravity_b", 3, "", "body", "unit gravity direction (0, 0, -1) seen from the trunk"),
    ObsTerm("command", 3, "m/s, m/s, rad/s", "body", "commanded v_x, v_y, yaw rate"),
    ObsTerm("joint_pos_rel", JOINTS, "rad", "joint", "joint angles minus the standing pose"),
    ObsTerm("joint_vel", JOINTS, "rad/s", "joint"),
    ObsTerm("last_action", JOINTS, "", "", "the previous action in [-1, 1]"),
)
"""The policy observation, in this order ([N, 48])."""


def go1_model() -> mujoco.MjModel:
    """The Go1 model shipped in ``embodied.sim``'s assets."""
    path = importlib.resources.files("embodied.sim") / "assets" / "go1.xml"
    return load_mjcf(Path(str(path)))


def rotate_to_body(xp: Any, quat_wxyz: Any, vec_w: Any) -> Any:
    """``R(q)^T v``: world vectors ``[N, 3]`` in the frame of the body with orientation
    ``quat_wxyz`` ``[N, 4]`` (body -> world). ``xp`` is numpy or torch."""
    w, x, y, z = (quat_wxyz[:, i] for i in range(4))
    vx, vy, vz = (vec_w[:, i] for i in range(3))
    # rows of R^T are the columns of R(q)
    bx = (1 - 2 * (y * y + z * z)) * vx + 2 * (x * y + w * z) * vy + 2 * (x * z - w * y) * vz
    by = 2 * (x * y - w * z) * vx + (1 - 2 * (x * x + z * z)) * vy + 2 * (y * z + w * x) * vz
    bz = 2 * (x * z + w * y) * vx + 2 * (y * z - w * x) * vy + (1 - 2 * (x * x + y * y)) * vz
    return xp.stack([bx, by, bz], 1)


@dataclass(frozen=True)
class Go1FlatCfg:
    """Velocity tracking on flat ground; weights are per second (multiplied by the control period)."""

    backend: MujocoTaskBackendCfg = field(default_factory=lambda: MujocoTaskBackendCfg(frame_skip=4))
    """Simulator; 4 substeps of 0.005 s: a 0.02 s (50 Hz) policy, as legged_gym's Go1."""
    action_scale_rad: float = ranged(0.25, 0.0, 3.15, "rad")
    """Joint angle offset (rad) commanded by an action of 1 (legged_gym: 0.25)."""
    command_vx_range: tuple[float, float] = ranged((0.0, 1.0), -5.0, 5.0, "m/s")
    """Commanded forward speed (m/s, body frame), drawn uniformly per episode."""
    command_vy_range: tuple[float, float] = ranged((0.0, 0.0), -5.0, 5.0, "m/s")
    """Commanded lateral speed (m/s, body frame)."""
    command_yaw_rate_range: tuple[float, float] = ranged((0.0, 0.0), -10.0, 10.0, "rad/s")
    """Commanded yaw rate (rad/s)."""
    tracking_sigma: float = ranged(0.25, 1e-4, 100.0, "(m/s)^2")
    """Width of the tracking kernel ``exp(-err^2 / sigma)`` (m^2/s^2 or rad^2/s^2)."""
    track_lin_vel_weight: float = ranged(1.0, 0.0, 1000.0)
    """Reward for the planar velocity tracking kernel."""
    track_ang_vel_weight: float = ranged(0.5, 0.0, 1000.0)
    """Reward for the yaw-rate tracking kernel."""
    lin_vel_z_weight: float = ranged(2.0, 0.0, 1000.0)
    """Cost of the squared vertical trunk speed (m^2/s^2)."""
    ang_vel_xy_weight: float = ranged(0.05, 0.0, 1000.0)
    """Cost of the squared roll and pitch rates (rad^2/s^2)."""
    orientation_weight: float = ranged(1.0, 0.0, 1000.0)
    """Cost of the squared horizontal components of gravity seen from the trunk (tilt)."""
    torque_weight: float = ranged(2e-4, 0.0, 1000.0)
    """Cost of the squared joint torques (N^2 m^2)."""
    action_rate_weight: float = ranged(0.01, 0.0, 1000.0)
    """Cost of the squared change of the action between steps."""
    termination_contact_force_n: float = ranged(1.0, 0.0, 100_000.0, "N")
    """A trunk or hip contact force above this (N) ends the episode."""
    reset_noise_scale: float = ranged(0.1, 0.0, 10.0)
    """Joint angles += U(-s, s) rad, all velocities U(-s, s) at reset."""

    def __post_init__(self) -> None:
        validate_cfg(self)
        for name in ("action_scale_rad", "tracking_sigma", "termination_contact_force_n"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"{name} must be > 0, got {getattr(self, name)}")


class _Go1FlatTerms(MujocoTaskTerms):
    """Go1 velocity tracking; observation ``[N, 48]`` (:data:`OBS_TERMS`), action ``[N, 12]``."""

    cfg: Go1FlatCfg
    contact_forces = True
    outputs: tuple[str, ...] = ("actuator_force",)
    ctrl_mid: Any
    ctrl_half: Any
    _command: Any
    _last_action: Any

    def __init__(self, cfg: Go1FlatCfg, num_envs: int, device: torch.device | str, seed: int) -> None:
        # the first reset (inside the backend's constructor) reads these buffers; either backend's
        # zeros() needs only the device
        self.device = torch.device(device)
        self._command = self.zeros(num_envs, 3)
        self._last_action = self.zeros(num_envs, JOINTS)
        super().__init__(cfg, num_envs, device, seed)  # type: ignore[call-arg]
        if self.model.nu != JOINTS:
            raise ValueError(f"the Go1 model has {self.model.nu} actuators, expected {JOINTS}")
        # actions are offsets around the standing pose: ctrl = q_stand + scale * a
        self.ctrl_mid = self.asarray(self._stand_joints())
        self.ctrl_half = self.asarray(np.full(JOINTS, cfg.action_scale_rad))
        names = [mujoco.mj_id2name(self.model, mujoco.mjtObj.mjOBJ_BODY, b) for b in range(self.model.nbody)]
        self._ground_bodies = [i for i, name in enumerate(names) if name == "trunk" or str(name).endswith("_hip")]

    def load_model(self) -> mujoco.MjModel:
        return go1_model()

    def _stand_joints(self) -> np.ndarray:
        """Standing pose joint angles ``[12]`` (the ``home`` keyframe)."""
        return np.asarray(self.model.key_qpos[0, 7:], dtype=np.float64)

    def obs_dim(self) -> int:
        return terms_dim(OBS_TERMS)

    def _base(self) -> tuple[Any, Any, Any]:
        """Body-frame trunk linear velocity, angular velocity and gravity direction, ``[N, 3]`` each."""
        quat = self.qpos[:, 3:7]
        lin_vel_b = rotate_to_body(self.xp, quat, self.qvel[:, :3])
        down = self.qvel[:, :3] * 0
        down[:, 2] = -1.0
        return lin_vel_b, self.qvel[:, 3:6], rotate_to_body(self.xp, quat, down)

    def observe(self) -> Any:
        lin_vel_b, ang_vel_b, gravity_b = self._base()
        values = {
            "base_lin_vel_b": lin_vel_b,
            "base_ang_vel_b": ang_vel_b,
            "gravity_b": gravity_b,
            "command": self._command,
            "joint_pos_rel": self.qpos[:, 7:] - self.ctrl_mid,
            "joint_vel": self.qvel[:, 6:],
            "last_action": self._last_action,
        }
        return self.cat([values[term.name] for term in OBS_TERMS])

    def before_step(self) -> None:
        pass  # every term reads the state after the step

    def after_step(self, ctrl: Any) -> tuple[dict[str, Any], Any]:
        cfg, xp, dt = self.cfg, self.xp, self.dt
        lin_vel_b, ang_vel_b, gravity_b = self._base()
        action = (ctrl - self.ctrl_mid) / self.ctrl_half
        lin_err = ((self._command[:, :2] - lin_vel_b[:, :2]) ** 2).sum(axis=1)
        yaw_err = (self._command[:, 2] - ang_vel_b[:, 2]) ** 2
        terms = {
            "track_lin_vel": cfg.track_lin_vel_weight * dt * xp.exp(-lin_err / cfg.tracking_sigma),
            "track_ang_vel": cfg.track_ang_vel_weight * dt * xp.exp(-yaw_err / cfg.tracking_sigma),
            "lin_vel_z": -cfg.lin_vel_z_weight * dt * lin_vel_b[:, 2] ** 2,
            "ang_vel_xy": -cfg.ang_vel_xy_weight * dt * (ang_vel_b[:, :2] ** 2).sum(axis=1),
            "orientation": -cfg.orientation_weight * dt * (gravity_b[:, :2] ** 2).sum(axis=1),
            "torque": -cfg.torque_weight * dt * (self.out["actuator_force"] ** 2).sum(axis=1),
            "action_rate": -cfg.action_rate_weight * dt * ((action - self._last_action) ** 2).sum(axis=1),
        }
        self._last_action[:] = action
        force = self.out["cfrc_ext"][:, self._ground_bodies, 3:]
        touched = ((force**2).sum(axis=2) > cfg.termination_contact_force_n**2).any(axis=1)
        finite = xp.isfinite(self.qpos).all(axis=1) & xp.isfinite(self.qvel).all(axis=1)
        return terms, touched | ~finite

    def sample_reset_state(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        s = self.cfg.reset_noise_scale
        qpos = np.tile(self.model.key_qpos[0], (n, 1))
        qpos[:, 7:] += self.rng.uniform(-s, s, size=(n, JOINTS))
        return qpos, self.rng.uniform(-s, s, size=(n, self.model.nv))

    def _reset_envs(self, ids: Any) -> None:
        super()._reset_envs(ids)  # type: ignore[misc]
        cfg = self.cfg
        ranges = (cfg.command_vx_range, cfg.command_vy_range, cfg.command_yaw_rate_range)
        command = np.stack([self.rng.uniform(lo, hi, size=len(ids)) for lo, hi in ranges], axis=1)
        self._command[ids] = self.asarray(command)
        self._last_action[ids] = 0.0

    def io_spec(self) -> IOSpec:
        actions = actuator_fields(
            self.model,
            "rad",
            self._stand_joints(),
            np.full(JOINTS, self.cfg.action_scale_rad),
            description="joint angle target of the PD servo (kp 35 N m/rad, kd 0.5 N m s/rad, effort-limited)",
        )
        return self._spec(OBS_TERMS, actions)


class Go1Flat(_Go1FlatTerms, OnMujoco):
    """Go1 velocity tracking on the MuJoCo backend."""


class Go1FlatWarp(_Go1FlatTerms, OnMjwarp):
    """Go1 velocity tracking on the MuJoCo-Warp backend."""
