"""An independent Crazyflie 2.x in MuJoCo, batched, for sim-to-sim checks of quadrotor policies.

Nothing here is shared with the torch simulator (``sim/quadrotor.py``): the rigid body, the
ground contact and the integrator are MuJoCo's (``assets/crazyflie.xml``, written from published
numbers), and the rotor command chain is written out again from ``docs/conventions.md``:

    thrust command T_i (N) -> cut below T_min -> rpm setpoint sqrt(T_i / k_f)
    -> first-order lag (tau) -> rotor thrust k_f rpm^2 along body z at the rotor
    -> yaw reaction torque spin_i * torque_to_thrust * thrust about body z

with ``spin = (-1, +1, -1, +1)`` for M1..M4 (M1 front-right and M3 back-left spin
counter-clockwise seen from above, so they push the body about -z).

:class:`MujocoCrazyflie` steps ``N`` vehicles together through :func:`mujoco.rollout.rollout`:
one call per control period, ``substeps`` MuJoCo steps each, with the rotor thrusts of every
substep computed beforehand from the exact solution of the motor lag (the lag does not depend on
the body's motion). A :class:`Perturbation` changes the vehicle (mass, inertia, motor lag,
per-motor thrust, a yaw torque) away from the nominal one.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import numpy as np

from embodied.config import ConfigError
from embodied.sim.mujoco_model import load_mjcf
from embodied.sim.vehicle_variants import NOMINAL, VARIANTS

log = logging.getLogger(__name__)

MODEL_PATH = Path(__file__).with_name("assets") / "crazyflie.xml"
"""The MJCF model of the nominal vehicle."""

NUM_ROTORS = 4
NUM_CONTROLS = NUM_ROTORS + 6
"""Actuators in the model: four rotor thrusts, world disturbance force (3), body disturbance torque (3)."""

ROTOR_SPIN_CF2 = (-1.0, 1.0, -1.0, 1.0)
"""Reaction-torque sign about body z per motor M1..M4 (Crazyflie 2.x, docs/conventions.md)."""


@dataclass(frozen=True)
class CrazyflieParams:
    """The vehicle: rigid body (the model file's nominal values) and the rotor command chain.

    Defaults are the default variant's (``embodied.sim.vehicle_variants.NOMINAL``, sources in docs/conventions.md);
    :meth:`from_policy_extra` takes the command-chain values a policy was trained with.
    """

    mass_kg: float = NOMINAL.mass_kg
    inertia_kgm2: tuple[float, float, float] = NOMINAL.inertia_kgm2
    gravity_mps2: float = 9.81
    thrust_coef_n_per_rpm2: float = NOMINAL.thrust_coef_n_per_rpm2
    """Rotor thrust = coef * rpm^2 (N)."""
    torque_to_thrust_m: float = NOMINAL.torque_to_thrust_m
    """Rotor drag torque about its axis per newton of thrust (m)."""
    motor_tau_s: float = NOMINAL.motor_tau_s
    """First-order time constant of the rotor speed."""
    max_rpm: float = NOMINAL.max_rpm
    """Motor speed limit; setpoints above it are clamped."""
    max_thrust_per_motor_n: float = NOMINAL.max_thrust_per_motor_n
    """Thrust command at action +1 (firmware THRUST_MAX, the lowest accepted version's)."""
    min_thrust_per_motor_n: float = NOMINAL.min_thrust_per_motor_n
    """Commands below this produce no thrust (firmware THRUST_MIN cut)."""
    rotor_spin: tuple[float, float, float, float] = ROTOR_SPIN_CF2
    """Reaction-torque sign about body z, M1..M4."""

    def __post_init__(self) -> None:
        for name in ("mass_kg", "thrust_coef_n_per_rpm2", "motor_tau_s", "max_rpm", "max_thrust_per_motor_n"):
            if not getattr(self, name) > 0.0:
                raise ConfigError(f"crazyflie params: {name} must be > 0, got {getattr(self, name)!r}")
        if len(self.inertia_kgm2) != 3 or min(self.inertia_kgm2) <= 0.0:
            raise ConfigError(f"crazyflie params: inertia_kgm2 needs 3 positive values, got {self.inertia_kgm2}")
        if len(self.rotor_spin) != NUM_ROTORS or any(abs(s) != 1.0 for s in self.rotor_spin):
            raise ConfigError(f"crazyflie params: rotor_spin needs 4 entries of +1 or -1, got {self.rotor_spin}")
        if not 0.0 <= self.min_thrust_per_motor_n < self.max_thrust_per_motor_n:
            raise ConfigError(
                "crazyflie params: need 0 <= min_thrust_per_motor_n < max_thrust_per_motor_n, got "
                f"{self.min_thrust_per_motor_n} and {self.max_thrust_per_motor_n}"
            )

    @classmethod
    def from_policy_extra(cls, extra: dict[str, Any]) -> CrazyflieParams:
        """The nominal vehicle with the command-chain keys of ``policy_io.json`` ``extra`` applied.

        Read when present: ``thrust_coef_n_per_rpm2``, ``torque_to_thrust_m``, ``motor_tau_s``,
        ``max_rpm``, ``max_thrust_per_motor_n``, ``min_thrust_per_motor_n``, ``rotor_spin``,
        ``gravity_mps2``. Mass and inertia are the published values of the policy's
        ``vehicle_variant`` (:mod:`embodied.sim.vehicle_variants`), not the ones it was trained
        with; without a variant (older exports) the model file's own.
        """
        values: dict[str, Any] = {}
        name = extra.get("vehicle_variant")
        if name is not None:
            if not isinstance(name, str) or name not in VARIANTS:
                raise ConfigError(
                    f"policy_io.json extra.vehicle_variant: expected one of {', '.join(VARIANTS)}, got {name!r}"
                )
            values |= {"mass_kg": VARIANTS[name].mass_kg, "inertia_kgm2": VARIANTS[name].inertia_kgm2}
        names = {f.name for f in fields(cls)} - {"mass_kg", "inertia_kgm2"}
        for name in names:
            if name not in extra:
                continue
            raw = extra[name]
            try:
                values[name] = tuple(float(v) for v in raw) if name == "rotor_spin" else float(raw)
            except (TypeError, ValueError):
                raise ConfigError(
                    f"policy_io.json extra.{name}: expected a number (list for rotor_spin), got {raw!r}"
                ) from None
        return cls(**values)

    @property
    def hover_thrust_n(self) -> float:
        """Per-motor thrust that carries the nominal weight."""
        return self.mass_kg * self.gravity_mps2 / NUM_ROTORS


@dataclass(frozen=True)
class Perturbation:
    """A departure from the nominal vehicle (all neutral by default)."""

    mass_scale: float = 1.0
    """Multiplies the mass (a heavier or lighter vehicle, e.g. with a payload)."""
    inertia_scale: float = 1.0
    """Multiplies all three principal moments of inertia."""
    motor_tau_scale: float = 1.0
    """Multiplies the motor time constant (slower or faster spin-up)."""
    thrust_mismatch: float = 0.0
    """Each motor's thrust coefficient is scaled by a factor drawn uniformly from
    ``[1 - m, 1 + m]`` per episode (worn propellers, motor spread)."""
    yaw_torque_nm: float = 0.0
    """Constant torque about body z (N m), with a random sign per episode."""
    obs_delay_steps: int = 0
    """The policy sees the vehicle's state this many control periods late (applied by the
    evaluation loop, which assembles the observation)."""

    def __post_init__(self) -> None:
        for name in ("mass_scale", "inertia_scale", "motor_tau_scale"):
            if not getattr(self, name) > 0.0:
                raise ConfigError(f"perturbation: {name} must be > 0, got {getattr(self, name)!r}")
        if not 0.0 <= self.thrust_mismatch < 1.0:
            raise ConfigError(f"perturbation: thrust_mismatch must be in [0, 1), got {self.thrust_mismatch!r}")
        if self.obs_delay_steps < 0:
            raise ConfigError(f"perturbation: obs_delay_steps must be >= 0, got {self.obs_delay_steps!r}")


def load_model(params: CrazyflieParams, perturbation: Perturbation, timestep_s: float) -> Any:
    """The MuJoCo model of ``params`` with ``perturbation``'s mass and inertia, stepping ``timestep_s``."""

    model = load_mjcf(MODEL_PATH)
    body = model.body("crazyflie").id
    model.body_mass[body] = params.mass_kg * perturbation.mass_scale
    model.body_inertia[body] = np.asarray(params.inertia_kgm2) * perturbation.inertia_scale
    model.opt.gravity[:] = (0.0, 0.0, -params.gravity_mps2)
    model.opt.timestep = timestep_s
    for i, spin in enumerate(params.rotor_spin):
        # Site transmission: gear (fx, fy, fz, tx, ty, tz) in the rotor's frame per newton of command.
        model.actuator_gear[i] = (0.0, 0.0, 1.0, 0.0, 0.0, spin * params.torque_to_thrust_m)
    return model


def thrust_to_rpm_setpoint(thrust_cmd_n: np.ndarray, params: CrazyflieParams) -> np.ndarray:
    """``[N, 4]`` thrust commands (N) -> rotor speed setpoints (rpm): 0 below the cut, else
    ``sqrt(T / k_f)`` clamped to ``max_rpm``."""
    thrust = np.clip(thrust_cmd_n, 0.0, params.max_thrust_per_motor_n)
    rpm = np.sqrt(thrust / params.thrust_coef_n_per_rpm2)
    rpm = np.where(thrust < params.min_thrust_per_motor_n, 0.0, rpm)
    return np.minimum(rpm, params.max_rpm)


class MujocoCrazyflie:
    """``num_envs`` Crazyflies in MuJoCo, advanced one control period per :meth:`step`.

    State (numpy float64): ``qpos [N, 7]`` (position_w m, quat_wb w x y z), ``qvel [N, 6]``
    (lin_vel_w m/s, ang_vel_b rad/s: MuJoCo's free-joint convention), ``motor_rpm [N, 4]``.
    Per-episode draws (thrust mismatch, yaw torque sign) come from ``rng`` at :meth:`reset`.
    """

    def __init__(
        self,
        params: CrazyflieParams,
        num_envs: int,
        dt_s: float,
        substeps: int = 5,
        perturbation: Perturbation | None = None,
        num_threads: int = 1,
    ) -> None:
        import mujoco

        if num_envs < 1:
            raise ConfigError(f"num_envs must be >= 1, got {num_envs}")
        if substeps < 1 or not dt_s > 0.0:
            raise ConfigError(f"need dt_s > 0 and substeps >= 1, got dt_s={dt_s}, substeps={substeps}")
        self.params = params
        self.perturbation = perturbation or Perturbation()
        self.num_envs = num_envs
        self.dt_s = dt_s
        self.substeps = substeps
        self.model = load_model(params, self.perturbation, dt_s / substeps)
        self._datas = [mujoco.MjData(self.model) for _ in range(max(1, num_threads))]
        self._spec = int(mujoco.mjtState.mjSTATE_FULLPHYSICS)
        self._nstate = mujoco.mj_stateSize(self.model, self._spec)
        # Layout of a full-physics state vector: time, qpos (7), qvel (6), then empty act/plugin.
        self._state = np.zeros((num_envs, self._nstate))
        self.motor_rpm = np.zeros((num_envs, NUM_ROTORS))
        self.diverged = np.zeros(num_envs, dtype=bool)
        """``[N]`` envs whose simulation blew up (MuJoCo reset them internally); they are frozen
        from then on and their state is meaningless: end their episodes."""
        self._frozen = np.zeros(num_envs, dtype=bool)
        self._frozen_state = np.zeros((num_envs, self._nstate))
        self.thrust_coef = np.full((num_envs, NUM_ROTORS), params.thrust_coef_n_per_rpm2)
        """``[N, 4]`` per-motor thrust coefficient (nominal times the episode's mismatch)."""
        self.force_w = np.zeros((num_envs, 3))
        """``[N, 3]`` constant disturbance force per episode, world (N)."""
        self.torque_b = np.zeros((num_envs, 3))
        """``[N, 3]`` constant disturbance torque per episode, body (N m)."""
        tau = params.motor_tau_s * self.perturbation.motor_tau_scale
        h = dt_s / substeps
        # Exact lag: rpm(t) = cmd + (rpm_0 - cmd) * exp(-t / tau). MuJoCo holds a control over a
        # step, so substep k gets the thrust at its midpoint (t = (k + 1/2) h): second-order
        # accurate, where the value at the start of the step lags the motor by h / 2.
        self._decay = np.exp(-h * (np.arange(substeps) + 0.5) / tau)[None, :, None]  # [1, S, 1]
        self._decay_end = math.exp(-dt_s / tau)

    # ------------------------------------------------------------------ state
    @property
    def qpos(self) -> np.ndarray:
        return self._state[:, 1:8]

    @property
    def qvel(self) -> np.ndarray:
        return self._state[:, 8:14]

    @property
    def position_w(self) -> np.ndarray:
        return self._state[:, 1:4]

    @property
    def quat_wb(self) -> np.ndarray:
        return self._state[:, 4:8]

    @property
    def lin_vel_w(self) -> np.ndarray:
        return self._state[:, 8:11]

    @property
    def ang_vel_b(self) -> np.ndarray:
        return self._state[:, 11:14]

    def reset(
        self,
        position_w: np.ndarray,
        quat_wb: np.ndarray,
        lin_vel_w: np.ndarray,
        ang_vel_b: np.ndarray,
        motor_rpm: np.ndarray,
        rng: np.random.Generator,
        force_w: np.ndarray | None = None,
        torque_b: np.ndarray | None = None,
    ) -> None:
        """Start every env from the given ``[N, k]`` state; draws the perturbation's per-episode
        values from ``rng``. ``force_w``/``torque_b [N, 3]`` are the sampled disturbances (zero if None)."""
        n = self.num_envs
        quat = np.asarray(quat_wb, dtype=np.float64)
        self._state[:] = 0.0
        self.diverged[:] = False
        self._frozen[:] = False
        self._state[:, 1:4] = position_w
        self._state[:, 4:8] = quat / np.linalg.norm(quat, axis=1, keepdims=True)
        self._state[:, 8:11] = lin_vel_w
        self._state[:, 11:14] = ang_vel_b
        self.motor_rpm = np.array(np.broadcast_to(motor_rpm, (n, NUM_ROTORS)), dtype=np.float64)
        p = self.perturbation
        mismatch = rng.uniform(1.0 - p.thrust_mismatch, 1.0 + p.thrust_mismatch, size=(n, NUM_ROTORS))
        if p.thrust_mismatch == 0.0:
            mismatch[:] = 1.0  # exactly nominal (the draw above keeps the random stream aligned)
        self.thrust_coef = self.params.thrust_coef_n_per_rpm2 * mismatch
        self.force_w = np.zeros((n, 3)) if force_w is None else np.array(force_w, dtype=np.float64)
        self.torque_b = np.zeros((n, 3)) if torque_b is None else np.array(torque_b, dtype=np.float64)
        if p.yaw_torque_nm != 0.0:
            self.torque_b[:, 2] += p.yaw_torque_nm * rng.choice((-1.0, 1.0), size=n)

    def step(self, rpm_cmd: np.ndarray) -> None:
        """Hold rotor speed setpoints ``rpm_cmd [N, 4]`` (clamped to ``[0, max_rpm]``) for one control period."""
        from mujoco import rollout

        cmd = np.clip(rpm_cmd, 0.0, self.params.max_rpm)[:, None, :]  # [N, 1, 4]
        rpm = cmd + (self.motor_rpm[:, None, :] - cmd) * self._decay  # [N, S, 4]
        control = np.empty((self.num_envs, self.substeps, NUM_CONTROLS))
        control[:, :, :NUM_ROTORS] = self.thrust_coef[:, None, :] * rpm * rpm
        control[:, :, 4:7] = self.force_w[:, None, :]
        control[:, :, 7:10] = self.torque_b[:, None, :]
        expected_time_s = self._state[:, 0] + self.dt_s
        states, _ = rollout.rollout(
            self.model, self._datas, self._state, control, nstep=self.substeps, skip_checks=False
        )
        self._state = np.ascontiguousarray(states[:, -1, :])
        self.motor_rpm = cmd[:, 0, :] + (self.motor_rpm - cmd[:, 0, :]) * self._decay_end
        # MuJoCo resets an env whose velocities blow up (qpos0: hovering at rest, which would
        # look like success); its clock restarting gives it away.
        blew_up = np.abs(self._state[:, 0] - expected_time_s) > 0.5 * self.model.opt.timestep
        if blew_up.any():
            self.diverged |= blew_up
            self.freeze(blew_up)  # MuJoCo's reset state (at rest) is a quiet state to hold
        if self._frozen.any():
            self._state[self._frozen] = self._frozen_state[self._frozen]

    def freeze(self, mask: np.ndarray) -> None:
        """Stop simulating the envs where ``mask [N]`` (ended episodes): their state stays as it is
        now, so a vehicle that left the box does not tumble on until MuJoCo flags it unstable."""
        new = mask & ~self._frozen
        self._frozen_state[new] = self._state[new]
        self._frozen_state[new, 8:14] = 0.0
        self._frozen_state[new, 4:8] = (1.0, 0.0, 0.0, 0.0)
        self._frozen |= mask

    def rotor_thrust_n(self) -> np.ndarray:
        """``[N, 4]`` current rotor thrusts (N)."""
        return self.thrust_coef * self.motor_rpm**2


def quat_to_rot(quat_wb: np.ndarray) -> np.ndarray:
    """Unit quaternions ``[N, 4]`` (w, x, y, z) -> rotation matrices ``[N, 3, 3]`` (body -> world)."""
    w, x, y, z = (quat_wb[:, i] for i in range(4))
    return np.stack(
        (
            np.stack((1 - 2 * (y * y + z * z), 2 * (x * y - w * z), 2 * (x * z + w * y)), axis=1),
            np.stack((2 * (x * y + w * z), 1 - 2 * (x * x + z * z), 2 * (y * z - w * x)), axis=1),
            np.stack((2 * (x * z - w * y), 2 * (y * z + w * x), 1 - 2 * (x * x + y * y)), axis=1),
        ),
        axis=1,
    )
