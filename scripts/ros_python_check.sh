#!/usr/bin/env bash
# Install the robot-side runtime exactly as real/ros2/README.md says ("Install on a ROS 2
# machine") into Pythons shaped like ROS 2's: Python 3.10 + numpy 1.21.5 (Humble) and Python 3.12
# + numpy 1.26.4 (Jazzy), interpreters from pyenv. Then fly the DDS closed-loop demo with the node
# running from that venv (`embodied-deploy`, no torch) against `embodied sim-robot` from .venv,
# and check that numpy was not replaced and that the policy ran in numpy.
#
# Skips (exit 0, with a message) when pyenv's 3.10/3.12 are absent. Needs PyPI (or a pip cache)
# for numpy, cyclonedds, rosbags and PyYAML. A ROS machine's venv uses --system-site-packages to
# see rclpy and ROS's numpy; here numpy is installed first to stand in for ROS's.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)
out="$repo/build/ros-python-check"
mkdir -p "$out"

# The README's runtime line, read from the README itself so the check follows the docs.
runtime_line=$(grep -m1 -E '^pip install .*# = the `runtime` extra' real/ros2/README.md | sed 's/ *#.*$//')
[ -n "$runtime_line" ] || { echo "ros-python check: no runtime install line in real/ros2/README.md"; exit 1; }

# A tiny exported quad-hover policy (the test fixture's exporter), made once with .venv.
export_dir="$out/export"
if [ ! -f "$export_dir/policy.onnx" ]; then
  .venv/bin/python - "$export_dir" <<'EOF'
import sys
from pathlib import Path
sys.path.insert(0, "tests")
from real_support import export_policy, quad_spec
export_policy(Path(sys.argv[1]), quad_spec(history=2), seed=3)
EOF
fi

checked=0
for pair in "3.10 1.21.5 humble" "3.12 1.26.4 jazzy"; do
  read -r pyver numpy_version distro <<<"$pair"
  python=$(ls -d "$HOME"/.pyenv/versions/"$pyver".*/bin/python 2>/dev/null | sort -V | tail -1 || true)
  if [ -z "$python" ]; then
    echo "ros-python check ($distro): skipped, no pyenv Python $pyver under ~/.pyenv/versions"
    continue
  fi
  venv="$out/venv-$pyver"
  rm -rf "$venv"
  "$python" -m venv "$venv"
  # shellcheck disable=SC1091
  (
    source "$venv/bin/activate"
    pip install -q "numpy==$numpy_version"          # stands in for ROS's own numpy
    pip install -q --no-deps "$repo"                # README: the package only, no torch
    eval "$runtime_line" >"$out/pip-$pyver.log" 2>&1 || { cat "$out/pip-$pyver.log"; exit 1; }
    got=$(python -c 'import numpy; print(numpy.__version__)')
    [ "$got" = "$numpy_version" ] || { echo "ros-python check ($distro): numpy replaced: $numpy_version -> $got"; exit 1; }
    if python -c 'import onnxruntime' 2>/dev/null || python -c 'import torch' 2>/dev/null; then
      echo "ros-python check ($distro): the runtime line installed onnxruntime or torch"; exit 1
    fi
    embodied-deploy --help >/dev/null
  )
  domain=$((60 + RANDOM % 40))
  sim_log="$out/sim-$pyver.json"
  node_log="$out/node-$pyver.log"
  .venv/bin/embodied sim-robot quad-hover --episodes 1 --seconds 20 --loopback --domain-id "$domain" \
    --realtime --handover-starts --rt-priority 0 --json >"$sim_log" 2>"$out/sim-$pyver.err" &
  sim_pid=$!
  "$venv/bin/embodied-deploy" "$export_dir" --robot crazyflie_sim --loopback --domain-id "$domain" \
    --duration 12 --no-live --rt-priority 0 >"$node_log" 2>&1 &
  node_pid=$!
  sim_rc=0
  wait "$sim_pid" || sim_rc=$?
  kill -TERM "$node_pid" 2>/dev/null || true
  wait "$node_pid" || true
  "$venv/bin/python" - "$sim_log" "$node_log" "$numpy_version" "$distro" "$sim_rc" <<'EOF'
import json
import sys

import numpy

sim_log, node_log, numpy_version, distro, sim_rc = sys.argv[1:]
assert numpy.__version__ == numpy_version, f"numpy replaced: {numpy.__version__}"
text = open(node_log).read()
assert "runs on numpy" in text, f"the node did not run the policy in numpy:\n{text[-2000:]}"
lines = [line for line in open(sim_log).read().splitlines() if line.startswith("{")]
assert sim_rc == "0" and lines, f"sim-robot failed (exit {sim_rc}); see {sim_log}"
summary = json.loads(lines[-1])
assert summary["steps"] > 20 and summary["commands"] > 20, summary
print(f"ros-python check ({distro}): numpy {numpy.__version__} kept; node flew {summary['steps']} steps, "
      f"{summary['commands']} commands, from {sys.executable}")
EOF
  checked=$((checked + 1))
done
echo "ros-python check: $checked venv(s) checked"
