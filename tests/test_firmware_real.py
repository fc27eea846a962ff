"""Real-firmware tier: the Crazyflie app checked against crazyflie-firmware source trees.

Set ``CRAZYFLIE_BASE`` to one checkout, or several separated by ``:`` (each with its submodules,
e.g. ``git clone --recursive`` and ``git checkout 2025.12``); without it every test here is
skipped. For each tree:
  - the version check accepts it (2025.12 or newer) or refuses it naming the version and why;
  - the app is built inside the tree by its own Kbuild (``make`` of the out-of-tree app, the
    flight flags), and every symbol the app's objects need is defined by that firmware (or the
    toolchain's libc/libm); when the whole image links, ``cf2.bin`` is checked too;
  - every console format of the app runs through the tree's own ``eprintf.c`` (compiled for the
    host) and terminates, and the shim's eprintf model agrees with it on probe formats;
  - the motor command for known observations, through the tree's own ``powerDistributionForce``
    and ``motorsCompensateBatteryVoltage`` (extracted from its source and compiled for the host
    with its ``platform_defaults.h``), produces the simulator's thrust command (the command chain of docs/conventions.md), and
    the shim's model of that chain agrees with the real one.
"""

from __future__ import annotations

import logging
import os
import re
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from export_support import (
    HOVER_ACTION,
    MAX_THRUST_N,
    MIN_THRUST_N,
    near_hover_policy,
    needs_arm,
    needs_gcc,
    quad_io_spec,
    write_io,
)

from embodied.crazyflie import firmware_build as fb
from embodied.crazyflie import firmware_tree as ft
from embodied.crazyflie.vehicle import c_policy_io, firmware_config, vehicle_variant
from embodied.errors import EmbodiedError
from embodied.export.c_header import generate_c
from embodied.export.host_lib import HostPolicyLib

log = logging.getLogger(__name__)

TREES = [Path(p) for p in os.environ.get("CRAZYFLIE_BASE", "").split(":") if p]
pytestmark = [
    pytest.mark.skipif(
        not TREES, reason="CRAZYFLIE_BASE not set (path(s) to crazyflie-firmware checkouts, ':'-separated)"
    ),
    pytest.mark.slow,
]


def _tree_id(tree: Path) -> str:
    return tree.name or str(tree)


def _require_tree(tree: Path) -> None:
    if not tree.is_dir():
        pytest.skip(f"{tree} (from CRAZYFLIE_BASE) does not exist")


def _require_accepted_tree(tree: Path) -> None:
    _require_tree(tree)
    try:
        fb.check_crazyflie_tree(tree)
    except EmbodiedError:
        pytest.skip(f"{tree}: refused by the version check (covered by its own test)")


def _release(tree: Path) -> int | None:
    found = re.match(r"(\d{4})\.(\d{2})", fb.firmware_version(tree))
    return None if found is None else int(found.group(1)) * 100 + int(found.group(2))


@pytest.mark.parametrize("tree", TREES, ids=_tree_id)
def test_version_check_accepts_new_trees_and_names_why_old_ones_are_refused(tree: Path) -> None:
    _require_tree(tree)
    release = _release(tree)
    if release is not None and release >= 202512:
        assert fb.check_crazyflie_tree(tree) == fb.firmware_version(tree)
        return
    if release is None:  # no git version: judged by what the app relies on alone
        force = fb.c_function_body((tree / fb._FORCE_MODE_FILE).read_text(), "powerDistributionForce") or ""
        if "normalizedForces" in force:
            assert fb.check_crazyflie_tree(tree) == "unknown version"
            return
    with pytest.raises(EmbodiedError) as err:
        fb.check_crazyflie_tree(tree)
    text = str(err.value)
    assert f"crazyflie-firmware {fb.firmware_version(tree)}" in text  # the version found
    assert "2025.12 or newer" in text and ", ".join(fb.CHECKED_FIRMWARE) in text  # what is accepted
    assert "controlModeForce" in text  # why


def _policy(out: Path) -> Path:
    module = near_hover_policy(146, HOVER_ACTION, seed=21)
    io_path = write_io(module, quad_io_spec(history=32), out)
    generate_c(module, io_path, out / "c")
    return out / "c"


def _arm_multilib_symbols() -> set[str]:
    """Symbols newlib's hard-float libc/libm define (the firmware links them)."""
    names: set[str] = set()
    for lib in ("libc.a", "libm.a", "libgcc.a"):
        path = subprocess.run(
            ["arm-none-eabi-gcc", *fb.ARM_CFLAGS, f"-print-file-name={lib}"], capture_output=True, text=True, check=True
        ).stdout.strip()
        if not os.path.isfile(path):
            path = subprocess.run(
                ["arm-none-eabi-gcc", *fb.ARM_CFLAGS, "-print-libgcc-file-name"], capture_output=True, text=True
            ).stdout.strip()
        out = subprocess.run(["arm-none-eabi-nm", "--defined-only", path], capture_output=True, text=True).stdout
        names |= {line.split()[-1] for line in out.splitlines() if len(line.split()) == 3}
    return names


def _symbols(paths: list[Path], undefined: bool) -> set[str]:
    """Symbols the ARM objects ``paths`` define (or need); other objects are skipped."""
    flag = "--undefined-only" if undefined else "--defined-only"
    cmd = ["arm-none-eabi-nm", flag, *map(str, paths)]
    out = subprocess.run(cmd, capture_output=True, text=True, check=False).stdout
    return {line.split()[-1] for line in out.splitlines() if line.strip() and not line.endswith(":")}


@needs_arm
@pytest.mark.parametrize("tree", TREES, ids=_tree_id)
def test_app_builds_inside_the_real_tree(tree: Path, tmp_path: Path) -> None:
    _require_accepted_tree(tree)
    staged = fb.stage_crazyflie_app(_policy(tmp_path), tmp_path / "app")
    start = time.monotonic()
    try:
        # The product's own path (`embodied firmware build --crazyflie-base`), with -k so that a
        # tree whose vendor submodules are incomplete still builds the app; the link decides cf2.bin.
        fb.build_crazyflie_real(staged, tree, keep_going=True)
        failure = ""
    except EmbodiedError as err:
        failure = str(err)
    seconds = time.monotonic() - start
    app_errors = [line for line in failure.splitlines() if str(staged) in line and "rror" in line]
    assert not app_errors, "\n".join(app_errors)
    objects = [staged / "src" / f"{name}.o" for name in ("controller_policy", "quad_ctrl", "policy")]
    for obj in objects:
        assert obj.is_file(), f"Kbuild did not compile {obj.name}:\n{failure}"
    # The flags Kbuild used are the flight flags this project tests with.
    cmd_file = staged / "src" / ".controller_policy.o.cmd"
    if cmd_file.is_file():
        cmd = cmd_file.read_text()
        assert "-std=gnu11" in cmd and "-Os" in cmd and "ffp-contract" not in cmd
    needed = _symbols(objects, undefined=True) - _symbols(objects, undefined=False)
    binary = staged / "build" / "cf2.bin"
    if binary.is_file():
        defined = _symbols([staged / "build" / "cf2.elf"], undefined=False)
    else:
        # No image (an incomplete tree): every object the firmware's Kbuild compiled defines what it has.
        built = [p for p in (staged / "build").rglob("*.o") if p.name != "built-in.o"]
        defined = _symbols(built, undefined=False) | _arm_multilib_symbols()
    missing = sorted(needed - defined)
    assert not missing, f"{tree}: the app needs symbols this firmware does not define: {missing}"
    assert {"controllerPid", "controllerPidInit", "controllerPidTest"} <= needed
    log.warning(
        "%s (%s): app built by Kbuild in %.0f s, full image %s",
        tree,
        fb.firmware_version(tree),
        seconds,
        "linked" if binary.is_file() else f"not linked: {failure[-300:]}",
    )


EPRINTF_HARNESS = r"""
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
#include "eprintf.h"
static char out[8192];
static size_t used;
static int put(int c) { if (used < sizeof(out) - 1) out[used++] = (char)c; return c; }
static void hung(int sig) { (void)sig; _exit(3); }
/* argv[1]: a format; prints what eprintf wrote; exit 3 when it does not return within 1 s. */
int main(int argc, char **argv) {
    if (argc != 2) return 2;
    signal(SIGALRM, hung);
    alarm(1);
    eprintf(put, argv[1], 0, 0, 0, 0);
    fwrite(out, 1, used, stdout);
    return 0;
}
"""


@needs_gcc
@pytest.mark.parametrize("tree", TREES, ids=_tree_id)
def test_console_formats_through_the_real_eprintf(tree: Path, tmp_path: Path) -> None:
    _require_tree(tree)
    source = tree / "src" / "utils" / "src" / "eprintf.c"
    if not source.is_file():
        pytest.skip(f"{source} missing")
    (tmp_path / "harness.c").write_text(EPRINTF_HARNESS)
    exe = tmp_path / "eprintf_check"
    utils = tree / "src" / "utils" / "interface"
    cmd = ["gcc", "-O1", "-w", f"-I{utils}", str(source), str(tmp_path / "harness.c"), "-o", str(exe), "-lm"]
    subprocess.run(cmd, check=True, capture_output=True)

    def run(fmt: str) -> subprocess.CompletedProcess[bytes]:
        return subprocess.run([str(exe), fmt], capture_output=True, timeout=10, check=False)

    c_out = _policy(tmp_path)
    lib = HostPolicyLib(fb.build_host_library(c_out, tmp_path / "host"))
    for fmt in fb.app_console_formats(fb.stage_crazyflie_app(c_out, tmp_path / "app")):
        proc = run(fmt)
        assert proc.returncode == 0, f"the real eprintf hangs on the app's format {fmt!r}"
        assert proc.stdout.decode() == fmt  # no conversions: printed verbatim
    # The shim's eprintf model agrees with the real eprintf on what hangs (int-only probes).
    for probe in ("model %.12s\n", "%.12d", "%-3d", "%+d", "% d", "end %", "%d", "%05d", "%x", "%.3d", "%5.2d", "%u%%"):
        hangs = run(probe).returncode == 3
        model = lib.eprintf_problem(probe)
        assert hangs == (model is not None and "loops forever" in model), (probe, hangs, model)


CHAIN_HARNESS = r"""
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include "platform_defaults.h"
#define ASSERT(e) do { if (!(e)) abort(); } while (0)
#define NBR_OF_MOTORS 4
#define STABILIZER_NR_OF_MOTORS 4
typedef enum { controlModeLegacy = 0, controlModeForceTorque = 1, controlModeForce = 2 } control_mode_t;
typedef struct { float normalizedForces[4]; control_mode_t controlMode; } control_t;
typedef union { int32_t list[4]; } motors_thrust_uncapped_t;
/* Extracted from the tree: */
@FUNCTIONS@
/* stdin: lines "f1 f2 f3 f4 supply_voltage"; stdout: per motor the capped PWM ratio and the
   thrust the firmware's own fit gives at that PWM, "pwm thrust_n" x4. */
int main(void) {
    control_t c;
    float vbat;
    c.controlMode = controlModeForce;
    while (scanf("%f %f %f %f %f", &c.normalizedForces[0], &c.normalizedForces[1], &c.normalizedForces[2],
                 &c.normalizedForces[3], &vbat) == 5) {
        motors_thrust_uncapped_t u;
        int i;
        powerDistributionForce(&c, &u);
        for (i = 0; i < 4; ++i) {
            float r = motorsCompensateBatteryVoltage((uint32_t)i, (float)u.list[i], vbat);
            int32_t comp = (int32_t)r; /* stabilizer.c stores it in an int32 list */
            uint16_t pwm = comp > UINT16_MAX ? UINT16_MAX : (uint16_t)comp; /* powerDistributionCap */
            double v = (double)vbat * pwm / 65535.0;
            double t = pwm == 0 ? 0.0 : VMOTOR2THRUST0 + v * (VMOTOR2THRUST1 + v * (VMOTOR2THRUST2 + v * VMOTOR2THRUST3));
            printf("%u %.9g ", (unsigned)pwm, t);
        }
        printf("\n");
    }
    return 0;
}
"""


def _policy_build(c_out: Path) -> ft.FirmwareConfig:
    """The firmware build the test policy's vehicle variant needs (staged into app-config)."""
    return firmware_config(vehicle_variant(c_policy_io(c_out)))


def _real_chain(tree: Path, work: Path, config: ft.FirmwareConfig) -> Path:
    """A host executable of the tree's force-mode power distribution and battery compensation,
    with the tree's Kconfig defaults for ``config`` as its ``autoconf.h``."""
    power = (tree / "src" / "modules" / "src" / "power_distribution_quadrotor.c").read_text()
    motors = (tree / "src" / "drivers" / "src" / "motors.c").read_text()
    functions = [
        fb.c_function_body(power, "powerDistributionForce"),
        fb.c_function_body(motors, "motorsCompensateBatteryVoltage"),
    ]
    assert all(functions), "could not find powerDistributionForce / motorsCompensateBatteryVoltage in the tree"
    inc = work / "inc"
    inc.mkdir()
    (inc / "autoconf.h").write_text(ft.autoconf_for(tree, config))
    (work / "chain.c").write_text(CHAIN_HARNESS.replace("@FUNCTIONS@", "\n".join(f or "" for f in functions)))
    exe = work / "chain"
    cmd = ["gcc", "-std=gnu11", "-O1", "-w", f"-I{inc}", f"-I{tree / 'src' / 'platform' / 'interface'}"]
    subprocess.run([*cmd, str(work / "chain.c"), "-o", str(exe), "-lm"], check=True, capture_output=True)
    return exe


def _run_chain(exe: Path, forces: np.ndarray, volts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    lines = "".join(
        f"{f[0]:.9g} {f[1]:.9g} {f[2]:.9g} {f[3]:.9g} {v:.9g}\n" for f, v in zip(forces, volts, strict=True)
    )
    out = subprocess.run([str(exe)], input=lines, capture_output=True, text=True, check=True).stdout
    values = np.array([line.split() for line in out.strip().splitlines()], dtype=np.float64).reshape(-1, 4, 2)
    return values[:, :, 0], values[:, :, 1]


@needs_gcc
@pytest.mark.parametrize("tree", TREES, ids=_tree_id)
def test_motor_command_for_known_observations_equals_the_simulators_thrust(tree: Path, tmp_path: Path) -> None:
    _require_accepted_tree(tree)
    c_out = _policy(tmp_path)
    config = _policy_build(c_out)
    module = near_hover_policy(146, HOVER_ACTION, seed=21)
    # The app compiled against this tree's own platform_defaults.h (its THRUST_MAX/THRUST_MIN).
    lib = HostPolicyLib(
        fb.build_host_library(
            c_out,
            tmp_path / "host",
            platform=ft.platform_constants(tree, config),
            platform_dir=tree / "src" / "platform" / "interface",
        )
    )
    chain = _real_chain(tree, tmp_path, config)
    rng = np.random.default_rng(0)
    setpoint = np.array([0.0, 0.0, 1.0], dtype=np.float32)
    forces_all, volts, expected_thrust = [], [], []
    for k in range(32):
        assert lib.cf_init()
        lib.cf_param_set("enable", 1)
        est = np.array([0, 0, 1, 1, 0, 0, 0, 0, 0, 0], dtype=np.float32)
        est[0:3] += rng.uniform(-0.3, 0.3, 3).astype(np.float32)
        q = np.array([1.0, *rng.uniform(-0.2, 0.2, 3)])
        est[3:7] = q / np.linalg.norm(q)
        est[7:10] = rng.uniform(-1, 1, 3)
        gyro_rad_s = rng.uniform(-2, 2, 3).astype(np.float32)
        yaw_sp_rad = float(rng.uniform(-np.pi, np.pi))  # any heading (the observation's frame)
        mode, forces, _ = lib.cf_tick(
            0, est, np.degrees(gyro_rad_s), setpoint, setpoint_timestamp_ms=0, setpoint_yaw_deg=np.degrees(yaw_sp_rad)
        )
        assert mode == 2
        # The simulator's side: the network on the observation of that state, then the command
        # chain of docs/conventions.md.
        ctx = lib.new_contexts(1, initial_action=HOVER_ACTION)
        setpoint_with_yaw = np.append(setpoint, np.float32(yaw_sp_rad)).astype(np.float32)
        obs, _ = lib.assemble_obs(ctx, np.concatenate([est, gyro_rad_s])[None], setpoint_with_yaw[None])
        action = module(torch.from_numpy(obs)).detach().numpy()[0].clip(-1, 1).astype(np.float64)
        thrust = (action + 1) / 2 * MAX_THRUST_N
        expected_thrust.append(np.where(thrust >= MIN_THRUST_N, thrust, 0.0))
        forces_all.append(forces)
        volts.append(3.0 + 1.2 * k / 31)  # over the battery's range
    pwm, thrust_real = _run_chain(chain, np.array(forces_all), np.array(volts))
    expected = np.array(expected_thrust)
    # Equal to the PWM's 16-bit resolution (one step is ~5e-5 of full voltage).
    np.testing.assert_allclose(thrust_real, expected, rtol=2e-3, atol=1e-5)
    assert np.all(pwm > 0) and np.all(pwm < 65535)
    # The shim, given this tree's constants (read from its headers, not from a version table),
    # gives the real chain's PWM.
    shim = HostPolicyLib(fb.build_host_library(c_out, tmp_path / "shim", platform=ft.platform_constants(tree, config)))
    assert shim.cf_init()
    shim.cf_param_set("enable", 1)
    f = np.linspace(0.0, 1.0, 41, dtype=np.float32)
    sweep = np.stack([f, f[::-1], np.full_like(f, 0.15), np.full_like(f, 0.9)], axis=1)
    sweep_v = np.linspace(2.5, 4.3, len(f))
    pwm_real, thrust_sweep = _run_chain(chain, sweep, sweep_v)
    pwm_shim, thrust_shim = shim.motor_chain(sweep, sweep_v)
    np.testing.assert_allclose(pwm_shim, pwm_real, atol=1)  # rounding of the last PWM step
    np.testing.assert_allclose(thrust_shim, thrust_sweep, rtol=1e-3, atol=1e-6)


# The tree's own sources compiled for the host around the app in the hand-back test; everything
# they call is in this list or libc/libm (checked on 2025.12 to master).
PID_SOURCES = (
    "src/modules/src/controller/controller_pid.c",
    "src/modules/src/controller/attitude_pid_controller.c",
    "src/modules/src/controller/position_controller_pid.c",
    "src/modules/src/power_distribution_quadrotor.c",
    "src/utils/src/pid.c",
    "src/utils/src/filter.c",
    "src/utils/src/num.c",
    "src/utils/src/eprintf.c",
)
TREE_INCLUDES = (
    "src/modules/interface",
    "src/modules/interface/controller",
    "src/utils/interface",
    "src/utils/interface/lighthouse",
    "src/platform/interface",
    "src/config",
    "src/hal/interface",
    "src/drivers/interface",
)
# Host stand-ins for what only runs on the drone. Limits: no scheduler (vTaskDelay and the tick
# count do nothing; the app's appMain is never called), and the console goes to stderr.
HOST_STUBS = {
    "FreeRTOS.h": "#pragma once\n#include <stdint.h>\ntypedef uint32_t TickType_t;\n#define M2T(X) ((TickType_t)(X))\n",
    "task.h": '#pragma once\n#include "FreeRTOS.h"\nvoid vTaskDelay(TickType_t t);\nTickType_t xTaskGetTickCount(void);\n',
}
# What motors.c around motorsCompensateBatteryVoltage provides (motors.h, cfassert.h).
COMPENSATE_PRELUDE = """#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include "autoconf.h"
#include "platform_defaults.h"
#define NBR_OF_MOTORS 4
#define ASSERT(e) do { if (!(e)) abort(); } while (0)
"""
HOST_STUBS_C = """#include <stdio.h>
#include "FreeRTOS.h"
int consolePutchar(int ch) { return fputc(ch, stderr); }
void vTaskDelay(TickType_t t) { (void)t; }
TickType_t xTaskGetTickCount(void) { return 0; }
"""


def _handback_exe(tree: Path, work: Path, c_out: Path) -> Path:
    """The app + the tree's PID and power distribution, in the stabilizer-loop model of
    tests/c/stabilizer_handback.c, built for the host with the tree's default Crazyflie 2.x config."""
    staged = fb.stage_crazyflie_app(c_out, work / "app")
    inc = work / "host_inc"
    inc.mkdir()
    for name, text in HOST_STUBS.items():
        (inc / name).write_text(text)
    (inc / "autoconf.h").write_text(ft.autoconf_for(tree, _policy_build(c_out)))
    (work / "stubs.c").write_text(HOST_STUBS_C)
    motors = (tree / "src" / "drivers" / "src" / "motors.c").read_text()
    compensate = fb.c_function_body(motors, "motorsCompensateBatteryVoltage")
    assert compensate, f"{tree}: motorsCompensateBatteryVoltage not found in motors.c"
    (work / "compensate.c").write_text(COMPENSATE_PRELUDE + compensate)
    exe = work / "stabilizer_handback"
    cmd = ["gcc", "-std=gnu11", "-O1", "-w", f"-I{inc}", f"-I{staged / 'src'}"]
    cmd += [f"-I{tree / p}" for p in TREE_INCLUDES]
    cmd += [
        str(Path(__file__).parent / "c" / "stabilizer_handback.c"),
        str(work / "stubs.c"),
        str(work / "compensate.c"),
    ]
    cmd += [str(staged / "src" / n) for n in ("quad_ctrl.c", "policy.c")] + [str(tree / s) for s in PID_SOURCES]
    proc = subprocess.run([*cmd, "-o", str(exe), "-lm"], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, (
        f"{tree}: the app with the tree's controller_pid.c does not build:\n{proc.stderr[-3000:]}"
    )
    return exe


def _pwm_rows(exe: Path, who: str, tick: int, how: str) -> dict[int, tuple[int, ...]]:
    proc = subprocess.run([str(exe), who, str(tick), how], capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, f"{who} {tick} {how}: exit {proc.returncode}\n{proc.stderr[-2000:]}"
    rows = [tuple(int(v) for v in line.split()) for line in proc.stdout.strip().splitlines()]
    return {row[0]: row[1:] for row in rows}


@needs_gcc
@pytest.mark.parametrize("tree", TREES, ids=_tree_id)
def test_hand_back_to_the_trees_own_pid_on_odd_and_even_ticks(tree: Path, tmp_path: Path) -> None:
    _require_accepted_tree(tree)
    exe = _handback_exe(tree, tmp_path, _policy(tmp_path))
    for how in ("disarm", "nan", "stale"):
        for hand_back in (501, 502, 503, 504):
            app = _pwm_rows(exe, "app", hand_back, how)
            pid = _pwm_rows(exe, "pid", hand_back, how)
            assert app[hand_back - 1][0] == 2  # the policy flew up to the hand-back (controlModeForce)
            for tick in range(hand_back, hand_back + 9):
                mode, *motors = app[tick]
                where = f"{tree.name}: {how}, hand-back on tick {hand_back}, tick {tick}: app {motors}, PID alone {list(pid[tick][1:])}"
                assert mode == 0, where  # the PID's legacy command
                assert min(motors) > 0, where  # no motor stopped
                # Exactly what the stock PID flying alone on the same inputs commands.
                assert tuple(motors) == pid[tick][1:], where
