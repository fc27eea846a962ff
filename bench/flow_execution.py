"""How a cloned flow policy's chunks are executed decides its closed-loop success (arm-push).

Trains ``bc-flow`` (the algorithm itself, without the trainer's env stepping) on a demonstration
dataset and, every ``--eval-every`` gradient steps, evaluates the same weights (the EMA policy)
executed three ways on the same episodes:

- ``first``: the deterministic sampler (zero start), first action of each plan, plan every step;
- ``ensemble``: the deterministic sampler with temporal ensembling (mean of what the last ``H``
  plans said for this step; ``algo.policy.temporal_ensemble``);
- ``stochastic``: a fresh ``N(0, I)`` start per plan (seeded), first action.

Prints one JSON line per evaluation. Example (the figures in docs/benchmarks/finetuning.md)::

    embodied collect scripted:arm-push --episodes 500 --noise 0.3 --record intended --seed 2 --out /tmp/dart500
    python bench/flow_execution.py --dataset /tmp/dart500 --steps 15000 --eval-every 2500
    python bench/flow_execution.py --dataset /tmp/dart500 --chunk 2 --hidden 512,512,512 --steps 12500
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from embodied import registry
from embodied.action_chunks import ChunkExecutor, ChunkSpec
from embodied.algo import PreloadSource
from embodied.algos.bc_flow import BCFlow, BCFlowCfg
from embodied.env import ObsDict
from embodied.policies.flow import FlowPolicy, FlowPolicyCfg
from embodied.training.evaluate import evaluate

TASK = "arm-push"


def executions(policy: FlowPolicy, seed: int) -> dict[str, Callable[[Any], Callable[[ObsDict], torch.Tensor]]]:
    """``mode -> policy_for_env`` (a fresh executor per evaluation batch)."""
    spec = ChunkSpec(policy.cfg.chunk, 1)

    def zero_start(obs: torch.Tensor) -> torch.Tensor:
        return policy.sample_chunk(policy.normalize(obs), policy.x0_fixed.expand(obs.shape[0], -1))

    def make(plan: Callable[[torch.Tensor], torch.Tensor], chunk: ChunkSpec) -> Callable[[Any], Any]:
        def for_env(_env: Any) -> Callable[[ObsDict], torch.Tensor]:
            executor = ChunkExecutor(plan, chunk)
            return lambda obs: executor(obs["policy"])

        return for_env

    gen = torch.Generator().manual_seed(seed)

    def noisy_start(obs: torch.Tensor) -> torch.Tensor:
        x0 = torch.randn(obs.shape[0], policy.flat_dim, generator=gen)
        return policy.sample_chunk(policy.normalize(obs), x0)

    return {
        "first": make(zero_start, spec),
        "ensemble": make(zero_start, dataclasses.replace(spec, temporal_ensemble=True)),
        "stochastic": make(noisy_start, spec),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dataset", type=Path, required=True, help="a dataset written by `embodied collect`")
    parser.add_argument("--steps", type=int, default=15000, help="gradient steps")
    parser.add_argument("--eval-every", type=int, default=2500, help="gradient steps between evaluations")
    parser.add_argument("--episodes", type=int, default=100, help="episodes per evaluation")
    parser.add_argument("--chunk", type=int, default=4, help="actions per plan")
    parser.add_argument("--hidden", default="256,256", help="velocity network widths, comma-separated")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(args.seed)
    hidden = tuple(int(width) for width in args.hidden.split(","))
    cfg = BCFlowCfg(policy=FlowPolicyCfg(hidden=hidden, chunk=args.chunk), grad_steps_per_update=1, ema_decay=0.995)
    task_cfg = registry.task_cfg(TASK)

    def make_env(n: int, seed: int) -> Any:
        return registry.make_env(TASK, task_cfg, n, "cpu", seed)

    env = make_env(1, 0)
    algo = BCFlow(cfg, env)
    env.close()
    algo.preload(PreloadSource(dataset=args.dataset))
    start = time.perf_counter()
    for step in range(1, args.steps + 1):
        loss = algo.update()["bc_loss"]
        if step % args.eval_every:
            continue
        row: dict[str, Any] = {"grad_steps": step, "bc_loss": round(loss, 4)}
        for mode, policy_for_env in executions(algo.policy, args.seed).items():
            row[mode] = evaluate(policy_for_env, make_env, args.episodes, 12345).success_rate
        row["wall_s"] = round(time.perf_counter() - start)
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
