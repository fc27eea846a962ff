#!/usr/bin/env bash
# Create .venv-isaaclab: Isaac Lab 3 "kit-less" (no Isaac Sim; Newton physics on warp, CPU or
# CUDA) beside embodied, for the isaaclab backend (sim/isaaclab.py, docs/backends.md "Isaac Lab").
# Then `.venv-isaaclab/bin/python -m pytest tests/test_isaaclab_real.py` runs there.
#
# Isaac Lab 3.0.0 (PyPI) needs Python 3.12 and pins torch 2.11.0. PyPI's only Linux build of
# torch 2.11 is the CUDA 13 one, and it does not import without its nvidia-* libraries (with
# --no-deps: "libcudnn.so.9: cannot open shared object file"), so that build goes in with them
# (~4.7 GB installed); it runs on the CPU where no GPU exists. No CPU build of torch 2.11 for
# Python 3.12 is reachable here (download.pytorch.org is not). Then isaaclab with its declared
# dependencies, and embodied (editable, core dependencies) and pytest.
# Safe to re-run (pip skips what is installed).
#
# PYTHON picks the interpreter (default: pyenv's 3.12); ISAACLAB_VENV the folder (default .venv-isaaclab).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${ISAACLAB_VENV:-.venv-isaaclab}
if [ -z "${PYTHON:-}" ]; then
  PYTHON=$(ls -d "$HOME"/.pyenv/versions/3.12*/bin/python 2>/dev/null | tail -n 1 || true)
  PYTHON=${PYTHON:-python3.12}
fi
[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
"$VENV/bin/python" -c 'import sys; assert sys.version_info[:2] == (3, 12), f"Isaac Lab 3 needs Python 3.12, got {sys.version}"'
PIP=("$VENV/bin/python" -m pip install -q)
"${PIP[@]}" --upgrade pip
# torch first and pinned, so nothing below moves it
"${PIP[@]}" "torch==2.11.0"
"${PIP[@]}" "isaaclab==3.0.0" "torch==2.11.0"
"${PIP[@]}" -e . "pytest>=8" "torch==2.11.0"
"$VENV/bin/python" - <<'PY'
import isaaclab, newton, torch, warp
import isaaclab_tasks  # noqa: F401  registers the Isaac-* task ids
import embodied.sim.isaaclab  # noqa: F401
print(f"isaaclab {isaaclab.__version__}, newton {newton.__version__}, warp {warp.config.version}, torch {torch.__version__}")
PY
echo "ready: $VENV/bin/embodied train isaaclab:Isaac-Cartpole-Direct --num-envs 64 --device cpu env.asset_root=builtin"
