#!/usr/bin/env bash
# Compile the default quad-hover config's simulator step ahead (`embodied train quad-hover` steps
# it through a compiled kernel, env.sim.compile in configs/quad_hover/ppo.sweep.yaml). Cold, that
# compile takes 1-2 minutes on 2 cores, once per machine: torch saves it in its inductor cache folder
# (TORCHINDUCTOR_CACHE_DIR, by default under the temp folder, so a reboot that clears /tmp clears it)
# and later runs load it in about 2 s (tasks/compiled_step_cache.py). It trains one rollout of the
# default config into a temporary run directory, which builds the same training and evaluation
# steps a full run builds, then removes that directory.
# scripts/setup.sh runs it; EMBODIED_WARM_COMPILE=0 there skips it.
set -euo pipefail
cd "$(dirname "$0")/.."
run_root=$(mktemp -d)
trap 'rm -rf "$run_root"' EXIT
echo "preparing the default quad-hover compiled step (1-2 minutes when not yet cached, once per machine) ..."
if .venv/bin/embodied train quad-hover --no-progress trainer.total_env_steps=8192 \
    --run-dir "$run_root/run" > "$run_root/log" 2>&1; then
  compiled=$(grep -c "compiling the fused quad-hover step" "$run_root/log" || true)
  if [ "$compiled" -gt 0 ]; then
    echo "compiled $compiled step(s) and saved them: \`embodied train quad-hover\` loads them"
  else
    echo "already compiled on this machine: \`embodied train quad-hover\` loads it"
  fi
else
  tail -n 20 "$run_root/log" >&2
  echo "warning: compiling the quad-hover step failed (above); \`embodied train quad-hover\` will report the same" >&2
fi
