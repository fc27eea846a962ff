#!/usr/bin/env bash
# Create .venv-lerobot: a separate environment for the LeRobot policy adapter (policies/vla.py,
# docs/finetuning.md "VLA"), then `pytest tests/test_vla_lerobot.py` runs there.
#
# lerobot pins gymnasium < 1.0 while the core environment's MuJoCo extra needs gymnasium >= 1.0,
# so lerobot gets its own venv (like scripts/setup_robosuite.sh) with embodied's core only. CPU
# torch goes in first and stays pinned, so pip never pulls a CUDA build; with torch 2.13 pip
# resolves lerobot 0.3.2. PyPI's torchvision is a CUDA build whose compiled ops cannot load
# beside CPU torch: scripts/lerobot_torchvision_ops.py then declares the two operator schemas
# torchvision's import needs (its docstring says what that does not cover).
# Safe to re-run (pip skips what is installed).
#
# PYTHON picks the interpreter (default python3); LEROBOT_VENV the folder (default .venv-lerobot).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/side_venv.sh
side_venv "${LEROBOT_VENV:-.venv-lerobot}" lerobot-constraints.txt <<< "torch==2.13.0"
"${PIP[@]}" -c "$CONSTRAINTS" "lerobot"
# embodied with its core dependencies (no extras: the mujoco extra wants gymnasium >= 1.0) and pytest
"${PIP[@]}" -c "$CONSTRAINTS" -e . "pytest>=8"
if ! "$VENV/bin/python" -c "import torchvision" >/dev/null 2>&1; then
  SITE=$("$VENV/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
  cp scripts/lerobot_torchvision_ops.py "$SITE/embodied_torchvision_ops.py"
  echo "import embodied_torchvision_ops" > "$SITE/embodied_torchvision_ops.pth"
fi
"$VENV/bin/python" - <<'PY'
import lerobot, torch, torchvision
from lerobot.policies.act.modeling_act import ACTPolicy  # noqa: F401  the policy the tests build
import embodied.policies.vla  # noqa: F401
print(f"lerobot {lerobot.__version__}, torch {torch.__version__}, torchvision {torchvision.__version__}")
PY
echo "ready: $VENV/bin/python -m pytest tests/test_vla_lerobot.py"
