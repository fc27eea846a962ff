"""``quad-hover``: fly a Crazyflie-class quadrotor to a setpoint and hold it (after L2F).

Episodes start from L2F's distribution (10 % level at the setpoint, the rest displaced, tilted,
moving and spinning), last 500 control steps of 10 ms, and end early when any position axis
leaves a box around the setpoint. Observation and action layouts follow ``docs/conventions.md``
so the firmware can assemble the same observation on board.

Every episode draws a setpoint yaw ``yaw_sp_rad`` per env (uniform in
``setpoint_yaw_rad ± setpoint_yaw_range_rad``) and an initial yaw relative to it (uniform in
``± init_yaw_range_rad``, before the random tilt). The policy observation is expressed in the
setpoint's heading frame (``tasks/quadrotor/terms.py``, docs/conventions.md), so the full yaw range is
one task to the policy.

Optional position-error integral (``pos_err_integral: true``): a per-env state
``pos_err_int_h [N, 3]`` (m*s, heading frame) that is zero at every episode start and, after each
physics step, is updated from the new (noise-free) position error ``e = R_whᵀ (pos_w - setpoint_w)``::

    I <- clamp(decay * I + dt_s * e, -limit, +limit)      per axis, float32

in exactly this order (two products, one sum, then the clamp); ``dt_s`` is the control period,
``decay = pos_err_integral_decay`` and ``limit = pos_err_integral_limit_ms``. The observation
right after a reset therefore carries ``I = 0``, the one after the first step ``dt_s * e_1``.
The firmware (``firmware/common/quad_ctrl.c``) and the ROS 2 ``integrate`` op
(``real/observation.py``) implement the same rule from ``policy_io.json``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from embodied.config import ConfigError, ranged, to_plain
from embodied.env import ObsDict, StepResult
from embodied.io_spec import ActionField, IOSpec, obs_fields, terms_dim
from embodied.sim.counter_normal import stream_key
from embodied.sim.quadrotor import (
    ANG_VEL,
    LIN_VEL,
    POS,
    QUAT,
    ROTOR_SPIN,
    RPM,
    LayoutTensor,
    Quadrotor,
    QuadrotorCfg,
    require_finite,
)
from embodied.tasks.quadrotor.gaps import DRAW, GAP_CRITIC_DIM, QuadGapCfg, QuadGaps
from embodied.tasks.quadrotor.gaps import STATE_KEYS as GAP_STATE_KEYS
from embodied.tasks.quadrotor.hover_core import (
    POOL,
    CoreConsts,
    compiled_step_core,
    critic_static_inputs,
    ends_in_success,
    finite,
    heading_errors,
    observation,
    quat_multiply,
    step_core,
    sum_terms,
)
from embodied.tasks.quadrotor.hover_fused import FusedConsts, compiled_fused_step
from embodied.tasks.quadrotor.terms import (
    STATE_DIM,
    heading_cos_sin,
    noise_std_row,
    policy_terms,
    yaw_flip_action,
    yaw_flip_obs,
    yaw_symmetry_tables,
)

POLICY_STATE_DIM = STATE_DIM
"""pos_err_h (3) + rot_hb (9) + lin_vel_h (3) + ang_vel_b (3) (``quadrotor.terms.STATE_TERMS``)."""
CRITIC_STATIC_DIM = 6 + 6
"""Per-episode critic inputs: parameter scales - 1 (6), normalized disturbance force and torque (6)."""
CRITIC_DIM = POLICY_STATE_DIM + 4 + CRITIC_STATIC_DIM
"""Noise-free state, normalized motor speeds (4), parameter scales - 1 (6), disturbance force/torque (6);
``QuadHoverCfg.critic_dim`` adds the position-error integral (3) when it is enabled."""
POS_ERR_INT_DIM = 3
"""Size of the optional ``pos_err_int_h`` field (heading x, y, z)."""

ENVELOPE_MAX_TILT_RAD = 1.6
"""Tilt bound written to ``extra.envelope``: the initial attitudes reach 90° and recoveries
overshoot a little; beyond this the policy has not been trained."""
ENVELOPE_ANG_VEL_RAD_S = math.radians(2000.0)
"""Body-rate bound (norm) written to ``extra.envelope.ang_vel_rad_s``: the Crazyflie's BMI088 gyro
full scale (±2000 °/s, ``SENSORS_BMI088_GYRO_FS_CFG`` in crazyflie-firmware's
``sensors_bmi088_bmp3xx.c``), beyond which the measured rate, and so the observation, saturates.
Trained policies visit far more than the initial rates: the default hover policy turns to its
heading at up to ~17 rad/s of yaw rate (p99.9 per step) and recovers from 90° tilts at ~20 rad/s
roll/pitch (episode maxima), so a bound from the initial rates cut the motors in normal flight
(docs/benchmarks/ros2-dds.md, "Gap hold")."""
ENVELOPE_LIN_VEL_MARGIN_MPS = 2.0
"""Added to the largest initial speed per axis for ``extra.envelope.lin_vel_m_s``."""

CONVENTIONS: dict[str, str] = {
    "world_frame": "right-handed, z up, gravity along -z",
    "body_frame": "FLU: x forward, y left, z up",
    "quaternion": "(w, x, y, z), body -> world",
    "rotation_matrix": "R_hb = R_wh^T R_wb (body -> heading), row-major",
    "heading_frame": "world rotated about z by the setpoint yaw: R_wh = Rz(yaw_sp_rad)",
    "lin_vel": "heading frame, m/s",
    "ang_vel": "body frame, rad/s",
    "motor_order": "M1 front-right CCW, M2 back-right CW, M3 back-left CCW, M4 front-left CW (seen from above)",
    "action": "thrust command T = (a + 1) / 2 * max_thrust_per_motor_n per motor (N), M1..M4; "
    "T < min_thrust_per_motor_n gives no thrust",
}


@dataclass(frozen=True)
class QuadHoverCfg:
    """Hover task settings; defaults follow L2F (REFERENCE.md) without its curriculum."""

    sim: QuadrotorCfg = field(default_factory=QuadrotorCfg)
    """Simulator: physical parameters, randomization, integration, ground, compile."""
    gaps: QuadGapCfg = field(default_factory=QuadGapCfg)
    """Reality-gap models (delays, estimator and gyro errors, thrust mismatch, battery sag,
    ground effect, body drag; ``tasks/quadrotor/gaps.py``), all off by default."""
    episode_steps: int = 500
    """Control steps per episode (5 s at the 10 ms control period)."""
    setpoint_w: tuple[float, float, float] = ranged((0.0, 0.0, 1.0), -1000.0, 1000.0, "m")
    """Target position in world (m); 1 m up keeps the whole termination box above the ground."""
    action_history: int = 1
    """H: number of previous actions in the policy observation (newest first)."""
    init_level_fraction: float = ranged(0.1, 0.0, 1.0)
    """Fraction of episodes that start exactly at the setpoint, level and at rest."""
    init_pos_range_m: float = ranged(0.2, 0.0, 10.0, "m")
    """Other episodes start uniformly within ± this per axis around the setpoint."""
    init_max_angle_rad: float = ranged(math.pi / 2, 0.0, math.pi, "rad", angle=True)
    """Initial attitude: rotation about a uniformly random axis by up to this angle (bounds the tilt)."""
    init_lin_vel_mps: float = ranged(1.0, 0.0, 20.0, "m/s")
    """Initial linear velocity uniform within ± this per world axis."""
    init_ang_vel_rad_s: float = ranged(1.0, 0.0, 50.0, "rad/s")
    """Initial angular velocity uniform within ± this per body axis."""
    setpoint_yaw_rad: float = ranged(0.0, -math.pi, math.pi, "rad", angle=True)
    """Centre of the setpoint yaw distribution (rad, world)."""
    setpoint_yaw_range_rad: float = ranged(math.pi, 0.0, math.pi, "rad", angle=True)
    """Setpoint yaw uniform within ± this around ``setpoint_yaw_rad`` per episode; 0 fixes it."""
    init_yaw_range_rad: float = ranged(math.pi, 0.0, math.pi, "rad", angle=True)
    """Initial yaw relative to the setpoint yaw, uniform within ± this (the whole circle by
    default: a real vehicle may start at any heading relative to its target)."""
    obs_noise_std: tuple[float, float, float, float] = ranged(
        (0.001, 0.001, 0.002, 0.002), 0.0, 1.0, "m, -, m/s, rad/s"
    )
    """Gaussian noise σ on the policy's pos_err_h, rot_hb, lin_vel_h, ang_vel_b (L2F values)."""
    disturbance_force_std_n: float = ranged(0.0132, 0.0, 100.0, "N")
    """Per-episode constant world force on each env, N(0, σ) per axis."""
    disturbance_torque_std_nm: float = ranged(2.6e-5, 0.0, 10.0, "N m")
    """Per-episode constant body torque on each env, N(0, σ) per axis."""
    reward_constant: float = 2.0
    """Alive bonus added every step."""
    reward_scale: float = 0.5
    """Multiplies the sum of weighted costs below (L2F: r = c - scale * costs)."""
    pos_weight: float = 10.0
    """Weight of ||pos_err||^2 (m^2)."""
    pos_bonus_weight: float = 0.0
    """Weight of the precision bonus exp(-||pos_err||^2 / (2 r^2)), r = ``pos_bonus_radius_m``:
    steepest between r and 2r, so it rewards the last centimetres where the squared cost is
    flat. Added to the reward (not scaled by ``reward_scale``); 0 leaves it out."""
    pos_bonus_radius_m: float = ranged(0.05, 1e-3, 10.0, "m")
    """Width r of the precision bonus (m)."""
    orientation_weight: float = 5.0
    """Weight of the tilt cost q_x^2 + q_y^2 of R_hb ((1 - cos tilt) / 2: 0 level, 1 upside down)."""
    yaw_symmetry: bool = True
    """Use the X quadrotor's exact 180° yaw symmetry (docs/conventions.md): when the body x axis
    points away from the setpoint heading (``R_hb[0][0] < 0``) the policy sees the observation of
    the body turned by π with motors relabelled M1<->M3, M2<->M4, and its action is relabelled
    back before it reaches the motors. The policy then only meets heading errors within ±90°.
    ``policy_io.json`` declares it (``extra.yaw_symmetry``) and the exported ONNX/C policy
    contains it, so deployments feed the physical observation unchanged."""
    yaw_weight: float = 5.0
    """Weight of the heading error to the setpoint yaw, ``q_z²`` of R_hb (0 aligned, 1 at 180°).
    Equal to ``orientation_weight`` this is L2F's ``1 - q_w²`` cost. With ``yaw_symmetry`` the
    heading error counts modulo 180° (``quadrotor.terms.yaw_cost_mod_pi``): the policy cannot tell
    the two ends of the body x axis apart, and physically they are the same vehicle."""
    lin_vel_weight: float = 0.1
    """Weight of ||lin_vel_w||^2."""
    action_weight: float = 0.1
    """Weight of ||action - hover_action||^2."""
    termination_penalty: float = 0.0
    """Subtracted once on the step an episode terminates early."""
    position_bound_m: float = ranged(0.6, 0.01, 100.0, "m")
    """Terminate when any axis of the position error exceeds this."""
    success_radius_m: float = ranged(0.1, 1e-3, 100.0, "m")
    """Success: distance to the setpoint at the end of a full-length episode below this."""
    success_max_tilt_rad: float = ranged(math.radians(10.0), 0.0, math.pi, "rad", angle=True)
    """Success: tilt (angle between body z and world z) at the end below this."""
    pos_err_integral: bool = False
    """Add ``pos_err_int_h`` (leaky, clamped integral of the position error; module docstring)
    to the policy and critic observations, so a policy can cancel the constant disturbance force."""
    pos_err_integral_limit_ms: float = ranged(0.5, 1e-3, 100.0, "m s")
    """Clamp of each integral axis (m*s). With the default 2 s time constant the steady-state
    integral is 2 s * error, so 0.5 m*s saturates only at a 0.25 m persistent error: three times
    the ~0.08 m offset the disturbance leaves (0.16 m*s). It bounds the wind-up of large errors
    (it would reach 1.2 m*s at the 0.6 m box edge), so a transient cannot leave an integral that
    dwarfs the other observation entries or takes many seconds to unwind."""
    randomization_ramp: float = ranged(0.0, 0.0, 1.0, "of training")
    """Curriculum: the fraction of training (of ``trainer.total_env_steps``) over which every
    per-episode draw of the parameter randomization (``sim.randomization``) and of the gap models
    (delays, thrust mismatch, battery sag, position and gyro biases) grows linearly from the
    nominal vehicle to its configured range. A draw ``x`` is used as ``nominal + s (x - nominal)``
    with ``s = min(1, progress / ramp)`` (``progress`` counted from ``randomization_ramp_start``;
    delays rounded to whole steps); white noise, drag and ground effect are not scaled. 0 (default): full ranges from the start. Only the training
    env ramps (the trainer reports its progress); envs built for ``eval`` or ``verify`` always
    draw from the full ranges."""
    critic_gap_inputs: bool = False
    """Give the critic the episode's gap-model draws (``QuadGaps.critic_inputs``: observation and
    motor delay, per-motor thrust mismatch; 6 entries after the 12 static ones), so its value
    estimate need not guess from the delayed, noisy trajectory what vehicle this episode flies.
    The policy does not see them (the real vehicle does not know them). Zeros without gaps."""
    randomization_ramp_start: float = ranged(0.0, 0.0, 1.0, "of training")
    """Curriculum: the fraction of training before ``randomization_ramp`` begins (the nominal
    vehicle until then), so the policy first learns to hover the vehicle it can learn fastest and
    only then meets the gap models. The scale is ``clip((progress - start) / ramp, 0, 1)``; with
    ``randomization_ramp`` 0 a start > 0 switches the full ranges on at that fraction."""
    pos_err_integral_decay: float = ranged(0.995, 0.0, 1.0, "per step")
    """Leak per control step in (0, 1] (1 = pure integrator). 0.995 at 10 ms is a time constant
    dt / (1 - decay) = 2 s: a few seconds, so the integral settles within an episode (5 s) and
    forgets the initial transient."""

    def __post_init__(self) -> None:
        def need(ok: bool, msg: str) -> None:
            if not ok:
                raise ConfigError(f"quad-hover: {msg}")

        need(self.episode_steps >= 1, f"episode_steps must be >= 1, got {self.episode_steps}")
        finite = {
            k: getattr(self, k)
            for k in (
                "setpoint_w",
                "setpoint_yaw_rad",
                "setpoint_yaw_range_rad",
                "init_yaw_range_rad",
                "init_level_fraction",
                "init_pos_range_m",
                "init_max_angle_rad",
                "init_lin_vel_mps",
                "init_ang_vel_rad_s",
                "obs_noise_std",
                "disturbance_force_std_n",
                "disturbance_torque_std_nm",
                "reward_constant",
                "reward_scale",
                "pos_weight",
                "pos_bonus_weight",
                "pos_bonus_radius_m",
                "orientation_weight",
                "yaw_weight",
                "lin_vel_weight",
                "action_weight",
                "termination_penalty",
                "position_bound_m",
                "success_radius_m",
                "success_max_tilt_rad",
                "pos_err_integral_decay",
                "randomization_ramp",
                "randomization_ramp_start",
            )
        }
        require_finite("quad-hover", {k: tuple(v) if isinstance(v, list) else v for k, v in finite.items()})
        for name in ("setpoint_yaw_range_rad", "init_yaw_range_rad"):
            need(0.0 <= getattr(self, name) <= math.pi, f"{name} must be in [0, pi], got {getattr(self, name)}")
        need(self.action_history >= 0, f"action_history must be >= 0, got {self.action_history}")
        need(0.0 <= self.init_level_fraction <= 1.0, "init_level_fraction must be in [0, 1]")
        for name in (
            "init_pos_range_m",
            "init_max_angle_rad",
            "init_lin_vel_mps",
            "init_ang_vel_rad_s",
            "disturbance_force_std_n",
            "disturbance_torque_std_nm",
            "reward_scale",
            "termination_penalty",
            "pos_bonus_weight",
        ):
            need(getattr(self, name) >= 0.0, f"{name} must be >= 0, got {getattr(self, name)}")
        need(min(self.obs_noise_std) >= 0.0, f"obs_noise_std must be >= 0, got {self.obs_noise_std}")
        need(self.init_max_angle_rad <= math.pi, "init_max_angle_rad must be <= pi")
        need(self.position_bound_m > 0.0, "position_bound_m must be > 0")
        need(self.pos_bonus_radius_m > 0.0, f"pos_bonus_radius_m must be > 0, got {self.pos_bonus_radius_m}")
        need(
            self.init_pos_range_m < self.position_bound_m,
            f"init_pos_range_m ({self.init_pos_range_m}) must be below position_bound_m ({self.position_bound_m})",
        )
        need(self.success_radius_m > 0.0 and self.success_max_tilt_rad > 0.0, "success thresholds must be > 0")
        need(
            math.isfinite(self.pos_err_integral_limit_ms) and self.pos_err_integral_limit_ms > 0.0,
            f"pos_err_integral_limit_ms must be a finite number > 0, got {self.pos_err_integral_limit_ms}",
        )
        need(
            0.0 <= self.randomization_ramp <= 1.0,
            f"randomization_ramp must be in [0, 1] (a fraction of training), got {self.randomization_ramp}",
        )
        need(
            0.0 <= self.randomization_ramp_start <= 1.0,
            f"randomization_ramp_start must be in [0, 1] (a fraction of training), got {self.randomization_ramp_start}",
        )
        need(
            0.0 < self.pos_err_integral_decay <= 1.0,
            f"pos_err_integral_decay must be in (0, 1] (1 = pure integrator), got {self.pos_err_integral_decay}",
        )
        ground = self.sim.ground_z_m
        need(
            ground is None or self.setpoint_w[2] - self.position_bound_m > ground,
            f"setpoint_w z ({self.setpoint_w[2]}) minus position_bound_m ({self.position_bound_m}) must stay above "
            f"the ground at z={ground} so no episode can reach the ground before the bound terminates it",
        )

    @property
    def integral_dim(self) -> int:
        """3 with ``pos_err_integral``, else 0."""
        return POS_ERR_INT_DIM if self.pos_err_integral else 0

    @property
    def policy_terms(self) -> tuple[Any, ...]:
        """The policy observation's terms (``quadrotor.terms.policy_terms``), in order."""
        return policy_terms(self.pos_err_integral, self.action_history)

    @property
    def obs_dim(self) -> int:
        """Size of the policy observation: 18 (+ 3 with the integral) + 4 H."""
        return terms_dim(self.policy_terms)

    @property
    def critic_dim(self) -> int:
        """Size of the critic observation: 34 (+ 3 with the integral, + 6 with ``critic_gap_inputs``)."""
        return CRITIC_DIM - CRITIC_STATIC_DIM + self.critic_static_dim + self.integral_dim

    @property
    def critic_static_dim(self) -> int:
        """Per-episode critic inputs: 12 (+ 6 with ``critic_gap_inputs``)."""
        return CRITIC_STATIC_DIM + (GAP_CRITIC_DIM if self.critic_gap_inputs else 0)


class QuadHover:
    """``num_envs`` hover episodes on the built-in quadrotor; implements :class:`embodied.env.VecEnv`.

    Observation groups: ``"policy"`` ``[N, 18 + 4H]`` (conventions.md layout, noisy) and
    ``"critic"`` ``[N, 34]`` (noise-free state 18, motor speeds mapped to [-1, 1] 4, parameter
    scales - 1 6, disturbance force and torque divided by their σ 6). Actions ``[N, 4]`` in [-1, 1].
    With ``pos_err_integral`` both groups get ``pos_err_int_h`` (3, noise-free) right after the
    18 state entries: policy ``[N, 21 + 4H]``, critic ``[N, 37]``.
    With ``yaw_symmetry`` (default) the policy group is the canonical observation (relabelled
    where ``R_hb[0][0] < 0``, :attr:`yaw_flip`) and actions are taken in the same labels; the
    critic group stays physical.
    """

    action_hist = LayoutTensor()
    """``[N, 4H]`` previous actions, newest first. Like the integral it is kept in the
    simulator's layout on every assignment, so the compiled step's stride guards never fail."""
    pos_err_int_h = LayoutTensor()
    """``[N, 3]`` leaky integral of the position error (m*s, heading frame); stays zero unless
    ``cfg.pos_err_integral``."""
    heading = LayoutTensor()
    """``[N, 2]`` (cos, sin) of each env's setpoint yaw (``quadrotor.terms.heading_cos_sin``)."""

    fusable: bool = True
    """The step may run as one compiled function (:mod:`embodied.tasks.quadrotor.hover_fused`); a
    subclass whose step hooks (setpoint, success, resets) differ sets False."""
    physical_actions: bool = False
    """Set True by drivers whose actions come from a controller that builds its own observation
    from :meth:`physical_state` (firmware software-in-the-loop, sim-robot): they are already in
    M1..M4 labels, so ``step`` applies them as given instead of undoing the yaw-symmetry flip of
    the observation it returned."""

    def __init__(self, cfg: QuadHoverCfg, num_envs: int, device: torch.device, seed: int) -> None:
        self.cfg = cfg
        self.num_envs = int(num_envs)
        self.device = torch.device(device)
        self.dt = cfg.sim.dt_s
        self.max_episode_steps = cfg.episode_steps
        self.action_dim = 4
        self.obs_spec: dict[str, tuple[int, ...]] = {"policy": (cfg.obs_dim,), "critic": (cfg.critic_dim,)}
        self.generator = torch.Generator(device=self.device)
        self.generator.manual_seed(seed)
        self.sim = Quadrotor(cfg.sim, self.num_envs, self.device, self.generator)

        p = cfg.sim.params
        f32 = torch.float32
        self.hover_action = p.hover_action
        self._rpm_per_action = 0.5 * p.max_rpm
        self._setpoint_w = torch.tensor(cfg.setpoint_w, dtype=f32, device=self.device)
        self._terms = cfg.policy_terms
        self._noise_std = torch.tensor(noise_std_row(self._terms, cfg.obs_noise_std), dtype=f32, device=self.device)
        self._noisy = max(cfg.obs_noise_std) > 0.0
        self._disturb_std = torch.tensor(
            [cfg.disturbance_force_std_n] * 3 + [cfg.disturbance_torque_std_nm] * 3, dtype=f32, device=self.device
        )
        # Critic scaling of the disturbances: unit variance when enabled, raw when disabled.
        self._disturb_norm = 1.0 / torch.where(
            self._disturb_std > 0, self._disturb_std, torch.ones_like(self._disturb_std)
        )
        self._cos_success_tilt = math.cos(cfg.success_max_tilt_rad)
        self._no_success = torch.zeros((), dtype=torch.bool, device=self.device)
        k = -cfg.reward_scale
        self._consts = CoreConsts(
            dt_s=cfg.sim.dt_s,
            substeps=cfg.sim.substeps,
            rpm_per_action=self._rpm_per_action,
            max_thrust_n=p.max_thrust_per_motor_n,
            min_thrust_n=p.min_thrust_per_motor_n,
            inv_thrust_coef=1.0 / p.thrust_coef_n_per_rpm2,
            max_rpm=p.max_rpm,
            hover_action=self.hover_action,
            k_pos=k * cfg.pos_weight,
            pos_bonus=cfg.pos_bonus_weight,
            pos_bonus_inv_2r2=1.0 / (2.0 * cfg.pos_bonus_radius_m**2),
            k_ori=k * cfg.orientation_weight,
            k_yaw=k * cfg.yaw_weight,
            yaw_mod_pi=cfg.yaw_symmetry,
            k_vel=k * cfg.lin_vel_weight,
            k_act=k * cfg.action_weight,
            alive=cfg.reward_constant,
            termination_penalty=cfg.termination_penalty,
            position_bound_m=cfg.position_bound_m,
            max_episode_steps=cfg.episode_steps,
            history=cfg.action_history,
            integral=cfg.pos_err_integral,
            integral_decay=cfg.pos_err_integral_decay,
            integral_limit_ms=cfg.pos_err_integral_limit_ms,
        )
        self._core: Callable[..., dict[str, Any]] = compiled_step_core() if cfg.sim.compile else step_core
        self._host_checks = self.device.type == "cpu"
        """Data-dependent branches (skip the reset when no env ended, index only ended envs) are
        free on CPU; elsewhere every step takes the branch-free path and never syncs."""
        self._hover_rpm_nominal = p.hover_rpm
        # On CPU, episodes restart from a pool of pre-drawn initial conditions (state, parameter
        # scales, disturbances) refilled in bulk: a handful of ops per reset instead of ~40.
        self._pool_size = max(1024, 4 * self.num_envs)
        self._pool = torch.zeros(0, self._pool_width, dtype=f32, device=self.device)
        self._pool_cursor = 0
        self._critic_static = torch.zeros(self.num_envs, cfg.critic_static_dim, dtype=f32, device=self.device)
        """``[N, 12 (+6)]`` per-episode critic inputs: parameter scales - 1, normalized disturbances
        (and the gap-model draws with ``cfg.critic_gap_inputs``)."""

        self.action_hist = torch.zeros(self.num_envs, 4 * cfg.action_history, dtype=f32, device=self.device)
        self.episode_step = torch.zeros(self.num_envs, dtype=torch.long, device=self.device)
        """``[N]`` steps taken in the current episode."""
        self.pos_err_int_h = torch.zeros(self.num_envs, POS_ERR_INT_DIM, dtype=f32, device=self.device)
        self.yaw_sp_rad = torch.zeros(self.num_envs, dtype=f32, device=self.device)
        """``[N]`` setpoint yaw of each env's episode (rad, world)."""
        self.heading = heading_cos_sin(self.yaw_sp_rad)
        self._yaw_sym = yaw_symmetry_tables(self._terms) if cfg.yaw_symmetry else None
        self._flip_source = torch.tensor(
            [] if self._yaw_sym is None else self._yaw_sym["obs_source"], dtype=torch.long, device=self.device
        )
        self._flip_sign = torch.tensor(
            [] if self._yaw_sym is None else self._yaw_sym["obs_sign"], dtype=f32, device=self.device
        )
        self.yaw_flip = torch.zeros(self.num_envs, 1, dtype=torch.bool, device=self.device)
        """``[N, 1]``: the policy's last observation was relabelled (``cfg.yaw_symmetry``), so its
        next action is relabelled back before the motors."""
        self.gaps = (
            QuadGaps(
                cfg.gaps, self.num_envs, cfg.episode_steps, STATE_DIM, self.hover_action, self.device, self.generator
            )
            if cfg.gaps.enabled
            else None
        )
        """Reality-gap state, or None when every gap model is off."""
        self._no_gap_state = tuple(torch.zeros(0, device=self.device) for _ in GAP_STATE_KEYS)
        self._noise_key = torch.tensor(stream_key(seed), dtype=torch.long, device=self.device)
        self._noise_counter = torch.zeros((), dtype=torch.long, device=self.device)
        """Stream of the fused step's observation noise (``sim/counter_normal.py``): the key
        follows the seed, the counter the steps taken."""
        self._fused = (
            compiled_fused_step(self.device.type)
            if cfg.sim.compile and cfg.gaps.fusable and self.fusable and not cfg.critic_gap_inputs
            else None
        )
        """The whole step as one compiled function (``tasks/quadrotor/hover_fused.py``), or None:
        the eager step, a task with hooks of its own, or gap models it does not model (drag,
        ground effect)."""
        self._fused_consts = {flip: self._make_fused_consts(flip) for flip in (False, True)}
        self.randomization_scale = 1.0
        """``s`` of ``cfg.randomization_ramp``: how far per-episode draws reach into their ranges
        (1 = full); only :meth:`set_training_progress` lowers it."""
        self.reset(seed)

    @property
    def _pool_width(self) -> int:
        """Columns of a pool row: the start (``POOL``), then the gap models' draws (``gaps.DRAW``) when on."""
        return POOL.width + (DRAW.width if self.cfg.gaps.enabled else 0)

    # ------------------------------------------------------------------ VecEnv
    def in_layout(self, x: torch.Tensor) -> torch.Tensor:
        """``x [N, K]`` in the simulator's memory layout (:meth:`Quadrotor.in_layout`)."""
        return self.sim.in_layout(x)

    def reset(self, seed: int | None = None) -> ObsDict:
        """Reset every env (new initial states, parameters, disturbances); returns the observation."""
        if seed is not None:
            self.generator.manual_seed(seed)
            self._noise_key = torch.tensor(stream_key(seed), dtype=torch.long, device=self.device)
            self._noise_counter = torch.zeros((), dtype=torch.long, device=self.device)
        self._pool = self._pool[:0]  # drawn from the old stream: discard
        self._pool_cursor = 0
        self._reset_envs(torch.ones(self.num_envs, dtype=torch.bool, device=self.device))
        return self.observe()

    def step(self, action: torch.Tensor) -> StepResult:
        """Apply ``action [N, 4]`` for one control period; auto-resets ended episodes.

        Returns ``(obs, reward [N], terminated [N], truncated [N], info)`` with ``info`` keys
        ``final_obs``, ``reward_terms`` (dict of ``[N]``), ``success`` (``[N]`` bool, set only
        where truncated after a full episode and close to the setpoint and level).
        """
        if self._fused is not None:
            return self._step_fused(action.to(self.device, torch.float32))
        if self._host_checks:
            self._ensure_pool(self.num_envs)
        obs_noise = self._draw_obs_noise()
        action = action.to(self.device, torch.float32)
        if self._yaw_sym is not None and not self.physical_actions:  # acted on the relabelled body: to M1..M4
            action = yaw_flip_action(action, self.yaw_flip)
        action = self.in_layout(action)
        physics = self.sim.physics_inputs()
        gaps, motor_action, rpm_limits = self.gaps, None, None
        if gaps is not None:
            motor_action = gaps.motor_action(action.clamp(-1.0, 1.0))
            rpm_limits = gaps.rpm_limits(self.episode_step, self.cfg.sim.params.max_rpm)
            extra_acc = gaps.extra_acc_w(self.sim.state, self.sim.rot_wb(), self.sim.thrust_coef, self.sim.inv_mass)
            if extra_acc is not None:  # drag and ground effect join gravity and the disturbance
                physics = (*physics[:5], self.in_layout(physics[5] + extra_acc), *physics[6:])
        setpoint_w, vel_sp_w, acc_sp_w = self._setpoint_at(self.episode_step + 1)
        out = self._core(
            self.sim.state,
            action,
            motor_action,
            rpm_limits,
            self.action_hist,
            self.episode_step,
            self.pos_err_int_h,
            self._critic_static,
            obs_noise,
            setpoint_w,
            self.heading,
            self._terms,
            physics,
            self.sim.rot_tables,
            self._consts,
            vel_sp_w,
            acc_sp_w,
        )
        self.sim.state, self.episode_step = out["state"], out["episode_step"]
        self.action_hist, self.pos_err_int_h = out["action_hist"], out["pos_err_int_h"]
        terms: dict[str, torch.Tensor] = out["terms"]
        reward, terminated, truncated = out["reward"], out["terminated"], out["truncated"]
        policy = out["policy"]
        if gaps is not None:
            gaps.push(policy[:, :STATE_DIM])
            policy = gaps.view(policy, STATE_DIM)
        obs = final_obs = {"policy": policy, "critic": out["critic"]}
        success = self._no_success.expand(self.num_envs)
        done = terminated | truncated
        step_info = self._on_step(out["pos_err_h"])
        # On CPU a host check is free and skips the reset on most steps; on accelerators the
        # masked reset runs unconditionally so stepping never waits for the device.
        host = self._host_checks
        if not host or bool(done.any()):
            success = self._success(out["pos_err_h"], out["rot_hb"], truncated)
            if not host or not bool(torch.isfinite(reward).all()):
                final_obs = {k: finite(v) for k, v in obs.items()}
                terms = {k: finite(v) for k, v in terms.items()}
                reward = sum_terms(terms)
            self._reset_envs(done)
            # The step's noise draw is reused: rows of envs that did not end stay identical to
            # final_obs, and the restarted ones get noise independent of their new state.
            obs = self._observe(obs_noise)
            if gaps is not None:  # restarted envs see their fresh state; the others keep theirs
                obs["policy"] = torch.where(done.unsqueeze(1), gaps.view(obs["policy"], STATE_DIM), policy)
        if self._yaw_sym is not None:
            # Without a reset this step the two are one tensor: flip it once.
            shared = final_obs["policy"] is obs["policy"]
            final_policy = None if shared else self._canonical(final_obs["policy"], update=False)
            obs = {**obs, "policy": self._canonical(obs["policy"], update=True)}
            final_obs = {**final_obs, "policy": obs["policy"] if final_policy is None else final_policy}
        info: dict[str, Any] = {"final_obs": final_obs, "reward_terms": terms, "success": success} | step_info
        return obs, reward, terminated, truncated, info

    def fused_inputs(self, action: torch.Tensor) -> tuple[Any, ...]:
        """The arguments of :func:`~embodied.tasks.quadrotor.hover_fused.fused_step` for one step with
        ``action [N, 4]`` from the current state (the pool refilled first where it runs low)."""
        sim = self.sim
        if self._host_checks:  # the pool stays on the host's schedule, as in the eager step
            self._ensure_pool(self.num_envs)
            pool, cursor = self._pool, torch.tensor(self._pool_cursor, device=self.device)
        else:  # no host sync on accelerators: fresh rows for every env, taken from row 0
            pool, cursor = self._draw_initial(self.num_envs), torch.zeros((), dtype=torch.long, device=self.device)
        return (
            action,
            self.yaw_flip,
            sim.state,
            sim.param_scales,
            sim.force_w,
            sim.torque_b,
            self.action_hist,
            self.episode_step,
            self.pos_err_int_h,
            self.yaw_sp_rad,
            self.heading,
            self._setpoint_w,
            sim.nominal,
            sim.gravity_w,
            pool,
            cursor,
            self._noise_counter,
            self._noise_key,
            *self._fused_gap_state(),
            self._fused_consts[not self.physical_actions],
        )

    def _fused_gap_state(self) -> tuple[torch.Tensor, ...]:
        """The gap models' per-env state in :func:`~embodied.tasks.quadrotor.hover_fused.fused_step`'s
        order (``gaps.STATE_KEYS``); empty tensors when every model is off (the step never reads them)."""
        return self._no_gap_state if self.gaps is None else self.gaps.tensors()

    def _step_fused(self, action: torch.Tensor) -> StepResult:
        """:meth:`step` through :func:`~embodied.tasks.quadrotor.hover_fused.fused_step` (one compiled call)."""
        sim, fused = self.sim, self._fused
        assert fused is not None
        out = fused(*self.fused_inputs(action))
        sim.state, sim.force_w, sim.torque_b = out["state"], out["force_w"], out["torque_b"]
        if self.cfg.sim.randomization.enabled:  # the setter refreshes the derived parameters
            sim.param_scales = out["param_scales"]
        self.action_hist, self.pos_err_int_h, self.heading = out["action_hist"], out["pos_err_int_h"], out["heading"]
        self.episode_step, self.yaw_sp_rad, self.yaw_flip = out["episode_step"], out["yaw_sp_rad"], out["yaw_flip"]
        self._noise_counter = out["noise_counter"]
        if self.gaps is not None:
            for name, value in out["gaps"].items():
                setattr(self.gaps, name, value)
        if self._host_checks:
            self._pool_cursor = int(out["cursor"])
        self._critic_static = out["critic"][:, -CRITIC_STATIC_DIM:]  # fused only without critic_gap_inputs
        info: dict[str, Any] = {
            "final_obs": {"policy": out["final_policy"], "critic": out["final_critic"]},
            "reward_terms": out["terms"],
            "success": out["success"],
        }
        obs = {"policy": out["policy"], "critic": out["critic"]}
        return obs, out["reward"], out["terminated"], out["truncated"], info

    def _make_fused_consts(self, flip_actions: bool) -> FusedConsts:
        """Constants of the fused step; ``flip_actions``: actions arrive in relabelled labels."""
        cfg, sym = self.cfg, self._yaw_sym
        return FusedConsts(
            core=self._consts,
            terms=self._terms,
            rot_tables=self.sim.rot_tables,
            dynamics_tables=self.sim.tables,
            noise_std=tuple(self._noise_std.tolist()) if self._noisy else (),
            disturb_norm=tuple(self._disturb_norm.tolist()),
            flip_source=None if sym is None else tuple(sym["obs_source"]),
            flip_sign=() if sym is None else tuple(sym["obs_sign"]),
            flip_select=-1 if sym is None else int(sym["select_index"]),
            flip_actions=flip_actions,
            success_radius_m=cfg.success_radius_m,
            cos_success_tilt=self._cos_success_tilt,
            gaps=cfg.gaps.enabled,
            gap_noise_std=cfg.gaps.noise_std if cfg.gaps.noisy else (),
        )

    def set_training_progress(self, fraction: float) -> None:
        """Curriculum hook (:class:`embodied.env.TrainingCurriculum`): ``fraction`` of training
        done, in [0, 1]. With ``cfg.randomization_ramp`` or ``cfg.randomization_ramp_start`` above 0,
        episodes that start from now on draw their parameters and gaps from ranges scaled by
        ``clip((fraction - start) / ramp, 0, 1)`` (a step from 0 to 1 at ``start`` without a ramp)."""
        ramp, start = self.cfg.randomization_ramp, self.cfg.randomization_ramp_start
        if ramp > 0.0 or start > 0.0:
            past_start = max(0.0, float(fraction) - start)
            self.randomization_scale = min(1.0, past_start / ramp) if ramp > 0.0 else float(past_start > 0.0)

    # ------------------------------------------------------------------ task hooks
    def _setpoint_at(self, step: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """Setpoint at episode step ``step [N]``: position ``[3]`` or ``[N, 3]`` (world, m) and the
        feed-forward velocity and acceleration ``[N, 3]`` (None for a fixed setpoint)."""
        return self._setpoint_w, None, None

    def _on_step(self, pos_err_h: torch.Tensor) -> dict[str, Any]:
        """Called after every physics step with the new ``pos_err_h [N, 3]``, before ended envs
        reset; returns extra ``info`` entries (none for hover)."""
        return {}

    def _success(self, pos_err_h: torch.Tensor, rot_hb: torch.Tensor, truncated: torch.Tensor) -> torch.Tensor:
        """``[N]`` bool: a full-length episode that ends close to the setpoint and nearly level."""
        dist_sq_m2, cos_tilt = pos_err_h.square().sum(dim=1), rot_hb[:, 8]
        return ends_in_success(truncated, dist_sq_m2, cos_tilt, self.cfg.success_radius_m, self._cos_success_tilt)

    def _canonical(self, policy: torch.Tensor, update: bool) -> torch.Tensor:
        """``policy [N, D]`` under the 180° yaw symmetry (``quadrotor.terms.yaw_symmetry_tables``);
        ``update`` records which envs were flipped, for the next action."""
        assert self._yaw_sym is not None
        canonical, flip = yaw_flip_obs(policy, self._flip_source, self._flip_sign, self._yaw_sym["select_index"])
        if update:
            self.yaw_flip = flip
        return canonical

    def io_spec(self) -> IOSpec:
        """Policy observation/action fields, control period, conventions and on-board constants."""
        cfg, p = self.cfg, self.cfg.sim.params
        fields = obs_fields(self._terms)
        action = ActionField(
            "motor_thrust",
            4,
            "N",
            scale=0.5 * p.max_thrust_per_motor_n,
            offset=0.5 * p.max_thrust_per_motor_n,
            description=(
                "per-motor thrust commands M1..M4 (firmware: normalizedForces = T / THRUST_MAX); "
                "below min_thrust_per_motor_n the motor stops"
            ),
        )
        extra: dict[str, Any] = {
            # Selects the Crazyflie tooling (firmware build, software-in-the-loop, flash): embodied.crazyflie.
            "vehicle": "crazyflie",
            # Which Crazyflie (embodied.sim.vehicle_variants): the firmware platform and the verified vehicle.
            "vehicle_variant": p.variant,
            "action_history": cfg.action_history,
            "prev_actions_at_reset": p.hover_action,
            "max_rpm": p.max_rpm,
            "hover_rpm": p.hover_rpm,
            "hover_action": p.hover_action,
            "max_thrust_per_motor_n": p.max_thrust_per_motor_n,
            "min_thrust_per_motor_n": p.min_thrust_per_motor_n,
            "rotor_spin": list(ROTOR_SPIN),
            "mass_kg": p.mass_kg,
            "inertia_kgm2": list(p.inertia_kgm2),
            "arm_length_m": p.arm_length_m,
            "thrust_coef_n_per_rpm2": p.thrust_coef_n_per_rpm2,
            "torque_to_thrust_m": p.torque_to_thrust_m,
            "motor_tau_s": p.motor_tau_s,
            "gravity_mps2": p.gravity_mps2,
            "setpoint_w": list(cfg.setpoint_w),
            "heading_frame": "setpoint_yaw",
            **({} if self._yaw_sym is None else {"yaw_symmetry": self._yaw_sym}),
            "envelope": {
                "pos_err_m": cfg.position_bound_m,
                "tilt_rad": ENVELOPE_MAX_TILT_RAD,
                "ang_vel_rad_s": ENVELOPE_ANG_VEL_RAD_S,
                "lin_vel_m_s": cfg.init_lin_vel_mps + ENVELOPE_LIN_VEL_MARGIN_MPS,
            },
            "position_bound_m": cfg.position_bound_m,
            "obs_noise_std": list(cfg.obs_noise_std),
            "episode_steps": cfg.episode_steps,
            "task_cfg": to_plain(cfg),
        }
        if cfg.pos_err_integral:
            # Numeric extras become POLICY_<KEY> defines in policy.h (read by quad_ctrl.c).
            extra |= {
                "pos_err_int_decay": float(cfg.pos_err_integral_decay),
                "pos_err_int_limit_ms": float(cfg.pos_err_integral_limit_ms),
                "pos_err_int_dt_s": float(self.dt),
            }
        return IOSpec(fields, (action,), self.dt, dict(CONVENTIONS), extra)

    def state_dict(self) -> dict[str, Any]:
        """Physics, parameters, disturbances, action history, step counters and RNG state."""
        return {
            "sim": self.sim.state_dict(),
            "action_hist": self.action_hist.clone(),
            "episode_step": self.episode_step.clone(),
            "pos_err_int_h": self.pos_err_int_h.clone(),
            "yaw_sp_rad": self.yaw_sp_rad.clone(),
            "yaw_flip": self.yaw_flip.clone(),
            "gaps": {} if self.gaps is None else self.gaps.state_dict(),
            "rng": self.generator.get_state(),
            # The whole pool and its cursor: it keeps its fixed size (the fused step's shape).
            "init_pool": self._pool.clone(),
            "init_pool_cursor": self._pool_cursor,
            "noise_stream": torch.stack((self._noise_key, self._noise_counter)).cpu(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.sim.load_state_dict(state["sim"])
        if state["action_hist"].shape != self.action_hist.shape:
            raise ConfigError(
                f"quad-hover state: action_hist shape {tuple(state['action_hist'].shape)} != "
                f"{tuple(self.action_hist.shape)} (different num_envs or action_history)"
            )
        self.action_hist = state["action_hist"].to(self.device, torch.float32).clone()
        self.episode_step = state["episode_step"].to(self.device, torch.long).clone()
        # Checkpoints from before the integral existed resume with it at zero.
        integral = state.get("pos_err_int_h", torch.zeros_like(self.pos_err_int_h))
        self.pos_err_int_h = integral.to(self.device, torch.float32).clone()
        self.yaw_sp_rad = state.get("yaw_sp_rad", torch.zeros_like(self.yaw_sp_rad)).to(self.device, torch.float32)
        self.heading = heading_cos_sin(self.yaw_sp_rad)
        self.yaw_flip = state.get("yaw_flip", torch.zeros_like(self.yaw_flip)).to(self.device, torch.bool).clone()
        if self.gaps is not None:
            self.gaps.load_state_dict(state.get("gaps", {}))
        self.generator.set_state(state["rng"])
        pool = state["init_pool"].to(self.device, torch.float32)
        if pool.shape[1] == POOL.yaw_sp + 1:  # checkpoints from before the heading columns
            pool = torch.cat((pool, heading_cos_sin(pool[:, POOL.yaw_sp])), dim=1)
        if self.gaps is not None and pool.shape[1] == POOL.width:  # from before the pool held gap draws
            pool = torch.cat((pool, self.gaps.draw(pool.shape[0], self.randomization_scale)), dim=1)
        self._pool = pool.clone()
        self._pool_cursor = int(state.get("init_pool_cursor", 0))  # older checkpoints: the unused rows only
        if "noise_stream" in state:  # checkpoints from before the fused step keep the seeded stream
            key, counter = state["noise_stream"].to(self.device, torch.long)
            self._noise_key, self._noise_counter = key.clone(), counter.clone()
        self._refresh_critic_static()

    def close(self) -> None:
        """Nothing to release (pure tensors)."""

    # ------------------------------------------------------------------ helpers
    def observe(self, noise: bool = True) -> ObsDict:
        """Observation of the current state (draws observation noise when ``noise``); with gap
        models on, the policy part is what the vehicle sees (delayed, with estimator errors)."""
        obs = self._observe(self._draw_obs_noise() if noise else None)
        if self.gaps is not None:
            obs["policy"] = self.gaps.view(obs["policy"], STATE_DIM)
        if self._yaw_sym is not None:
            obs["policy"] = self._canonical(obs["policy"], update=True)
        return obs

    def _observe(self, obs_noise: torch.Tensor | None) -> ObsDict:
        state = self.sim.state
        setpoint_w, vel_sp_w, acc_sp_w = self._setpoint_at(self.episode_step)
        pos_err_h, rot_hb = heading_errors(state, setpoint_w, self.heading, self.sim.rot_tables)
        policy, critic = observation(
            self._terms,
            state,
            pos_err_h,
            rot_hb,
            self.heading,
            self.action_hist,
            self.pos_err_int_h,
            self._critic_static,
            obs_noise,
            self._rpm_per_action,
            vel_sp_w,
            acc_sp_w,
        )
        return {"policy": policy, "critic": critic}

    def _draw_obs_noise(self) -> torch.Tensor | None:
        """``[N, 18]`` Gaussian observation noise, or None when all σ are zero."""
        if not self._noisy:
            return None
        eps = torch.randn(self.num_envs, POLICY_STATE_DIM, generator=self.generator, device=self.device)
        return eps * self._noise_std

    def physical_state(self) -> dict[str, torch.Tensor]:
        """Raw state of all envs (clones): ``position_w [N,3]`` (m), ``quat_wb [N,4]`` (w,x,y,z),
        ``lin_vel_w [N,3]`` (m/s), ``ang_vel_b [N,3]`` (rad/s), ``motor_rpm [N,4]``,
        ``pos_err_int_h [N,3]`` (m*s, heading; zeros unless ``cfg.pos_err_integral``), ``setpoint_w [3]``
        and ``yaw_sp_rad [N]`` (rad)
        — what the firmware software-in-the-loop needs to build its own observation."""
        s = self.sim.state
        return {
            "position_w": s[:, POS].clone(),
            "quat_wb": s[:, QUAT].clone(),
            "lin_vel_w": s[:, LIN_VEL].clone(),
            "ang_vel_b": s[:, ANG_VEL].clone(),
            "motor_rpm": s[:, RPM].clone(),
            "pos_err_int_h": self.pos_err_int_h.clone(),
            "setpoint_w": self._setpoint_w.clone(),
            "yaw_sp_rad": self.yaw_sp_rad.clone(),
        }

    def set_physical_state(
        self,
        env_ids: Sequence[int] | torch.Tensor | None = None,
        *,
        position_w: torch.Tensor | Sequence[float] | None = None,
        quat_wb: torch.Tensor | Sequence[float] | None = None,
        lin_vel_w: torch.Tensor | Sequence[float] | None = None,
        ang_vel_b: torch.Tensor | Sequence[float] | None = None,
        motor_rpm: torch.Tensor | Sequence[float] | None = None,
        episode_step: int | None = None,
        action_hist: torch.Tensor | Sequence[float] | None = None,
        pos_err_int_h: torch.Tensor | Sequence[float] | None = None,
        yaw_sp_rad: torch.Tensor | Sequence[float] | float | None = None,
    ) -> ObsDict:
        """Force parts of the state of ``env_ids`` (all if None); values broadcast to ``[k, size]``.

        The quaternion is normalized; ``pos_err_int_h`` (m*s) is stored as given (not clamped);
        ``yaw_sp_rad`` (rad) sets the setpoint yaw (and so the heading frame) of those envs.
        Returns the (noise-free) observation of the new state.
        """
        ids = torch.arange(self.num_envs, device=self.device) if env_ids is None else torch.as_tensor(env_ids)
        ids = ids.to(self.device, torch.long)
        state = self.sim.state.clone()
        for value, cols in (
            (position_w, POS),
            (quat_wb, QUAT),
            (lin_vel_w, LIN_VEL),
            (ang_vel_b, ANG_VEL),
            (motor_rpm, RPM),
        ):
            if value is not None:
                v = torch.as_tensor(value, dtype=torch.float32, device=self.device)
                if cols == QUAT:
                    v = v / torch.linalg.vector_norm(v, dim=-1, keepdim=True)
                state[ids, cols] = v.expand(len(ids), cols.stop - cols.start)
        self.sim.state = state
        if episode_step is not None:
            self.episode_step[ids] = episode_step
        if action_hist is not None:
            self.action_hist[ids] = torch.as_tensor(action_hist, dtype=torch.float32, device=self.device).expand(
                len(ids), self.action_hist.shape[1]
            )
        if pos_err_int_h is not None:
            self.pos_err_int_h[ids] = torch.as_tensor(pos_err_int_h, dtype=torch.float32, device=self.device).expand(
                len(ids), POS_ERR_INT_DIM
            )
        if yaw_sp_rad is not None:
            yaw = self.yaw_sp_rad.clone()
            yaw[ids] = torch.as_tensor(yaw_sp_rad, dtype=torch.float32, device=self.device).expand(len(ids))
            self.yaw_sp_rad = yaw
            self.heading = heading_cos_sin(yaw)
        return self.observe(noise=False)

    def _refresh_critic_static(self) -> None:
        sim = self.sim
        static = critic_static_inputs(sim.param_scales, sim.force_w, sim.torque_b, self._disturb_norm)
        if self.cfg.critic_gap_inputs:
            gap_inputs = (
                torch.zeros(self.num_envs, GAP_CRITIC_DIM, device=self.device)
                if self.gaps is None
                else self.gaps.critic_inputs()
            )
            static = torch.cat((static, gap_inputs), dim=1)
        self._critic_static = static

    def _draw_initial(self, count: int) -> torch.Tensor:
        """``[count, pool width]`` fresh initial conditions from L2F's distribution (columns
        ``POOL``), then the gap models' per-episode draws (``gaps.DRAW``) when they are on."""
        c, g, dev = self.cfg, self.generator, self.device
        scales = self.sim.sample_param_scales(count)
        if self.randomization_scale < 1.0:  # curriculum: towards the nominal vehicle (scale 1)
            scales = 1.0 + (scales - 1.0) * self.randomization_scale
        u = torch.rand(count, 13, generator=g, device=dev)
        gauss = torch.randn(count, 9, generator=g, device=dev)
        moving = (u[:, 10:11] >= c.init_level_fraction).float()  # 0 for the level-at-setpoint starts
        position_w = self._setpoint_w + moving * (2.0 * u[:, 0:3] - 1.0) * c.init_pos_range_m
        # Rotation by angle ~ U[0, max] about a uniformly random axis (normalized Gaussian).
        axis = gauss[:, 0:3] / torch.linalg.vector_norm(gauss[:, 0:3], dim=1, keepdim=True).clamp_min(1e-9)
        half = (0.5 * c.init_max_angle_rad) * u[:, 3:4] * moving
        quat_tilt = torch.cat((torch.cos(half), axis * torch.sin(half)), dim=1)
        # Heading: setpoint yaw, then the initial yaw relative to it, applied before the tilt.
        yaw_sp = c.setpoint_yaw_rad + (2.0 * u[:, 11:12] - 1.0) * c.setpoint_yaw_range_rad
        half_yaw = 0.5 * (yaw_sp + (2.0 * u[:, 12:13] - 1.0) * c.init_yaw_range_rad)
        quat_wb = quat_multiply(
            torch.cat((torch.cos(half_yaw), torch.zeros_like(u[:, 0:2]), torch.sin(half_yaw)), 1), quat_tilt
        )
        lin_vel_w = moving * (2.0 * u[:, 4:7] - 1.0) * c.init_lin_vel_mps
        ang_vel_b = moving * (2.0 * u[:, 7:10] - 1.0) * c.init_ang_vel_rad_s
        # Motors start at each env's hover speed (thrust ∝ kf rpm² balances m g): L2F does not
        # train from a free fall.
        hover_rpm = self._hover_rpm_nominal * torch.sqrt(scales[:, 0:1] / scales[:, 4:5])
        disturb = gauss[:, 3:9] * self._disturb_std
        heading = heading_cos_sin(yaw_sp[:, 0])
        start = (
            position_w,
            quat_wb,
            lin_vel_w,
            ang_vel_b,
            hover_rpm.expand(count, 4),
            scales,
            disturb,
            yaw_sp,
            heading,
        )
        gap_draws = () if self.gaps is None else (self.gaps.draw(count, self.randomization_scale),)
        return torch.cat((*start, *gap_draws), 1)

    def _ensure_pool(self, count: int) -> None:
        """Keep at least ``count`` unused rows in the CPU pool of initial conditions, refilling
        it to ``_pool_size`` rows in bulk (a fixed size, so the fused step never recompiles).
        Both steps call it with ``num_envs`` before stepping, so they draw the same rows."""
        left = self._pool.shape[0] - self._pool_cursor
        if left < count:
            fresh = self._draw_initial(max(self._pool_size, count) - left)
            self._pool = torch.cat((self._pool[self._pool_cursor :], fresh))
            self._pool_cursor = 0

    def _take_initial(self, count: int) -> torch.Tensor:
        """``count`` rows from the CPU pool, refilling it in bulk when it runs out."""
        self._ensure_pool(max(count, self.num_envs))
        rows = self._pool[self._pool_cursor : self._pool_cursor + count]
        self._pool_cursor += count
        return rows

    def _reset_envs(self, mask: torch.Tensor) -> None:
        """New initial conditions for envs where ``mask [N]``; action history set to hover,
        position-error integral to zero."""
        sim = self.sim
        if self._host_checks:
            ids = mask.nonzero().squeeze(1)
            rows = self._take_initial(int(ids.numel()))
            sim.state[ids] = rows[:, POOL.state]
            if self.cfg.sim.randomization.enabled:
                sim.param_scales[ids] = rows[:, POOL.scales]
                sim.refresh_params()
            sim.force_w[ids] = rows[:, POOL.force_w]
            sim.torque_b[ids] = rows[:, POOL.torque_b]
            self.action_hist[ids] = self.hover_action
            self.episode_step[ids] = 0
            self.pos_err_int_h[ids] = 0.0
            self.yaw_sp_rad[ids] = rows[:, POOL.yaw_sp]
            self.heading[ids] = rows[:, POOL.heading]
            if self.gaps is not None:  # each restarted env's draws in its own row
                draws = torch.zeros(self.num_envs, DRAW.width, device=self.device)
                draws[ids] = rows[:, POOL.width :]
                self.gaps.redraw(mask, draws)
        else:  # branch-free: draw for every env, keep the rows of envs that did not end
            rows = self._draw_initial(self.num_envs)
            m = mask.unsqueeze(1)
            sim.state = torch.where(m, rows[:, POOL.state], sim.state)
            if self.cfg.sim.randomization.enabled:
                sim.param_scales = torch.where(m, rows[:, POOL.scales], sim.param_scales)  # setter refreshes
            sim.force_w = torch.where(m, rows[:, POOL.force_w], sim.force_w)
            sim.torque_b = torch.where(m, rows[:, POOL.torque_b], sim.torque_b)
            self.action_hist = torch.where(m, self.hover_action, self.action_hist)
            self.episode_step = torch.where(mask, 0, self.episode_step)
            self.pos_err_int_h = torch.where(m, 0.0, self.pos_err_int_h)
            self.yaw_sp_rad = torch.where(mask, rows[:, POOL.yaw_sp], self.yaw_sp_rad)
            self.heading = torch.where(m, rows[:, POOL.heading], self.heading)
            if self.gaps is not None:
                self.gaps.redraw(mask, rows[:, POOL.width :])
        if self.gaps is not None:  # delay buffers start at the fresh (noise-free) state
            self.gaps.refill(mask, self._observe(None)["policy"][:, :STATE_DIM])
        self._refresh_critic_static()  # after the gap draws: the critic may see them
