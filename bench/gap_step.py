"""The quad-hover task step with the reality-gap models: eager against the fused compiled step.

``--preset sweep`` trains with gap models on (observation delay, thrust mismatch, mass and motor
lag randomization). Its step runs eagerly unless ``env.sim.compile=true``; then the whole step,
gap models included, is one compiled call (``tasks/quadrotor/hover_fused.py``). This script
times both on the preset's env (its ``num_envs``, the curriculum at full width), in the same
process, alternating blocks so a busy neighbour slows both alike, and reports medians and their
ratio.

    taskset -c 1 .venv/bin/python bench/gap_step.py --preset sweep --threads 1

Prints one JSON object (µs per step). The first run compiles the fused step (tens of seconds,
timed and reported as ``fused_first_step_s``); later runs load it from the compiled-step cache.
Not a test: the numbers depend on the machine.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from embodied.commands.bench_gpu import machine
from embodied.commands.train import preset_file
from embodied.config import apply_overrides
from embodied.experiment import resolve_experiment
from embodied.tasks.quadrotor.hover import QuadHover, QuadHoverCfg

CPU = torch.device("cpu")


def build(cfg: QuadHoverCfg, num_envs: int, fused: bool) -> QuadHover:
    """The preset's env, its curriculum at full width; ``fused``: with ``sim.compile`` on."""
    env = QuadHover(apply_overrides(cfg, {"sim": {"compile": fused}}, "bench"), num_envs, CPU, seed=0)
    if (env._fused is not None) != fused:
        raise SystemExit(f"the env {'did not take' if fused else 'took'} the fused step")
    env.set_training_progress(1.0)
    env.reset(seed=0)
    return env


def block_us(env: QuadHover, actions: list[torch.Tensor], steps: int) -> float:
    """Mean µs per step over ``steps`` steps."""
    start = time.perf_counter()
    for i in range(steps):
        env.step(actions[i % len(actions)])
    return (time.perf_counter() - start) / steps * 1e6


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="sweep", help="quad-hover PPO preset (default: sweep)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default: 1, as training's)")
    parser.add_argument("--steps", type=int, default=300, help="steps per timed block (default: 300)")
    parser.add_argument("--repeats", type=int, default=7, help="blocks per variant; medians reported (default: 7)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    exp = resolve_experiment("quad-hover", "ppo", preset_file("quad-hover", "ppo", args.preset))
    env_cfg = exp.env
    assert isinstance(env_cfg, QuadHoverCfg)
    n = exp.num_envs
    eager = build(env_cfg, n, fused=False)
    fused = build(env_cfg, n, fused=True)
    gen = torch.Generator().manual_seed(0)
    # Near hover with some spread: episodes end and restart throughout, as in training.
    actions = [(torch.rand(n, 4, generator=gen) * 2 - 1) * 0.3 + eager.hover_action for _ in range(64)]
    start = time.perf_counter()
    fused.step(actions[0])  # compiles, or loads from the compiled-step cache
    first_s = time.perf_counter() - start
    for env in (eager, fused):
        block_us(env, actions, 30)  # warm
    times: dict[str, list[float]] = {"eager": [], "fused": []}
    for _ in range(args.repeats):
        times["eager"].append(block_us(eager, actions, args.steps))
        times["fused"].append(block_us(fused, actions, args.steps))
    eager_us, fused_us = statistics.median(times["eager"]), statistics.median(times["fused"])
    report = {
        "preset": args.preset,
        "num_envs": n,
        "threads": args.threads,
        "eager_us_per_step": round(eager_us, 1),
        "fused_us_per_step": round(fused_us, 1),
        "eager_over_fused": round(eager_us / fused_us, 2),
        "fused_first_step_s": round(first_s, 2),
        "blocks_us": {k: [round(v, 1) for v in vs] for k, vs in times.items()},
        "machine": machine("cpu"),
    }
    print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
