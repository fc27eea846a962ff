"""Packaging: the installed layout the static checks run on, and the firmware package data.

The full check (build the wheel, install it into a fresh venv, train, export, emulate, deploy)
is ``scripts/wheel_check.sh``, run by CI after the fast suite; these are its fast parts.
"""

from __future__ import annotations

import fnmatch
import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

from embodied.export.c_build import firmware_dir

REPO = Path(__file__).resolve().parent.parent
tomllib = pytest.importorskip("tomllib", reason="Python >= 3.11 reads pyproject.toml with tomllib")


def _layout_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("installed_layout", REPO / "scripts" / "installed_layout.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_installed_layout_maps_every_package_dir(tmp_path: Path) -> None:
    layout = _layout_module().build_layout(tmp_path / "layout")
    quad = layout / "embodied" / "sim" / "quadrotor.py"
    assert quad.is_symlink() and quad.resolve() == (REPO / "sim" / "quadrotor.py").resolve()
    assert (layout / "embodied" / "real" / "transports").is_dir()  # folders are real directories
    assert not (layout / "embodied" / "real" / "transports").is_symlink()
    assert (layout / "embodied" / "firmware" / "common" / "quad_ctrl.c").is_file()
    assert not list(layout.rglob("__pycache__"))
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    for name in pyproject["tool"]["setuptools"]["package-dir"]:
        assert (layout.joinpath(*name.split(".")) / "__init__.py").is_file(), name


def test_firmware_sources_are_package_data() -> None:
    """Every file under firmware/ (but build output) matches a package-data glob, so a wheel
    install can build and emulate the firmware."""
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    globs = pyproject["tool"]["setuptools"]["package-data"]["embodied.firmware"]
    root = firmware_dir()
    assert root.resolve() == (REPO / "firmware").resolve()  # the editable install maps the checkout
    shipped = [p for p in root.rglob("*") if p.is_file() and "build" not in p.relative_to(root).parts]
    missing = [
        str(p.relative_to(root))
        for p in shipped
        if p.suffix not in (".py", ".pyc")
        and not any(fnmatch.fnmatch(str(p.relative_to(root)), g.replace("**/", "*")) for g in globs)
        and p.name not in globs
    ]
    assert not missing, f"firmware files no package-data glob ships: {missing}"


def _package_dir(name: str, package_dirs: dict[str, Path]) -> Path:
    """The source folder of package ``name``: below its nearest ancestor in ``package_dirs``
    (``installed_layout.package_dirs``, the ``package-dir`` mapping)."""
    parts = name.split(".")
    for cut in range(len(parts), 0, -1):
        mapped = package_dirs.get(".".join(parts[:cut]))
        if mapped is not None:
            return mapped.joinpath(*parts[cut:])
    raise AssertionError(f"{name} is under no package-dir entry")


def test_every_package_data_folder_is_a_listed_package() -> None:
    """Each folder that holds package data is in ``packages``: setuptools treats such a folder
    as a package and warns that a later version may leave it out of the wheel where it is not
    listed (e.g. a new configs/<task>/ folder)."""
    layout = _layout_module()
    package_dirs = layout.package_dirs(REPO / "pyproject.toml")
    setuptools_cfg = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    packages = set(setuptools_cfg["packages"])
    unlisted = set()
    for package, globs in setuptools_cfg["package-data"].items():
        root = _package_dir(package, package_dirs)
        for pattern in globs:
            for path in root.glob(pattern):
                rel = path.parent.relative_to(root)
                if path.is_file() and rel.parts and not layout.SKIP_DIRS.intersection(rel.parts):
                    unlisted.add(".".join((package, *rel.parts)))
    assert not unlisted - packages, (
        f"add to [tool.setuptools] packages in pyproject.toml: {sorted(unlisted - packages)}"
    )
