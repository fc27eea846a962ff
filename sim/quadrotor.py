"""Batched rigid-body quadrotor (Crazyflie 2.x class) in torch, CPU or CUDA.

Frames follow ``docs/conventions.md``: world z up, body FLU, quaternion ``(w, x, y, z)``
rotating body vectors into the world, motors M1..M4 = front-right, back-right, back-left,
front-left; M1/M3 spin counter-clockwise seen from above (reaction torque -z on the body),
M2/M4 clockwise (+z), as on the real Crazyflie 2.x.

The state of ``N`` vehicles is one packed float32 tensor ``[N, 17]``::

    position_w (3, m) | quat_wb (4) | lin_vel_w (3, m/s) | ang_vel_b (3, rad/s) | motor_rpm (4)

:func:`rk4_step` advances it by one control period. It is a pure tensor function (no Python
branching on data, no in-place writes) so ``torch.compile`` can fuse it; :class:`Quadrotor`
holds the state, the per-env parameters and the disturbances, and calls it eagerly or
compiled (opt-in, compiled once per process).
"""

from __future__ import annotations

import functools
import logging
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import torch

from embodied.config import ConfigError, ranged
from embodied.sim.vehicle_variants import DEFAULT_VARIANT, NOMINAL, VARIANTS

log = logging.getLogger(__name__)

STATE_DIM = 17
POS = slice(0, 3)
QUAT = slice(3, 7)
LIN_VEL = slice(7, 10)
ANG_VEL = slice(10, 13)
RPM = slice(13, 17)

RPM_TO_RAD_S = 2.0 * math.pi / 60.0

ROTOR_SPIN: tuple[float, float, float, float] = (-1.0, 1.0, -1.0, 1.0)
"""Sign of each rotor's reaction (drag) torque about body z, M1..M4: M1/M3 spin counter-clockwise
seen from above (-z on the body), M2/M4 clockwise (+z). Crazyflie 2.x, docs/conventions.md."""


def require_finite(where: str, values: dict[str, Any], *, positive: bool = False, non_negative: bool = False) -> None:
    """Raise :class:`ConfigError` naming the first entry of ``values`` (scalars or tuples of
    them) that is NaN/inf, or not > 0 (``positive``) / not >= 0 (``non_negative``)."""
    for name, value in values.items():
        for v in value if isinstance(value, tuple | list) else (value,):
            if not isinstance(v, int | float) or not math.isfinite(v):
                raise ConfigError(f"{where}: {name} must be a finite number, got {value!r}")
            if positive and not v > 0.0:
                raise ConfigError(f"{where}: {name} must be > 0, got {value!r}")
            if non_negative and not v >= 0.0:
                raise ConfigError(f"{where}: {name} must be >= 0, got {value!r}")


@dataclass(frozen=True)
class QuadrotorParams:
    """Nominal physical parameters (Crazyflie 2.x, published system-identification data).

    The defaults are the Crazyflie 2.1 (``variant``); ``configs/vehicles/<variant>.yaml`` holds
    every variant's published values (``embodied.sim.vehicle_variants``)."""

    variant: str = DEFAULT_VARIANT
    """The Crazyflie this trains (crazyflie-2.1, crazyflie-2.1-plus, crazyflie-2.1-brushless):
    written into policy_io.json, it picks the firmware platform `flash` builds and the vehicle
    `verify` flies. The values below must fit that variant's firmware thrust limits."""
    mass_kg: float = ranged(NOMINAL.mass_kg, 0.005, 50.0, "kg")
    """Take-off mass including battery."""
    inertia_kgm2: tuple[float, float, float] = ranged(NOMINAL.inertia_kgm2, 1e-7, 10.0, "kg m^2")
    """Principal moments of inertia about body x, y, z."""
    arm_length_m: float = ranged(NOMINAL.arm_length_m, 0.01, 2.0, "m")
    """Centre of mass to rotor axis; each rotor sits at arm/sqrt(2) along body x and y."""
    thrust_coef_n_per_rpm2: float = ranged(NOMINAL.thrust_coef_n_per_rpm2, 1e-13, 1e-5, "N/rpm^2")
    """Rotor thrust = coef * rpm^2 (N)."""
    torque_to_thrust_m: float = ranged(NOMINAL.torque_to_thrust_m, 1e-4, 0.1, "m")
    """Rotor drag (yaw) torque = ratio * thrust (N m per N), sign per rotor from ROTOR_SPIN."""
    max_rpm: float = ranged(NOMINAL.max_rpm, 1000.0, 200_000.0, "rpm")
    """Motor speed limit; ``thrust_coef * max_rpm^2`` (0.149 N) must reach ``max_thrust_per_motor_n``."""
    max_thrust_per_motor_n: float = ranged(NOMINAL.max_thrust_per_motor_n, 0.01, 500.0, "N")
    """Thrust command at action +1 (the firmware's THRUST_MAX; the smallest of the accepted
    firmware versions, docs/conventions.md)."""
    min_thrust_per_motor_n: float = ranged(NOMINAL.min_thrust_per_motor_n, 0.0, 100.0, "N")
    """Thrust commands below this produce no thrust (the firmware's THRUST_MIN cut in its
    battery compensation; the largest of the accepted firmware versions)."""
    motor_tau_s: float = ranged(NOMINAL.motor_tau_s, 1e-3, 1.0, "s")
    """First-order motor time constant. L2F's code uses 0.15 s, which is deliberately slow;
    the Crazyflie's brushed 7 mm coreless motors with 45 mm propellers spin up in a few tens of
    milliseconds, so 0.05 s sits between the two and domain randomization can widen it."""
    gravity_mps2: float = ranged(9.81, 0.5, 30.0, "m/s^2")
    """Magnitude of gravity, acting along world -z."""

    def __post_init__(self) -> None:
        where = "quadrotor params"
        require_finite(
            where,
            {
                "mass_kg": self.mass_kg,
                "inertia_kgm2": tuple(self.inertia_kgm2),
                "arm_length_m": self.arm_length_m,
                "thrust_coef_n_per_rpm2": self.thrust_coef_n_per_rpm2,
                "max_rpm": self.max_rpm,
                "max_thrust_per_motor_n": self.max_thrust_per_motor_n,
                "motor_tau_s": self.motor_tau_s,
            },
            positive=True,
        )
        require_finite(
            where,
            {
                "torque_to_thrust_m": self.torque_to_thrust_m,
                "min_thrust_per_motor_n": self.min_thrust_per_motor_n,
                "gravity_mps2": self.gravity_mps2,
            },
            non_negative=True,
        )
        if len(self.inertia_kgm2) != 3:
            raise ConfigError(f"{where}: inertia_kgm2 needs 3 positive values, got {self.inertia_kgm2}")
        if self.variant not in VARIANTS:
            raise ConfigError(f"{where}: variant {self.variant!r} is not one of {', '.join(VARIANTS)}")
        v = VARIANTS[self.variant]
        how = f"(train it with --config configs/vehicles/{v.name}.yaml)"
        if self.max_thrust_per_motor_n > v.firmware_thrust_max_n * (1 + 1e-6):
            raise ConfigError(
                f"{where}: max_thrust_per_motor_n = {self.max_thrust_per_motor_n} N is above the {v.name} "
                f"firmware's THRUST_MAX {v.firmware_thrust_max_n} N, which the motors would never get {how}"
            )
        if self.min_thrust_per_motor_n < v.firmware_thrust_min_n * (1 - 1e-6):
            raise ConfigError(
                f"{where}: min_thrust_per_motor_n = {self.min_thrust_per_motor_n} N is below the {v.name} "
                f"firmware's THRUST_MIN {v.firmware_thrust_min_n} N, under which its motors stop {how}"
            )
        if not self.min_thrust_per_motor_n < self.max_thrust_per_motor_n:
            raise ConfigError(
                f"{where}: min_thrust_per_motor_n ({self.min_thrust_per_motor_n}) must be below "
                f"max_thrust_per_motor_n ({self.max_thrust_per_motor_n})"
            )
        if self.thrust_coef_n_per_rpm2 * self.max_rpm**2 < self.max_thrust_per_motor_n:
            raise ConfigError(
                f"{where}: the motors cannot reach max_thrust_per_motor_n = {self.max_thrust_per_motor_n} N: "
                f"thrust_coef_n_per_rpm2 * max_rpm^2 = {self.thrust_coef_n_per_rpm2 * self.max_rpm**2:.4g} N"
            )

    @property
    def hover_thrust_per_motor_n(self) -> float:
        """Thrust per rotor that carries the nominal weight (m g / 4)."""
        return self.mass_kg * self.gravity_mps2 / 4.0

    @property
    def hover_rpm(self) -> float:
        """Motor speed at which four rotors carry the nominal weight."""
        return math.sqrt(self.hover_thrust_per_motor_n / self.thrust_coef_n_per_rpm2)

    @property
    def hover_action(self) -> float:
        """Action in [-1, 1] whose thrust command carries the nominal weight:
        ``2 (m g / 4) / max_thrust - 1`` (0.177 for the defaults)."""
        return 2.0 * self.hover_thrust_per_motor_n / self.max_thrust_per_motor_n - 1.0


def action_to_rpm_cmd(
    action: torch.Tensor, max_thrust_n: float, min_thrust_n: float, inv_thrust_coef: float, max_rpm: float
) -> torch.Tensor:
    """Policy action ``[N, 4]`` in [-1, 1] -> motor speed setpoints ``[N, 4]`` (rpm), pure.

    The thrust command ``T = (a + 1) / 2 * max_thrust_n`` (what the firmware applies), zero
    below ``min_thrust_n`` (the firmware's cut), then ``rpm = sqrt(T / k_f)`` with the nominal
    thrust coefficient (the firmware's thrust-to-PWM curve knows no per-vehicle deviation; a
    randomized or mismatched ``k_f`` in the physics then gives a different real thrust).
    """
    thrust_n = (action.clamp(-1.0, 1.0) + 1.0) * (0.5 * max_thrust_n)
    rpm = torch.sqrt(thrust_n * inv_thrust_coef).clamp(max=max_rpm)
    return torch.where(thrust_n >= min_thrust_n, rpm, torch.zeros_like(rpm))


@dataclass(frozen=True)
class RandomizationCfg:
    """Per-env multiplicative ranges ``(low, high)`` on the nominal parameters, drawn uniformly
    at every reset of that env. ``(1.0, 1.0)`` disables a parameter (the default: all off)."""

    mass_scale: tuple[float, float] = ranged((1.0, 1.0), 0.1, 10.0, "x nominal")
    """Scales mass_kg."""
    inertia_scale: tuple[float, float] = ranged((1.0, 1.0), 0.1, 10.0, "x nominal")
    """Scales each principal inertia independently."""
    thrust_coef_scale: tuple[float, float] = ranged((1.0, 1.0), 0.1, 10.0, "x nominal")
    """Scales thrust_coef_n_per_rpm2 (all four rotors alike)."""
    motor_tau_scale: tuple[float, float] = ranged((1.0, 1.0), 0.1, 10.0, "x nominal")
    """Scales motor_tau_s."""

    def __post_init__(self) -> None:
        for name in ("mass_scale", "inertia_scale", "thrust_coef_scale", "motor_tau_scale"):
            low, high = getattr(self, name)
            require_finite("quadrotor randomization", {name: (low, high)})
            if not 0.0 < low <= high:
                raise ConfigError(f"quadrotor randomization: {name} needs 0 < low <= high, got {(low, high)}")

    @property
    def enabled(self) -> bool:
        return any(
            r != (1.0, 1.0) for r in (self.mass_scale, self.inertia_scale, self.thrust_coef_scale, self.motor_tau_scale)
        )

    def ranges(self) -> tuple[tuple[float, float], ...]:
        """Ranges in the column order of :attr:`Quadrotor.param_scales`: mass, Ixx, Iyy, Izz, kf, tau."""
        return (self.mass_scale, *(self.inertia_scale,) * 3, self.thrust_coef_scale, self.motor_tau_scale)


@dataclass(frozen=True)
class QuadrotorCfg:
    """Simulator settings: physics, integration, randomization, ground and bounds."""

    params: QuadrotorParams = field(default_factory=QuadrotorParams)
    """Nominal physical parameters."""
    randomization: RandomizationCfg = field(default_factory=RandomizationCfg)
    """Per-env domain randomization (off by default)."""
    dt_s: float = ranged(0.01, 1e-4, 0.1, "s")
    """Integration period of one :meth:`Quadrotor.step` (the task's control period)."""
    substeps: int = 1
    """RK4 substeps per step; raise it for very fast motors (dt/substeps must stay < 2 tau)."""
    ground_z_m: float | None = ranged(0.0, -100.0, 100.0, "m")
    """World height of the ground plane; ``None`` disables it. Touching it is only flagged
    (:meth:`Quadrotor.below_ground`), the task decides what that means."""
    compile: bool = False
    """Run the physics step through ``torch.compile`` (opt-in: ~15 s or more of cold warm-up,
    then several times faster; compiled once per process and shape). The quad-hover task then
    compiles its whole step (physics, observation, reward, termination)."""

    def __post_init__(self) -> None:
        require_finite("quadrotor", {"dt_s": self.dt_s}, positive=True)
        if self.ground_z_m is not None:
            require_finite("quadrotor", {"ground_z_m": self.ground_z_m})
        if self.substeps < 1:
            raise ConfigError(f"quadrotor: substeps must be >= 1, got {self.substeps}")
        fastest_tau_s = self.params.motor_tau_s * self.randomization.motor_tau_scale[0]
        # RK4 on the linear motor lag is stable for h / tau < 2.78; keep a margin.
        if self.dt_s / self.substeps > 2.0 * fastest_tau_s:
            raise ConfigError(
                f"quadrotor: dt_s/substeps = {self.dt_s / self.substeps:g} s is too long for the fastest motor "
                f"time constant {fastest_tau_s:g} s (needs <= 2 tau); raise substeps"
            )


TERMS_PER_OUTPUT = 4
"""Every output of the bilinear forms below is a sum of at most this many products."""


Tables = tuple[tuple[int, ...], tuple[int, ...], tuple[float, ...]]
"""``(left_idx, right_idx, coef)`` of a bilinear form: index tuples (layout constants) and the
coefficients (which may depend on the physical parameters). Plain Python numbers, so that
``torch.compile`` folds them into the kernel as constants and drops the zero padding."""
PhysicsInputs = tuple[
    torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor,
    tuple[int, ...], tuple[int, ...], tuple[float, ...],
]  # fmt: skip
"""The arguments of :func:`rk4_step` between ``rpm_cmd`` and ``dt_s`` (seven tensors, then the
:data:`Tables`), as :meth:`Quadrotor.physics_inputs` returns them."""


class DerivedParams(NamedTuple):
    """Per-env physical values from the parameter scales (:func:`derived_params`); ``[N, 1]``
    except ``inertia`` and ``inv_inertia`` ``[N, 3]``."""

    mass_kg: torch.Tensor
    inv_mass: torch.Tensor
    inertia: torch.Tensor
    inv_inertia: torch.Tensor
    thrust_coef: torch.Tensor
    thrust_acc_coef: torch.Tensor
    inv_tau: torch.Tensor


def derived_params(param_scales: torch.Tensor, nominal: torch.Tensor) -> DerivedParams:
    """``param_scales [N, 6]`` times ``nominal [6]`` (mass kg, Ixx, Iyy, Izz kg m², thrust
    coefficient N/rpm², motor τ s) and the quotients the physics step reads. Pure: the
    simulator caches it per parameter change, the fused task step computes it in its graph."""
    values = param_scales * nominal
    mass_kg, inertia, thrust_coef = values[:, 0:1], values[:, 1:4], values[:, 4:5]
    inv_mass = 1.0 / mass_kg
    return DerivedParams(
        mass_kg, inv_mass, inertia, 1.0 / inertia, thrust_coef, thrust_coef * inv_mass, 1.0 / values[:, 5:6]
    )


def rk4_inputs(
    params: DerivedParams, gravity_w: torch.Tensor, force_w: torch.Tensor, torque_b: torch.Tensor
) -> tuple[torch.Tensor, ...]:
    """The seven per-env tensors of :data:`PhysicsInputs` from the derived parameters, gravity
    ``[3]`` (world, m/s²), the disturbance force ``force_w [N, 3]`` (N) and torque ``torque_b [N, 3]`` (N m)."""
    return (
        params.thrust_acc_coef,
        params.thrust_coef,
        params.inertia,
        params.inv_inertia,
        params.inv_tau,
        torch.addcmul(gravity_w, force_w, params.inv_mass),
        torque_b * params.inv_inertia,
    )


def _bilinear_tables(terms: list[tuple[int, int, int, float]], out_dim: int) -> Tables:
    """Gather tables for ``out_k = sum coef * a[i] * b[j]`` over ``terms (k, i, j, coef)``.

    Returns ``(left_idx, right_idx, coef)``, each of length ``out_dim * TERMS_PER_OUTPUT``,
    padded with zero-coefficient terms, for :func:`apply_bilinear`. Gathering only the needed
    products keeps the work per env at ~4 products per output instead of a full outer product.
    """
    slots: list[list[tuple[int, int, float]]] = [[] for _ in range(out_dim)]
    for out, i, j, coef in terms:
        slots[out].append((i, j, coef))
    padded = [slot + [(0, 0, 0.0)] * (TERMS_PER_OUTPUT - len(slot)) for slot in slots]
    # Term-major order (term t of every output, then term t + 1): the final sum becomes three
    # adds of contiguous column blocks, much cheaper on CPU than a reduction over a size-4 axis.
    order = [padded[out][t] for t in range(TERMS_PER_OUTPUT) for out in range(out_dim)]
    left = tuple(i for i, _, _ in order)
    right = tuple(j for _, j, _ in order)
    return left, right, tuple(float(c) for _, _, c in order)


@functools.cache
def _index_tensor(index: tuple[int, ...], device: torch.device) -> torch.Tensor:
    return torch.tensor(index, dtype=torch.long, device=device)


@functools.cache
def _coef_tensor(coef: tuple[float, ...], device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    return torch.tensor(coef, dtype=dtype, device=device)


def apply_bilinear(
    a: torch.Tensor, b: torch.Tensor, left_idx: tuple[int, ...], right_idx: tuple[int, ...], coef: tuple[float, ...]
) -> torch.Tensor:
    """``[N, Ka]``, ``[N, Kb]`` -> ``[N, out_dim]`` using tables from :func:`_bilinear_tables`."""
    if torch.compiler.is_compiling():
        # Constant column picks fuse into one vectorized loop under inductor; a gather through
        # an index tensor compiles to bounds-checked scalar loads (several times slower).
        out_dim = len(left_idx) // TERMS_PER_OUTPUT
        outputs: list[torch.Tensor] = []
        for k in range(out_dim):
            terms = [
                a[:, left_idx[n]] * b[:, right_idx[n]] * coef[n]
                for n in range(k, len(left_idx), out_dim)
                if coef[n] != 0.0
            ]
            outputs.append(functools.reduce(torch.add, terms))
        return torch.stack(outputs, dim=1)
    # Eager: two gathers instead of dozens of column ops (launch overhead dominates).
    a_cols = a.index_select(1, _index_tensor(left_idx, a.device))
    b_cols = b.index_select(1, _index_tensor(right_idx, b.device))
    prod = a_cols * b_cols * _coef_tensor(coef, a.device, a.dtype)
    t0, t1, t2, t3 = prod.view(a.shape[0], TERMS_PER_OUTPUT, -1).unbind(1)
    return (t0 + t1) + (t2 + t3)


W, X, Y, Z = 0, 1, 2, 3

# R_wb entries as quadratic forms of a unit quaternion; the diagonal uses w^2+x^2+y^2+z^2 = 1
# so every entry is a sum of products of two quaternion components.
_ROT_TERMS: list[tuple[int, int, int, float]] = [
    (0, W, W, 1), (0, X, X, 1), (0, Y, Y, -1), (0, Z, Z, -1),
    (1, X, Y, 2), (1, W, Z, -2),
    (2, X, Z, 2), (2, W, Y, 2),
    (3, X, Y, 2), (3, W, Z, 2),
    (4, W, W, 1), (4, X, X, -1), (4, Y, Y, 1), (4, Z, Z, -1),
    (5, Y, Z, 2), (5, W, X, -2),
    (6, X, Z, 2), (6, W, Y, -2),
    (7, Y, Z, 2), (7, W, X, 2),
    (8, W, W, 1), (8, X, X, -1), (8, Y, Y, -1), (8, Z, Z, 1),
]  # fmt: skip

ROT_TABLES = _bilinear_tables(_ROT_TERMS, 9)
"""``rot_wb_flat [N, 9] = apply_bilinear(q, q, *ROT_TABLES)`` (row-major R_wb)."""

# q_dot = 0.5 q ⊗ (0, ω) is bilinear in q and ω; (component, q index, ω index, coefficient).
_QDOT_TERMS: list[tuple[int, int, int, float]] = [
    (0, X, 0, -0.5), (0, Y, 1, -0.5), (0, Z, 2, -0.5),
    (1, W, 0, 0.5), (1, Y, 2, 0.5), (1, Z, 1, -0.5),
    (2, W, 1, 0.5), (2, Z, 0, 0.5), (2, X, 2, -0.5),
    (3, W, 2, 0.5), (3, X, 1, 0.5), (3, Y, 0, -0.5),
]  # fmt: skip


def mixer_matrix(params: QuadrotorParams) -> torch.Tensor:
    """``[4, 4]`` map from rotor thrusts (M1..M4, N) to ``(thrust_z, tau_x, tau_y, tau_z)`` in body.

    Row i is rotor i. Rotor i at body ``(r_x, r_y, 0)`` pushing ``(0, 0, f)`` gives torque
    ``(r_y f, -r_x f, 0)`` and a reaction torque ``ROTOR_SPIN[i] * ratio * f`` about z.
    """
    d = params.arm_length_m / math.sqrt(2.0)
    k = params.torque_to_thrust_m
    pos_xy = [(d, -d), (-d, -d), (-d, d), (d, d)]
    rows = [[1.0, ry, -rx, k * s] for (rx, ry), s in zip(pos_xy, ROTOR_SPIN)]
    return torch.tensor(rows, dtype=torch.float64)


def dynamics_tables(params: QuadrotorParams) -> Tables:
    """Bilinear tables over the packed state giving ``[N, 11]`` = (zaxis_w 3, quat_dot 4, wrench / kf 4).

    Every nonlinear product the derivative needs is a product of two state entries: the body z
    axis (third column of R_wb) is quadratic in q, the quaternion rate bilinear in q and ω, and
    the rotor wrench divided by the thrust coefficient is the mixer applied to rpm². Gathering
    them in one pass keeps the eager step at few kernel launches.
    """
    q0, w0, r0 = QUAT.start, ANG_VEL.start, RPM.start
    terms = [(k, q0 + i, q0 + j, c) for (r, i, j, c) in _ROT_TERMS if r in (2, 5, 8) for k in [(2, 5, 8).index(r)]]
    terms += [(3 + out, q0 + i, w0 + j, c) for (out, i, j, c) in _QDOT_TERMS]
    mixer = mixer_matrix(params)
    terms += [(7 + out, r0 + rotor, r0 + rotor, float(mixer[rotor, out])) for out in range(4) for rotor in range(4)]
    return _bilinear_tables(terms, 11)


def quat_to_rot(quat_wb: torch.Tensor) -> torch.Tensor:
    """Unit quaternions ``[N, 4]`` (w, x, y, z) -> row-major rotation matrices ``[N, 9]`` (body -> world)."""
    left, right, coef = ROT_TABLES
    return apply_bilinear(quat_wb, quat_wb, left, right, coef)


def _derivative(state: torch.Tensor, rpm_cmd: torch.Tensor, inputs: tuple[Any, ...]) -> torch.Tensor:
    """Time derivative ``[N, 17]`` of the packed state; ``inputs`` are :func:`rk4_step`'s
    arguments from ``thrust_acc_coef`` to ``coef``, in order."""
    thrust_acc_coef, thrust_coef, inertia, inv_inertia, inv_tau, ext_acc_w, ext_ang_acc_b, left, right, coef = inputs
    products = apply_bilinear(state, state, left, right, coef)
    zaxis_w, quat_dot, thrust_u, torque_u = products.split((3, 4, 1, 3), dim=1)
    lin_acc = torch.addcmul(ext_acc_w, zaxis_w, thrust_u * thrust_acc_coef)
    ang_vel = state[:, ANG_VEL]
    # Euler's equations: I dω/dt = τ - ω × (I ω), the last term being the gyroscopic coupling.
    gyro = torch.linalg.cross(ang_vel, ang_vel * inertia)
    ang_acc = torch.addcmul(ext_ang_acc_b, torque_u * thrust_coef - gyro, inv_inertia)
    rpm_dot = (rpm_cmd - state[:, RPM]) * inv_tau
    return torch.cat((state[:, LIN_VEL], quat_dot, lin_acc, ang_acc, rpm_dot), dim=1)


def rk4_step(
    state: torch.Tensor,
    rpm_cmd: torch.Tensor,
    thrust_acc_coef: torch.Tensor,
    thrust_coef: torch.Tensor,
    inertia: torch.Tensor,
    inv_inertia: torch.Tensor,
    inv_tau: torch.Tensor,
    ext_acc_w: torch.Tensor,
    ext_ang_acc_b: torch.Tensor,
    left: tuple[int, ...],
    right: tuple[int, ...],
    coef: tuple[float, ...],
    dt_s: float,
    substeps: int,
) -> torch.Tensor:
    """Advance the packed state by ``dt_s`` with ``substeps`` classic RK4 steps; pure function.

    Args (``N`` envs):
        state: ``[N, 17]`` packed state (module docstring).
        rpm_cmd: ``[N, 4]`` motor speed setpoints (rpm), held over the step.
        thrust_acc_coef: ``[N, 1]`` thrust coefficient / mass (m/s^2 per rpm^2).
        thrust_coef: ``[N, 1]`` N/rpm^2.
        inertia, inv_inertia: ``[N, 3]`` principal inertia (kg m^2) and its inverse.
        inv_tau: ``[N, 1]`` inverse motor time constant (1/s).
        ext_acc_w: ``[N, 3]`` gravity plus disturbance force / mass, world (m/s^2).
        ext_ang_acc_b: ``[N, 3]`` disturbance torque / inertia, body (rad/s^2).
        left, right, coef: :func:`dynamics_tables` on the device.
    Returns:
        ``[N, 17]`` new state with the quaternion renormalized.
    """
    if torch.compiler.is_compiling():
        return _rk4_rows(
            state,
            rpm_cmd,
            (thrust_acc_coef, thrust_coef, inertia, inv_inertia, inv_tau, ext_acc_w, ext_ang_acc_b),
            left,
            right,
            coef,
            dt_s,
            substeps,
        )
    h = dt_s / substeps
    inputs = (thrust_acc_coef, thrust_coef, inertia, inv_inertia, inv_tau, ext_acc_w, ext_ang_acc_b, left, right, coef)
    for _ in range(substeps):
        k1 = _derivative(state, rpm_cmd, inputs)
        k2 = _derivative(torch.add(state, k1, alpha=0.5 * h), rpm_cmd, inputs)
        k3 = _derivative(torch.add(state, k2, alpha=0.5 * h), rpm_cmd, inputs)
        k4 = _derivative(torch.add(state, k3, alpha=h), rpm_cmd, inputs)
        slope = torch.add(k1, k2 + k3, alpha=2.0) + k4
        state = torch.add(state, slope, alpha=h / 6.0)
        pos, quat, rest = state.split((3, 4, 10), dim=1)
        state = torch.cat((pos, quat * torch.rsqrt(quat.square().sum(dim=1, keepdim=True)), rest), dim=1)
    return state


Rows = list[torch.Tensor]
"""A batch as one ``[N]`` tensor per state component (struct of arrays)."""


def bilinear_rows(a: Rows, b: Rows, left: tuple[int, ...], right: tuple[int, ...], coef: tuple[float, ...]) -> Rows:
    """:func:`apply_bilinear` on rows: ``out_k = sum coef * a[i] * b[j]`` with the same tables."""
    out_dim = len(left) // TERMS_PER_OUTPUT
    return [
        functools.reduce(
            torch.add, [a[left[n]] * b[right[n]] * coef[n] for n in range(k, len(left), out_dim) if coef[n] != 0.0]
        )
        for k in range(out_dim)
    ]


def _derivative_rows(
    s: Rows,
    rpm_cmd: Rows,
    inputs: tuple[Rows, ...],
    left: tuple[int, ...],
    right: tuple[int, ...],
    coef: tuple[float, ...],
) -> Rows:
    """:func:`_derivative` on rows (same tables, same equations), for the compiled step."""
    thrust_acc_coef, thrust_coef, inertia, inv_inertia, inv_tau, ext_acc_w, ext_ang_acc_b = inputs
    products = bilinear_rows(s, s, left, right, coef)
    zaxis_w, quat_dot, thrust_u, torque_u = products[0:3], products[3:7], products[7], products[8:11]
    acc_per_axis = thrust_u * thrust_acc_coef[0]
    lin_acc = [ext_acc_w[i] + zaxis_w[i] * acc_per_axis for i in range(3)]
    w = s[ANG_VEL.start : ANG_VEL.stop]
    iw = [w[i] * inertia[i] for i in range(3)]
    # Euler's equations: I dω/dt = τ - ω × (I ω).
    gyro = [w[1] * iw[2] - w[2] * iw[1], w[2] * iw[0] - w[0] * iw[2], w[0] * iw[1] - w[1] * iw[0]]
    ang_acc = [ext_ang_acc_b[i] + (torque_u[i] * thrust_coef[0] - gyro[i]) * inv_inertia[i] for i in range(3)]
    rpm_dot = [(rpm_cmd[i] - s[RPM.start + i]) * inv_tau[0] for i in range(4)]
    return s[LIN_VEL.start : LIN_VEL.stop] + quat_dot + lin_acc + ang_acc + rpm_dot


def _rk4_rows(
    state: torch.Tensor,
    rpm_cmd: torch.Tensor,
    inputs: tuple[torch.Tensor, ...],
    left: tuple[int, ...],
    right: tuple[int, ...],
    coef: tuple[float, ...],
    dt_s: float,
    substeps: int,
) -> torch.Tensor:
    """:func:`rk4_step` written per state component, used under ``torch.compile``.

    Inductor vectorizes one fused loop over envs far better when every quantity is an ``[N]``
    row than with column picks from the packed ``[N, 17]`` layout, and better still when every
    input and the output are column-major ``[N, K]`` tensors (strides ``(1, N)``), so that each
    row is contiguous memory and no transpose happens at the kernel boundary (faster than
    row-major inputs: docs/benchmarks/simulators.md). Eager mode keeps the packed row-major version,
    whose few large ops suit launch-bound execution.
    """
    # With column-major inputs (``Quadrotor`` keeps them so under compile) these are views.
    s = list(state.t().unbind(0))
    cmd = list(rpm_cmd.t().unbind(0))
    rows = tuple(list(x.t().unbind(0)) for x in inputs)
    # Column-major [N, 17] (one contiguous row per component): the next call reads it as views.
    return torch.stack(rk4_rows(s, cmd, rows, left, right, coef, dt_s, substeps), dim=0).t()


def rk4_rows(
    s: Rows,
    cmd: Rows,
    rows: tuple[Rows, ...],
    left: tuple[int, ...],
    right: tuple[int, ...],
    coef: tuple[float, ...],
    dt_s: float,
    substeps: int,
) -> Rows:
    """:func:`rk4_step` on rows: the 17 state rows, 4 command rows and the seven inputs as rows
    (``[N]`` each); returns the 17 new state rows."""
    h = dt_s / substeps
    for _ in range(substeps):
        k1 = _derivative_rows(s, cmd, rows, left, right, coef)
        k2 = _derivative_rows([x + 0.5 * h * k for x, k in zip(s, k1)], cmd, rows, left, right, coef)
        k3 = _derivative_rows([x + 0.5 * h * k for x, k in zip(s, k2)], cmd, rows, left, right, coef)
        k4 = _derivative_rows([x + h * k for x, k in zip(s, k3)], cmd, rows, left, right, coef)
        s = [x + (h / 6.0) * (a + 2.0 * b + 2.0 * c + d) for x, a, b, c, d in zip(s, k1, k2, k3, k4)]
        q = s[QUAT.start : QUAT.stop]
        inv_norm = torch.rsqrt(q[0] * q[0] + q[1] * q[1] + q[2] * q[2] + q[3] * q[3])
        s[QUAT.start : QUAT.stop] = [c * inv_norm for c in q]
    return s


@functools.cache
def compiled_rk4_step() -> Callable[..., torch.Tensor]:
    """:func:`rk4_step` wrapped in ``torch.compile`` once per process (compiles lazily per shape).

    Shapes stay static: an env keeps its size for its lifetime, and kernels specialized to it
    vectorize better than shape-generic ones.
    """
    compiled = torch.compile(rk4_step, fullgraph=True, dynamic=False)
    called = False

    def step(*args: Any, **kwargs: Any) -> torch.Tensor:
        # Logged on the first call, not when the sim is built: a task whose whole step is fused
        # and compiled ahead (quad-hover) never calls this one.
        nonlocal called
        if not called:
            called = True
            log.info("compiling the quadrotor physics step (this first call takes a while)")
        out: torch.Tensor = compiled(*args, **kwargs)
        return out

    return step


class LayoutTensor:
    """An attribute holding an ``[N, K]`` tensor that is converted to the simulator's layout
    whenever it is assigned: the owner (a :class:`Quadrotor`, or a task stepping one) provides
    ``in_layout`` (:meth:`Quadrotor.in_layout`)."""

    def __init__(self, refresh_params: bool = False) -> None:
        self.refresh_params = refresh_params
        self.private = ""

    def __set_name__(self, owner: type, name: str) -> None:
        self.private = f"_{name}"

    def __get__(self, obj: Any, owner: type | None = None) -> torch.Tensor:
        value: torch.Tensor = getattr(obj, self.private)
        return value

    def __set__(self, obj: Any, value: torch.Tensor) -> None:
        setattr(obj, self.private, obj.in_layout(value))
        if self.refresh_params:
            obj.refresh_params()


class Quadrotor:
    """``num_envs`` quadrotors with per-env parameters and disturbances on one device.

    Attributes (properties, see :meth:`in_layout`): ``state [N, 17]``, ``param_scales [N, 6]``,
    ``force_w [N, 3]``, ``torque_b [N, 3]``.
    """

    def __init__(self, cfg: QuadrotorCfg, num_envs: int, device: torch.device, generator: torch.Generator) -> None:
        if num_envs < 1:
            raise ConfigError(f"num_envs must be >= 1, got {num_envs}")
        self.cfg = cfg
        self.num_envs = num_envs
        self.device = torch.device(device)
        self.generator = generator
        self.column_major = cfg.compile
        """Keep every per-env ``[N, K]`` tensor column-major (strides ``(1, N)``) for the
        compiled step (:func:`_rk4_rows`); row-major for the eager one. Assigning a tensor of
        the other layout to ``state``, ``force_w``, ``torque_b`` or ``param_scales`` converts it,
        so callers never see a recompile for a stride change."""
        p = cfg.params
        f32 = torch.float32
        self.nominal = torch.tensor(
            [p.mass_kg, *p.inertia_kgm2, p.thrust_coef_n_per_rpm2, p.motor_tau_s], dtype=f32, device=self.device
        )  # [6], column order of param_scales
        ranges = torch.tensor(cfg.randomization.ranges(), dtype=f32, device=self.device)  # [6, 2]
        self._scale_low = ranges[:, 0]
        self._scale_span = ranges[:, 1] - ranges[:, 0]
        self.tables: Tables = dynamics_tables(p)
        """:func:`dynamics_tables` of the nominal parameters."""
        self.rot_tables: Tables = ROT_TABLES
        """ROT_TABLES on the device."""
        self.gravity_w = torch.tensor([0.0, 0.0, -p.gravity_mps2], dtype=f32, device=self.device)
        initial = torch.zeros(num_envs, STATE_DIM, dtype=f32, device=self.device)
        initial[:, 3] = 1.0
        self.state = initial
        self.param_scales = torch.ones(num_envs, 6, dtype=f32, device=self.device)
        self.force_w = torch.zeros(num_envs, 3, dtype=f32, device=self.device)
        self.torque_b = torch.zeros(num_envs, 3, dtype=f32, device=self.device)
        # Reused output of the command clamp, already in the compiled step's layout.
        self._rpm_cmd_rows = torch.empty(4, num_envs, dtype=f32, device=self.device)
        self._step_fn: Callable[..., torch.Tensor] = compiled_rk4_step() if cfg.compile else rk4_step

    # ----------------------------------------------------------------- layout
    def in_layout(self, x: torch.Tensor) -> torch.Tensor:
        """``x [N, K]`` in this simulator's layout (a copy only when it differs)."""
        if self.column_major:
            return x if x.stride(0) == 1 and x.stride(1) == x.shape[0] else x.t().contiguous().t()
        return x.contiguous()

    state = LayoutTensor()
    """``[N, 17]`` packed state (module docstring); the views below slice it."""
    force_w = LayoutTensor()
    """``[N, 3]`` disturbance force in world (N)."""
    torque_b = LayoutTensor()
    """``[N, 3]`` disturbance torque in body (N m)."""
    param_scales = LayoutTensor(refresh_params=True)
    """``[N, 6]`` multipliers of the nominal (mass, Ixx, Iyy, Izz, kf, tau); assigning refreshes
    the derived tensors, call :meth:`refresh_params` after writing it in place."""

    # ----------------------------------------------------------------- parameters
    def refresh_params(self) -> None:
        """Recompute the derived per-env tensors the physics step reads; call after writing
        ``param_scales`` in place."""
        self.derived = DerivedParams(*(self.in_layout(x) for x in derived_params(self.param_scales, self.nominal)))
        """:func:`derived_params` of the current scales, in the simulator's layout."""

    @property
    def mass_kg(self) -> torch.Tensor:
        """``[N, 1]`` per-env mass (kg)."""
        return self.derived.mass_kg

    @property
    def inv_mass(self) -> torch.Tensor:
        """``[N, 1]`` 1 / mass (1/kg)."""
        return self.derived.inv_mass

    @property
    def thrust_coef(self) -> torch.Tensor:
        """``[N, 1]`` per-env thrust coefficient (N/rpm²)."""
        return self.derived.thrust_coef

    def randomize(self, mask: torch.Tensor | None = None) -> None:
        """Redraw the parameter scales of envs where ``mask [N] bool`` (all if None).

        Draws nothing (and consumes no random numbers) when randomization is disabled.
        """
        if not self.cfg.randomization.enabled:
            return
        scales = self.sample_param_scales(self.num_envs)
        # Masked-out rows keep their scales; the setter refreshes the derived tensors.
        self.param_scales = scales if mask is None else torch.where(mask.unsqueeze(1), scales, self.param_scales)

    def sample_param_scales(self, count: int) -> torch.Tensor:
        """``[count, 6]`` draws from the randomization ranges (inertia axes independent);
        ones, without consuming random numbers, when randomization is disabled."""
        if not self.cfg.randomization.enabled:
            return torch.ones(count, 6, device=self.device)
        u = torch.rand(count, 6, generator=self.generator, device=self.device)
        return self._scale_low + u * self._scale_span

    def hover_rpm(self) -> torch.Tensor:
        """``[N, 1]`` per-env motor speed that balances gravity with the current parameters."""
        return torch.sqrt(self.mass_kg * self.cfg.params.gravity_mps2 / (4.0 * self.thrust_coef))

    # ----------------------------------------------------------------- state views
    @property
    def position_w(self) -> torch.Tensor:
        return self.state[:, POS]

    @property
    def quat_wb(self) -> torch.Tensor:
        return self.state[:, QUAT]

    @property
    def lin_vel_w(self) -> torch.Tensor:
        return self.state[:, LIN_VEL]

    @property
    def ang_vel_b(self) -> torch.Tensor:
        return self.state[:, ANG_VEL]

    @property
    def motor_rpm(self) -> torch.Tensor:
        return self.state[:, RPM]

    def rot_wb(self) -> torch.Tensor:
        """``[N, 9]`` row-major rotation matrices body -> world of the current attitudes."""
        quat = self.state[:, QUAT]
        return apply_bilinear(quat, quat, *self.rot_tables)

    def below_ground(self) -> torch.Tensor:
        """``[N] bool``: centre of mass at or below the ground plane (all False without a ground)."""
        if self.cfg.ground_z_m is None:
            return torch.zeros(self.num_envs, dtype=torch.bool, device=self.device)
        return self.state[:, 2] <= self.cfg.ground_z_m

    # ----------------------------------------------------------------- stepping
    def rpm_cmd_from_action(self, action: torch.Tensor) -> torch.Tensor:
        """``[N, 4]`` rpm setpoints for policy actions ``[N, 4]`` (:func:`action_to_rpm_cmd`)."""
        p = self.cfg.params
        return action_to_rpm_cmd(
            action, p.max_thrust_per_motor_n, p.min_thrust_per_motor_n, 1.0 / p.thrust_coef_n_per_rpm2, p.max_rpm
        )

    def step(self, rpm_cmd: torch.Tensor) -> torch.Tensor:
        """Advance ``dt_s`` holding ``rpm_cmd [N, 4]`` (clamped to [0, max_rpm]); returns the new state."""
        if self.column_major:  # one op that clamps and transposes into the reused buffer
            rpm_cmd = torch.clamp(rpm_cmd.t(), 0.0, self.cfg.params.max_rpm, out=self._rpm_cmd_rows).t()
        else:
            rpm_cmd = rpm_cmd.clamp(0.0, self.cfg.params.max_rpm)
        self.state = self._step_fn(self.state, rpm_cmd, *self.physics_inputs(), self.cfg.dt_s, self.cfg.substeps)
        return self.state

    def physics_inputs(self) -> PhysicsInputs:
        """The per-env and table arguments of :func:`rk4_step` after ``state`` and ``rpm_cmd``,
        for callers that fuse the physics into a larger pure function."""
        p = rk4_inputs(self.derived, self.gravity_w, self.force_w, self.torque_b)
        return (p[0], p[1], p[2], p[3], p[4], self.in_layout(p[5]), self.in_layout(p[6]), *self.tables)

    def state_dict(self) -> dict[str, torch.Tensor]:
        """Physics state, parameter scales and disturbances (clones)."""
        return {
            "state": self.state.clone(),
            "param_scales": self.param_scales.clone(),
            "force_w": self.force_w.clone(),
            "torque_b": self.torque_b.clone(),
        }

    def load_state_dict(self, sd: dict[str, torch.Tensor]) -> None:
        for key in ("state", "param_scales", "force_w", "torque_b"):
            expected = getattr(self, key).shape
            if sd[key].shape != expected:
                raise ConfigError(f"quadrotor state {key!r}: shape {tuple(sd[key].shape)} != {tuple(expected)}")
        self.state = sd["state"].to(self.device, torch.float32).clone()
        self.param_scales = sd["param_scales"].to(self.device, torch.float32).clone()
        self.force_w = sd["force_w"].to(self.device, torch.float32).clone()
        self.torque_b = sd["torque_b"].to(self.device, torch.float32).clone()
