"""Pure functions of one quad-hover step (no state, no randomness), shared by the eager step,
the compiled step and the fused step (``tasks/quadrotor/hover_fused.py``): the step's physics,
observation, reward terms and termination (:func:`step_core`) and the observation alone
(:func:`observation`)."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import torch

from embodied.sim.quadrotor import (
    ANG_VEL,
    LIN_VEL,
    POS,
    QUAT,
    RPM,
    PhysicsInputs,
    Tables,
    action_to_rpm_cmd,
    apply_bilinear,
    rk4_step,
)
from embodied.tasks.quadrotor.terms import (
    assemble,
    rot_wb_to_hb,
    tilt_cost,
    vec_w_to_h,
    yaw_cost,
    yaw_cost_mod_pi,
)


class PoolLayout(NamedTuple):
    """Columns of one initial condition (a row of ``QuadHover``'s pre-drawn pool)."""

    state: slice
    """Packed sim state (17)."""
    scales: slice
    force_w: slice
    torque_b: slice
    yaw_sp: int
    """Setpoint yaw (rad)."""
    heading: slice
    """(cos, sin) of the setpoint yaw (``quadrotor.terms.heading_cos_sin``), drawn once per row
    rather than per step."""
    width: int


POOL = PoolLayout(slice(0, 17), slice(17, 23), slice(23, 26), slice(26, 29), 29, slice(30, 32), 32)


class CoreConsts(NamedTuple):
    """Python constants of :func:`step_core` (compile specializes on them)."""

    dt_s: float
    substeps: int
    rpm_per_action: float
    max_thrust_n: float
    min_thrust_n: float
    inv_thrust_coef: float
    max_rpm: float
    hover_action: float
    k_pos: float
    pos_bonus: float
    pos_bonus_inv_2r2: float
    k_ori: float
    k_yaw: float
    yaw_mod_pi: bool
    k_vel: float
    k_act: float
    alive: float
    termination_penalty: float
    position_bound_m: float
    max_episode_steps: int
    history: int
    integral: bool
    integral_decay: float
    integral_limit_ms: float


def observation(
    terms: tuple[Any, ...],
    state: torch.Tensor,
    pos_err_h: torch.Tensor,
    rot_hb: torch.Tensor,
    heading: torch.Tensor,
    action_hist: torch.Tensor,
    pos_err_int_h: torch.Tensor,
    critic_static: torch.Tensor,
    obs_noise: torch.Tensor | None,
    rpm_per_action: float,
    vel_sp_w: torch.Tensor | None = None,
    acc_sp_w: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Policy ``[N, terms_dim(terms)]`` and critic ``[N, 34 (+3)]`` observations.

    ``terms``: the policy's term table (``QuadHoverCfg.policy_terms``); ``pos_err_h [N, 3]``,
    ``rot_hb [N, 9]``, ``heading [N, 2]`` (cos, sin of the setpoint yaw), ``action_hist [N, 4H]``,
    ``pos_err_int_h [N, 3]``. ``obs_noise [N, 18]`` is added to the noised state terms of the
    policy only. The critic sees the clean state terms, the integral when the policy has it,
    normalized motor speeds and the per-episode static inputs. Tracking tasks pass the moving
    setpoint's feed-forward velocity and acceleration ``vel_sp_w``, ``acc_sp_w [N, 3]`` (world) for
    the ``lin_vel_err_h`` and ``acc_sp_h`` terms; the critic then sees ``acc_sp_h`` as well.
    """
    clean = {
        "pos_err_h": pos_err_h,
        "rot_hb": rot_hb,
        "lin_vel_h": vec_w_to_h(state[:, LIN_VEL], heading),
        "ang_vel_b": state[:, ANG_VEL],
        "pos_err_int_h": pos_err_int_h,
        "prev_actions": action_hist,
    }
    if vel_sp_w is not None:
        clean["lin_vel_err_h"] = vec_w_to_h(state[:, LIN_VEL] - vel_sp_w, heading)
    if acc_sp_w is not None:
        clean["acc_sp_h"] = vec_w_to_h(acc_sp_w, heading)
    # The table puts the noised state terms first (quadrotor.terms.STATE_TERMS).
    noised = tuple(t for t in terms if t.noise_group is not None)
    rest = tuple(t for t in terms if t.noise_group is None)
    clean_state = assemble(noised, clean)  # [N, 18]
    noisy_state = clean_state if obs_noise is None else clean_state + obs_noise
    policy = torch.cat((noisy_state, *(clean[t.name] for t in rest)), dim=1) if rest else noisy_state
    critic_extra = tuple(t for t in terms if t.name in ("acc_sp_h", "pos_err_int_h"))
    rpm_norm = state[:, RPM] * (1.0 / rpm_per_action) - 1.0
    critic = torch.cat((clean_state, *(clean[t.name] for t in critic_extra), rpm_norm, critic_static), dim=1)
    return policy, critic


def heading_errors(
    state: torch.Tensor, setpoint_w: torch.Tensor, heading: torch.Tensor, rot_tables: Tables
) -> tuple[torch.Tensor, torch.Tensor]:
    """``pos_err_h [N, 3]`` (position minus setpoint, heading frame) and ``rot_hb [N, 9]`` of
    ``state [N, 17]`` for ``setpoint_w [3]`` (or ``[N, 3]``) and ``heading [N, 2]``."""
    quat = state[:, QUAT]
    rot_hb = rot_wb_to_hb(apply_bilinear(quat, quat, *rot_tables), heading)
    return vec_w_to_h(state[:, POS] - setpoint_w, heading), rot_hb


def critic_static_inputs(
    param_scales: torch.Tensor, force_w: torch.Tensor, torque_b: torch.Tensor, disturb_norm: torch.Tensor
) -> torch.Tensor:
    """``[N, 12]`` per-episode critic inputs: ``param_scales [N, 6]`` - 1, then ``force_w``,
    ``torque_b [N, 3]`` times ``disturb_norm [6]``."""
    return torch.cat((param_scales - 1.0, torch.cat((force_w, torque_b), dim=1) * disturb_norm), dim=1)


def ends_in_success(
    truncated: torch.Tensor, dist_sq_m2: torch.Tensor, cos_tilt: torch.Tensor, radius_m: float, cos_max_tilt: float
) -> torch.Tensor:
    """``[N]`` bool: a full-length episode (``truncated``) that ends within ``radius_m`` of the
    setpoint (``dist_sq_m2 [N]``: squared distance) and tilted less than the angle whose cosine
    is ``cos_max_tilt`` (``cos_tilt [N]``: ``R_hb[2][2]``)."""
    return truncated & (dist_sq_m2 < radius_m * radius_m) & (cos_tilt > cos_max_tilt)


def terms_of_reward(
    dist_sq_m2: torch.Tensor,
    rot_hb_c: torch.Tensor | Sequence[torch.Tensor],
    vel_sq: torch.Tensor,
    action_sq: torch.Tensor,
    terminated: torch.Tensor,
    c: CoreConsts,
) -> dict[str, torch.Tensor]:
    """The ``[N]`` reward terms of a step from the squared position error (m²), the 9
    components of ``R_hb`` (``rot_hb.T [9, N]`` or nine ``[N]`` rows: ``quadrotor.terms.tilt_cost``),
    the squared velocity (or velocity error) and the squared action offset from hover."""
    terms = {
        "position": dist_sq_m2 * c.k_pos,
        "orientation": tilt_cost(rot_hb_c) * c.k_ori,
        "yaw": (yaw_cost_mod_pi(rot_hb_c) if c.yaw_mod_pi else yaw_cost(rot_hb_c)) * c.k_yaw,
        "velocity": vel_sq * c.k_vel,
        "action": action_sq * c.k_act,
        "alive": torch.full_like(dist_sq_m2, c.alive),
    }
    if c.pos_bonus != 0.0:
        terms["position_bonus"] = torch.exp(dist_sq_m2 * -c.pos_bonus_inv_2r2) * c.pos_bonus
    if c.termination_penalty > 0.0:
        terms["termination"] = terminated * -c.termination_penalty
    return terms


def episode_ends(inside: torch.Tensor, episode_step: torch.Tensor, c: CoreConsts) -> tuple[torch.Tensor, torch.Tensor]:
    """``(terminated, truncated)`` ``[N]`` bool: left the position box (``inside [N]`` False;
    NaN fails every comparison, so a diverged env terminates too), or reached the episode length
    (``episode_step [N]``, counted after the step) inside it."""
    terminated = ~inside
    return terminated, (episode_step >= c.max_episode_steps) & inside


def sum_terms(terms: dict[str, torch.Tensor]) -> torch.Tensor:
    """``[N]`` reward: the sum of the ``[N]`` reward terms."""
    return torch.stack(list(terms.values())).sum(dim=0)


def quat_multiply(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Hamilton product ``a ⊗ b`` of ``[N, 4]`` (w, x, y, z) quaternions."""
    aw, ax, ay, az = a.unbind(1)
    bw, bx, by, bz = b.unbind(1)
    return torch.stack(
        (
            aw * bw - ax * bx - ay * by - az * bz,
            aw * bx + ax * bw + ay * bz - az * by,
            aw * by - ax * bz + ay * bw + az * bx,
            aw * bz + ax * by - ay * bx + az * bw,
        ),
        dim=1,
    )


def step_core(
    state: torch.Tensor,
    action: torch.Tensor,
    motor_action: torch.Tensor | None,
    rpm_limits: tuple[torch.Tensor, torch.Tensor] | None,
    action_hist: torch.Tensor,
    episode_step: torch.Tensor,
    pos_err_int_h: torch.Tensor,
    critic_static: torch.Tensor,
    obs_noise: torch.Tensor | None,
    setpoint_w: torch.Tensor,
    heading: torch.Tensor,
    terms: tuple[Any, ...],
    physics: PhysicsInputs,
    rot_tables: Tables,
    c: CoreConsts,
    vel_sp_w: torch.Tensor | None = None,
    acc_sp_w: torch.Tensor | None = None,
) -> dict[str, Any]:
    """Physics, observation, reward terms and termination of one step, as a pure function
    (no randomness, no data-dependent branches) so it can run compiled; resets stay outside.

    ``state [N, 17]``, ``action [N, 4]`` (sent: history and action cost), ``motor_action [N, 4]``
    (what the motors get, delayed by the gap models; None: ``action``), ``rpm_limits``
    (``[N, 4]`` setpoint scale and ``[N, 1]`` cap of the gap models, or None),
    ``action_hist [N, 4H]``, ``episode_step [N]``,
    ``pos_err_int_h [N, 3]``, ``critic_static [N, 12]``, ``setpoint_w [3]`` (or ``[N, 3]``),
    ``heading [N, 2]``; a moving setpoint adds its feed-forward ``vel_sp_w`` and ``acc_sp_w [N, 3]``
    (the velocity cost then penalizes the velocity error);
    returns the new state, history, counters and integral (updated by the module docstring's
    rule when ``c.integral``), ``pos_err_h``, ``rot_hb``, ``terms`` (dict of ``[N]``),
    ``reward``, ``terminated``, ``truncated``, ``policy`` and ``critic``.
    """
    action = action.clamp(-1.0, 1.0)
    applied = action if motor_action is None else motor_action
    rpm_cmd = action_to_rpm_cmd(applied, c.max_thrust_n, c.min_thrust_n, c.inv_thrust_coef, c.max_rpm)
    if rpm_limits is not None:  # thrust mismatch (scale) and battery sag (cap) of the gap models
        rpm_cmd = torch.minimum(rpm_cmd * rpm_limits[0], rpm_limits[1])
    state = rk4_step(state, rpm_cmd, *physics, c.dt_s, c.substeps)
    episode_step = episode_step + 1
    if c.history > 0:
        action_hist = torch.cat((action, action_hist[:, :-4]), dim=1)
    pos_err_h, rot_hb = heading_errors(state, setpoint_w, heading, rot_tables)
    if c.integral:
        # decay * I + dt * e, then the clamp: the order the firmware and ROS node repeat.
        pos_err_int_h = (pos_err_int_h * c.integral_decay + pos_err_h * c.dt_s).clamp(
            -c.integral_limit_ms, c.integral_limit_ms
        )
    # A non-finite entry anywhere in the state reaches the position within the same RK4 step,
    # so the box check also ends diverged envs. The validated setpoint keeps the whole box
    # above the ground, so it covers the ground as well.
    terminated, truncated = episode_ends((pos_err_h.abs() <= c.position_bound_m).all(dim=1), episode_step, c)
    vel_err_w = state[:, LIN_VEL] if vel_sp_w is None else state[:, LIN_VEL] - vel_sp_w
    reward_terms = terms_of_reward(
        pos_err_h.square().sum(dim=1),
        rot_hb.T,
        vel_err_w.square().sum(dim=1),
        (action - c.hover_action).square().sum(dim=1),
        terminated,
        c,
    )
    reward = sum_terms(reward_terms)
    policy, critic = observation(
        terms,
        state,
        pos_err_h,
        rot_hb,
        heading,
        action_hist,
        pos_err_int_h,
        critic_static,
        obs_noise,
        c.rpm_per_action,
        vel_sp_w,
        acc_sp_w,
    )
    return {
        "state": state,
        "action_hist": action_hist,
        "episode_step": episode_step,
        "pos_err_int_h": pos_err_int_h,
        "pos_err_h": pos_err_h,
        "rot_hb": rot_hb,
        "terms": reward_terms,
        "reward": reward,
        "terminated": terminated,
        "truncated": truncated,
        "policy": policy,
        "critic": critic,
    }


@functools.cache
def compiled_step_core() -> Callable[..., dict[str, Any]]:
    """:func:`step_core` through ``torch.compile``, once per process (static shapes)."""
    return torch.compile(step_core, fullgraph=True, dynamic=False)


def finite(x: torch.Tensor) -> torch.Tensor:
    """Replace NaN/inf by 0 so a diverged env cannot poison the learner's batch. Written as one
    comparison (false for NaN and both infinities) because inductor vectorizes it;
    ``nan_to_num`` compiles to a scalar ``isnan`` per element on CPU."""
    return torch.where(x.abs() < math.inf, x, 0.0)
