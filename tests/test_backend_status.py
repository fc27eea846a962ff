"""``embodied list`` says what each backend can do here (embodied/sim/capabilities.py).

The machine-wide cases run ``embodied list`` in a subprocess whose imports a ``sitecustomize``
blocks (it is inherited by the probe subprocesses, so they see the same machine): ``absent``
makes a module's files unfindable, ``broken`` finds it but fails its import as a build for
another platform would."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from embodied import registry
from embodied.sim import capabilities

BLOCKER = """
import importlib.abc, importlib.util, os, sys

_BLOCK = dict(item.split("=") for item in os.environ.get("EMBODIED_TEST_BLOCK", "").split(",") if item)


class _Broken(importlib.abc.Loader):
    def create_module(self, spec):
        return None

    def exec_module(self, module):
        raise ImportError(f"{module.__name__}: simulated broken build (libmissing.so)")


class _Blocker(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        mode = _BLOCK.get(name.split(".")[0])
        if mode == "absent":
            raise ModuleNotFoundError(f"No module named {name!r} (blocked by the test)", name=name)
        if mode == "broken":
            return importlib.util.spec_from_loader(name, _Broken())
        return None


sys.meta_path.insert(0, _Blocker())
"""


def _backend_lines(tmp_path: Path, block: dict[str, str]) -> dict[str, str]:
    (tmp_path / "sitecustomize.py").write_text(BLOCKER)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]),
        "EMBODIED_TEST_BLOCK": ",".join(f"{name}={mode}" for name, mode in block.items()),
    }
    code = "from embodied.cli import main; raise SystemExit(main(['list']))"
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    listing = done.stdout.split("backends:\n", 1)[1]
    return {line.split()[0]: line for line in listing.splitlines() if line.startswith("  ")}


def _optional_roots() -> set[str]:
    """The top-level package of every module any backend imports or lists."""
    return {m.split(".")[0] for row in registry.BACKENDS.values() for m in row.modules + row.status_modules}


def test_every_backend_without_its_packages_says_how_to_install(tmp_path: Path) -> None:
    lines = _backend_lines(tmp_path, dict.fromkeys(_optional_roots(), "absent"))
    assert set(lines) == set(registry.BACKENDS)
    for name, row in registry.BACKENDS.items():
        if row.modules or row.status_modules:
            assert f"not installed: run {row.install}" in lines[name], lines[name]
        else:
            assert lines[name].endswith("; installed"), lines[name]  # built in


def test_a_package_that_fails_to_import_is_unusable_not_installed(tmp_path: Path) -> None:
    pytest.importorskip("mujoco")
    pytest.importorskip("gymnasium")
    block = dict.fromkeys(_optional_roots() - {"mujoco", "gymnasium"}, "absent")
    block["mujoco"] = "broken"
    lines = _backend_lines(tmp_path, block)
    assert "installed but unusable here: import mujoco failed" in lines["mujoco"]
    assert "simulated broken build" in lines["mujoco"]
    assert lines["gymnasium"].endswith("; installed")
    assert "not installed: run" in lines["mjwarp"]  # warp absent: not installed wins over broken


def test_without_a_vulkan_driver_maniskill_is_unusable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(capabilities, "VULKAN_ICD_GLOBS", ("/nonexistent/icd.d/*.json",))
    spec = capabilities.ProbeSpec(("json",), ("vulkan",), "apt-get install a Vulkan driver")
    status = capabilities.backend_statuses({"maniskill": spec})["maniskill"]
    assert status.state == "unusable" and "no Vulkan driver manifest in /nonexistent" in status.line()


def test_camera_check_finds_no_gl_library(monkeypatch: pytest.MonkeyPatch) -> None:
    import ctypes.util

    monkeypatch.delenv("MUJOCO_GL", raising=False)
    monkeypatch.setattr(ctypes.util, "find_library", lambda name: None)
    failures = capabilities.probe([], ["gl"])
    assert "no EGL or OSMesa library" in failures["gl"] and "libegl1" in failures["gl"]


def test_mujoco_cameras_render_where_a_gl_library_exists() -> None:
    """The real probe subprocess opens MuJoCo's offscreen context (EGL or OSMesa, set by embodied.sim)."""
    from embodied.sim.offscreen_gl import available_gl_platform

    pytest.importorskip("mujoco")
    if available_gl_platform() is None:
        pytest.skip("no EGL or OSMesa library here")
    spec = capabilities.ProbeSpec(("mujoco",), ("gl",), "pip install mujoco")
    assert capabilities.backend_statuses({"mujoco": spec})["mujoco"].line() == "installed"


def test_the_mujoco_backend_checks_for_the_batch_api() -> None:
    """mujoco < 4.0 (e.g. the 3.12 that Isaac Lab's Newton pins) imports but has no mjb_* batch API:
    the mujoco backend then says unusable; with mujoco 4.0 the check passes."""
    assert "batch" in registry.BACKENDS["mujoco"].checks
    mujoco = pytest.importorskip("mujoco")
    failures = capabilities.probe([], ["batch"])
    if int(mujoco.__version__.split(".")[0]) >= 4:
        assert failures == {}
    else:
        assert "mujoco >= 4.0" in failures["batch"]
