#!/usr/bin/env bash
# Create .venv-robosuite: a separate environment for the robosuite backend (docs/backends.md).
#
# robosuite 1.5.2 runs only with mujoco <= 3.9 and numpy 1.26 (through mink 0.0.5), while the
# core environment (.venv, scripts/setup.sh) has mujoco 4.0 and numpy 2. embodied itself runs
# in process here: its core needs only torch, numpy and its small pure-Python dependencies,
# which all install against numpy 1.26. Safe to re-run (pip skips what is installed).
#
# PYTHON picks the interpreter (default python3); ROBOSUITE_VENV the folder (default .venv-robosuite).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/side_venv.sh
# Every install below is held to these pins, so no later step can lift numpy or mujoco.
side_venv "${ROBOSUITE_VENV:-.venv-robosuite}" robosuite-constraints.txt <<'PINS'
robosuite==1.5.2
mujoco>=3.3,<=3.9.0
numpy>=1.26,<2
# opencv 4.12+ wheels need numpy 2
opencv-python<4.12
opencv-python-headless<4.12
PINS
"${PIP[@]}" -c "$CONSTRAINTS" "robosuite==1.5.2" "mujoco>=3.3,<=3.9.0" "numpy>=1.26,<2"
# embodied with its core dependencies and the ONNX export (not the mujoco extra: it wants mujoco
# 4.0), and pytest; onnx and onnxruntime install against numpy 1.26
"${PIP[@]}" -c "$CONSTRAINTS" -e ".[export]" "pytest>=8"
"$VENV/bin/python" - <<'PY'
import mujoco, numpy, onnxruntime, robosuite, torch
import embodied.training.trainer  # the core imports against this numpy and mujoco
print(f"robosuite {robosuite.__version__}, mujoco {mujoco.__version__}, numpy {numpy.__version__}, torch {torch.__version__}")
PY
echo "ready: $VENV/bin/embodied train robosuite:Lift --algo sac (docs/backends.md)"
