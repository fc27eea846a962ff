#!/usr/bin/env bash
# Build the wheel, install it (not editable) into a fresh venv and use it the way a user of
# `pip install embodied` would, from a folder outside the checkout: train a tiny quad-hover run,
# export every format (ONNX, C, host library: needs the firmware sources as package data),
# emulate the firmware on QEMU and build the Crazyflie app when the ARM toolchain is present,
# evaluate the policy artifact and the firmware controller in the loop, and run the deployment node
# for a moment over Cyclone DDS on loopback plus its ros2-launch dry run.
#
# The fresh venv borrows its third-party dependencies (torch, onnxruntime, cyclonedds, ...)
# from .venv through a .pth line instead of downloading them again; embodied itself comes
# only from the wheel, which the script checks before using it.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)
out="$repo/build/wheel-check"
rm -rf "$out"
mkdir -p "$out/dist" "$out/work"

.venv/bin/python -m pip wheel -q --no-deps -w "$out/dist" . >"$out/build.log" 2>&1 ||
  { cat "$out/build.log"; exit 1; }
wheel=$(ls "$out"/dist/embodied-*.whl)
echo "wheel: $(basename "$wheel")"

python=$(.venv/bin/python -c 'import sys; print(sys.executable)')
"$python" -m venv "$out/venv"
"$out/venv/bin/python" -m pip install -q --no-deps "$wheel"
site_new=$("$out/venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
site_dev=$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
echo "$site_dev" >"$site_new/_embodied_wheel_check_deps.pth"

cd "$out/work"  # outside the checkout: nothing can import embodied from the source tree
"$out/venv/bin/python" - "$site_new" <<'EOF'
import sys
from pathlib import Path

import embodied
import embodied.firmware
import embodied.sim

site = Path(sys.argv[1]).resolve()
for module in (embodied, embodied.sim, embodied.firmware):
    path = Path(module.__file__).resolve()
    assert site in path.parents, f"{module.__name__} imported from {path}, not from the installed wheel"
print(f"embodied imported from the wheel: {Path(embodied.__file__).parent}")
EOF

cli="$out/venv/bin/embodied"
run="$out/work/run"
# The default command's config (its default preset, sweep, read from the wheel's
# configs/quad_hover/default_presets.yaml), with the eager step: a cold compile at 16 envs costs a minute.
"$cli" train quad-hover --run-dir "$run" --no-progress --num-envs 16 env.sim.compile=false \
  trainer.total_env_steps=1024 trainer.eval_every_env_steps=0 trainer.eval_episodes=4 >/dev/null
grep -q "^  action_history: 16$" "$run/config.yaml" \
  || { echo "the wheel's quad-hover default is not its sweep preset ($run/config.yaml)" >&2; exit 1; }
"$cli" export "$run" --format all
if command -v qemu-system-arm >/dev/null 2>&1 && command -v arm-none-eabi-gcc >/dev/null 2>&1; then
  "$cli" firmware emulate "$run"
  "$cli" firmware build "$run"
else
  echo "firmware emulate: skipped (qemu-system-arm or arm-none-eabi-gcc not installed)"
fi
# The policy artifact (ckpt/policy.pt) in torch, and the firmware controller in the loop.
"$cli" eval "$run" --policy torch --episodes 4
"$cli" eval "$run" --policy c --episodes 4
"$cli" deploy "$run" --robot crazyflie_sim --print-launch
"$cli" deploy "$run" --robot crazyflie_sim --loopback --domain-id 87 --duration 1 --no-live
echo "wheel check passed"
