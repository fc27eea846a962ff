#!/usr/bin/env bash
# Create .venv-lerobot: a separate environment for LeRobot (policies/vla.py, the LeRobotDataset
# reader/writer, `--base lerobot:...`, `export --format lerobot`; docs/finetuning.md "LeRobot").
#
# lerobot 0.4.4 is the newest release for Python 3.11 (0.5 and later need Python >= 3.12, for
# which no CPU torch wheel is reachable here). It pins torch < 2.11 while the only CPU torch on
# this machine is 2.13, so lerobot goes in with --no-deps and its own dependency list (read from
# the installed wheel's metadata) goes in without torch, torchvision and torchcodec; CPU torch
# 2.13 stays pinned, so pip never pulls a multi-GB CUDA build. torchcodec (compiled against one
# torch version) is left out: LeRobotDataset then decodes video with PyAV. PyPI's torchvision is
# a CUDA build whose compiled ops cannot load beside CPU torch: scripts/lerobot_torchvision_ops.py
# then declares the two operator schemas torchvision's import needs (its docstring says what that
# does not cover). Safe to re-run (pip skips what is installed).
#
# PYTHON picks the interpreter (default python3); LEROBOT_VENV the folder (default .venv-lerobot).
set -euo pipefail
cd "$(dirname "$0")/.."
LEROBOT_VERSION=0.4.4
source scripts/side_venv.sh
side_venv "${LEROBOT_VENV:-.venv-lerobot}" lerobot-constraints.txt <<< "torch==2.13.0
torchvision==0.28.0"
"${PIP[@]}" -c "$CONSTRAINTS" --no-deps "lerobot==$LEROBOT_VERSION" "torchvision==0.28.0"
# lerobot's base dependencies and its smolvla extra, less the torch family pinned above
mapfile -t DEPS < <("$VENV/bin/python" - <<'PY'
from importlib.metadata import requires
from pip._vendor.packaging.requirements import Requirement  # pip's copy: the venv has no packaging yet

for line in requires("lerobot") or []:
    req = Requirement(line)
    if req.name in {"torch", "torchvision", "torchcodec", "lerobot"}:
        continue
    marker = str(req.marker or "")
    if marker and "extra" in marker and not any(e in marker for e in ('"smolvla"', '"transformers-dep"')):
        continue
    req.marker = None
    print(str(req))
PY
)
"${PIP[@]}" -c "$CONSTRAINTS" "${DEPS[@]}"
# embodied with its MuJoCo, data, export and DDS extras (lerobot >= 0.4 shares their gymnasium >= 1), so the sim tasks,
# Minari datasets, exports and `embodied deploy` of a LeRobot policy work here too; then the LeRobot policy plugin (export --format lerobot)
"${PIP[@]}" -c "$CONSTRAINTS" -e ".[mujoco,data,export,dds]" "pytest>=8"
"${PIP[@]}" -c "$CONSTRAINTS" --no-deps -e integrations/lerobot_policy_embodied
if ! "$VENV/bin/python" -c "import torchvision" >/dev/null 2>&1; then
  SITE=$("$VENV/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
  cp scripts/lerobot_torchvision_ops.py "$SITE/embodied_torchvision_ops.py"
  echo "import embodied_torchvision_ops" > "$SITE/embodied_torchvision_ops.pth"
fi
"$VENV/bin/python" - <<'PY'
import lerobot, torch, torchvision
from lerobot.datasets.lerobot_dataset import LeRobotDataset  # noqa: F401  the dataset tests use
from lerobot.policies.act.modeling_act import ACTPolicy  # noqa: F401  the policy the tests build
import embodied.policies.vla  # noqa: F401
print(f"lerobot {lerobot.__version__}, torch {torch.__version__}, torchvision {torchvision.__version__}")
PY
echo "ready: $VENV/bin/python -m pytest tests/test_vla_lerobot.py"
