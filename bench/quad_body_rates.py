"""Body rates a trained quadrotor policy flies: where the safety envelope's ``ang_vel_rad_s`` must sit.

Rebuilds the run (``config.yaml`` + its checkpoint), flies ``--episodes`` episodes of its own task
in parallel with the deterministic policy, and reports per body axis (x, y, z) the quantiles of
each episode's largest ``|ang_vel_b|`` and, after ``--settle-s`` seconds, of the per-step
``|ang_vel_b|``; also the largest norm seen. Compare with ``extra.envelope.ang_vel_rad_s`` in the
run's ``policy_io.json``.

    .venv/bin/python bench/quad_body_rates.py RUN_DIR --episodes 1000

Prints one JSON object (rad/s).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from embodied import registry
from embodied.training.run import load_run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--episodes", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=123)
    parser.add_argument(
        "--settle-s", type=float, default=0.5, help="skip this much of each episode for the per-step figures"
    )
    args = parser.parse_args()
    run = load_run(args.run_dir)
    env = registry.make_env(run.cfg.task_name, run.cfg.env, args.episodes, "cpu", args.seed)
    episode_steps = int(run.io_spec.extra["episode_steps"])
    settle_steps = round(args.settle_s / run.io_spec.control_period_s)
    obs = env.reset(seed=args.seed)
    episode_max = torch.zeros(args.episodes, 3)
    settled: list[torch.Tensor] = []
    largest_norm = 0.0
    with torch.no_grad():
        for step in range(episode_steps):
            obs, *_ = env.step(run.algo.policy.act(obs, deterministic=True))
            ang_vel_b = env.physical_state()["ang_vel_b"]  # [N, 3] rad/s (ended envs: their reset state)
            largest_norm = max(largest_norm, float(ang_vel_b.norm(dim=1).max()))
            episode_max = torch.maximum(episode_max, ang_vel_b.abs())
            if step >= settle_steps:
                settled.append(ang_vel_b.abs())
    env.close()
    per_step = torch.cat(settled)
    quantiles = (0.5, 0.99, 1.0)
    report = {
        "run_dir": str(args.run_dir),
        "episodes": args.episodes,
        "episode_max_abs_rad_s": {
            axis: {f"q{q:g}": round(float(episode_max[:, i].quantile(q)), 3) for q in quantiles}
            for i, axis in enumerate("xyz")
        },
        "settled_p999_abs_rad_s": {
            axis: round(float(per_step[:, i].quantile(0.999)), 3) for i, axis in enumerate("xyz")
        },
        "largest_norm_rad_s": round(largest_norm, 3),
        "envelope_ang_vel_rad_s": run.io_spec.extra.get("envelope", {}).get("ang_vel_rad_s"),
    }
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
