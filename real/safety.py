"""Safety layer between the policy and the robot: envelope, clipping, rate limit, watchdog,
e-stop, re-arm.

States (``SafetyState``):

- ``inactive``: the node is configured but not activated (lifecycle). Safe command.
- ``waiting``: no valid input yet (start-up). Safe command.
- ``stale``: a required input is too old (arrival or header stamp). Safe command.
- ``fault``: inputs are fresh but do not form a valid observation (NaN, wrong sizes, ...).
- ``envelope``: the state is outside the training distribution (position error, tilt, rates):
  the policy's output there means nothing. Safe command.
- ``estop``: latched by the e-stop topic; only ``false`` on that topic releases it.
- ``rearming``: inputs are fresh and valid again; the safe command is held until
  ``rearm_periods`` consecutive good periods have passed (sensor glitches cannot toggle the
  policy on and off).
- ``hold``: armed, but a watched input has had no new message for ``safety.gap_hold``'s
  ``after_periods``: its hold command (e.g. hover thrust) is sent instead of the policy's action,
  and the first period with fresh inputs drives again at once (no re-arm). A gap that reaches the
  input's stale limit escalates to ``stale`` (safe command, re-arm rule).
- ``armed``: the policy drives. Its action is clipped to each field's ``[low, high]``,
  rate-limited, then mapped to physical units (``action * scale + offset``).

On arming, the rate limiter starts from the safe command expressed as a normalized action, so
the first commands ramp from what the robot was last told.
"""

from __future__ import annotations

import enum
import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from embodied.config import ConfigError
from embodied.io_spec import IOSpec
from embodied.real.observation import policy_extra_number
from embodied.real.robot_config import EnvelopeCheck, GapHoldCfg, SafetyCfg

log = logging.getLogger(__name__)

DEFAULT_ENVELOPE: dict[str, float] = {"pos_err_m": 0.6, "tilt_rad": 1.6, "ang_vel_rad_s": 10.0, "lin_vel_m_s": 3.0}
"""Limits used when ``policy_io.json`` has no ``extra.envelope`` (quadrotor training bounds)."""


class Envelope:
    """Plausibility bounds on observation fields: ``violation(fields) -> message or None``."""

    def __init__(
        self, checks: tuple[EnvelopeCheck, ...], io_spec: IOSpec, overrides: Mapping[str, float], source: str
    ) -> None:
        self.checks = checks
        exported = io_spec.extra.get("envelope")
        if checks and not isinstance(exported, Mapping):
            log.warning(
                "policy_io.json has no extra.envelope; using the default limits %s (override them with "
                "safety.envelope_limits in %s)",
                DEFAULT_ENVELOPE,
                source,
            )
        exported = exported if isinstance(exported, Mapping) else {}
        self.limits: dict[str, float] = {}
        for check in checks:
            value = overrides.get(check.key, exported.get(check.key, DEFAULT_ENVELOPE.get(check.key)))
            if not isinstance(value, int | float) or not value > 0:
                raise ConfigError(
                    f"{source}: safety.envelope.{check.key}: no positive limit for {check.key!r} in "
                    f"safety.envelope_limits, policy_io.json extra.envelope or the defaults {sorted(DEFAULT_ENVELOPE)}"
                )
            self.limits[check.key] = float(value)

    @staticmethod
    def measure(check: EnvelopeCheck, value: np.ndarray) -> float:
        if check.measure == "tilt":
            # Row-major rotation matrix: entry [2][2] is the body z axis' component on the frame's z.
            return math.acos(float(np.clip(value[8], -1.0, 1.0)))
        if check.measure == "abs_max":
            return float(np.max(np.abs(value))) if value.size else 0.0
        return float(np.linalg.norm(value))

    def violation(self, fields: Mapping[str, np.ndarray]) -> tuple[str, str] | None:
        """``(limit key, message)`` of the first bound exceeded, else ``None``."""
        for check in self.checks:
            value = fields.get(check.field)
            if value is None:
                continue
            measured = self.measure(check, value)
            limit = self.limits[check.key]
            if not measured <= limit:  # also catches NaN
                return check.key, f"{check.field} {check.measure} {measured:.3g} exceeds {check.key} {limit:.3g}"
        return None


class SafetyState(str, enum.Enum):
    INACTIVE = "inactive"
    WAITING = "waiting"
    STALE = "stale"
    FAULT = "fault"
    ENVELOPE = "envelope"
    ESTOP = "estop"
    REARMING = "rearming"
    HOLD = "hold"
    ARMED = "armed"


@dataclass(frozen=True)
class ActionMap:
    """Per-entry ``low``, ``high``, ``scale``, ``offset`` of the action vector [A] from policy_io."""

    low: np.ndarray
    high: np.ndarray
    scale: np.ndarray
    offset: np.ndarray

    @classmethod
    def from_io_spec(cls, io_spec: IOSpec) -> ActionMap:
        def per_entry(attr: str) -> np.ndarray:
            return np.concatenate([np.full(f.size, getattr(f, attr), dtype=np.float64) for f in io_spec.action_fields])

        return cls(per_entry("low"), per_entry("high"), per_entry("scale"), per_entry("offset"))

    def to_physical(self, action: np.ndarray) -> np.ndarray:
        return action * self.scale + self.offset

    def to_normalized(self, command: np.ndarray) -> np.ndarray:
        """Inverse of :meth:`to_physical` (entries with zero scale map to 0)."""
        safe_scale = np.where(self.scale == 0.0, 1.0, self.scale)
        return np.where(self.scale == 0.0, 0.0, (command - self.offset) / safe_scale)


class SafetyLayer:
    """Decides each period what is sent: the filtered policy action or the safe command."""

    def __init__(self, io_spec: IOSpec, cfg: SafetyCfg, period_s: float, source: str = "robot config") -> None:
        self.cfg = cfg
        self.period_s = period_s
        self.actions = ActionMap.from_io_spec(io_spec)
        if cfg.safe_command is not None and len(cfg.safe_command) != io_spec.action_dim:
            raise ConfigError(
                f"{source}: safety.safe_command has {len(cfg.safe_command)} values but the policy has "
                f"{io_spec.action_dim} actions"
            )
        rate = io_spec.extra.get("max_action_rate_per_s", cfg.max_action_rate_per_s)
        self.max_step = None if rate is None else float(rate) * period_s
        """Largest normalized change per period (policy_io's extra.max_action_rate_per_s wins)."""
        self._gap_command = self._resolve_gap_command(io_spec, cfg.gap_hold, source)
        self.state = SafetyState.WAITING
        self.good_periods = 0
        self.estop_latched = False
        self.sent_action: np.ndarray | None = None
        """The normalized action sent on the last armed period (the rate limiter's reference)."""

    def _resolve_gap_command(self, io_spec: IOSpec, gap: GapHoldCfg | None, source: str) -> np.ndarray | None:
        """``gap_hold.command`` in physical units [A] (``None``: the safe command)."""
        if gap is None or gap.command is None:
            return None
        if isinstance(gap.command, str):
            normalized = policy_extra_number(io_spec, gap.command, f"{source}: safety.gap_hold.command")
            return self.actions.to_physical(np.full(io_spec.action_dim, normalized))
        if len(gap.command) != io_spec.action_dim:
            raise ConfigError(
                f"{source}: safety.gap_hold.command has {len(gap.command)} values but the policy has "
                f"{io_spec.action_dim} actions"
            )
        return np.asarray(gap.command, dtype=np.float64)

    def gap_command(self, hold_value: np.ndarray | None) -> np.ndarray | None:
        """What is sent during a short input gap (physical units), or ``None`` when unknown."""
        return self._gap_command if self._gap_command is not None else self.safe_command(hold_value)

    def set_estop(self, engaged: bool) -> None:
        """E-stop input: ``True`` latches; ``False`` releases (the node must still re-arm)."""
        if engaged:
            self.estop_latched = True
        elif self.estop_latched:
            self.estop_latched = False
            self.good_periods = 0
            self.state = SafetyState.REARMING

    def safe_command(self, hold_value: np.ndarray | None) -> np.ndarray | None:
        """The robot's safe command (physical units), or ``None`` when holding with no data yet."""
        if self.cfg.safe_command is not None:
            return np.asarray(self.cfg.safe_command, dtype=np.float64)
        return hold_value

    def step(
        self, problem: SafetyState | None, action: np.ndarray | None, hold_value: np.ndarray | None = None
    ) -> tuple[np.ndarray | None, bool]:
        """One period. ``problem`` is what is wrong with this period's inputs (``STALE``,
        ``FAULT``, ``ENVELOPE``, ``INACTIVE``, ``HOLD`` for a short input gap) or ``None``;
        ``action`` is the policy output.

        Returns ``(command in physical units or None = send nothing, armed)``. ``armed`` is
        ``True`` only on periods where the policy's action was sent.
        """
        if problem is None and action is None:
            problem = SafetyState.FAULT
        if self.estop_latched:
            self.state = SafetyState.ESTOP
        elif problem is SafetyState.HOLD:
            if self.state in (SafetyState.ARMED, SafetyState.HOLD):
                self.state = SafetyState.HOLD
                command = self.gap_command(hold_value)
                if command is not None:  # the rate limiter resumes from what the robot was told
                    self.sent_action = self.actions.to_normalized(command)
                return command, False
            self.good_periods = 0  # not driving: a period with a gap does not count towards re-arming
        elif problem is not None:
            waiting = self.state is SafetyState.WAITING and problem is SafetyState.STALE
            self.state = SafetyState.WAITING if waiting else problem
            self.good_periods = 0
        elif self.state is SafetyState.HOLD:
            self.state = SafetyState.ARMED  # a gap shorter than the stale limit does not disarm
        elif self.state is not SafetyState.ARMED:
            self.good_periods += 1
            self.state = SafetyState.REARMING
            if self.good_periods >= max(self.cfg.rearm_periods, 1):
                self.state = SafetyState.ARMED
                safe = self.safe_command(hold_value)
                self.sent_action = None if safe is None else self.actions.to_normalized(safe)
        if self.state is not SafetyState.ARMED or action is None or problem is not None:
            return self.safe_command(hold_value), False
        clipped = np.clip(action.astype(np.float64), self.actions.low, self.actions.high)
        if self.max_step is not None and self.sent_action is not None:
            clipped = self.sent_action + np.clip(clipped - self.sent_action, -self.max_step, self.max_step)
        self.sent_action = clipped
        return self.actions.to_physical(clipped), True
