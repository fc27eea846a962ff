#!/usr/bin/env bash
# Check the import contracts of pyproject.toml's [tool.importlinter] (layers, torch-free
# runtime) on the installed layout (build/layout/, see scripts/installed_layout.py), where
# embodied.sim, .tasks, .policies and .real are the subpackages a wheel installs; then the
# folder graph (scripts/folder_graph.py): no folder over 25 % of the lines, no folder cycle.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)
layout=$(.venv/bin/python scripts/installed_layout.py --out "$repo/build/layout")
cd "$layout"
PYTHONPATH="$layout" "$repo/.venv/bin/lint-imports" "$repo/pyproject.toml" --no-cache "$@"
exec "$repo/.venv/bin/python" "$repo/scripts/folder_graph.py"
