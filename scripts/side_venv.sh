# Sourced by scripts/setup_robosuite.sh and scripts/setup_lerobot.sh: a virtual environment beside
# .venv for a package whose pins the core environment cannot share.
#
# side_venv FOLDER PINS_NAME < PINS creates FOLDER (with $PYTHON, default python3) unless it
# exists, writes the pins read from stdin to FOLDER/PINS_NAME, upgrades pip and installs CPU torch
# first under those pins, so pip never pulls a multi-GB CUDA build as a dependency. It sets
# VENV (the folder), CONSTRAINTS (the pins file) and PIP (pip install -q, as an array).
side_venv() {
  VENV=$1
  [ -x "$VENV/bin/python" ] || "${PYTHON:-python3}" -m venv "$VENV"
  PIP=("$VENV/bin/python" -m pip install -q)
  CONSTRAINTS="$VENV/$2"
  cat > "$CONSTRAINTS"
  "$VENV/bin/python" -m pip install -q --upgrade pip
  "${PIP[@]}" -c "$CONSTRAINTS" "torch==2.13.0"
}
