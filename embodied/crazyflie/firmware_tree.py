"""What a crazyflie-firmware tree builds for a platform: its Kconfig defaults as ``autoconf.h``,
and the motor and mass constants its ``platform_defaults.h`` then defines.

Nothing here is a table of versions: the constants are whatever the tree's own headers give for
that configuration (``THRUST_MAX`` is 0.1125 N in 2025.12 and 0.12 N from 2025.12.1 on, for
example), read by compiling and running a small probe with the host compiler.
"""

from __future__ import annotations

import re
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from embodied.errors import EmbodiedError
from embodied.export.c_build import require_tool, run_checked

PLATFORM_HEADERS = Path("src/platform/interface")
_BLOCK_START = re.compile(r"^(config|menuconfig|choice|endchoice|menu|endmenu|if|endif|source|comment)\b")


@dataclass(frozen=True)
class FirmwareConfig:
    """The Kconfig choices that decide a Crazyflie build's motor constants.

    ``platform``: the ``PLATFORM_*`` symbol without its prefix (``CF2``, ``CF21BL``); ``setup``:
    the Crazyflie 2.x propeller setup symbol of a ``CF2`` build (``CRAZYFLIE_LEGACY_PROPELLERS``,
    ``CRAZYFLIE_21_PLUS``, ``CRAZYFLIE_THRUST_UPGRADE_KIT``), None for the tree's default.
    """

    platform: str = "CF2"
    setup: str | None = None

    def config_lines(self) -> list[str]:
        """The ``CONFIG_...=y`` lines an out-of-tree ``app-config`` needs to select this build."""
        lines = [f"CONFIG_PLATFORM_{self.platform}=y"]
        if self.setup is not None:
            lines.append(f"CONFIG_{self.setup}=y")
        return lines


@dataclass(frozen=True)
class PlatformConstants:
    """Motor and mass constants of one firmware build (``platform_defaults.h``).

    ``thrust_max_n``/``thrust_min_n``: per-motor thrust at ``normalizedForces`` 1 and the cut
    below which a motor stops (N); ``vmotor2thrust``: the cubic thrust(motor voltage) fit,
    coefficients 0..3 (N, N/V, N/V², N/V³); ``mass_kg``: ``CF_MASS``; ``arm_length_m``:
    ``ARM_LENGTH``; ``autoconf``: the ``autoconf.h`` text these came from.
    """

    thrust_max_n: float
    thrust_min_n: float
    vmotor2thrust: tuple[float, float, float, float]
    mass_kg: float
    arm_length_m: float
    autoconf: str

    def shim_defines(self) -> list[str]:
        """``-D`` flags that make ``firmware/shim/platform_defaults.h`` model this build."""
        values = {
            "SHIM_THRUST_MAX": self.thrust_max_n,
            "SHIM_THRUST_MIN": self.thrust_min_n,
            "SHIM_CF_MASS": self.mass_kg,
            **{f"SHIM_VMOTOR2THRUST{i}": c for i, c in enumerate(self.vmotor2thrust)},
        }
        return [f"-D{name}={value:.9e}f" for name, value in values.items()]


def _kconfig_text(base: Path) -> str:
    path = Path(base) / "Kconfig"
    if not path.is_file():
        raise EmbodiedError(f"{path} not found: not a crazyflie-firmware checkout")
    return path.read_text(errors="replace")


def _block(lines: list[str], start: int) -> list[str]:
    """The option lines after ``lines[start]`` up to the next Kconfig block keyword."""
    out = []
    for line in lines[start + 1 :]:
        if _BLOCK_START.match(line.strip()):
            break
        out.append(line.strip())
    return out


def kconfig_default(base: Path, symbol: str) -> str | None:
    """The first unconditional ``default`` of ``config SYMBOL`` in the tree's top Kconfig, or of
    the ``choice`` that holds it (the choice's selected member); None when there is none."""
    lines = _kconfig_text(base).splitlines()
    for i, line in enumerate(lines):
        if line.strip() != f"config {symbol}":
            continue
        for option in _block(lines, i):
            found = re.match(r"default\s+(\S+)\s*$", option)
            if found:
                return found.group(1)
        # A choice member: the default of the enclosing choice.
        for j in range(i - 1, -1, -1):
            head = lines[j].strip()
            if head == "endchoice":
                return None
            if head == "choice":
                for option in _block(lines, j):
                    found = re.match(r"default\s+(\S+)\s*$", option)
                    if found:
                        return found.group(1)
                return None
        return None
    return None


def autoconf_for(base: Path, config: FirmwareConfig) -> str:
    """``autoconf.h`` of a default build of ``config``: the tree's Kconfig defaults for battery
    compensation, the 2.x propeller setup and the brushless maximum thrust."""
    lines = [f"#define CONFIG_PLATFORM_{config.platform} 1"]
    if kconfig_default(base, "ENABLE_THRUST_BAT_COMPENSATED") == "y":
        lines.append("#define CONFIG_ENABLE_THRUST_BAT_COMPENSATED 1")
    if config.platform == "CF2":
        setup = config.setup or kconfig_default(base, "CRAZYFLIE_21_PLUS")
        if setup is not None:
            lines.append(f"#define CONFIG_{setup.removeprefix('CONFIG_')} 1")
    max_thrust = kconfig_default(base, "THRUST_BAT_COMPENSATION_MAX_THRUST")
    if config.platform == "CF21BL" and max_thrust is not None:
        lines.append(f"#define CONFIG_THRUST_BAT_COMPENSATION_MAX_THRUST {max_thrust}")
    return "\n".join(lines) + "\n"


_PROBE = r"""
#include <stdio.h>
#include "platform_defaults.h"
#ifndef THRUST_MAX
#error "no THRUST_MAX for this configuration"
#endif
int main(void) {
    printf("%.9e %.9e %.9e %.9e %.9e %.9e %.9e %.9e\n", (double)THRUST_MAX, (double)THRUST_MIN,
           (double)VMOTOR2THRUST0, (double)VMOTOR2THRUST1, (double)VMOTOR2THRUST2, (double)VMOTOR2THRUST3,
           (double)CF_MASS, (double)ARM_LENGTH);
    return 0;
}
"""


def platform_constants(base: Path, config: FirmwareConfig | None = None, cc: str = "gcc") -> PlatformConstants:
    """The tree's ``THRUST_MAX``, ``THRUST_MIN``, thrust fit, ``CF_MASS`` and ``ARM_LENGTH`` for a
    default build of ``config`` (default: the tree's default Crazyflie 2.x build)."""
    config = config or FirmwareConfig()
    base = Path(base)
    headers = base / PLATFORM_HEADERS
    if not (headers / "platform_defaults.h").is_file():
        raise EmbodiedError(f"{headers / 'platform_defaults.h'} not found: not a crazyflie-firmware checkout")
    autoconf = autoconf_for(base, config)
    with tempfile.TemporaryDirectory(prefix="cf-constants-") as tmp:
        work = Path(tmp)
        (work / "autoconf.h").write_text(autoconf)
        (work / "probe.c").write_text(_PROBE)
        exe = work / "probe"
        try:
            run_checked([require_tool(cc), "-w", f"-I{work}", f"-I{headers}", str(work / "probe.c"), "-o", str(exe)])
        except EmbodiedError as err:
            raise EmbodiedError(
                f"{headers}: platform_defaults.h defines no motor constants for {config} "
                f"(battery compensation off, or an unknown setup):\n{err}"
            ) from None
        out = subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout.split()
    v = [float(x) for x in out]
    return PlatformConstants(
        thrust_max_n=v[0],
        thrust_min_n=v[1],
        vmotor2thrust=(v[2], v[3], v[4], v[5]),
        mass_kg=v[6],
        arm_length_m=v[7],
        autoconf=autoconf,
    )


def _published(
    config: FirmwareConfig,
    fit: tuple[float, float, float, float],
    thrust: tuple[float, float],
    mass_arm: tuple[float, float],
) -> tuple[FirmwareConfig, PlatformConstants]:
    lines = [f"#define {line.removesuffix('=y')} 1" for line in config.config_lines()]
    autoconf = "\n".join([*lines, "#define CONFIG_ENABLE_THRUST_BAT_COMPENSATED 1"]) + "\n"
    return config, PlatformConstants(thrust[0], thrust[1], fit, mass_arm[0], mass_arm[1], autoconf)


PUBLISHED_PLATFORMS: dict[FirmwareConfig, PlatformConstants] = dict(
    (
        _published(
            FirmwareConfig("CF2", "CRAZYFLIE_LEGACY_PROPELLERS"),
            (-0.014830744918356092, 0.04724465241828281, -0.01847364358025878, 0.005960923942142),
            (0.1125, 0.02),
            (0.029, 0.046),
        ),
        _published(
            FirmwareConfig("CF2", "CRAZYFLIE_21_PLUS"),
            (-0.02476537915958403, 0.06523793527519485, -0.026792504967750107, 0.006776789303971145),
            (0.1125, 0.02),
            (0.029, 0.046),
        ),
        _published(
            FirmwareConfig("CF21BL"),
            (-0.014058926705279723, 0.04265273261724981, 0.0018327760144017432, 0.0020576974784587178),
            (0.2, 0.02136263065537499),
            (0.0393, 0.050),
        ),
    )
)
"""What crazyflie-firmware 2025.12 (the oldest accepted release) defines for each build, from
its ``platform_defaults_cf2.h`` / ``platform_defaults_cf21bl.h`` with Kconfig defaults: the
constants the shim models when no firmware tree is given (CI). A tree's own values come from
:func:`platform_constants`."""
