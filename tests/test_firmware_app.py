"""The Crazyflie app's controller_policy.c itself, on the host through the firmware shim.

The shim (firmware/shim/) stands in for the firmware around the app: PID, RTOS, console,
param/log tables, and a model of the motor chain (controlModeForce -> battery compensation ->
PWM -> thrust) of crazyflie-firmware 2025.12-2026.08; its limits are written in shim.c.
tests/test_firmware_real.py checks that model against the real firmware source.
"""

from __future__ import annotations

import dataclasses
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from export_support import (
    ENVELOPE,
    HOVER_ACTION,
    MAX_THRUST_N,
    MIN_THRUST_N,
    near_hover_policy,
    needs_arm,
    needs_gcc,
    quad_io_spec,
    random_policy,
    write_io,
)

from embodied.crazyflie import firmware_build as fb
from embodied.crazyflie.firmware_tree import PUBLISHED_PLATFORMS, FirmwareConfig, PlatformConstants
from embodied.export.c_header import generate_c
from embodied.export.host_lib import HostPolicyLib
from embodied.export.policy_io import read_policy_io
from embodied.io_spec import IOSpec
from embodied.policies.mlp import ExportedPolicy
from embodied.sim.vehicle_variants import VARIANTS

RAD_TO_DEG = np.float32(180.0 / math.pi)
FORCE, LEGACY = 2, 0  # control modes: the policy flies / the PID flies
# The shim's default build for a crazyflie-2.1 policy: crazyflie-firmware 2025.12's cf2 platform
# with legacy propellers (THRUST_MAX 0.1125 N, THRUST_MIN 0.02 N); 2025.12.1 and newer define
# THRUST_MAX 0.12 N and THRUST_MIN 0.0128 N (platform_defaults_cf2.h).
CF2_2025_12 = PUBLISHED_PLATFORMS[FirmwareConfig("CF2", "CRAZYFLIE_LEGACY_PROPELLERS")]
CF2_2025_12_1 = dataclasses.replace(CF2_2025_12, thrust_max_n=0.12, thrust_min_n=0.012817578393224994)
SETPOINT = np.array([0.1, -0.2, 1.0], dtype=np.float32)
LEVEL = np.array([0.1, -0.2, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0], dtype=np.float32)


def build_app_lib(
    out: Path,
    module: ExportedPolicy,
    spec: IOSpec,
    platform: PlatformConstants | None = None,
    config: FirmwareConfig | None = None,
) -> HostPolicyLib:
    """The app on the shim, which models ``config`` (default: the build the policy's variant needs)
    with ``platform``'s motor constants (default: that build's in crazyflie-firmware 2025.12)."""
    io_path = write_io(module, spec, out)
    generate_c(module, io_path, out / "c")
    return HostPolicyLib(fb.build_host_library(out / "c", out / "build", platform=platform, config=config))


def thrust_of_forces(forces: np.ndarray, platform: PlatformConstants = CF2_2025_12) -> np.ndarray:
    """What normalizedForces ask the firmware for, in N per motor (f * THRUST_MAX)."""
    return forces.astype(np.float64) * platform.thrust_max_n


def action_of_thrust(thrust_n: np.ndarray) -> np.ndarray:
    """The command chain of docs/conventions.md inverted: a = 2 T / T_max - 1."""
    return 2.0 * thrust_n / MAX_THRUST_N - 1.0


def reference_forces(lib: HostPolicyLib, estimate10: np.ndarray, gyro_rad_s: np.ndarray) -> np.ndarray:
    """The policy's command on a fresh history (quad_ctrl.c alone), as normalizedForces of 2025.12."""
    ctx = lib.new_contexts(1, initial_action=HOVER_ACTION)
    state13 = np.concatenate([estimate10, gyro_rad_s]).astype(np.float32)
    setpoint_with_yaw = np.append(SETPOINT, 0.0).astype(np.float32)
    action = lib.step(ctx, state13[None], setpoint_with_yaw[None])[0].astype(np.float64)
    thrust = (action + 1.0) / 2.0 * MAX_THRUST_N
    return np.where(thrust >= MIN_THRUST_N, thrust / CF2_2025_12.thrust_max_n, 0.0)


@pytest.fixture(scope="module")
def app_lib(tmp_path_factory: pytest.TempPathFactory) -> HostPolicyLib:
    out = tmp_path_factory.mktemp("app")
    return build_app_lib(out, near_hover_policy(146, HOVER_ACTION, seed=3), quad_io_spec(history=32))


def _moved(seed: int) -> tuple[np.ndarray, np.ndarray]:
    """An estimate inside the envelope near SETPOINT and its gyro rates (rad/s)."""
    rng = np.random.default_rng(seed)
    est = LEVEL.copy()
    est[0:3] += rng.uniform(-0.2, 0.2, 3).astype(np.float32)
    q = np.array([1.0, *rng.uniform(-0.1, 0.1, 3)])
    est[3:7] = (q / np.linalg.norm(q)).astype(np.float32)
    est[7:10] = rng.uniform(-0.5, 0.5, 3).astype(np.float32)
    return est, rng.uniform(-1.0, 1.0, 3).astype(np.float32)


@needs_gcc
def test_enable_defaults_to_zero_and_the_first_engaged_tick_commands_the_policy(app_lib: HostPolicyLib) -> None:
    lib = app_lib
    assert lib.cf_init()
    assert lib.cf_log("selftest") == 1 and lib.cf_log("fault") == 0
    est, gyro = _moved(1)
    # Not armed after boot: the PID flies (legacy mode) although the setpoint is a position.
    for tick in range(5):
        mode, _, _ = lib.cf_tick(tick, est, gyro * RAD_TO_DEG, SETPOINT, setpoint_timestamp_ms=tick)
        assert mode == LEGACY
    lib.cf_param_set("enable", 1)
    # Engagement on a tick that is not a multiple of the decimation: the policy's own command
    # (fresh history) goes out on that very tick, in force mode, gyro converted from deg/s.
    mode, forces, thrust = lib.cf_tick(37, est, gyro * RAD_TO_DEG, SETPOINT, setpoint_timestamp_ms=37)
    assert mode == FORCE
    expected = reference_forces(lib, est, gyro)
    np.testing.assert_allclose(forces, expected, atol=2e-6)
    assert np.all(forces > 0.1)  # never zeros at handover
    # The firmware's chain turns f back into the commanded thrust (to PWM resolution).
    np.testing.assert_allclose(thrust, thrust_of_forces(forces), rtol=2e-3)
    # Held for the 9 ticks in between; the next policy step 10 ticks after engagement.
    est2, gyro2 = _moved(2)
    for tick in range(38, 47):
        mode, held, _ = lib.cf_tick(tick, est2, gyro2 * RAD_TO_DEG, SETPOINT, setpoint_timestamp_ms=tick)
        assert mode == FORCE
        np.testing.assert_array_equal(held, forces)
    mode, new, _ = lib.cf_tick(47, est2, gyro2 * RAD_TO_DEG, SETPOINT, setpoint_timestamp_ms=47)
    assert mode == FORCE and not np.array_equal(new, forces)
    assert lib.cf_log("steps") == 2
    # Disarm, then re-arm later in another state: the first command is the policy's on that
    # state with a fresh history, not the previous engagement's held values.
    lib.cf_param_set("enable", 0)
    mode, _, _ = lib.cf_tick(48, est2, gyro2 * RAD_TO_DEG, SETPOINT, setpoint_timestamp_ms=48)
    assert mode == LEGACY and lib.cf_log("active") == 0
    est3, gyro3 = _moved(3)
    lib.cf_param_set("enable", 1)
    mode, forces3, _ = lib.cf_tick(123, est3, gyro3 * RAD_TO_DEG, SETPOINT, setpoint_timestamp_ms=123)
    assert mode == FORCE
    np.testing.assert_allclose(forces3, reference_forces(lib, est3, gyro3), atol=2e-6)
    assert lib.cf_log("engaged") == 2


@needs_gcc
def test_setpoint_timeout_and_mode_hand_back_to_pid(app_lib: HostPolicyLib) -> None:
    lib = app_lib
    assert lib.cf_init()
    lib.cf_param_set("enable", 1)
    est, gyro = _moved(4)
    assert lib.cf_tick(0, est, gyro * RAD_TO_DEG, SETPOINT, setpoint_timestamp_ms=1)[0] == FORCE
    for tick in range(1, 201):  # the same setpoint stamp for 200 ms: still fine
        est = est.copy()
        est[2] += 1e-5  # a live estimator keeps moving
        assert lib.cf_tick(tick, est, gyro * RAD_TO_DEG, SETPOINT, setpoint_timestamp_ms=1)[0] == FORCE
    assert lib.cf_tick(202, est, gyro * RAD_TO_DEG, SETPOINT, setpoint_timestamp_ms=1)[0] == LEGACY
    # A fresh setpoint that is not an absolute position (and yaw) goes to the PID too.
    assert lib.cf_tick(203, est, gyro, SETPOINT, setpoint_timestamp_ms=300, position_mode=False)[0] == LEGACY
    assert lib.cf_tick(204, est, gyro, SETPOINT, setpoint_timestamp_ms=301)[0] == FORCE
    assert lib.cf_log("fault") == 0 and lib.cf_log("active") == 1


def _engaged(lib: HostPolicyLib, seed: int) -> tuple[np.ndarray, np.ndarray]:
    assert lib.cf_init()
    lib.console()
    lib.cf_param_set("enable", 1)
    est, gyro = _moved(seed)
    assert lib.cf_tick(0, est, gyro * RAD_TO_DEG, SETPOINT, setpoint_timestamp_ms=0)[0] == FORCE
    return est, gyro


@needs_gcc
@pytest.mark.parametrize("where", ["position", "velocity", "gyro", "quaternion", "setpoint_yaw"])
def test_non_finite_input_disengages_and_disarms(app_lib: HostPolicyLib, where: str) -> None:
    lib = app_lib
    est, gyro = _engaged(lib, seed=5)
    bad_est, bad_gyro, yaw = est.copy(), gyro * RAD_TO_DEG, 0.0
    if where == "position":
        bad_est[1] = np.nan
    elif where == "velocity":
        bad_est[8] = np.inf
    elif where == "gyro":
        bad_gyro[2] = np.nan
    elif where == "quaternion":
        bad_est[4] = -np.inf
    else:
        yaw = float("nan")
    mode, _, _ = lib.cf_tick(1, bad_est, bad_gyro, SETPOINT, setpoint_timestamp_ms=1, setpoint_yaw_deg=yaw)
    assert mode == LEGACY  # the PID's command on that very tick, not zeros and not the held one
    assert lib.cf_log("fault") == 3 and lib.cf_log("active") == 0
    assert "non-finite estimate" in lib.console()
    # Disarmed: a sane state again does not re-engage until the operator sets enable = 1.
    assert lib.cf_tick(2, est, gyro * RAD_TO_DEG, SETPOINT, setpoint_timestamp_ms=2)[0] == LEGACY
    lib.cf_param_set("enable", 1)
    assert lib.cf_tick(3, est, gyro * RAD_TO_DEG, SETPOINT, setpoint_timestamp_ms=3)[0] == FORCE


@needs_gcc
def test_stale_estimate_disengages(app_lib: HostPolicyLib) -> None:
    lib = app_lib
    est, gyro = _engaged(lib, seed=6)
    # The estimate stops changing (the Kalman filter predicts at 100 Hz; 100 ms allowed).
    for tick in range(1, 101):
        assert lib.cf_tick(tick, est, gyro * RAD_TO_DEG, SETPOINT, setpoint_timestamp_ms=tick)[0] == FORCE
    assert lib.cf_tick(101, est, gyro * RAD_TO_DEG, SETPOINT, setpoint_timestamp_ms=101)[0] == LEGACY
    assert lib.cf_log("fault") == 4
    assert "stale estimate" in lib.console()


@needs_gcc
@pytest.mark.parametrize(
    ("change", "value"),
    [("pos_axis", 0.61), ("tilt", 1.7), ("ang_vel", 10.5), ("lin_vel", 3.1), ("pos_heading", 0.5)],
)
def test_leaving_the_envelope_disengages(app_lib: HostPolicyLib, change: str, value: float) -> None:
    lib = app_lib
    _engaged(lib, seed=7)
    out_est, out_gyro, yaw_deg = LEVEL.copy(), np.zeros(3, dtype=np.float32), 0.0
    if change == "pos_axis":
        out_est[2] = SETPOINT[2] - value  # below the setpoint by more than the training box
    elif change == "tilt":
        out_est[3:7] = [math.cos(value / 2), math.sin(value / 2), 0.0, 0.0]
    elif change == "ang_vel":
        out_gyro = np.array([value / math.sqrt(2), 0.0, value / math.sqrt(2)], dtype=np.float32)
    elif change == "lin_vel":
        out_est[7:10] = [0.0, value / math.sqrt(2), -value / math.sqrt(2)]
    else:
        # 0.5 m along world x and y is inside the box in the world frame, but 0.707 m along the
        # heading frame's x for a setpoint yaw of 45 deg: the box is the policy's (heading) frame.
        out_est[0:2] = SETPOINT[0:2] + value
        yaw_deg = 45.0
        assert lib.cf_tick(1, out_est, out_gyro, SETPOINT, setpoint_timestamp_ms=1)[0] == FORCE
    mode, _, _ = lib.cf_tick(
        2, out_est, out_gyro * RAD_TO_DEG, SETPOINT, setpoint_timestamp_ms=2, setpoint_yaw_deg=yaw_deg
    )
    assert mode == LEGACY
    assert lib.cf_log("fault") == 5 and lib.cf_log("active") == 0
    assert "left the flight envelope" in lib.console()


@needs_gcc
def test_no_engagement_outside_the_envelope_and_params_override_it(app_lib: HostPolicyLib) -> None:
    lib = app_lib
    assert lib.cf_init()
    lib.cf_param_set("enable", 1)
    below = LEVEL.copy()
    below[2] = SETPOINT[2] - 1.0  # on the ground 1 m below the setpoint
    assert lib.cf_tick(0, below, np.zeros(3), SETPOINT, setpoint_timestamp_ms=0)[0] == LEGACY
    assert lib.cf_log("waitEnv") == 1 and lib.cf_log("fault") == 0  # waiting, not a fault
    lifted = LEVEL.copy()
    lifted[2] = SETPOINT[2] - 0.3
    assert lib.cf_tick(1, lifted, np.zeros(3), SETPOINT, setpoint_timestamp_ms=1)[0] == FORCE
    lib.cf_param_set("enable", 0)
    lib.cf_tick(2, lifted, np.zeros(3), SETPOINT, setpoint_timestamp_ms=2)
    lib.cf_param_set("envPos", 0.25)  # a tighter box from cfclient
    lib.cf_param_set("enable", 1)
    lifted[2] += 1e-4
    assert lib.cf_tick(3, lifted, np.zeros(3), SETPOINT, setpoint_timestamp_ms=3)[0] == LEGACY
    lib.cf_param_set("envPos", ENVELOPE["pos_err_m"])
    lifted[2] += 1e-4
    assert lib.cf_tick(4, lifted, np.zeros(3), SETPOINT, setpoint_timestamp_ms=4)[0] == FORCE


@needs_gcc
def test_self_test_failure_falls_back_to_pid_and_says_so(tmp_path: Path) -> None:
    module = near_hover_policy(146, HOVER_ACTION)
    io_path = write_io(module, quad_io_spec(history=32), tmp_path)
    generate_c(module, io_path, tmp_path / "c")
    src = tmp_path / "c" / "policy.c"
    text = src.read_text()
    head, sep, tail = text.partition("static const float policy_b0[64] = {\n    ")
    assert sep
    src.write_text(head + sep + "4.0f + " + tail)  # the network no longer matches its embedded example
    lib = HostPolicyLib(fb.build_host_library(tmp_path / "c", tmp_path / "build"))
    assert lib.cf_init()  # the system test still passes: the firmware keeps running
    assert lib.cf_log("selftest") == 0 and lib.cf_log("fault") == 1
    assert "policy self-test failed" in lib.console()
    lib.cf_param_set("enable", 1)
    est, gyro = _moved(8)
    for tick in range(20):
        est[2] += 1e-4
        assert lib.cf_tick(tick, est, gyro * RAD_TO_DEG, SETPOINT, setpoint_timestamp_ms=tick)[0] == LEGACY


@needs_gcc
def test_console_formats_are_what_eprintf_prints(app_lib: HostPolicyLib, tmp_path: Path) -> None:
    # The shim's model of eprintf: two-digit precision, flags and a trailing '%' hang it;
    # unknown conversions misread the arguments.
    for bad in ("model %.12s\n", "%-5d", "%+d", "50%", "%e", "%g", "%p", "%lf", "%zu"):
        assert app_lib.eprintf_problem(bad) is not None, bad
    for good in ("plain\n", "%d %i %u %x %X %c %s", "%5.2f", "%08x", "%.3f", "%lu %lld %llx", "100%%"):
        assert app_lib.eprintf_problem(good) is None, good
    module = random_policy()
    io_path = write_io(module, quad_io_spec(history=32), tmp_path)
    generate_c(module, io_path, tmp_path / "c")
    formats = fb.app_console_formats(fb.stage_crazyflie_app(tmp_path / "c", tmp_path / "app"))
    assert len(formats) >= 6 and all(f.startswith("EMBODIED: ") for f in formats)
    assert read_policy_io(tmp_path).model_sha256 in formats[0]  # the start-up line names the model
    for fmt in formats:
        assert app_lib.eprintf_problem(fmt) is None, fmt
        assert "%" not in fmt, f"the app prints no conversions at all: {fmt!r}"


@needs_gcc
def test_shim_console_aborts_on_a_format_eprintf_hangs_on(app_lib: HostPolicyLib) -> None:
    code = (
        "import ctypes, sys; lib = ctypes.CDLL(sys.argv[1]); "
        "lib.shim_debug_print(b'model %.12s\\n', b'abc'); print('not reached')"
    )
    proc = subprocess.run([sys.executable, "-c", code, str(app_lib.path)], capture_output=True, text=True)
    assert proc.returncode != 0 and "not reached" not in proc.stdout
    assert "eprintf loops forever" in proc.stderr and "%.12s" in proc.stderr


@needs_gcc
@pytest.mark.parametrize("platform", [CF2_2025_12, CF2_2025_12_1], ids=["2025.12", "2025.12.1"])
def test_motor_chain_gives_the_commanded_thrust_on_each_release(tmp_path: Path, platform: PlatformConstants) -> None:
    """Same policy, two releases with different THRUST_MAX / THRUST_MIN: the same thrust comes out."""
    module = near_hover_policy(146, HOVER_ACTION, seed=9)
    lib = build_app_lib(tmp_path, module, quad_io_spec(history=32), platform=platform)
    assert lib.cf_init()
    lib.cf_param_set("enable", 1)
    est, gyro = _moved(9)
    for volts in (4.2, 3.7):
        mode, forces, thrust = lib.cf_tick(
            0, est, gyro * RAD_TO_DEG, SETPOINT, setpoint_timestamp_ms=0, supply_voltage_v=volts
        )
        assert mode == FORCE
        commanded = (reference_forces(lib, est, gyro) * CF2_2025_12.thrust_max_n).astype(np.float64)
        np.testing.assert_allclose(thrust_of_forces(forces, platform), commanded, rtol=1e-6)
        np.testing.assert_allclose(thrust, commanded, rtol=2e-3)  # PWM is 16-bit
        lib.cf_param_set("enable", 0)
        lib.cf_tick(1, est, gyro, SETPOINT, setpoint_timestamp_ms=1)
        lib.cf_param_set("enable", 1)


@needs_gcc
def test_thrust_below_the_cut_is_zero_like_the_simulator(tmp_path: Path) -> None:
    """A policy asking for 0.015 N per motor: the simulator gives 0; so must every release
    (2025.12.1 and newer would fly 0.015 N since their THRUST_MIN is 0.0128 N, unless the app cuts it)."""
    module = near_hover_policy(146, HOVER_ACTION)
    with torch.no_grad():
        [m for m in module.modules() if isinstance(m, torch.nn.Linear)][-1].weight.zero_()
        [m for m in module.modules() if isinstance(m, torch.nn.Linear)][-1].bias.fill_(2 * 0.015 / MAX_THRUST_N - 1)
    for name, platform in (("2025.12", CF2_2025_12), ("2025.12.1", CF2_2025_12_1)):
        lib = build_app_lib(tmp_path / name, module, quad_io_spec(history=32), platform=platform)
        assert lib.cf_init()
        lib.cf_param_set("enable", 1)
        mode, forces, thrust = lib.cf_tick(0, LEVEL, np.zeros(3), SETPOINT, setpoint_timestamp_ms=0)
        assert mode == FORCE
        np.testing.assert_array_equal(forces, 0.0)
        np.testing.assert_array_equal(thrust, 0.0)


@needs_arm
def test_app_refuses_to_build_without_battery_compensation_or_thrust_action(tmp_path: Path) -> None:
    module = random_policy()
    io_path = write_io(module, quad_io_spec(history=32), tmp_path)
    generate_c(module, io_path, tmp_path / "c")
    staged = fb.stage_crazyflie_app(tmp_path / "c", tmp_path / "app")
    src = staged / "src"
    cmd = ["arm-none-eabi-gcc", *fb.ARM_CFLAGS, *fb.STRICT_CFLAGS, f"-I{src}", f"-I{fb.firmware_dir() / 'shim'}"]
    cmd += ["-c", str(src / "controller_policy.c"), "-o", str(tmp_path / "x.o")]
    proc = subprocess.run([*cmd, "-DSHIM_NO_THRUST_BAT_COMPENSATED"], capture_output=True, text=True)
    assert proc.returncode != 0 and "CONFIG_ENABLE_THRUST_BAT_COMPENSATED is off" in proc.stderr
    # A policy trained with the old rpm action: refused with the contract named.
    header = (src / "policy.h").read_text().replace("MOTOR_THRUST", "MOTOR_RPM")
    (src / "policy.h").write_text(header)
    proc = subprocess.run(cmd, capture_output=True, text=True)
    assert proc.returncode != 0 and "motor_thrust action" in proc.stderr


@needs_gcc
def test_controller_policy_c_flies_the_simulator_in_closed_loop(tmp_path: Path) -> None:
    """controller_policy.c at 1 kHz in the loop with the torch simulator: every 10 ms command,
    turned back from normalizedForces (via the firmware's THRUST_MAX) into the action, equals the
    network's output on the task's own observation (units, frames, decimation, history); an
    episode end re-arms the app (a fresh engagement, history reset like the task's)."""
    from embodied.crazyflie.sil import packed_state
    from embodied.tasks.quadrotor.hover import QuadHover, QuadHoverCfg

    cfg = QuadHoverCfg(
        action_history=4, obs_noise_std=(0.0,) * 4, episode_steps=40, init_level_fraction=1.0, yaw_symmetry=False
    )
    env = QuadHover(cfg, num_envs=1, device=torch.device("cpu"), seed=0)
    spec = env.io_spec()
    hover = float(spec.extra["hover_action"])
    module = near_hover_policy(spec.obs_dim, hover, seed=11)
    lib = build_app_lib(tmp_path, module, spec)
    assert lib.cf_init()
    lib.cf_param_set("enable", 1)
    decimation = lib.control_period_us // 1000
    obs = env.observe(noise=False)["policy"]
    tick, engagements, compared = 0, 0, 0
    for _ in range(100):
        if int(env.episode_step[0]) == 0:  # a new episode: the operator re-arms
            lib.cf_param_set("enable", 0)
            lib.cf_tick(tick, np.zeros(10), np.zeros(3), SETPOINT, setpoint_timestamp_ms=tick)
            tick += 1
            lib.cf_param_set("enable", 1)
            engagements += 1
        states, setpoints = packed_state(env)
        estimate10, gyro_deg_s = states[0, :10], states[0, 10:13] * RAD_TO_DEG
        commands = []
        for _ in range(decimation):  # the stabilizer's 1 kHz ticks within one policy period
            mode, forces, _ = lib.cf_tick(
                tick,
                estimate10,
                gyro_deg_s,
                setpoints[0, :3],
                setpoint_timestamp_ms=tick,
                setpoint_yaw_deg=float(setpoints[0, 3] * RAD_TO_DEG),  # the float32 product, as the firmware forms it
            )
            assert mode == FORCE
            commands.append(forces.copy())
            tick += 1
        assert all(np.array_equal(c, commands[0]) for c in commands)  # held between policy steps
        action = action_of_thrust(thrust_of_forces(commands[0]))
        expected = module(obs).detach().numpy()[0].clip(-1.0, 1.0)
        np.testing.assert_allclose(action, expected, atol=3e-6)
        compared += 1
        obs = env.step(torch.from_numpy(action.astype(np.float32))[None])[0]["policy"]
    assert engagements >= 3 and compared == 100
    assert lib.cf_log("engaged") == engagements and lib.cf_log("fault") == 0


@needs_gcc
@pytest.mark.parametrize(
    ("variant", "build"),
    [
        ("crazyflie-2.1", FirmwareConfig("CF2", "CRAZYFLIE_21_PLUS")),
        ("crazyflie-2.1-plus", FirmwareConfig("CF2", "CRAZYFLIE_LEGACY_PROPELLERS")),
        ("crazyflie-2.1-plus", FirmwareConfig("CF21BL")),
        ("crazyflie-2.1-brushless", FirmwareConfig("CF2", "CRAZYFLIE_21_PLUS")),
    ],
)
def test_app_refuses_a_policy_for_another_variant_at_start_up(
    tmp_path: Path, variant: str, build: FirmwareConfig
) -> None:
    spec = quad_io_spec(history=32)
    extra = {**spec.extra, "vehicle_variant": variant}
    if variant == "crazyflie-2.1-brushless":  # its firmware cuts below 0.0214 N (THRUST_MIN)
        extra["min_thrust_per_motor_n"] = VARIANTS[variant].min_thrust_per_motor_n
    spec = dataclasses.replace(spec, extra=extra)
    module = near_hover_policy(146, HOVER_ACTION, seed=12)
    lib = build_app_lib(tmp_path, module, spec, platform=PUBLISHED_PLATFORMS[build], config=build)
    assert lib.cf_init()  # the system test passes: the PID flies
    assert lib.cf_log("fault") == 6
    assert lib.console().splitlines() == [
        f"EMBODIED: policy trained for {variant}, not this firmware platform: the PID controller flies"
    ]
    lib.cf_param_set("enable", 1)
    est, gyro = _moved(12)
    for tick in range(3):
        assert lib.cf_tick(tick, est, gyro * RAD_TO_DEG, SETPOINT, setpoint_timestamp_ms=tick)[0] == LEGACY
    # The build that variant needs (the default host build) lets it fly.
    lib = build_app_lib(tmp_path / "matching", module, spec)
    assert lib.cf_init() and lib.cf_log("fault") == 0
    lib.cf_param_set("enable", 1)
    assert lib.cf_tick(0, est, gyro * RAD_TO_DEG, SETPOINT, setpoint_timestamp_ms=0)[0] == FORCE


@needs_gcc
@pytest.mark.parametrize("how", ["disarm", "nan_estimate", "stale_setpoint"])
def test_hand_back_on_odd_and_even_ticks_sends_only_the_pids_command(app_lib: HostPolicyLib, how: str) -> None:
    # The stand-in PID writes roll/pitch/yaw on even ticks only, like the stock one, and the
    # harness keeps the stabilizer's control_t across ticks: a hand-back must still put only the
    # PID's own numbers in the command (not the policy's normalizedForces read as roll/pitch/yaw).
    # Hand-backs: the operator disarms, the estimate turns NaN, or setpoints stop for 200 ms.
    lib = app_lib
    for hand_back_tick in (300, 301, 302, 303):
        assert lib.cf_init()
        lib.cf_param_set("enable", 1)
        est, gyro = _moved(hand_back_tick)
        gyro_deg_s = gyro * RAD_TO_DEG
        first = hand_back_tick - 201 if how == "stale_setpoint" else 200
        stamp = first
        for tick in range(first, hand_back_tick + 4):
            est = est.copy()
            est[2] += 1e-5  # a live estimator
            if tick == hand_back_tick and how == "disarm":
                lib.cf_param_set("enable", 0)
            sent = est.copy()
            if tick == hand_back_tick and how == "nan_estimate":
                sent[2] = np.nan
            if how != "stale_setpoint" and tick < hand_back_tick:
                stamp = tick  # a fresh setpoint every tick until the hand-back
            mode, _, thrust_n = lib.cf_tick(tick, sent, gyro_deg_s, SETPOINT, setpoint_timestamp_ms=stamp)
            where = f"{how}, hand-back on tick {hand_back_tick}, tick {tick}"
            assert mode == (FORCE if tick < hand_back_tick else LEGACY), where
            if tick < hand_back_tick:
                continue
            _, rpy, thrust, pid_rpy, pid_thrust = lib.cf_control()
            np.testing.assert_array_equal(rpy, pid_rpy, err_msg=where)
            assert thrust == pid_thrust > 0, where
            assert np.all(thrust_n > 0), (where, thrust_n)
