#!/usr/bin/env bash
# Type-check embodied as a wheel installs it. mypy cannot follow the package-dir mapping of the
# editable install (embodied.sim -> sim/, ...), so this builds build/layout/ (symlinks, see
# scripts/installed_layout.py) and runs mypy there with pyproject.toml's [tool.mypy] settings:
# every first-party import resolves, third-party modules without types are listed by name, and
# the contract layer is strict. tests/ is checked too (its helper modules resolve through
# MYPYPATH), with no module excused. Extra arguments go to mypy.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)
layout=$(.venv/bin/python scripts/installed_layout.py --out "$repo/build/layout")
cd "$layout"
MYPYPATH="$repo/tests" exec "$repo/.venv/bin/mypy" --config-file "$repo/pyproject.toml" \
  --cache-dir "$repo/build/mypy_cache" embodied "$repo/tests" "$@"
