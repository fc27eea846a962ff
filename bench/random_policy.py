"""Return and success rate of uniformly random actions on a task: the floor a trained policy must clear.

The task's env config is resolved as ``embodied train TASK --algo ALGO`` would resolve it (the
shipped ``configs/<task>/<algo>.yaml`` plus ``key=value`` overrides), so the episodes have the
same horizon and reward as that training run's evaluations. Actions are drawn uniformly in
[-1, 1] from a generator seeded with ``--seed``; episodes are counted as ``evaluate`` counts
them (one per env, in parallel).

    .venv-robosuite/bin/python bench/random_policy.py robosuite:Lift --algo sac --episodes 32

Prints one JSON object: the evaluation (``mean_return``, ``std_return``, ``success_rate``, ...)
and the command's settings.
"""

from __future__ import annotations

import argparse
import json
import logging
from typing import Any

import torch

from embodied import registry
from embodied.env import ObsDict
from embodied.experiment import resolve_experiment
from embodied.training.evaluate import PolicyFn, evaluate


def random_policy(env: Any, seed: int) -> PolicyFn:
    """Uniform actions ``[N, action_dim]`` in [-1, 1], reproducible from ``seed``."""
    gen = torch.Generator().manual_seed(seed)

    def act(obs: ObsDict) -> torch.Tensor:
        return (torch.rand((env.num_envs, env.action_dim), generator=gen) * 2 - 1).to(env.device)

    return act


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("task", help="task name, e.g. robosuite:Lift or gym:Pendulum-v1")
    parser.add_argument("--algo", default="sac", help="whose shipped config sets the env (default: sac)")
    parser.add_argument("--episodes", type=int, default=32, help="episodes, all in parallel (default: 32)")
    parser.add_argument("--seed", type=int, default=0, help="env and action seed (default: 0)")
    parser.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="config overrides, e.g. env.horizon=200")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    cfg = resolve_experiment(args.task, args.algo, overrides=args.overrides)

    def make_env(num_envs: int, seed: int) -> Any:
        return registry.make_env(args.task, cfg.env, num_envs, "cpu", seed)

    result = evaluate(lambda env: random_policy(env, args.seed), make_env, args.episodes, args.seed)
    out = {"task": args.task, "algo_config": args.algo, "seed": args.seed, "overrides": args.overrides}
    print(json.dumps(out | result.as_dict(), indent=1))


if __name__ == "__main__":
    main()
