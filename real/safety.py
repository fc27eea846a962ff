"""Safety layer between the policy and the robot: clipping, rate limit, watchdog, e-stop, re-arm.

States (``SafetyState``):

- ``waiting``: no valid input yet (start-up). Safe command.
- ``stale``: a required input is older than its ``stale_timeout_s``. Safe command.
- ``fault``: inputs are fresh but do not form a valid observation (NaN, wrong sizes, ...).
- ``estop``: latched by the e-stop topic; only ``false`` on that topic releases it.
- ``rearming``: inputs are fresh and valid again; the safe command is held until
  ``rearm_periods`` consecutive good periods have passed (sensor glitches cannot toggle the
  policy on and off).
- ``armed``: the policy drives. Its action is clipped to each field's ``[low, high]``,
  rate-limited, then mapped to physical units (``action * scale + offset``).

On arming, the rate limiter starts from the safe command expressed as a normalized action, so
the first commands ramp from what the robot was last told.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import numpy as np

from embodied.config import ConfigError
from embodied.io_spec import IOSpec
from embodied.real.robot_config import SafetyCfg


class SafetyState(str, enum.Enum):
    WAITING = "waiting"
    STALE = "stale"
    FAULT = "fault"
    ESTOP = "estop"
    REARMING = "rearming"
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
        self.state = SafetyState.WAITING
        self.good_periods = 0
        self.estop_latched = False
        self.sent_action: np.ndarray | None = None
        """The normalized action sent on the last armed period (the rate limiter's reference)."""

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
        self, inputs_fresh: bool, action: np.ndarray | None, hold_value: np.ndarray | None = None
    ) -> tuple[np.ndarray | None, bool]:
        """One period. ``action`` is the policy output, ``None`` when no valid observation exists.

        Returns ``(command in physical units or None = send nothing, armed)``. ``armed`` is
        ``True`` only on periods where the policy's action was sent.
        """
        if self.estop_latched:
            self.state = SafetyState.ESTOP
        elif not inputs_fresh:
            self.state = SafetyState.WAITING if self.state is SafetyState.WAITING else SafetyState.STALE
            self.good_periods = 0
        elif action is None:
            self.state = SafetyState.FAULT
            self.good_periods = 0
        elif self.state is not SafetyState.ARMED:
            self.good_periods += 1
            self.state = SafetyState.REARMING
            if self.good_periods >= max(self.cfg.rearm_periods, 1):
                self.state = SafetyState.ARMED
                safe = self.safe_command(hold_value)
                self.sent_action = None if safe is None else self.actions.to_normalized(safe)
        if self.state is not SafetyState.ARMED or action is None:
            return self.safe_command(hold_value), False
        clipped = np.clip(action.astype(np.float64), self.actions.low, self.actions.high)
        if self.max_step is not None and self.sent_action is not None:
            clipped = self.sent_action + np.clip(clipped - self.sent_action, -self.max_step, self.max_step)
        self.sent_action = clipped
        return self.actions.to_physical(clipped), True
