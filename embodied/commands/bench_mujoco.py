"""Throughput of the MuJoCo locomotion tasks against raw physics and gymnasium, in one run.

Each bench times three things on the same model and thread count, interleaved and repeated
(medians reported) so background load hits them alike:

- the task's full ``step`` (physics, contact forces, observation, reward, auto-reset);
- raw ``mujoco.rollout`` of the same number of substeps (no observation, no reward), once
  with one call per control step (``ratio_vs_raw``: the cadence an RL loop needs) and once with
  ten control steps per call (``ratio_vs_raw_chunked``: an upper bound no env can reach);
- gymnasium's ``SyncVectorEnv`` of the matching ``*-v5`` env (a Python loop over envs).

``steps_per_s`` counts env steps (``frame_skip`` substeps each) summed over envs. It builds
tasks by name, so it lives with the bench command, above the simulators.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import gymnasium
import mujoco
import numpy as np
import torch

from embodied import registry
from embodied.config import int_in_range
from embodied.sim.mujoco import MujocoVecEnv

_GYM_IDS = {"mujoco-halfcheetah": "HalfCheetah-v5", "mujoco-ant": "Ant-v5", "mujoco-humanoid": "Humanoid-v5"}


def _time_task(env: MujocoVecEnv, actions: torch.Tensor) -> float:
    """Seconds for ``len(actions)`` env steps; ``actions`` ``[T, N, A]``."""
    start = time.perf_counter()
    for action in actions:
        env.step(action)
    return time.perf_counter() - start


def _time_raw(env: MujocoVecEnv, actions: np.ndarray, chunk_steps: int) -> float:
    """Seconds for ``mujoco.rollout`` to apply ``actions`` ``[T, N, A]`` (each held for
    ``frame_skip`` substeps, as the task does) to every env, ``chunk_steps`` control steps per
    call, starting from the model's default state."""
    from mujoco import rollout

    model, skip = env.model, env.backend.frame_skip
    steps, n, _ = actions.shape
    spec = mujoco.mjtState.mjSTATE_FULLPHYSICS
    data = mujoco.MjData(model)
    mujoco.mj_forward(model, data)
    state0 = np.zeros(mujoco.mj_stateSize(model, spec))
    mujoco.mj_getState(model, data, state0, spec)
    initial = np.tile(state0, (n, 1))
    # the same control sequence as the task: [N, T * frame_skip, nu] in actuator units
    ctrl = env.ctrl_mid + env.ctrl_half * np.clip(actions, -1, 1)
    control = np.ascontiguousarray(np.repeat(ctrl.transpose(1, 0, 2), skip, axis=1))
    chunk_steps = max(1, min(steps, chunk_steps))
    datas = [mujoco.MjData(model) for _ in range(env.physics.nthread)]
    elapsed = 0.0
    with rollout.Rollout(nthread=env.physics.nthread) as pool:
        for first in range(0, steps, chunk_steps):
            chunk = np.ascontiguousarray(control[:, first * skip : (first + chunk_steps) * skip])
            out = np.empty((n, chunk.shape[1], initial.shape[1]))
            sensordata = np.empty((n, chunk.shape[1], model.nsensordata))
            start = time.perf_counter()
            pool.rollout(model, datas, initial, chunk, state=out, sensordata=sensordata)
            elapsed += time.perf_counter() - start
            initial = np.ascontiguousarray(out[:, -1])
    return elapsed


def _time_gym_sync(vec: Any, steps: int, rng: np.random.Generator) -> float:
    """Env steps per second of a gymnasium vector env over ``steps`` random-action steps."""
    space = vec.single_action_space
    actions = rng.uniform(space.low, space.high, size=(steps, vec.num_envs, space.shape[0]))
    start = time.perf_counter()
    for action in actions.astype(np.float32):
        vec.step(action)
    return vec.num_envs * steps / (time.perf_counter() - start)


def bench_task(task: str, num_envs: int, device: str, steps: int, repeats: int = 3) -> dict[str, Any]:
    """Measure ``task`` at ``num_envs``; returns ``steps_per_s`` and the two ratios."""
    cfg = registry.task_cfg(task)
    env = registry.make_env(task, cfg, num_envs=num_envs, device=device, seed=0)
    assert isinstance(env, MujocoVecEnv)
    rng = np.random.default_rng(0)
    gen = torch.Generator().manual_seed(0)
    env_closers = [env.close]
    try:
        actions = torch.rand((steps, num_envs, env.action_dim), generator=gen) * 2 - 1
        actions_np = actions.numpy().astype(np.float64)
        env.step(actions[0])  # warm-up
        gym_envs = min(num_envs, 16)
        vec = gymnasium.make_vec(_GYM_IDS[task], num_envs=gym_envs, vectorization_mode="sync")
        vec.reset(seed=0)
        env_closers.append(vec.close)
        task_s, raw_s, chunked_s, gym_rates = [], [], [], []
        # interleaved, so that background load hits every contender alike
        for _ in range(repeats):
            task_s.append(_time_task(env, actions))
            # one call per control step: the cadence an RL loop needs (state fed back each call)
            raw_s.append(_time_raw(env, actions_np, chunk_steps=1))
            # 10 control steps per call: fewer thread-pool round trips, an upper bound
            chunked_s.append(_time_raw(env, actions_np, chunk_steps=10))
            gym_rates.append(_time_gym_sync(vec, max(10, steps // 2), rng))
        gym_rate = statistics.median(gym_rates)
        task_rate = num_envs * steps / statistics.median(task_s)
        raw_rate = num_envs * steps / statistics.median(raw_s)
        chunked_rate = num_envs * steps / statistics.median(chunked_s)
        skip = env.backend.frame_skip
        return {
            "task": task,
            "num_envs": num_envs,
            "steps": steps,
            "frame_skip": skip,
            "nthread": env.physics.nthread,
            "steps_per_s": task_rate,
            "substeps_per_s": task_rate * skip,
            "raw_rollout_substeps_per_s": raw_rate * skip,
            "raw_rollout_chunked_substeps_per_s": chunked_rate * skip,
            "gymnasium_sync_steps_per_s": gym_rate,
            "gymnasium_sync_envs": gym_envs,
            "ratio_vs_raw": task_rate / raw_rate,
            "ratio_vs_raw_chunked": task_rate / chunked_rate,
            "ratio_vs_gymnasium_sync": task_rate / gym_rate,
        }
    finally:
        for close in env_closers:
            close()


def bench_ant(num_envs: int, device: str, steps: int, repeats: int = 3) -> dict[str, Any]:
    """``mujoco-ant`` (Ant-v5 equivalent)."""
    return bench_task("mujoco-ant", num_envs, device, steps, repeats)


def bench_halfcheetah(num_envs: int, device: str, steps: int, repeats: int = 3) -> dict[str, Any]:
    """``mujoco-halfcheetah`` (HalfCheetah-v5 equivalent)."""
    return bench_task("mujoco-halfcheetah", num_envs, device, steps, repeats)


def bench_humanoid(num_envs: int, device: str, steps: int, repeats: int = 3) -> dict[str, Any]:
    """``mujoco-humanoid`` (Humanoid-v5 equivalent)."""
    return bench_task("mujoco-humanoid", num_envs, device, steps, repeats)


def main(argv: list[str] | None = None) -> int:
    """``python -m embodied.commands.bench_mujoco mujoco-ant --num-envs 1024 --steps 20``: JSON to stdout."""
    import argparse
    import json

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("task", choices=sorted(_GYM_IDS))
    parser.add_argument("--num-envs", type=int_in_range(1, 262_144), default=1024)
    parser.add_argument("--steps", type=int_in_range(1, 10**7), default=20)
    parser.add_argument("--repeats", type=int_in_range(1, 10_000), default=3)
    args = parser.parse_args(argv)
    result = bench_task(args.task, args.num_envs, "cpu", args.steps, repeats=args.repeats)
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
