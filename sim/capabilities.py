"""What each simulator backend can really do on this machine (``embodied list``).

``importlib.util.find_spec`` only says a package's files exist; a package can be present and
still fail to import (a build for another Python, a missing shared library, a CUDA-only wheel)
or import and then find no device (ManiSkill without a Vulkan driver, MuJoCo cameras without an
EGL or OSMesa library). So a backend whose packages are found is probed for real: one
subprocess per backend imports its modules and runs its device checks, so a crash or a hang in
one (SAPIEN opening Vulkan, say) cannot take the others or the caller down.

The answer is one of:

- ``installed``: every module imports and every required check passes;
- ``not installed: run <install>``: a module's files are absent;
- ``installed but unusable here: <reason>``: found, but an import or a required check fails.

A camera check that fails (``gl``) leaves the backend installed and says its cameras are
unusable. Only the standard library is imported here; the probe imports the backend's packages
in its own process.
"""

from __future__ import annotations

import glob
import importlib
import json
import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from embodied.errors import absent_modules

VULKAN_ICD_GLOBS = ("/usr/share/vulkan/icd.d/*.json", "/etc/vulkan/icd.d/*.json")
"""Where Vulkan loaders look for installable client drivers (any one is a Vulkan device to try)."""

PROBE_TIMEOUT_S = 120.0
"""How long one backend's probe may take (importing ManiSkill or warp cold takes seconds)."""

CHECKS: dict[str, str] = {
    "batch": "MuJoCo's native batch API (mjb_*, mujoco >= 4.0)",
    "vulkan": "a Vulkan device (SAPIEN opens its render system)",
    "gl": "an offscreen OpenGL context for MuJoCo cameras (EGL or OSMesa)",
}
"""Device checks a backend row can name, and what each needs."""

CAMERA_CHECKS = frozenset({"gl"})
"""Checks that only camera images need: failing one leaves the backend usable without cameras."""


def vulkan_drivers() -> list[str]:
    """Vulkan ICD manifest files present on this machine (empty: no Vulkan device)."""
    return sorted(path for pattern in VULKAN_ICD_GLOBS for path in glob.glob(pattern))


@dataclass(frozen=True)
class BackendStatus:
    """One backend's state on this machine (see the module docstring)."""

    state: str
    """``installed``, ``not installed`` or ``unusable``."""
    detail: str = ""
    """The install command (not installed), the failure (unusable), or why cameras fail (installed)."""

    @property
    def usable(self) -> bool:
        return self.state == "installed"

    def line(self) -> str:
        """The words ``embodied list`` prints."""
        if self.state == "not installed":
            return f"not installed: run {self.detail}"
        if self.state == "unusable":
            return f"installed but unusable here: {self.detail}"
        return f"installed; cameras unusable here: {self.detail}" if self.detail else "installed"


def _vulkan_precheck() -> str:
    """Why Vulkan cannot work, found without importing anything (empty: try it)."""
    if vulkan_drivers():
        return ""
    return f"needs {CHECKS['vulkan']}: no Vulkan driver manifest in {' or '.join(VULKAN_ICD_GLOBS)}"


PRECHECKS = {"vulkan": _vulkan_precheck}
"""Checks that can fail before the (slow) import probe; a failure skips the probe."""


def _check_vulkan() -> None:
    import sapien  # type: ignore[import-untyped]

    sapien.render.RenderSystem()  # raises "failed to find a rendering device" without a usable driver


def _check_batch() -> None:
    from embodied.sim.mujoco_native import _library

    _library()  # raises ImportError naming the mujoco version without mjb_*


def _check_gl() -> None:
    from embodied.sim.offscreen_gl import default_mujoco_gl, gl_install_hint

    platform = default_mujoco_gl()
    if platform is None:
        raise RuntimeError(f"no EGL or OSMesa library; {gl_install_hint()}")
    import mujoco

    context = mujoco.GLContext(16, 16)
    context.make_current()
    context.free()


def probe(modules: Sequence[str], checks: Sequence[str]) -> dict[str, str]:
    """Import ``modules`` and run ``checks`` here; ``{"import" | check: error}`` for each failure.

    Meant for the probe subprocess (:func:`backend_status` runs it there)."""
    failures: dict[str, str] = {}
    for module in modules:
        try:
            importlib.import_module(module)
        except Exception as err:  # any failure makes the backend unusable: report it
            failures["import"] = f"import {module} failed ({type(err).__name__}: {err})"
            return failures
    run = {"batch": _check_batch, "vulkan": _check_vulkan, "gl": _check_gl}
    for check in checks:
        try:
            run[check]()
        except Exception as err:  # as above, for the device check
            failures[check] = f"needs {CHECKS[check]}: {type(err).__name__}: {err}"
    return failures


_PROBE_MAIN = (
    "import json, sys\n"
    "from embodied.sim.capabilities import probe\n"
    "spec = json.loads(sys.argv[1])\n"
    "print('EMBODIED_PROBE ' + json.dumps(probe(spec['modules'], spec['checks'])))\n"
)


def _start(modules: Sequence[str], checks: Sequence[str]) -> subprocess.Popen[str]:
    spec = json.dumps({"modules": list(modules), "checks": list(checks)})
    return subprocess.Popen(
        [sys.executable, "-c", _PROBE_MAIN, spec],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
    )


def _finish(proc: subprocess.Popen[str], checks: Sequence[str]) -> BackendStatus:
    try:
        out, err = proc.communicate(timeout=PROBE_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        return BackendStatus("unusable", f"importing it took over {PROBE_TIMEOUT_S:.0f} s")
    lines = [line for line in out.splitlines() if line.startswith("EMBODIED_PROBE ")]
    if proc.returncode != 0 or not lines:
        tail = (err.strip().splitlines() or [f"exit status {proc.returncode}"])[-1]
        return BackendStatus("unusable", f"importing it ended the process ({tail})")
    failures: dict[str, str] = json.loads(lines[-1].removeprefix("EMBODIED_PROBE "))
    required = [failures[k] for k in ("import", *checks) if k in failures and k not in CAMERA_CHECKS]
    if required:
        return BackendStatus("unusable", "; ".join(required))
    return BackendStatus("installed", "; ".join(failures[k] for k in checks if k in failures))


@dataclass(frozen=True)
class ProbeSpec:
    """What to check for one backend: its modules, its device checks, how to install it."""

    modules: tuple[str, ...]
    checks: tuple[str, ...]
    install: str


def backend_statuses(specs: Mapping[str, ProbeSpec]) -> dict[str, BackendStatus]:
    """The status of every backend in ``specs``, probed in parallel subprocesses."""
    out: dict[str, BackendStatus] = {}
    running: dict[str, subprocess.Popen[str]] = {}
    for name, spec in specs.items():
        absent = absent_modules(spec.modules)
        early = [reason for check in spec.checks if check in PRECHECKS and (reason := PRECHECKS[check]())]
        if absent:
            out[name] = BackendStatus("not installed", spec.install)
        elif early:
            out[name] = BackendStatus("unusable", "; ".join(early))
        elif spec.modules or spec.checks:
            running[name] = _start(spec.modules, spec.checks)
        else:
            out[name] = BackendStatus("installed")  # built in: nothing to import
    for name, proc in running.items():
        out[name] = _finish(proc, specs[name].checks)
    return {name: out[name] for name in specs}
