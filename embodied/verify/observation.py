"""Assemble a quadrotor policy's observation from raw vehicle state, by ``policy_io.json`` field names.

This is written independently of the torch task's ``observation()``: it reads only the field
names, sizes, scales and ``extra`` constants of ``policy_io.json``, so a sim-to-sim check through
it also checks that the interface file says what the task really feeds the policy.

Known fields (numpy float64 inside, float32 out):

- world frame: ``pos_err_w`` (3, m), ``rot_wb`` (9, row-major R_wb), ``lin_vel_w`` (3, m/s),
  ``pos_err_int_w`` (3, m*s);
- setpoint heading frame ``h`` (``R_wh = Rz(yaw_sp_rad)``): ``pos_err_h = R_whᵀ (p - p_sp)``,
  ``rot_hb = R_whᵀ R_wb`` (9, row-major), ``lin_vel_h = R_whᵀ v_w``, ``pos_err_int_h``;
- ``ang_vel_b`` (3, rad/s, body) and ``prev_actions`` (4 H, newest first);
- moving setpoints (quad-track): ``lin_vel_err_h = R_whᵀ (v_w - v_sp_w)`` (the velocity minus
  the setpoint's feed-forward velocity) and ``acc_sp_h = R_whᵀ a_sp_w`` (its feed-forward
  acceleration, not noised).

Any other name is an error that names the field and the file.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from embodied.errors import EmbodiedError
from embodied.io_spec import IOSpec
from embodied.tasks.quadrotor.terms import ALL_TERMS, FEEDFORWARD_TERM, WORLD_FRAME_TERMS

TERM_SIZES: dict[str, int] = {t.name: t.size for t in (*ALL_TERMS, *WORLD_FRAME_TERMS)}
"""Every field this module assembles -> its size, from the quadrotor term table
(``tasks/quadrotor/terms.py``; ``prev_actions`` is 4 per action of history)."""

STATE_FIELDS: dict[str, int] = {
    t.name: t.noise_group for t in (*ALL_TERMS, *WORLD_FRAME_TERMS) if t.noise_group is not None
}
"""State fields: name -> index of its noise group in ``extra.obs_noise_std`` (sizes: :data:`TERM_SIZES`)."""

INTEGRAL_FIELDS: dict[str, str] = {"pos_err_int_w": "pos_err_w", "pos_err_int_h": "pos_err_h"}
"""Integral fields: name -> the error they integrate."""

HISTORY_FIELD = "prev_actions"
FEEDFORWARD_FIELD = FEEDFORWARD_TERM.name
KNOWN_FIELDS = tuple(TERM_SIZES)


def rot_z(yaw_rad: np.ndarray) -> np.ndarray:
    """``[N]`` yaw angles -> ``[N, 3, 3]`` rotations about z."""
    c, s = np.cos(yaw_rad), np.sin(yaw_rad)
    zero, one = np.zeros_like(c), np.ones_like(c)
    return np.stack((np.stack((c, -s, zero), 1), np.stack((s, c, zero), 1), np.stack((zero, zero, one), 1)), 1)


def state_terms(
    pos_err_w: np.ndarray,
    rot_wb: np.ndarray,
    lin_vel_w: np.ndarray,
    ang_vel_b: np.ndarray,
    yaw_sp_rad: np.ndarray,
    vel_sp_w: np.ndarray | None = None,
    acc_sp_w: np.ndarray | None = None,
) -> dict[str, np.ndarray]:
    """Every state field of :data:`STATE_FIELDS` as ``[N, size]``.

    Args:
        pos_err_w: ``[N, 3]`` position minus setpoint, world (m).
        rot_wb: ``[N, 3, 3]`` body -> world rotations.
        lin_vel_w: ``[N, 3]`` world (m/s).
        ang_vel_b: ``[N, 3]`` body (rad/s).
        yaw_sp_rad: ``[N]`` setpoint yaw defining the heading frame.
        vel_sp_w, acc_sp_w: ``[N, 3]`` feed-forward of a moving setpoint (world; zero when None).
    """
    r_hw = np.transpose(rot_z(yaw_sp_rad), (0, 2, 1))  # R_whᵀ
    n = pos_err_w.shape[0]
    vel_sp_w = np.zeros_like(lin_vel_w) if vel_sp_w is None else vel_sp_w
    acc_sp_w = np.zeros_like(lin_vel_w) if acc_sp_w is None else acc_sp_w
    return {
        "lin_vel_err_h": np.einsum("nij,nj->ni", r_hw, lin_vel_w - vel_sp_w),
        "acc_sp_h": np.einsum("nij,nj->ni", r_hw, acc_sp_w),
        "pos_err_w": pos_err_w,
        "pos_err_h": np.einsum("nij,nj->ni", r_hw, pos_err_w),
        "rot_wb": rot_wb.reshape(n, 9),
        "rot_hb": np.matmul(r_hw, rot_wb).reshape(n, 9),
        "lin_vel_w": lin_vel_w,
        "lin_vel_h": np.einsum("nij,nj->ni", r_hw, lin_vel_w),
        "ang_vel_b": ang_vel_b,
    }


@dataclass(frozen=True)
class IntegralRule:
    """``I <- clamp(decay * I + dt_s * e, -limit, limit)`` per axis (from ``policy_io.json`` extra)."""

    decay: float = 0.995
    dt_s: float = 0.01
    limit_ms: float = 0.5

    def update(self, integral: np.ndarray, error: np.ndarray) -> np.ndarray:
        return np.clip(integral * self.decay + error * self.dt_s, -self.limit_ms, self.limit_ms)


class ObservationLayout:
    """The observation layout of one ``policy_io.json``; builds ``[N, obs_dim]`` float32 rows.

    Raises :class:`EmbodiedError` naming the field and ``source`` for an unknown name or a
    size that does not match the name.
    """

    def __init__(self, spec: IOSpec, source: str) -> None:
        self.spec = spec
        self.source = source
        self.history = 0
        self.integral_field: str | None = None
        for f in spec.obs_fields:
            if f.name in STATE_FIELDS or f.name in INTEGRAL_FIELDS or f.name == FEEDFORWARD_FIELD:
                want = TERM_SIZES[f.name]
                if f.size != want:
                    raise EmbodiedError(f"{source}: obs field {f.name!r} has size {f.size}, expected {want}")
                if f.name in INTEGRAL_FIELDS:
                    self.integral_field = f.name
            elif f.name == HISTORY_FIELD:
                if f.size % 4 != 0:
                    raise EmbodiedError(f"{source}: obs field {f.name!r} has size {f.size}, expected a multiple of 4")
                self.history = f.size // 4
            else:
                raise EmbodiedError(
                    f"{source}: unknown obs field {f.name!r}; the MuJoCo check knows {', '.join(KNOWN_FIELDS)}"
                )
        extra = spec.extra
        self.heading_frame = bool(extra.get("heading_frame")) or any(f.name.endswith("_h") for f in spec.obs_fields)
        """True when the policy works in the setpoint's heading frame (any yaw is then fair game)."""
        noise = extra.get("obs_noise_std", (0.0, 0.0, 0.0, 0.0))
        if not (isinstance(noise, (list, tuple)) and len(noise) == 4):
            raise EmbodiedError(f"{source}: extra.obs_noise_std must be a list of 4 numbers, got {noise!r}")
        self.noise_std = tuple(float(x) for x in noise)
        self.integral_rule = IntegralRule(
            decay=float(extra.get("pos_err_int_decay", IntegralRule.decay)),
            dt_s=float(extra.get("pos_err_int_dt_s", spec.control_period_s)),
            limit_ms=float(extra.get("pos_err_int_limit_ms", IntegralRule.limit_ms)),
        )
        self.initial_action = float(extra.get("prev_actions_at_reset", extra.get("hover_action", 0.0)))

    @property
    def integral_source(self) -> str | None:
        """The error field the integral integrates (None without an integral field)."""
        return None if self.integral_field is None else INTEGRAL_FIELDS[self.integral_field]

    def assemble(
        self,
        terms: dict[str, np.ndarray],
        integral: np.ndarray | None,
        prev_actions: np.ndarray,
        rng: np.random.Generator | None,
    ) -> np.ndarray:
        """``[N, obs_dim]`` float32 observation.

        Args:
            terms: :func:`state_terms` of the state the policy sees.
            integral: ``[N, 3]`` position-error integral in its field's frame (None without one).
            prev_actions: ``[N, 4 H]`` newest first.
            rng: draws the Gaussian observation noise of ``extra.obs_noise_std``; None for none.
        """
        parts: list[np.ndarray] = []
        for f in self.spec.obs_fields:
            if f.name in STATE_FIELDS:
                value = terms[f.name]
                std = self.noise_std[STATE_FIELDS[f.name]]
                if rng is not None and std > 0.0:
                    value = value + rng.normal(0.0, std, size=value.shape)
            elif f.name == FEEDFORWARD_FIELD:
                value = terms[f.name]
            elif f.name in INTEGRAL_FIELDS:
                if integral is None:
                    raise EmbodiedError(f"{self.source}: obs field {f.name!r} needs the integral state")
                value = integral
            else:
                value = prev_actions
            parts.append(value * f.scale if f.scale != 1.0 else value)
        return np.concatenate(parts, axis=1).astype(np.float32)
