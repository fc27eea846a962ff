#!/usr/bin/env bash
# Set up and run the test suite from a fresh clone. As root on Debian/Ubuntu it also installs
# the embedded toolchain (arm-none-eabi-gcc, newlib, qemu-system-arm) that the firmware tests
# use; elsewhere those tests are skipped with a reason.
set -euo pipefail
cd "$(dirname "$0")/.."
if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ] && ! command -v qemu-system-arm >/dev/null 2>&1; then
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    gcc-arm-none-eabi libnewlib-arm-none-eabi qemu-system-arm gcc make >/dev/null
fi
bash scripts/setup.sh
.venv/bin/python -m pytest -q "$@"
