"""The quadrotor held level and still, as typed keyword arguments of ``QuadHover.set_physical_state``."""

from __future__ import annotations

from typing import TypedDict


class RestState(TypedDict):
    """Attitude and velocities of a vehicle at rest; position and the rest are left to the caller."""

    quat_wb: list[float]
    """``[4]`` w, x, y, z: body axes along the world axes."""
    lin_vel_w: list[float]
    """``[3]`` m/s."""
    ang_vel_b: list[float]
    """``[3]`` rad/s."""


def level_at_rest() -> RestState:
    """A fresh (unshared) level, still state to unpack into ``set_physical_state(**level_at_rest())``."""
    return {"quat_wb": [1.0, 0.0, 0.0, 0.0], "lin_vel_w": [0.0] * 3, "ang_vel_b": [0.0] * 3}
