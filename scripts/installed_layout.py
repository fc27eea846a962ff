"""Build the package tree as a wheel installs it, out of symlinks, for tools that cannot follow
setuptools' ``package-dir`` mapping (mypy, import-linter).

The source tree keeps ``sim/``, ``tasks/``, ``policies/``, ``real/`` and ``configs/`` at the top
level and ``pyproject.toml`` maps them to ``embodied.sim`` etc.; an editable install resolves
that mapping with an import hook that static tools do not run. This script reads the mapping
from ``[tool.setuptools] package-dir`` and writes ``build/layout/embodied/`` whose entries are
symlinks into the source tree, so ``build/layout`` is an import root where every first-party
module resolves. Edits to sources show through the links; re-run after adding a top-level file.

Usage: ``python scripts/installed_layout.py [--out build/layout]`` (prints the import root).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def package_dirs(pyproject: Path) -> dict[str, Path]:
    """``{"embodied": <root>/embodied, "embodied.sim": <root>/sim, ...}`` from ``package-dir``."""
    data = tomllib.loads(pyproject.read_text())
    try:
        mapping: dict[str, str] = data["tool"]["setuptools"]["package-dir"]
    except KeyError as err:
        raise SystemExit(f"{pyproject}: no [tool.setuptools] package-dir table") from err
    return {name: (pyproject.parent / path).resolve() for name, path in mapping.items()}


def build_layout(out: Path, pyproject: Path = ROOT / "pyproject.toml") -> Path:
    """Recreate ``out`` as the installed layout; returns ``out`` (the import root)."""
    dirs = package_dirs(pyproject)
    if out.exists():
        shutil.rmtree(out)
    # Parents before children so a mapped subpackage replaces the link its parent would make.
    for name in sorted(dirs, key=lambda n: n.count(".")):
        target = out.joinpath(*name.split("."))
        if target.is_symlink():
            target.unlink()
        target.mkdir(parents=True, exist_ok=True)
        for entry in sorted(dirs[name].iterdir()):
            if entry.name in ("__pycache__", "build") or entry.name.endswith(".egg-info"):
                continue
            link = target / entry.name
            if not link.exists() and not link.is_symlink():
                link.symlink_to(os.path.relpath(entry, target))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=ROOT / "build" / "layout", help="folder to (re)create")
    args = parser.parse_args(argv)
    sys.stdout.write(f"{build_layout(args.out.resolve())}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
