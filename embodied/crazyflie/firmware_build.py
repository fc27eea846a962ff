"""Crazyflie firmware builds: the host library with the controller and the app on the shim,
the QEMU STM32F405 target, the out-of-tree app against a shim or a real firmware checkout.

The C sources live in package ``embodied.firmware`` (``common/`` portable controller, ``host/``
ctypes entry points, ``shim/`` stand-ins for the Crazyflie firmware interface, ``qemu/``
bare-metal STM32F405 target, ``crazyflie_app/`` the out-of-tree app). Which policies get the
Crazyflie parts is read from ``policy_io.json`` (:mod:`embodied.crazyflie.vehicle`).
"""

from __future__ import annotations

import codecs
import logging
import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from embodied.crazyflie.firmware_tree import PUBLISHED_PLATFORMS, FirmwareConfig, PlatformConstants
from embodied.crazyflie.vehicle import (
    c_policy_io,
    firmware_config,
    flies_thrust,
    is_crazyflie,
    require_crazyflie,
    require_thrust,
    vehicle_header,
    vehicle_variant,
)
from embodied.errors import EmbodiedError
from embodied.export.c_build import (
    ARM_CFLAGS,
    FLIGHT_CFLAGS,
    HOST_LIBRARY,
    STRICT_CFLAGS,
    build_policy_library,
    firmware_dir,
    require_generated,
    require_tool,
    run_checked,
)
from embodied.policy_io import PolicyIO

log = logging.getLogger(__name__)

__all__ = [
    "ARM_CFLAGS",
    "FLIGHT_CFLAGS",
    "HOST_LIBRARY",
    "STRICT_CFLAGS",
    "firmware_dir",
    "require_tool",
    "run_checked",
]

QEMU_ELF = "policy_bench.elf"
QEMU_MACHINE = "netduinoplus2"
QEMU_FORWARD_PASSES = 20
VEHICLE_HEADER = "policy_vehicle.h"


def shim_defines(policy_io: PolicyIO, platform: PlatformConstants | None, config: FirmwareConfig | None) -> list[str]:
    """``-D`` flags that make ``firmware/shim`` model a firmware build: ``config`` (default: the
    build the policy's variant needs) with ``platform``'s constants (default: what
    crazyflie-firmware 2025.12 defines for that build, :data:`PUBLISHED_PLATFORMS`)."""
    config = config or firmware_config(vehicle_variant(policy_io))
    constants = platform or PUBLISHED_PLATFORMS.get(config)
    if constants is None:
        raise EmbodiedError(f"no published motor constants for {config}; pass a firmware tree's (platform_constants)")
    symbols = [f"-D{line.removesuffix('=y')}=1" for line in config.config_lines()]
    return [*symbols, *constants.shim_defines()]


def write_vehicle_header(policy_io: PolicyIO, folder: Path) -> Path:
    """``folder/policy_vehicle.h`` (:func:`embodied.crazyflie.vehicle.vehicle_header`)."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / VEHICLE_HEADER
    path.write_text(vehicle_header(policy_io))
    return path


def build_host_library(
    c_dir: Path,
    out_dir: Path,
    cc: str = "gcc",
    platform: PlatformConstants | None = None,
    platform_dir: Path | None = None,
    config: FirmwareConfig | None = None,
) -> Path:
    """``out_dir/libembodied_policy.so``: policy + portable controller (+ the Crazyflie app on the shim).

    Exposes ``sil_*`` (see ``firmware/host/sil_api.c``) and, for quad policies, ``cfh_*``
    (``firmware/host/cf_harness.c``). The shim models the firmware build ``config`` (default:
    the one the policy's vehicle variant needs) with ``platform``'s motor constants (default: the
    published ones of that build; pass a tree's, :func:`~embodied.crazyflie.firmware_tree.platform_constants`);
    ``platform_dir`` (a firmware tree's ``src/platform/interface``) makes the app include that
    tree's own ``platform_defaults.h`` instead.
    """
    require_generated(c_dir)
    fw = firmware_dir()
    sources: list[Path] = []
    includes: list[Path] = []
    defines: list[str] = []
    policy_io = c_policy_io(c_dir)
    if is_crazyflie(policy_io):
        require_crazyflie(policy_io, "the firmware controller")
        sources += [fw / "common" / "quad_ctrl.c", fw / "host" / "sil_api.c"]
        if flies_thrust(policy_io):
            # The Crazyflie app on the shim; it needs the thrust action (the command chain of docs/conventions.md).
            app = fw / "crazyflie_app" / "src" / "controller_policy.c"
            sources += [app, fw / "shim" / "shim.c", fw / "host" / "cf_harness.c"]
            includes += [Path(platform_dir)] if platform_dir is not None else []
            includes += [write_vehicle_header(policy_io, Path(out_dir) / "vehicle").parent, fw / "shim"]
            defines += shim_defines(policy_io, platform, config)
    return build_policy_library(c_dir, out_dir, cc, sources, includes, defines)


def build_qemu_elf(c_dir: Path, out_dir: Path, passes: int = QEMU_FORWARD_PASSES) -> Path:
    """Bare-metal STM32F405 image running the self-test and ``passes`` timed forward passes."""
    require_generated(c_dir)
    fw = firmware_dir()
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    out = out_dir / QEMU_ELF
    sources = [fw / "qemu" / "startup.c", fw / "qemu" / "main.c", Path(c_dir) / "policy.c"]
    defines = [f"-DBENCH_FORWARD_PASSES={int(passes)}"]
    if is_crazyflie(c_policy_io(c_dir)):
        sources.append(fw / "common" / "quad_ctrl.c")
        defines.append("-DBENCH_QUAD_CTRL")
    cmd = [require_tool("arm-none-eabi-gcc"), *ARM_CFLAGS, *STRICT_CFLAGS, *defines]
    cmd += [f"-I{c_dir}", f"-I{fw / 'common'}", "-nostartfiles", "--specs=rdimon.specs"]
    cmd += [f"-T{fw / 'qemu' / 'stm32f405.ld'}", "-Wl,--gc-sections", "-ffunction-sections", "-fdata-sections"]
    cmd += [str(s) for s in sources] + ["-o", str(out), "-lm"]
    run_checked(cmd)
    return out


@dataclass(frozen=True)
class QemuReport:
    """What the QEMU run printed, converted to instruction counts."""

    selftest_passed: bool
    selftest_max_err: float
    instructions_per_forward: float
    instructions_per_mac: float
    instructions_per_control_step: float | None
    num_macs: int
    exit_code: int


def run_qemu(elf: Path, timeout_s: float = 120.0) -> QemuReport:
    """Run ``elf`` on QEMU's netduinoplus2 with ``-icount shift=0`` and parse its report."""
    qemu = require_tool("qemu-system-arm")
    cmd = [qemu, "-M", QEMU_MACHINE, "-nographic", "-monitor", "none", "-serial", "none"]
    cmd += ["-semihosting-config", "enable=on,target=native", "-icount", "shift=0,align=off,sleep=off"]
    cmd += ["-kernel", str(elf)]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired:
        raise EmbodiedError(f"QEMU did not finish within {timeout_s:g} s (a fault loops forever)") from None
    values = dict(re.findall(r"^(\w+)=(\S+)$", proc.stdout, flags=re.MULTILINE))
    needed = ("selftest_passed", "calib_ticks", "calib_instructions", "forward_ticks", "forward_passes", "num_macs")
    missing = [k for k in needed if k not in values]
    if missing:
        raise EmbodiedError(
            f"QEMU output lacks {', '.join(missing)} (exit code {proc.returncode}):\n"
            f"{(proc.stdout + proc.stderr).strip()[-2000:]}"
        )
    ticks_per_instruction = int(values["calib_ticks"]) / int(values["calib_instructions"])
    if ticks_per_instruction <= 0:
        raise EmbodiedError("SysTick did not advance under QEMU; was -icount honoured?")
    passes = int(values["forward_passes"])
    per_forward = int(values["forward_ticks"]) / ticks_per_instruction / passes
    control_ticks = int(values.get("control_step_ticks", "0"))
    per_control = control_ticks / ticks_per_instruction / passes if control_ticks else None
    num_macs = int(values["num_macs"])
    return QemuReport(
        selftest_passed=values["selftest_passed"] == "1" and proc.returncode == 0,
        selftest_max_err=float(values.get("selftest_max_err", "nan")),
        instructions_per_forward=per_forward,
        instructions_per_mac=per_forward / num_macs,
        instructions_per_control_step=per_control,
        num_macs=num_macs,
        exit_code=proc.returncode,
    )


@dataclass(frozen=True)
class Footprint:
    """``arm-none-eabi-size`` of the app's code: flash = text + data, RAM = data + bss (bytes)."""

    text: int
    data: int
    bss: int

    @property
    def flash_bytes(self) -> int:
        return self.text + self.data

    @property
    def ram_bytes(self) -> int:
        return self.data + self.bss


def arm_size(obj: Path) -> Footprint:
    out = run_checked([require_tool("arm-none-eabi-size"), "-B", str(obj)])
    rows = [line.split() for line in out.strip().splitlines()[1:]]
    if not rows:
        raise EmbodiedError(f"arm-none-eabi-size printed nothing for {obj}")
    text, data, bss = (int(v) for v in rows[0][:3])
    return Footprint(text, data, bss)


def stage_crazyflie_app(c_dir: Path, dest: Path) -> Path:
    """Copy the app template, the portable controller and the generated policy into ``dest``."""
    require_generated(c_dir)
    policy_io = c_policy_io(c_dir)
    require_crazyflie(policy_io, "the Crazyflie app")
    require_thrust(policy_io)
    fw = firmware_dir()
    dest = Path(dest)
    if dest.exists():
        shutil.rmtree(dest)
    shutil.copytree(fw / "crazyflie_app", dest)
    for src in (fw / "common" / "quad_ctrl.c", fw / "common" / "quad_ctrl.h"):
        shutil.copy2(src, dest / "src" / src.name)
    for name in ("policy.c", "policy.h"):
        shutil.copy2(Path(c_dir) / name, dest / "src" / name)
    shutil.copy2(policy_io.path, dest / policy_io.path.name)
    write_vehicle_header(policy_io, dest / "src")
    # The firmware build the policy's variant flies: oot.mk merges app-config into .config.
    variant = vehicle_variant(policy_io)
    lines = [
        f"# {variant.title}: the build policy_io.json's vehicle_variant needs",
        *firmware_config(variant).config_lines(),
    ]
    with (dest / "app-config").open("a") as config:
        config.write("\n".join(lines) + "\n")
    return dest


def build_crazyflie_shim(staged_app: Path, out_dir: Path) -> tuple[Path, Footprint]:
    """Cross-compile the staged app against ``firmware/shim`` and link it into one relocatable object.

    The object holds only the app's own code and data (the shim stays out), so its size is
    the app's flash/RAM cost inside the real firmware.
    """
    fw = firmware_dir()
    gcc = require_tool("arm-none-eabi-gcc")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    src = Path(staged_app) / "src"
    defines = shim_defines(c_policy_io(src), None, None)  # the staged policy_io.json sits beside src/
    objects = []
    for name in ("controller_policy.c", "quad_ctrl.c", "policy.c"):
        obj = out_dir / name.replace(".c", ".o")
        cmd = [gcc, *ARM_CFLAGS, *STRICT_CFLAGS, *defines, "-ffunction-sections", "-fdata-sections"]
        cmd += [f"-I{src}", f"-I{fw / 'shim'}", "-c", str(src / name), "-o", str(obj)]
        run_checked(cmd)
        objects.append(obj)
    app = out_dir / "embodied_app.o"
    run_checked([gcc, *ARM_CFLAGS, "-r", "-nostdlib", *map(str, objects), "-o", str(app)])
    return app, arm_size(app)


ACCEPTED_FIRMWARE = "2025.12 or newer"
CHECKED_FIRMWARE: tuple[str, ...] = ("2025.12", "2025.12.1", "2026.04", "2026.08")
"""Releases whose motor path (controlModeForce -> battery compensation -> PWM) was built and checked."""
_MIN_FIRMWARE = (2025, 12)
_FORCE_MODE_FILE = Path("src/modules/src/power_distribution_quadrotor.c")
_MOTORS_FILE = Path("src/drivers/src/motors.c")


def c_function_body(source: str, name: str) -> str | None:
    """The text of C function ``name``'s definition (signature to closing brace), or None."""
    match = re.search(rf"^[\w \t\*]*\b{re.escape(name)}\s*\([^;{{]*\)\s*\{{", source, flags=re.MULTILINE)
    if match is None:
        return None
    depth, i = 0, match.end() - 1
    while i < len(source):
        depth += {"{": 1, "}": -1}.get(source[i], 0)
        if depth == 0:
            return source[match.start() : i + 1]
        i += 1
    return None


def firmware_version(base: Path) -> str:
    """``git describe --tags`` of a crazyflie-firmware checkout, or ``"unknown version"``."""
    try:
        out = subprocess.run(
            ["git", "-C", str(base), "describe", "--tags", "--always"],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        ).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        out = ""
    return out or "unknown version"


def _read(base: Path, rel: Path) -> str:
    path = base / rel
    return path.read_text(errors="replace") if path.is_file() else ""


def app_console_formats(staged_app: Path, cc: str = "gcc") -> list[str]:
    """Every ``DEBUG_PRINT`` format string of the staged app, its macros expanded (``cc -E``
    against the shim, whose ``debug.h`` marks each format under ``SHIM_LIST_FORMATS``)."""
    src = Path(staged_app) / "src"
    cmd = [require_tool(cc), "-E", "-P", "-DSHIM_LIST_FORMATS", f"-I{src}", f"-I{firmware_dir() / 'shim'}"]
    out = run_checked([*cmd, str(src / "controller_policy.c")])
    literal = r'"(?:[^"\\]|\\.)*"'
    formats = []
    for mark in re.finditer(rf"@\s*embodied_console_format\s*@\s*\(((?:\s*{literal})+)\s*\)", out):
        pieces = re.findall(rf"{literal}", mark.group(1))
        formats.append(codecs.decode("".join(p[1:-1] for p in pieces), "unicode_escape"))
    return formats


def check_crazyflie_tree(base: Path) -> str:
    """Validate a crazyflie-firmware checkout for the app; return its version (``git describe``).

    Accepted: crazyflie-firmware 2025.12 or newer, recognised by what the app relies on (a
    feature probe, so a tree without git history is judged too): ``controlModeForce`` implemented
    in the power distribution, battery-compensated thrust with ``THRUST_MAX``, the
    ``stabilizerStep_t`` out-of-tree interface; and, where git names the version, not older than
    2025.12.
    """
    base = Path(base)
    if not base.is_dir():
        raise EmbodiedError(f"--crazyflie-base {base}: not a directory")
    if not (base / "tools" / "make" / "oot.mk").is_file():
        raise EmbodiedError(
            f"--crazyflie-base {base}: no tools/make/oot.mk; this is not a crazyflie-firmware checkout "
            f"(this app needs crazyflie-firmware {ACCEPTED_FIRMWARE})"
        )
    version = firmware_version(base)
    where = f"--crazyflie-base {base} (crazyflie-firmware {version})"
    accepted = f"accepted: crazyflie-firmware {ACCEPTED_FIRMWARE} (checked: {', '.join(CHECKED_FIRMWARE)})"
    iface = _read(base, Path("src/modules/interface/controller/controller.h"))
    if "controllerOutOfTree" not in iface or "stabilizerStep_t" not in iface:
        raise EmbodiedError(
            f"{where}: controller.h lacks the stabilizerStep_t controllerOutOfTree interface; {accepted}"
        )
    force = c_function_body(_read(base, _FORCE_MODE_FILE), "powerDistributionForce")
    if force is None or "normalizedForces" not in force:
        raise EmbodiedError(
            f"{where}: controlModeForce is not implemented there (powerDistributionForce in {_FORCE_MODE_FILE} "
            f"ignores normalizedForces), so the motors would never get the policy's command; {accepted}"
        )
    compensate = c_function_body(_read(base, _MOTORS_FILE), "motorsCompensateBatteryVoltage")
    if compensate is None or "THRUST_MAX" not in compensate or "CONFIG_ENABLE_THRUST_BAT_COMPENSATED" not in compensate:
        raise EmbodiedError(
            f"{where}: motorsCompensateBatteryVoltage in {_MOTORS_FILE} does not map thrust through THRUST_MAX "
            f"with battery compensation, which the policy's thrust command relies on; {accepted}"
        )
    found = re.match(r"(\d{4})\.(\d{2})", version)
    if found is not None and (int(found.group(1)), int(found.group(2))) < _MIN_FIRMWARE:
        raise EmbodiedError(f"{where}: too old, controlModeForce first works in 2025.12; {accepted}")
    freertos = base / "vendor" / "FreeRTOS"
    if not freertos.is_dir() or not any(freertos.iterdir()):
        raise EmbodiedError(f"{where}: vendor/FreeRTOS is empty; run `git submodule update --init --recursive` there")
    return version


def build_crazyflie_real(staged_app: Path, base: Path, jobs: int = 2, keep_going: bool = False) -> Path:
    """``make`` the staged app against a firmware checkout (its own Kbuild and flags) for the
    platform of the policy's vehicle variant; returns ``build/<platform>.bin`` (``cf2.bin``,
    ``cf21bl.bin``). ``keep_going`` (``make -k``) still compiles the app's objects in
    ``staged_app/src`` when something else in the tree fails to build."""
    check_crazyflie_tree(base)
    require_tool("arm-none-eabi-gcc")
    make = require_tool("make")
    staged = Path(staged_app).resolve()
    # The app Makefile names its config via $(PWD), which make takes from the environment.
    env = dict(os.environ, PWD=str(staged))
    cmd = [make, f"CRAZYFLIE_BASE={Path(base).resolve()}", f"-j{jobs}", *(["-k"] if keep_going else [])]
    run_checked(cmd, cwd=staged, timeout_s=3600, env=env)
    # The firmware's Makefile names the image after the platform (cf2.bin, cf21bl.bin).
    platform = firmware_config(vehicle_variant(c_policy_io(staged / "src"))).platform.lower()
    binary = Path(staged_app) / "build" / f"{platform}.bin"
    if not binary.is_file():
        raise EmbodiedError(f"make finished but {binary} is missing")
    return binary
