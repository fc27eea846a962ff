"""Benchmark: training wall time until SAC / FastTD3 solve gym:Pendulum-v1 (eval return >= -200).

Runs the shipped configs (``configs/gym_pendulum_v1/<algo>.yaml``) through the shared trainer
several times with different seeds and prints, per run, the training time (excluding
evaluation) and env steps at the first evaluation whose mean return reaches the threshold,
then the median. Reference points (REFERENCE.md): RLtools SAC 4.7 s for 20k steps (C++),
Stable-Baselines3 SAC first >= -200 after 23.5-26 s.

    .venv/bin/python scripts/bench_offpolicy_pendulum.py --algo sac --runs 5
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

from embodied.experiment import resolve_experiment
from embodied.training.trainer import Trainer

SOLVED_RETURN = -200.0


def time_to_solve(algo: str, seed: int, overrides: list[str]) -> tuple[float | None, int | None, float, float]:
    """``(train seconds, env steps)`` at the first eval with return >= -200 (None if never), the best
    eval return, and the share of one CPU the process got (below 1 when other processes compete:
    with ``torch_threads: 1`` the time on an idle core is about seconds x share)."""
    cfg = resolve_experiment(
        "gym:Pendulum-v1",
        algo,
        overrides=[*overrides, "trainer.progress=false", "trainer.tensorboard=false"],
        seed=seed,
    )
    with tempfile.TemporaryDirectory() as run_dir:
        wall, cpu = time.perf_counter(), time.process_time()
        Trainer(cfg, Path(run_dir)).train()
        share = (time.process_time() - cpu) / (time.perf_counter() - wall)
        rows = [json.loads(line) for line in (Path(run_dir) / "metrics.jsonl").read_text().splitlines()]
    evals = [r for r in rows if "eval/mean_return" in r]
    best = max((r["eval/mean_return"] for r in evals), default=float("-inf"))
    for r in evals:
        if r["eval/mean_return"] >= SOLVED_RETURN:
            return r["eval/train_time_s"], int(r["eval/env_steps"]), best, share
    return None, None, best, share


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--algo", default="sac", choices=["sac", "fasttd3"])
    parser.add_argument("--runs", type=int, default=5, help="seeds 0..runs-1")
    parser.add_argument("--max-steps", type=int, default=8000, help="env steps per run (stops the run early)")
    parser.add_argument("overrides", nargs="*", help="key=value config overrides, e.g. num_envs=4")
    args = parser.parse_args()
    times: list[float] = []
    overrides = [f"trainer.total_env_steps={args.max_steps}", *args.overrides]
    for seed in range(args.runs):
        seconds, steps, best, share = time_to_solve(args.algo, seed, overrides)
        solved = f"{seconds:.2f} s at {steps} env steps" if seconds is not None else "not solved"
        print(f"seed {seed}: {solved} (best eval return {best:.1f}, CPU share {share:.2f})", flush=True)
        if seconds is not None:
            times.append(seconds)
    if times:
        print(f"{args.algo}: median {statistics.median(times):.2f} s over {len(times)}/{args.runs} solved runs")


if __name__ == "__main__":
    main()
