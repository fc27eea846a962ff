#!/usr/bin/env bash
# Create .venv with embodied and everything its tests use (CPU torch first, so pip never
# pulls a multi-GB CUDA build as a dependency). Safe to re-run.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q "torch==2.13.0"
.venv/bin/python -m pip install -q -e ".[all]"
# --- optional simulator backends (docs/backends.md) ---
# EMBODIED_EXTRAS=mjwarp scripts/setup.sh adds MuJoCo-Warp (its tests then run; without it they skip).
# EMBODIED_EXTRAS=maniskill adds ManiSkill3 (its tests also need a Vulkan driver; scripts/test.sh
# installs one as root on Debian 12). mani-skill and sapien go in with --no-deps (pyproject.toml says why).
for extra in ${EMBODIED_EXTRAS:-}; do
    .venv/bin/python -m pip install -q -e ".[${extra}]"
    if [ "$extra" = maniskill ]; then
        .venv/bin/python -m pip install -q --no-deps "mani-skill==3.0.1" "sapien==3.0.3"
    fi
done
# The default `embodied train quad-hover` compiles its simulator step on first use: do it now.
if [ "${EMBODIED_WARM_COMPILE-1}" = 1 ]; then bash scripts/warm_compile.sh; fi
echo "ready: .venv/bin/embodied --help"
