"""Compile a generated C policy: the strict flags, the package-data C sources, the host library.

The C sources live in ``firmware/`` (package ``embodied.firmware``): ``common/`` the portable
inference runtime and controller, ``host/`` the ctypes entry points. Every build uses the
strict flags below so what CI compiles is what flies. Vehicle-specific builds (the Crazyflie
app, the QEMU target) are :mod:`embodied.crazyflie.firmware_build`.
"""

from __future__ import annotations

import importlib.resources
import logging
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path

from embodied.errors import EmbodiedError

log = logging.getLogger(__name__)

FLIGHT_CFLAGS: tuple[str, ...] = ("-std=gnu11", "-Os")
"""What crazyflie-firmware's Kbuild compiles apps with; float contraction stays at GCC's default
(fused multiply-adds on the Cortex-M4F), so every build here is the flown build."""
STRICT_CFLAGS: tuple[str, ...] = (*FLIGHT_CFLAGS, "-Wall", "-Wextra", "-Werror", "-Wdouble-promotion")
ARM_CFLAGS: tuple[str, ...] = ("-mcpu=cortex-m4", "-mthumb", "-mfloat-abi=hard", "-mfpu=fpv4-sp-d16")
"""Cortex-M4F with its single-precision FPU (STM32F405 and its kin)."""
HOST_LIBRARY = "libembodied_policy.so"
INSTALL_HINT = (
    "install the embedded toolchain: apt-get install -y --no-install-recommends "
    "gcc-arm-none-eabi libnewlib-arm-none-eabi qemu-system-arm"
)


def firmware_dir() -> Path:
    """The firmware C sources: package ``embodied.firmware`` (``firmware/`` of a checkout, or the
    copy a wheel installs as package data)."""
    path = Path(str(importlib.resources.files("embodied.firmware")))
    if not (path / "common" / "quad_ctrl.c").is_file():
        raise EmbodiedError(f"firmware sources not found at {path}; reinstall embodied (they ship as package data)")
    return path


def require_tool(name: str) -> str:
    """Absolute path of executable ``name`` or an error saying how to install it."""
    found = shutil.which(name)
    if found is None:
        hint = INSTALL_HINT if ("arm" in name or "qemu" in name) else "install a C compiler (gcc)"
        raise EmbodiedError(f"{name} not found on PATH; {hint}")
    return found


def run_checked(
    cmd: list[str], cwd: Path | None = None, timeout_s: float = 300.0, env: dict[str, str] | None = None
) -> str:
    """Run ``cmd``; return stdout; raise :class:`EmbodiedError` with its output when it fails."""
    log.debug("running %s", " ".join(cmd))
    try:
        proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout_s, check=False, env=env)
    except subprocess.TimeoutExpired:
        raise EmbodiedError(f"{cmd[0]} did not finish within {timeout_s:g} s") from None
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip()[-3000:]
        raise EmbodiedError(f"`{' '.join(cmd)}` failed with exit code {proc.returncode}:\n{tail}")
    return proc.stdout


def require_generated(c_dir: Path) -> None:
    """Raise naming the file when ``c_dir`` lacks the generated ``policy.h``/``policy.c``."""
    for name in ("policy.h", "policy.c"):
        if not (Path(c_dir) / name).is_file():
            raise EmbodiedError(f"{Path(c_dir) / name} not found; run `embodied export RUN_DIR --format c` first")


def build_policy_library(
    c_dir: Path,
    out_dir: Path,
    cc: str = "gcc",
    extra_sources: Sequence[Path] = (),
    extra_includes: Sequence[Path] = (),
    defines: Sequence[str] = (),
) -> Path:
    """``out_dir/libembodied_policy.so``: the generated policy + ``firmware/host/policy_api.c``
    (``policy_*`` entry points, see :class:`embodied.export.host_lib.HostPolicyLib`), plus
    ``extra_sources`` (a vehicle's controller) compiled with the same strict flags."""
    require_generated(c_dir)
    fw = firmware_dir()
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    sources = [Path(c_dir) / "policy.c", fw / "host" / "policy_api.c", *map(Path, extra_sources)]
    includes = [Path(c_dir), fw / "common", *map(Path, extra_includes)]
    out = out_dir / HOST_LIBRARY
    cmd = [require_tool(cc), *STRICT_CFLAGS, *defines, "-fPIC", "-shared", "-fvisibility=default"]
    cmd += [f"-I{p}" for p in includes] + [str(s) for s in sources] + ["-o", str(out), "-lm"]
    run_checked(cmd)
    return out
