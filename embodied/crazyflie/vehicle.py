"""Which exported policies the Crazyflie tooling accepts: keyed by ``policy_io.json``'s
``extra.vehicle``, which the quadrotor tasks write (``"crazyflie"``).

The firmware's controller (``firmware/common/quad_ctrl.c``) assembles the quad-hover
observation itself, so a Crazyflie policy must also carry that observation layout; the
Crazyflie app commands per-motor thrust, so flying it needs the ``motor_thrust`` action.
"""

from __future__ import annotations

from pathlib import Path

from embodied.errors import EmbodiedError
from embodied.policy_io import POLICY_IO_FILENAME, PolicyIO, read_policy_io

VEHICLE = "crazyflie"
"""The value of ``extra.vehicle`` this package serves."""
OBS_LAYOUTS: tuple[tuple[str, ...], ...] = (
    ("pos_err_h", "rot_hb", "lin_vel_h", "ang_vel_b"),  # quad-hover
    ("pos_err_h", "rot_hb", "lin_vel_err_h", "ang_vel_b", "acc_sp_h"),  # quad-track (moving setpoint)
)
"""Observation fields ``quad_ctrl.c`` assembles, one layout per quadrotor task (after them: the
optional integral and the action history)."""
THRUST_ACTION = "motor_thrust"


def vehicle_name(policy_io: PolicyIO) -> str:
    """``extra.vehicle`` of a policy ("" when the task wrote none)."""
    return str(policy_io.io_spec.extra.get("vehicle", ""))


def is_crazyflie(policy_io: PolicyIO) -> bool:
    """Whether the policy was trained for the Crazyflie (``extra.vehicle == "crazyflie"``)."""
    return vehicle_name(policy_io) == VEHICLE


def flies_thrust(policy_io: PolicyIO) -> bool:
    """Whether the policy commands per-motor thrust (the command chain of docs/conventions.md),
    the only action the Crazyflie app flies."""
    return any(f.name == THRUST_ACTION for f in policy_io.io_spec.action_fields)


def c_policy_io(c_dir: Path) -> PolicyIO:
    """The ``policy_io.json`` of a C export: it sits in the export folder, beside ``c/``."""
    path = Path(c_dir).parent / POLICY_IO_FILENAME
    if not path.is_file():
        raise EmbodiedError(
            f"{path} not found: a C export folder ({c_dir}) must sit beside its policy_io.json; "
            "run `embodied export RUN_DIR --format c`"
        )
    return read_policy_io(path)


def require_crazyflie(policy_io: PolicyIO, what: str) -> None:
    """Raise naming ``what`` needs it when the policy is not a Crazyflie quad-hover policy."""
    if not is_crazyflie(policy_io):
        found = repr(vehicle_name(policy_io)) if vehicle_name(policy_io) else "not set"
        raise EmbodiedError(
            f"{policy_io.path}: extra.vehicle is {found}, but {what} flies {VEHICLE!r} quadrotor policies only "
            "(the quadrotor tasks write it; re-export runs exported before it existed)"
        )
    names = tuple(f.name for f in policy_io.io_spec.obs_fields)
    if not any(names[: len(layout)] == layout for layout in OBS_LAYOUTS):
        raise EmbodiedError(
            f"{policy_io.path}: observation starts {list(names[:5])}, but the firmware controller assembles "
            f"one of {[list(layout) for layout in OBS_LAYOUTS]}; {what} flies quad-hover and quad-track policies only"
        )


def require_thrust(policy_io: PolicyIO) -> None:
    """Raise when the policy does not command per-motor thrust."""
    if not flies_thrust(policy_io):
        raise EmbodiedError(
            f"{policy_io.path} has no {THRUST_ACTION} action: the Crazyflie app flies per-motor thrust commands "
            "(policy_io.json action motor_thrust with extra max/min_thrust_per_motor_n); retrain with a "
            "task that exports them"
        )
