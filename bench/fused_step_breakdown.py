"""Where the compiled quad-hover task step spends its time (``sim.compile=true``, CPU).

``embodied bench env quad-hover --compile`` gives one number, env steps per second. This script
takes the same step apart, so the gap to the bare physics (``embodied bench sim quadrotor``) has
names:

* ``sizes``: for each ``--num-envs``, ``QuadHover.step`` split into the compiled call
  (``CompiledFusedStep``: Python wrappers and the C++ entry with its kernels), the
  initial-condition pool refill (eager, amortized) and the rest of the Python step. The call's
  time at a few envs is its fixed cost; its growth per 1,024 envs is the kernels' work.
* ``variants`` (at the largest size): the compiled call alone with the observation noise off,
  the yaw relabelling off, both (configurations of the shipped step), and two edits of its source
  that exist only to size a part (:data:`EDITS`): the reset rows taken without the scan over ended
  envs (``torch.cumsum``, which inductor leaves to ATen between two kernels), and the final
  observation not computed.

    .venv/bin/python bench/fused_step_breakdown.py --threads 2 --num-envs 16,1024,2048,4096

Prints one JSON object (times in µs per step: medians over ``--repeats`` blocks of ``--steps``).
The first run compiles each variant (~30 s each); later runs load the shipped one from the
compiled-step cache.
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import time
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from embodied.commands.bench_gpu import machine
from embodied.config import apply_overrides
from embodied.registry import make_env, task_cfg
from embodied.tasks.quadrotor import hover_fused as quad_hover_fused

EDITS = {
    "no_scan": (
        "rank = torch.cumsum(done.to(torch.long), dim=0) - 1",
        "rank = torch.arange(n, device=done.device) * done.to(torch.long)",
    ),
    "no_final_obs": (
        '"final_policy": stacked(final_policy),\n        "final_critic": stacked(final_critic),',
        '"final_policy": stacked(policy),\n        "final_critic": stacked(after.critic),',
    ),
    "no_second_obs": (
        "policy, new_flip = after.policy, yaw_flip[:, 0]",
        "policy, new_flip = final.policy, yaw_flip[:, 0]\n    after = final",
    ),
}
"""Source edits of :func:`~embodied.tasks.quadrotor.hover_fused.fused_step` that size one part of it
(their results differ from the shipped step's): ``no_scan`` takes each ended env's pool row by
env index; ``no_final_obs`` returns the observation after the resets as the final one, so the final
observation rows are neither computed nor written; ``no_second_obs`` returns the observation
before the resets as the one after them (not computed a second time)."""


def median_us(fn: Callable[[int], Any], steps: int, repeats: int) -> float:
    """Median over ``repeats`` blocks of the time per call of ``fn(i)``, ``i`` in ``range(steps)``."""
    blocks = []
    for _ in range(repeats):
        start = time.perf_counter()
        for i in range(steps):
            fn(i)
        blocks.append((time.perf_counter() - start) / steps * 1e6)
    return statistics.median(blocks)


def hover_env(num_envs: int) -> Any:
    cfg = apply_overrides(task_cfg("quad-hover"), {"sim": {"compile": True}}, "fused_step_breakdown")
    return make_env("quad-hover", cfg, num_envs, torch.device("cpu"), seed=0)


def step_split(num_envs: int, steps: int, repeats: int) -> dict[str, float]:
    """``QuadHover.step`` under uniform random actions, split into its parts (µs per step)."""
    env = hover_env(num_envs)
    gen = torch.Generator().manual_seed(1)
    actions = [torch.rand(num_envs, env.action_dim, generator=gen) * 2 - 1 for _ in range(16)]
    spent = {"call": 0.0, "pool": 0.0}

    def timed(part: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(*args: Any) -> Any:
            start = time.perf_counter()
            out = fn(*args)
            spent[part] += time.perf_counter() - start
            return out

        return wrapper

    env._fused = timed("call", env._fused)
    env._ensure_pool = timed("pool", env._ensure_pool)
    for i in range(50):
        env.step(actions[i % 16])
    rows = []
    for _ in range(repeats):
        spent.update(call=0.0, pool=0.0)
        start = time.perf_counter()
        for i in range(steps):
            env.step(actions[i % 16])
        total = time.perf_counter() - start
        rows.append((total, spent["call"], spent["pool"]))
    total, call, pool = (statistics.median(r[j] for r in rows) / steps * 1e6 for j in range(3))
    env.close()
    return {
        "step_us": total,
        "compiled_call_us": call,
        "pool_refill_us": pool,
        "rest_us": total - call - pool,
        "env_steps_per_s": num_envs / total * 1e6,
    }


def edited_step(edit: str) -> Callable[..., Any]:
    """:func:`~embodied.tasks.quadrotor.hover_fused.fused_step` with one of :data:`EDITS`, compiled
    with the same options through ``torch.compile``."""
    old, new = EDITS[edit]
    source = Path(quad_hover_fused.__file__).read_text()
    if old not in source:
        raise SystemExit(f"fused_step no longer contains {old!r}: update this script")
    module = types.ModuleType(f"fused_step_{edit}")
    module.__file__ = quad_hover_fused.__file__  # the module reads its own folder at import
    exec(compile(source.replace(old, new), f"fused_step_{edit}", "exec"), module.__dict__)
    return compiled(module.fused_step)


def compiled(step: Callable[..., Any]) -> Callable[..., Any]:
    """``step`` through ``torch.compile`` with the options the shipped step compiles with."""
    return torch.compile(step, fullgraph=True, dynamic=False, options=quad_hover_fused.CPU_OPTIONS)


def variants(num_envs: int, steps: int, repeats: int) -> dict[str, float]:
    """The compiled call alone (µs per step) for each variant, on one fixed set of inputs."""
    env = hover_env(num_envs)
    action = torch.rand(num_envs, env.action_dim, generator=torch.Generator().manual_seed(1)) * 2 - 1
    *args, k = env.fused_inputs(action)
    shipped = env._fused
    consts = {
        "shipped": k,
        "no_obs_noise": k._replace(noise_std=()),
        "no_yaw_relabel": k._replace(flip_source=None),
        "neither": k._replace(noise_std=(), flip_source=None),
    }

    def with_consts(c: Any) -> Callable[[int], Any]:
        return lambda i: shipped(*args, c)

    calls = {name: with_consts(c) for name, c in consts.items()}
    compiled_shipped = compiled(quad_hover_fused.fused_step)
    # All through torch.compile (Dynamo's guards on every call), so each differs from the
    # shipped one by its edit only.
    calls["shipped_torch_compile"] = lambda i: compiled_shipped(*args, k)

    def edited(edit: str) -> Callable[[int], Any]:
        step = edited_step(edit)
        return lambda i: step(*args, k)

    for edit in EDITS:
        calls[f"{edit}_torch_compile"] = edited(edit)
    for call in calls.values():
        call(0)
    out: dict[str, float] = {}
    for name, call in calls.items():
        out[name] = median_us(call, steps, repeats)
    env.close()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=2, help="torch threads (default: 2)")
    parser.add_argument("--num-envs", default="16,1024,2048,4096", help="comma-separated env counts")
    parser.add_argument("--steps", type=int, default=300, help="steps per timed block (default: 300)")
    parser.add_argument("--repeats", type=int, default=7, help="timed blocks; medians are reported (default: 7)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    torch.set_num_threads(args.threads)
    sizes = [int(n) for n in args.num_envs.split(",")]
    result = {
        "threads": args.threads,
        **machine("cpu"),
        "sizes": {n: step_split(n, args.steps, args.repeats) for n in sizes},
        "variants_at": max(sizes),
        "variants": variants(max(sizes), args.steps, args.repeats),
    }
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
