"""Build the package tree as a wheel installs it, out of symlinks, for tools that cannot follow
setuptools' ``package-dir`` mapping (mypy, import-linter).

The source tree keeps ``sim/``, ``tasks/``, ``policies/``, ``real/`` and ``configs/`` at the top
level and ``pyproject.toml`` maps them to ``embodied.sim`` etc.; an editable install resolves
that mapping with an import hook that static tools do not run. This script reads the mapping
from ``[tool.setuptools] package-dir`` and writes ``build/layout/embodied/`` whose entries are
symlinks into the source tree (folders are real directories), so ``build/layout`` is an import root where every first-party
module resolves. Edits to sources show through the links; re-run after adding a top-level file.

Usage: ``python scripts/installed_layout.py [--out build/layout]`` (prints the import root; Python >= 3.11
for tomllib, like the type check it serves).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parent.parent


def package_dirs(pyproject: Path) -> dict[str, Path]:
    """``{"embodied": <root>/embodied, "embodied.sim": <root>/sim, ...}`` from ``package-dir``."""
    data = tomllib.loads(pyproject.read_text())
    try:
        mapping: dict[str, str] = data["tool"]["setuptools"]["package-dir"]
    except KeyError as err:
        raise SystemExit(f"{pyproject}: no [tool.setuptools] package-dir table") from err
    return {name: (pyproject.parent / path).resolve() for name, path in mapping.items()}


SKIP_DIRS = {"__pycache__", "build"}
"""Folders never mirrored: bytecode and colcon/CMake build output."""


def build_layout(out: Path, pyproject: Path = ROOT / "pyproject.toml") -> Path:
    """Recreate ``out`` as the installed layout; returns ``out`` (the import root).

    Folders are real directories and files are symlinks, because import graph builders walk
    the tree without following directory links.
    """
    dirs = package_dirs(pyproject)
    if out.exists():
        shutil.rmtree(out)
    for name, source in dirs.items():
        target = out.joinpath(*name.split("."))
        for folder, subdirs, files in os.walk(source):
            subdirs[:] = sorted(d for d in subdirs if d not in SKIP_DIRS and not d.endswith(".egg-info"))
            rel = Path(folder).relative_to(source)
            # a mapped subpackage (embodied.real.transports inside embodied.real) is mirrored once
            if any(".".join((name, *rel.parts[: i + 1])) in dirs for i in range(len(rel.parts))):
                continue
            (target / rel).mkdir(parents=True, exist_ok=True)
            for file in sorted(files):
                link = target / rel / file
                link.symlink_to(os.path.relpath(Path(folder) / file, link.parent))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=ROOT / "build" / "layout", help="folder to (re)create")
    args = parser.parse_args(argv)
    sys.stdout.write(f"{build_layout(args.out.resolve())}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
