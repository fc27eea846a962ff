#!/usr/bin/env bash
# Set up and run every check from a fresh clone. As root on Debian/Ubuntu it also installs
# the embedded toolchain (arm-none-eabi-gcc, newlib, qemu-system-arm) that the firmware tests
# use, and on Debian 12 a Vulkan driver for ManiSkill3; elsewhere those tests are skipped with a reason.
#
# Order: static checks (types on the installed layout, import contracts), the fast test suite,
# the wheel check, the tests marked slow (cold torch.compile equivalence checks), then the
# robosuite tests in .venv-robosuite, the LeRobot adapter's in .venv-lerobot. Extra arguments go to every pytest run, e.g.
# `bash scripts/test.sh -x`.
set -euo pipefail
cd "$(dirname "$0")/.."
# Embedded toolchain and the EGL libraries MuJoCo's offscreen camera renders through (as root, when
# any is missing).
if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ] \
  && { ! command -v qemu-system-arm >/dev/null 2>&1 || ! dpkg-query -W -f='${Status}' libegl-mesa0 2>/dev/null | grep -q "ok installed"; }; then
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    gcc-arm-none-eabi libnewlib-arm-none-eabi qemu-system-arm gcc make libegl1 libegl-mesa0 >/dev/null
fi
# ManiSkill3 needs a Vulkan device even on the CPU: Mesa >= 23 lavapipe, from bookworm-backports
# on Debian 12 (whose own mesa-vulkan-drivers, 22.3, is too old for SAPIEN). Without it the
# ManiSkill tests skip, naming this set-up.
if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ] && grep -q '^VERSION_CODENAME=bookworm' /etc/os-release \
  && ! dpkg --compare-versions "$(dpkg-query -W -f='${Version}' mesa-vulkan-drivers 2>/dev/null || echo 0)" ge 23; then
  echo "deb http://deb.debian.org/debian bookworm-backports main" > /etc/apt/sources.list.d/embodied-backports.list
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq -t bookworm-backports mesa-vulkan-drivers >/dev/null
fi
# --- optional simulator backends: MuJoCo-Warp and ManiSkill3 are installed so their tests run ---
export EMBODIED_EXTRAS="${EMBODIED_EXTRAS-mjwarp maniskill}"
# pip's wheel cache would hold a second copy of every download (GiBs for the side environments'
# torch builds) on a disk shared with other work; EMBODIED_PIP_CACHE=1 keeps it. (pip reads any
# value of PIP_NO_CACHE_DIR, 0 included, as "off", hence a variable of our own.)
[ "${EMBODIED_PIP_CACHE-0}" = 1 ] || export PIP_NO_CACHE_DIR=1
source scripts/disk_budget.sh
bash scripts/setup.sh
bash scripts/typecheck.sh
bash scripts/check_imports.sh
.venv/bin/python -m pytest -q -m "not slow" "$@"
bash scripts/wheel_check.sh
bash scripts/ros_python_check.sh
# pytest exits 5 when the selection is empty (no test is marked slow): not a failure here.
.venv/bin/python -m pytest -q -m slow "$@" || [ $? = 5 ]
# --- robosuite backend in its own environment (mujoco <= 3.9, numpy 1.26; docs/backends.md) ---
# Building .venv-robosuite took ~3 min on a 2-core machine and its tests ~1 min;
# EMBODIED_ROBOSUITE=0 skips both (in the core environment those tests skip with a reason).
# A tier whose environment does not fit on the disk is skipped with a line saying so (scripts/disk_budget.sh).
if [ "${EMBODIED_ROBOSUITE-1}" = 1 ] && tier_fits robosuite .venv-robosuite 4; then
  built=$(built_flag .venv-robosuite)
  bash scripts/setup_robosuite.sh
  .venv-robosuite/bin/python -m pytest -q tests/test_robosuite_backend.py "$@"
  prune_if_short .venv-robosuite "$built"
fi
# --- LeRobot policy adapter in its own environment (lerobot pins its own torch; docs/finetuning.md) ---
# Building .venv-lerobot took 467 s on the loaded 2-core machine (pip's cache warm) and its fast tests about
# 2.5 min (all of them 4.5 min);
# EMBODIED_LEROBOT=0 skips both (in the core environment those tests skip with a reason).
if [ "${EMBODIED_LEROBOT-1}" = 1 ] && tier_fits lerobot .venv-lerobot 4; then
  built=$(built_flag .venv-lerobot)
  bash scripts/setup_lerobot.sh
  HF_HUB_OFFLINE=1 .venv-lerobot/bin/python -m pytest -q tests/test_vla_lerobot.py tests/test_lerobot_dataset.py tests/test_lerobot_base.py tests/test_lerobot_export.py tests/test_reinflow_smolvla.py tests/test_o2o_residual_lerobot.py tests/test_lerobot_residual_export.py tests/test_real_lerobot_deploy.py "$@"
  prune_if_short .venv-lerobot "$built"
fi
# --- Isaac Lab 3 kit-less (Newton on warp's CPU device) in its own Python 3.12 environment (docs/backends.md) ---
# Building .venv-isaaclab took ~21 min and 7.8 GB on a 2-core machine with a cold pip cache (torch 2.11's
# CUDA build with its nvidia libraries is the only torch 2.11 for Python 3.12 on PyPI; it runs on the CPU);
# 36 s when it exists. EMBODIED_ISAACLAB=0 skips both (in the core environment the real-Isaac-Lab tests skip
# with a reason, and the stand-in tests of the adapter still run).
if [ "${EMBODIED_ISAACLAB-1}" = 1 ] && tier_fits isaaclab .venv-isaaclab 13; then
  bash scripts/setup_isaaclab.sh
  .venv-isaaclab/bin/python -m pytest -q tests/test_isaaclab_real.py "$@"
fi
