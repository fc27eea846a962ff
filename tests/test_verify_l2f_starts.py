"""The recovery check's start distribution (L2F's) and its gate, without training a policy."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from embodied.errors import EmbodiedError
from embodied.sim.mujoco_crazyflie import quat_to_rot
from embodied.verify.episodes import (
    L2F_START_RANGES,
    EpisodeRules,
    sample_initial_states,
    start_ranges,
    start_rules,
)
from embodied.verify.gates import DEFAULT_GATES, GATE_HELP, check_gates, parse_gate_overrides

# The robust preset's narrow starts: the L2F distribution must replace them, not blend with them.
NARROW = EpisodeRules(init_max_angle_rad=0.5, init_lin_vel_mps=0.5, init_ang_vel_rad_s=0.3, init_pos_range_m=0.1)


@pytest.mark.parametrize("any_yaw", [False, True])
def test_l2f_starts_fill_l2f_ranges_and_stay_inside_them(any_yaw: bool) -> None:
    rules = start_rules(dataclasses.replace(NARROW, any_yaw=any_yaw), "l2f")
    n = 20_000
    starts = sample_initial_states(rules, n, np.random.default_rng(0))
    moving = np.any(starts.lin_vel_w != 0.0, axis=1)
    assert 0.08 < 1.0 - moving.mean() < 0.12, "about 10 % start level and at rest on the setpoint"
    tilt_deg = np.degrees(np.arccos(np.clip(quat_to_rot(starts.quat_wb)[:, 2, 2], -1.0, 1.0)))
    assert tilt_deg.max() <= 90.0 + 1e-9 and tilt_deg.max() > 85.0
    assert np.mean(tilt_deg[moving] > 57.3) > 0.1, "beyond the shipped config's 1 rad tilt, often"
    offset_m = starts.position_w - np.asarray(rules.setpoint_w)
    for values, bound in ((starts.lin_vel_w, 1.0), (starts.ang_vel_b, 1.0), (offset_m, 0.2)):
        assert np.abs(values).max() <= bound and np.abs(values).max() > 0.99 * bound
        assert np.all(np.abs(values[moving]).max(axis=0) > 0.99 * bound), "every axis reaches its bound"
    assert np.allclose(np.linalg.norm(starts.quat_wb, axis=1), 1.0)


def test_start_rules_keep_everything_but_the_start_ranges() -> None:
    l2f = start_rules(NARROW, "l2f")
    assert start_ranges(l2f) == pytest.approx(L2F_START_RANGES)
    assert start_ranges(NARROW)["init_max_angle_rad"] == 0.5
    assert (l2f.episode_steps, l2f.position_bound_m, l2f.success_radius_m) == (
        NARROW.episode_steps,
        NARROW.position_bound_m,
        NARROW.success_radius_m,
    )
    assert start_rules(NARROW, "run") is NARROW
    with pytest.raises(EmbodiedError, match="'run' or 'l2f'"):
        start_rules(NARROW, "wide")  # type: ignore[arg-type]


def test_l2f_recovery_gate_default_override_and_verdict() -> None:
    assert DEFAULT_GATES["l2f_recovery_min"] == 0.9 and "L2F" in GATE_HELP["l2f_recovery_min"]
    assert parse_gate_overrides([], None)["l2f_recovery_min"] == 0.9
    looser = parse_gate_overrides(["l2f_recovery_min=0.8"], None)
    assert looser["l2f_recovery_min"] == 0.8 and looser["mujoco_success_min"] == 0.9
    with pytest.raises(EmbodiedError, match="gate 'l2f_recovery_min' needs a number"):
        parse_gate_overrides(["l2f_recovery_min=most"], None)

    def verdict(gates: dict[str, float], value: float) -> bool:
        return {g.name: g.passed for g in check_gates(gates, {"l2f_recovery_min": value})}["l2f_recovery_min"]

    assert not verdict(DEFAULT_GATES, 0.85) and verdict(looser, 0.85)
    assert verdict(DEFAULT_GATES, 0.9) and not verdict(looser, math.nan)
