# Sourced by scripts/test.sh: room on disk for the side environments (.venv-robosuite,
# .venv-lerobot, .venv-isaaclab), which together take about 13 GiB beside the 3 GiB of .venv.
# The machines these checks run on share one disk with other work, and its free space has been
# seen anywhere from under 1 GiB to 80 GiB, so a tier whose environment cannot fit is skipped
# with a line that says how much it needs and how much there is, instead of failing half-built.
#
# Sizes (measured on x86_64, Python 3.11/3.12, pip's cache off): .venv-robosuite 2.5 GiB,
# .venv-lerobot 2.8 GiB, .venv-isaaclab 8.0 GiB installed plus ~4 GiB of wheels held while pip
# installs them. The needs below add 1 GiB for the tests' own outputs.

# free_gib [PATH]: whole GiB free on the filesystem holding PATH (default: the working directory).
free_gib() {
  df -Pk "${1:-.}" | awk 'NR == 2 { printf "%d", $4 / 1048576 }'
}

# tier_fits NAME VENV NEED_GIB: true when VENV exists already (pip only tops it up) or NEED_GIB
# are free; otherwise says why NAME is skipped and is false.
tier_fits() {
  local name=$1 venv=$2 need_gib=$3 have_gib
  [ -x "$venv/bin/python" ] && return 0
  have_gib=$(free_gib)
  if [ "$have_gib" -lt "$need_gib" ]; then
    echo "SKIPPED tier $name: building $venv needs ${need_gib} GiB free, this disk has ${have_gib} GiB" \
      "(free some space, or run it alone: bash scripts/setup_$name.sh)"
    return 1
  fi
}

# prune_if_short VENV BUILT_HERE: removes VENV when this run built it (BUILT_HERE = 1) and less
# than EMBODIED_KEEP_VENV_GIB (default 16, what the tiers after it may need) is free, so one
# tier's environment does not crowd out the next. An environment that existed before is kept.
prune_if_short() {
  local venv=$1 built_here=$2 have_gib
  [ "$built_here" = 1 ] || return 0
  have_gib=$(free_gib)
  if [ "$have_gib" -lt "${EMBODIED_KEEP_VENV_GIB:-16}" ]; then
    echo "removing $venv after its tests: ${have_gib} GiB free is less than EMBODIED_KEEP_VENV_GIB=${EMBODIED_KEEP_VENV_GIB:-16}"
    rm -rf "$venv"
  fi
}

# built_flag VENV: 1 when VENV does not exist yet (this run will build it), else 0.
built_flag() {
  if [ -x "$1/bin/python" ]; then echo 0; else echo 1; fi
}
