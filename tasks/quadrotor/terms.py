"""Observation terms and the heading frame shared by the quadrotor tasks.

The policy observation layout is written once, in :data:`STATE_TERMS` and :func:`policy_terms`:
the same table gives the tensor (:func:`assemble`), its size and the ``policy_io.json`` fields
(``embodied.io_spec.terms_dim`` / ``obs_fields``), which the firmware and the ROS 2 node read.
:data:`ALL_TERMS` lists every term a quadrotor task can emit; ``tests/test_obs_term_counterparts.py``
holds each second implementation (the compiled step's rows, the firmware C, the numpy assembly of
``embodied verify`` and the ROS 2 robot configs) to it, term by term.

Heading frame ``h`` (docs/conventions.md): the world frame rotated about z by the setpoint yaw
``yaw_sp_rad``, ``R_wh = Rz(yaw_sp_rad)``. Vectors are expressed in it with ``R_whᵀ``; a policy
in this frame sees the same observation for any setpoint heading, so it flies from any initial
yaw to any yaw setpoint.

All functions are pure tensor code without data-dependent branches, so they compile inside the
tasks' fused step (``env.sim.compile=true``).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import torch

from embodied.io_spec import ObsTerm

STATE_TERMS: tuple[ObsTerm, ...] = (
    ObsTerm("pos_err_h", 3, "m", "heading", "R_wh^T (position_w - setpoint_w), R_wh = Rz(yaw_sp_rad)", 0),
    ObsTerm("rot_hb", 9, "", "body->heading", "R_wh^T R_wb, row-major", 1),
    ObsTerm("lin_vel_h", 3, "m/s", "heading", "R_wh^T lin_vel_w", 2),
    ObsTerm("ang_vel_b", 3, "rad/s", "body", "gyro rates", 3),
)
"""The vehicle state as the policy sees it, in this order (noised in the simulator)."""

STATE_DIM = sum(t.size for t in STATE_TERMS)
"""18: the size of :data:`STATE_TERMS`."""

INTEGRAL_TERM = ObsTerm(
    "pos_err_int_h",
    3,
    "m*s",
    "heading",
    "leaky clamped integral of pos_err_h: zero at reset, then after every control step "
    "I = clamp(decay * I + dt_s * pos_err_h, -limit, limit) per axis with the new error "
    "(extra: pos_err_int_decay, pos_err_int_limit_ms, pos_err_int_dt_s); no noise",
)


TRACK_STATE_TERMS: tuple[ObsTerm, ...] = (
    STATE_TERMS[0],
    STATE_TERMS[1],
    ObsTerm(
        "lin_vel_err_h",
        3,
        "m/s",
        "heading",
        "R_wh^T (lin_vel_w - vel_sp_w): velocity minus the setpoint's feed-forward velocity",
        2,
    ),
    STATE_TERMS[3],
)
"""Tracking tasks: :data:`STATE_TERMS` with the velocity taken relative to the moving setpoint's
feed-forward velocity (equal to ``lin_vel_h`` for a fixed setpoint)."""

FEEDFORWARD_TERM = ObsTerm(
    "acc_sp_h",
    3,
    "m/s^2",
    "heading",
    "R_wh^T acc_sp_w: the moving setpoint's feed-forward acceleration; no noise",
)
"""Tracking tasks: the acceleration the path asks for, right after the state terms."""


def history_term(history: int) -> ObsTerm:
    """``prev_actions``: the last ``history`` actions sent, newest first (4 per action)."""
    return ObsTerm(
        "prev_actions",
        4 * history,
        "normalized",
        "",
        f"last {history} actions sent, newest first, M1..M4 each",
    )


def policy_terms(integral: bool, history: int, tracking: bool = False) -> tuple[ObsTerm, ...]:
    """The policy observation's terms in order: state, tracking feed-forward (``tracking``),
    optional integral, optional history."""
    state = (*TRACK_STATE_TERMS, FEEDFORWARD_TERM) if tracking else STATE_TERMS
    terms = state + ((INTEGRAL_TERM,) if integral else ())
    return terms + ((history_term(history),) if history > 0 else ())


ALL_TERMS: tuple[ObsTerm, ...] = tuple(
    {t.name: t for t in (*policy_terms(True, 1), *policy_terms(True, 1, tracking=True))}.values()
)
"""Every term a quadrotor task can emit, once each (``prev_actions`` at a history of one action)."""


WORLD_FRAME_TERMS: tuple[ObsTerm, ...] = (
    ObsTerm("pos_err_w", 3, "m", "world", "position_w - setpoint_w", 0),
    ObsTerm("rot_wb", 9, "", "body->world", "R_wb, row-major", 1),
    ObsTerm("lin_vel_w", 3, "m/s", "world", "lin_vel_w", 2),
    ObsTerm("pos_err_int_w", 3, "m*s", "world", "leaky clamped integral of pos_err_w; no noise"),
)
"""The world-frame forms of the state terms that policies trained before the heading frame
take; no task emits them now, ``embodied verify`` still assembles them for such run directories."""


def noise_std_row(terms: tuple[ObsTerm, ...], obs_noise_std: tuple[float, ...]) -> list[float]:
    """Per-entry σ of the noised terms (which must lead the observation): ``[STATE_DIM]`` values."""
    row: list[float] = []
    for term in terms:
        if term.noise_group is None:
            break
        row += [float(obs_noise_std[term.noise_group])] * term.size
    return row


def assemble(terms: tuple[ObsTerm, ...], values: dict[str, torch.Tensor]) -> torch.Tensor:
    """``[N, sum of sizes]``: the ``[N, size]`` value of every term, in table order."""
    parts = [values[t.name] for t in terms]
    return torch.cat(parts, dim=1) if len(parts) > 1 else parts[0]


# ---------------------------------------------------------------------------- heading frame
def heading_cos_sin(yaw_sp_rad: torch.Tensor) -> torch.Tensor:
    """``[N]`` setpoint yaws (rad) -> ``[N, 2]`` float32 ``(cos, sin)``.

    Evaluated in float64 and rounded once, so the firmware (which does the same in double)
    gets bit-identical values and hence a bit-identical heading-frame observation.
    """
    yaw = yaw_sp_rad.double()
    return torch.stack((torch.cos(yaw), torch.sin(yaw)), dim=1).float()


def vec_w_to_h(vec_w: torch.Tensor, heading: torch.Tensor) -> torch.Tensor:
    """``R_whᵀ v``: ``vec_w [N, 3]``, ``heading [N, 2]`` (cos, sin) -> ``[N, 3]``.

    The operation order (``c x + s y``, ``c y - s x``) is the one ``quad_ctrl.c`` uses.
    """
    c, s = heading[:, 0:1], heading[:, 1:2]
    x, y = vec_w[:, 0:1], vec_w[:, 1:2]
    return torch.cat((c * x + s * y, c * y - s * x, vec_w[:, 2:3]), dim=1)


def rot_wb_to_hb(rot_wb: torch.Tensor, heading: torch.Tensor) -> torch.Tensor:
    """``R_whᵀ R_wb`` of row-major ``rot_wb [N, 9]`` -> row-major ``[N, 9]`` (rows mixed like vectors)."""
    c, s = heading[:, 0:1], heading[:, 1:2]
    row0, row1, row2 = rot_wb[:, 0:3], rot_wb[:, 3:6], rot_wb[:, 6:9]
    return torch.cat((c * row0 + s * row1, c * row1 - s * row0, row2), dim=1)


RotComponents = torch.Tensor | Sequence[torch.Tensor]
"""The 9 entries of row-major 3x3 rotations of ``N`` envs, indexable by entry: ``rot.T [9, N]``
of a ``[N, 9]`` batch, or nine ``[N]`` rows (the compiled step's layout)."""


def tilt_cost(rot_hb: RotComponents) -> torch.Tensor:
    """``[N]``: ``(1 - cos tilt) / 2 = q_x² + q_y²`` of the body-to-heading rotation (0 level, 1 upside down)."""
    return (1.0 - rot_hb[8]) * 0.5


def yaw_cost(rot_hb: RotComponents) -> torch.Tensor:
    """``[N]``: ``q_z² = (1 + r22 - r00 - r11) / 4`` of the body-to-heading rotation: ``(1 - cos ψ) / 2``
    for a pure heading error ψ (0 aligned with the setpoint yaw, 1 at 180°). With
    :func:`tilt_cost` it sums to ``1 - q_w²``, L2F's orientation cost."""
    return (1.0 + rot_hb[8] - rot_hb[0] - rot_hb[4]) * 0.25


def yaw_cost_mod_pi(rot_hb: RotComponents) -> torch.Tensor:
    """``[N]``: :func:`yaw_cost` of ``R_hb`` or of the relabelled body ``R_hb Rz(π)``, whichever is
    smaller: ``(1 + r22 - |r00 + r11|) / 4``, i.e. ``(1 - |cos ψ|) / 2`` for a pure heading error ψ
    (0 with either end of the body x axis on the setpoint heading, 1/2 at ±90°). The reward of a
    policy under the 180° yaw symmetry, which cannot tell the two ends apart."""
    return (1.0 + rot_hb[8] - (rot_hb[0] + rot_hb[4]).abs()) * 0.25


# ---------------------------------------------------------------------------- 180° yaw symmetry
MOTOR_FLIP: tuple[int, int, int, int] = (2, 3, 0, 1)
"""Motor relabelling of the X quadrotor turned by π about body z: the rotor in M1's place
(front-right) is then M3, in M2's place (back-right) M4, and so on. M1/M3 and M2/M4 share their
spin direction (``ROTOR_SPIN``), so the relabelled vehicle has identical physics
(docs/conventions.md, "180° yaw symmetry"). The map is its own inverse."""

YAW_FLIP_SELECT = ("rot_hb", 0)
"""Entry (term, offset) whose sign selects the flip: ``R_hb[0][0] < 0``, body x pointing away
from the setpoint heading."""


def _term_flip(term: ObsTerm) -> tuple[list[int], list[float]]:
    """Per entry of ``term``: (source offset within the term, sign) of the relabelled body
    ``b' = b Rz(π)``."""
    n = term.size
    if term.name in ("pos_err_h", "lin_vel_h", "pos_err_int_h", "lin_vel_err_h", "acc_sp_h"):
        return list(range(n)), [1.0] * n  # heading-frame vectors do not depend on the body
    if term.name == "rot_hb":
        # R_hb' = R_hb Rz(π) = R_hb diag(-1, -1, 1): columns 0 and 1 change sign (row-major 3x3).
        return list(range(9)), [-1.0, -1.0, 1.0] * 3
    if term.name == "ang_vel_b":
        return [0, 1, 2], [-1.0, -1.0, 1.0]  # ω_b' = Rz(π)ᵀ ω_b
    if term.name == "prev_actions":
        return [4 * (i // 4) + MOTOR_FLIP[i % 4] for i in range(n)], [1.0] * n
    raise ValueError(f"observation term {term.name!r} has no 180° yaw-symmetry rule (quadrotor.terms._term_flip)")


def yaw_symmetry_tables(terms: tuple[ObsTerm, ...]) -> dict[str, Any]:
    """The 180° yaw symmetry of an observation laid out by ``terms``, as ``policy_io.json``
    writes it (``extra.yaw_symmetry``)::

        flip      = obs[select_index] < 0
        obs'[i]   = obs_sign[i] * obs[obs_source[i]]      where flip, else obs[i]
        action[j] = out[action_source[j]]                 where flip, else out[j]

    ``out`` is the policy's output for ``obs'`` (relabelled motors); ``action`` goes to the motors.
    Applied to an observation that is already canonical it changes nothing.
    """
    source: list[int] = []
    sign: list[float] = []
    start = 0
    select = -1
    for term in terms:
        src, sgn = _term_flip(term)
        source += [start + i for i in src]
        sign += sgn
        if term.name == YAW_FLIP_SELECT[0]:
            select = start + YAW_FLIP_SELECT[1]
        start += term.size
    if select < 0:
        raise ValueError("the 180° yaw symmetry needs the rot_hb observation term")
    return {
        "select_index": select,
        "obs_source": source,
        "obs_sign": sign,
        "action_source": list(MOTOR_FLIP),
        "rule": "flip = obs[select_index] < 0; obs'[i] = obs_sign[i] * obs[obs_source[i]]; "
        "policy output out = f(obs'); action[j] = out[action_source[j]]; unflipped otherwise",
    }


def yaw_flip_obs(
    obs: torch.Tensor, source: torch.Tensor, sign: torch.Tensor, select: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """``obs [N, D]`` -> (canonical ``[N, D]``, flip ``[N, 1]`` bool) by :func:`yaw_symmetry_tables`
    (``source [D]`` long, ``sign [D]``). The compiled step has its own form on rows
    (``quadrotor.hover_fused.flip_rows``)."""
    flip = obs[:, select : select + 1] < 0.0
    return torch.where(flip, obs[:, source] * sign, obs), flip


def yaw_flip_action(action: torch.Tensor, flip: torch.Tensor) -> torch.Tensor:
    """``action [N, 4]`` with motors relabelled (:data:`MOTOR_FLIP`) where ``flip [N, 1]``."""
    return torch.where(flip, action[:, _motor_flip_index(action.device)], action)


@functools.cache
def _motor_flip_index(device: torch.device) -> torch.Tensor:
    return torch.tensor(MOTOR_FLIP, dtype=torch.long, device=device)
