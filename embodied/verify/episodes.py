"""Fly a quadrotor policy in the MuJoCo Crazyflie: initial states, closed loop, success.

The episode rules mirror the hover task's as ``policy_io.json`` states them (``extra.task_cfg``
when present, else the published L2F defaults): start states drawn like training, a fixed number
of control periods, early termination when any world axis of the position error leaves the
training box, success when a full-length episode ends close to the setpoint and nearly level.
With a heading-frame policy the setpoint yaw is drawn over ±180° and the initial heading within
``init_yaw_range_rad`` of it.

Tracking policies (``extra.tracking``, quad-track) fly a moving setpoint: the task's reference paths
(``draw_paths`` of ``tasks/quadrotor/track.py`` with the run's path settings) give the position, feed-forward
velocity and acceleration at every control step, starts move with the path, and success is a
full-length episode with RMS position error below ``success_rms_m``.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from embodied.errors import EmbodiedError
from embodied.io_spec import IOSpec
from embodied.sim.mujoco_crazyflie import (
    NUM_ROTORS,
    CrazyflieParams,
    MujocoCrazyflie,
    Perturbation,
    quat_to_rot,
    thrust_to_rpm_setpoint,
)
from embodied.verify.observation import ObservationLayout, state_terms

log = logging.getLogger(__name__)

ArrayPolicy = Callable[[np.ndarray], np.ndarray]
"""``obs [N, obs_dim] float32 -> action [N, 4]`` in [-1, 1]."""


@dataclass(frozen=True)
class EpisodeRules:
    """Start distribution, length, bounds and success of an episode (the task's training values)."""

    episode_steps: int = 500
    setpoint_w: tuple[float, float, float] = (0.0, 0.0, 1.0)
    init_level_fraction: float = 0.1
    init_pos_range_m: float = 0.2
    init_max_angle_rad: float = math.pi / 2
    init_lin_vel_mps: float = 1.0
    init_ang_vel_rad_s: float = 1.0
    disturbance_force_std_n: float = 0.0132
    disturbance_torque_std_nm: float = 2.6e-5
    position_bound_m: float = 0.6
    success_radius_m: float = 0.1
    success_max_tilt_rad: float = math.radians(10.0)
    init_yaw_range_rad: float = math.pi
    success_rms_m: float = 0.1
    any_yaw: bool = False
    """Draw the setpoint yaw and the initial heading relative to it over ±180° (heading-frame policies)."""

    @classmethod
    def from_spec(cls, spec: IOSpec, source: str) -> EpisodeRules:
        """Rules from ``extra.task_cfg`` (keys of the hover task's config), then ``extra``, then defaults."""
        extra = spec.extra
        task_cfg = extra.get("task_cfg") or {}
        if not isinstance(task_cfg, dict):
            raise EmbodiedError(f"{source}: extra.task_cfg must be an object, got {type(task_cfg).__name__}")
        values: dict[str, Any] = {}
        for f in cls.__dataclass_fields__.values():
            raw = task_cfg.get(f.name, extra.get(f.name))
            if raw is None or f.name == "any_yaw":
                continue
            try:
                if f.name == "setpoint_w":
                    values[f.name] = tuple(float(x) for x in raw)
                elif f.name == "episode_steps":
                    values[f.name] = int(raw)
                else:
                    values[f.name] = float(raw)
            except (TypeError, ValueError):
                raise EmbodiedError(f"{source}: task value {f.name!r} = {raw!r} is not of the expected form") from None
        heading = bool(extra.get("heading_frame")) or any(f.name.endswith("_h") for f in spec.obs_fields)
        return cls(**values, any_yaw=heading)


L2F_START_RANGES: dict[str, float] = {
    "init_level_fraction": 0.1,
    "init_pos_range_m": 0.2,
    "init_max_angle_rad": math.pi / 2,
    "init_lin_vel_mps": 1.0,
    "init_ang_vel_rad_s": 1.0,
}
"""L2F's published start distribution (docs/conventions.md, "L2F's start distribution"): 10 % of
the episodes level and at rest on the setpoint, the rest displaced up to 0.2 m per axis, rotated
up to 90° about a random axis, moving up to 1 m/s and spinning up to 1 rad/s per axis."""

StartDistribution = Literal["run", "l2f"]
"""Where :func:`run_episodes` draws its starts from: the run's own task ranges, or L2F's."""


def start_rules(rules: EpisodeRules, starts: StartDistribution) -> EpisodeRules:
    """``rules`` with the start ranges of ``starts``; everything else (length, bounds, success,
    disturbances, heading draw) stays the run's."""
    if starts == "run":
        return rules
    if starts == "l2f":
        ranges: dict[str, Any] = dict(L2F_START_RANGES)  # every key is a float field of EpisodeRules
        return dataclasses.replace(rules, **ranges)
    raise EmbodiedError(f"start distribution must be 'run' or 'l2f', got {starts!r}")


def start_ranges(rules: EpisodeRules) -> dict[str, float]:
    """The start ranges of ``rules`` by name (the keys of :data:`L2F_START_RANGES`), for reports."""
    return {name: float(getattr(rules, name)) for name in L2F_START_RANGES}


@dataclass
class MujocoEvalResult:
    """Outcome of :func:`run_episodes`."""

    episodes: int
    success_rate: float
    mean_episode_length: float
    final_pos_err_m: float
    """Median distance to the setpoint at the end of full-length episodes (NaN if none)."""
    rms_error_m: float
    """Mean over episodes of the RMS position error over each episode's steps (m)."""
    trajectories: np.ndarray = field(repr=False)
    """``[K, T + 1, 3]`` position error (world, m) of the first K episodes, NaN after they end."""

    def as_dict(self) -> dict[str, float]:
        return {
            "episodes": self.episodes,
            "success_rate": self.success_rate,
            "mean_episode_length": self.mean_episode_length,
            "final_pos_err_m": self.final_pos_err_m,
            "rms_error_m": self.rms_error_m,
        }


@dataclass(frozen=True)
class InitialStates:
    """``N`` episode starts (world frame): position, attitude, velocities, setpoint yaw, disturbances."""

    position_w: np.ndarray
    quat_wb: np.ndarray
    lin_vel_w: np.ndarray
    ang_vel_b: np.ndarray
    yaw_sp_rad: np.ndarray
    force_w: np.ndarray
    torque_b: np.ndarray


def _quat_mul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    aw, ax, ay, az = a.T
    bw, bx, by, bz = b.T
    return np.stack(
        (
            aw * bw - ax * bx - ay * by - az * bz,
            aw * bx + ax * bw + ay * bz - az * by,
            aw * by - ax * bz + ay * bw + az * bx,
            aw * bz + ax * by - ay * bx + az * bw,
        ),
        axis=1,
    )


def sample_initial_states(rules: EpisodeRules, n: int, rng: np.random.Generator) -> InitialStates:
    """``n`` starts from the training distribution (L2F's): a fraction level at rest on the
    setpoint, the rest displaced, tilted about a random axis, moving and spinning."""
    moving = (rng.uniform(size=(n, 1)) >= rules.init_level_fraction).astype(np.float64)
    setpoint = np.asarray(rules.setpoint_w)
    position_w = setpoint + moving * rng.uniform(-1, 1, (n, 3)) * rules.init_pos_range_m
    axis = rng.normal(size=(n, 3))
    axis /= np.maximum(np.linalg.norm(axis, axis=1, keepdims=True), 1e-9)
    half = 0.5 * rules.init_max_angle_rad * rng.uniform(size=(n, 1)) * moving
    tilt = np.concatenate((np.cos(half), axis * np.sin(half)), axis=1)
    if rules.any_yaw:
        yaw_sp = rng.uniform(-math.pi, math.pi, n)
        heading = yaw_sp + rng.uniform(-rules.init_yaw_range_rad, rules.init_yaw_range_rad, n)
        yaw_q = np.stack((np.cos(heading / 2), np.zeros(n), np.zeros(n), np.sin(heading / 2)), axis=1)
        quat_wb = _quat_mul(yaw_q, tilt)
    else:
        yaw_sp = np.zeros(n)
        quat_wb = tilt
    return InitialStates(
        position_w=position_w,
        quat_wb=quat_wb,
        lin_vel_w=moving * rng.uniform(-1, 1, (n, 3)) * rules.init_lin_vel_mps,
        ang_vel_b=moving * rng.uniform(-1, 1, (n, 3)) * rules.init_ang_vel_rad_s,
        yaw_sp_rad=yaw_sp,
        force_w=rng.normal(size=(n, 3)) * rules.disturbance_force_std_n,
        torque_b=rng.normal(size=(n, 3)) * rules.disturbance_torque_std_nm,
    )


class Reference:
    """The setpoint of every episode at control step ``k``: fixed (hover) or moving (tracking)."""

    def __init__(self, spec: IOSpec, rules: EpisodeRules, n: int, seed: int, source: str) -> None:
        self.setpoint_w = np.asarray(rules.setpoint_w, dtype=np.float64)
        self.dt_s = spec.control_period_s
        self.paths: Any = None
        if "tracking" in spec.extra:
            import dataclasses

            import torch

            from embodied.tasks.quadrotor.track import PATH_CFG_KEYS, QuadTrackCfg, draw_paths

            task_cfg = spec.extra.get("task_cfg") or {}
            values: dict[str, Any] = {
                k: tuple(v) if isinstance(v, list) else v for k, v in task_cfg.items() if k in PATH_CFG_KEYS
            }
            try:
                cfg = dataclasses.replace(QuadTrackCfg(), **values)
            except (TypeError, ValueError) as err:
                raise EmbodiedError(f"{source}: extra.task_cfg path settings are not valid: {err}") from None
            # Its own generator: the hover checks' start-state draws stay as they were.
            self.paths = draw_paths(cfg, n, torch.Generator().manual_seed(seed), torch.device("cpu"))

    @property
    def moving(self) -> bool:
        return self.paths is not None

    def at(self, step: int, n: int) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None]:
        """Setpoint ``[3]`` or ``[N, 3]`` (world, m) and feed-forward velocity and acceleration ``[N, 3]``."""
        if self.paths is None:
            return self.setpoint_w, None, None
        import torch

        pos, vel, acc = self.paths.at(torch.full((n,), step * self.dt_s, dtype=torch.float32))
        return self.setpoint_w + pos.double().numpy(), vel.double().numpy(), acc.double().numpy()


class ActionDecoder:
    """Policy action ``[N, 4]`` in [-1, 1] -> rotor speed setpoints (rpm), by the action field's units.

    ``"N"``: per-motor thrust command ``a * scale + offset`` through the firmware's cut and
    ``sqrt(T / k_f)``; ``"rpm"`` (older exports): the speed setpoint itself.
    """

    def __init__(self, spec: IOSpec, params: CrazyflieParams, source: str) -> None:
        if len(spec.action_fields) != 1 or spec.action_fields[0].size != NUM_ROTORS:
            raise EmbodiedError(f"{source}: the MuJoCo check needs one action field of 4 motor commands")
        self.field = spec.action_fields[0]
        if self.field.units not in ("N", "rpm"):
            raise EmbodiedError(
                f"{source}: action field {self.field.name!r} has units {self.field.units!r}; "
                "the MuJoCo check flies 'N' (thrust command) or 'rpm' (rotor speed setpoint)"
            )
        self.params = params

    def __call__(self, action: np.ndarray) -> np.ndarray:
        command = np.clip(action, self.field.low, self.field.high) * self.field.scale + self.field.offset
        if self.field.units == "N":
            return thrust_to_rpm_setpoint(command, self.params)
        return np.clip(command, 0.0, self.params.max_rpm)


def run_episodes(
    policy: ArrayPolicy,
    spec: IOSpec,
    episodes: int,
    seed: int,
    perturbation: Perturbation | None = None,
    substeps: int = 2,
    record: int = 0,
    source: str = "policy_io.json",
    initial: InitialStates | None = None,
    noise: bool = True,
    num_threads: int = 1,
    starts: StartDistribution = "run",
) -> MujocoEvalResult:
    """Fly ``episodes`` episodes at once in MuJoCo and score them like the task.

    Args:
        policy: batched deterministic policy on ``[N, obs_dim]`` float32 observations.
        spec: the policy's ``policy_io.json`` (fields, control period, extra).
        perturbation: vehicle and observation changes (nominal if None).
        substeps: MuJoCo steps per control period.
        record: keep the position-error trajectories of this many episodes.
        initial: explicit starts (drawn from the task's distribution when None).
        noise: add the task's observation noise.
        starts: draw the starts from the run's own task ranges (``"run"``) or from L2F's
            (``"l2f"``, :data:`L2F_START_RANGES`); ignored when ``initial`` is given.
    """
    if episodes < 1:
        raise EmbodiedError(f"episodes must be >= 1, got {episodes}")
    perturbation = perturbation or Perturbation()
    layout = ObservationLayout(spec, source)
    rules = start_rules(EpisodeRules.from_spec(spec, source), starts)
    params = CrazyflieParams.from_policy_extra(spec.extra)
    decode = ActionDecoder(spec, params, source)
    rng = np.random.default_rng(seed)
    start = initial or sample_initial_states(rules, episodes, rng)
    n = start.position_w.shape[0]
    reference = Reference(spec, rules, n, seed, source)
    if reference.moving and initial is None:  # starts move with the path, as in the task
        start = dataclasses.replace(start, lin_vel_w=start.lin_vel_w + reference.at(0, n)[1])
    sim = MujocoCrazyflie(params, n, spec.control_period_s, substeps, perturbation, num_threads)
    hover_rpm = math.sqrt(params.hover_thrust_n * perturbation.mass_scale / params.thrust_coef_n_per_rpm2)
    sim.reset(
        start.position_w,
        start.quat_wb,
        start.lin_vel_w,
        start.ang_vel_b,
        np.full((n, NUM_ROTORS), hover_rpm),
        rng,
        start.force_w,
        start.torque_b,
    )
    prev_actions = np.full((n, 4 * layout.history), layout.initial_action)
    integral = np.zeros((n, 3)) if layout.integral_field else None
    alive = np.ones(n, dtype=bool)
    length = np.zeros(n, dtype=np.int64)
    success = np.zeros(n, dtype=bool)
    final_err = np.full(n, np.nan)
    k = min(record, n)
    traj = np.full((k, rules.episode_steps + 1, 3), np.nan)
    obs_rng = rng if noise else None

    sq_err = np.zeros(n)

    def observe_terms(step: int) -> tuple[dict[str, np.ndarray], np.ndarray, np.ndarray]:
        setpoint, vel_sp, acc_sp = reference.at(step, n)
        pos_err_w = sim.position_w - setpoint
        rot_wb = quat_to_rot(sim.quat_wb)
        terms = state_terms(pos_err_w, rot_wb, sim.lin_vel_w, sim.ang_vel_b, start.yaw_sp_rad, vel_sp, acc_sp)
        return terms, pos_err_w, rot_wb

    terms, pos_err_w, _ = observe_terms(0)
    traj[:, 0] = pos_err_w[:k]
    # The policy sees the state ``obs_delay_steps`` control periods late; at the start of an
    # episode the oldest available state (the initial one) stands in for the missing past.
    delayed: deque[dict[str, np.ndarray]] = deque([terms] * (perturbation.obs_delay_steps + 1))
    cos_tilt = math.cos(rules.success_max_tilt_rad)
    for step in range(1, rules.episode_steps + 1):
        obs = layout.assemble(delayed[0], integral, prev_actions, obs_rng)
        action = np.asarray(policy(obs), dtype=np.float64).reshape(n, NUM_ROTORS).clip(-1.0, 1.0)
        if layout.history:
            prev_actions = np.concatenate((action, prev_actions[:, :-NUM_ROTORS]), axis=1)
        sim.step(decode(action))
        terms, pos_err_w, rot_wb = observe_terms(step)
        if integral is not None and layout.integral_source is not None:
            integral = layout.integral_rule.update(integral, terms[layout.integral_source])
        delayed.append(terms)
        delayed.popleft()
        out = ~np.all(np.abs(pos_err_w) <= rules.position_bound_m, axis=1) | sim.diverged  # NaN counts as out
        ended_now = alive & out
        alive &= ~out
        sim.freeze(ended_now)
        length += alive | ended_now
        sq_err += np.where(alive | ended_now, np.sum(np.nan_to_num(pos_err_w, nan=1e3) ** 2, axis=1), 0.0)
        traj[:, step] = np.where(alive[:k, None], pos_err_w[:k], np.nan)
        if not alive.any():
            break
    dist = np.linalg.norm(pos_err_w, axis=1)
    final_err = np.where(alive, dist, np.nan)
    rms = np.sqrt(sq_err / np.maximum(length, 1))
    if reference.moving:
        success = alive & (rms < rules.success_rms_m)
    else:
        success = alive & (dist < rules.success_radius_m) & (rot_wb[:, 2, 2] > cos_tilt)
    finished = final_err[np.isfinite(final_err)]
    return MujocoEvalResult(
        episodes=n,
        success_rate=float(success.mean()),
        mean_episode_length=float(length.mean()),
        final_pos_err_m=float(np.median(finished)) if finished.size else float("nan"),
        rms_error_m=float(rms.mean()),
        trajectories=traj,
    )
