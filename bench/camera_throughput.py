"""Camera observation throughput of a rendering backend's task: ``--task`` with ``--camera``
(default ManiSkill3's PushCube-v1 ``base_camera`` on its physx CPU backend, where SAPIEN renders
through lavapipe, software Vulkan; ``robosuite:Lift`` with ``agentview`` renders through
robosuite's MuJoCo offscreen context on EGL).

Per batch size ``N``: frames/s of ``render_images()`` alone and env steps/s of ``step`` with the
camera on against the same task with state observations only, both envs built in this process
and timed interleaved, median of ``--repeats`` runs; wall-clock rates and, beside them, rates
per CPU-second of this process (the machine is shared). Prints one JSON line per ``N``::

    OMP_NUM_THREADS=1 nice -n 10 .venv/bin/python bench/camera_throughput.py --num-envs 4 16 --size-px 64
    OMP_NUM_THREADS=1 nice -n 10 .venv-robosuite/bin/python bench/camera_throughput.py \
        --task robosuite:Lift --camera agentview --num-envs 1 4 --size-px 64
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import time
from collections.abc import Callable

import torch

from embodied import registry
from embodied.config import apply_overrides
from embodied.env import RenderingEnv, VecEnv

TASK = "maniskill:PushCube-v1"
CAMERA = "base_camera"


def make(task: str, num_envs: int, camera: str, size_px: int) -> VecEnv:
    cfg = apply_overrides(registry.task_cfg(task), {"backend": {"camera": camera, "image_size_px": size_px}}, "bench")
    env = registry.make_env(task, cfg, num_envs=num_envs, device="cpu", seed=0)
    assert isinstance(env, VecEnv)
    return env


def rates(fn: Callable[[], object], calls: int, items: int) -> tuple[float, float]:
    """``(items per wall second, items per CPU second of this process)`` over ``calls`` calls of ``fn``."""
    wall, cpu = time.perf_counter(), time.process_time()
    for _ in range(calls):
        fn()
    return calls * items / (time.perf_counter() - wall), calls * items / (time.process_time() - cpu)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--task", default=TASK, help=f"a task of a rendering backend (default {TASK})")
    parser.add_argument("--camera", default=CAMERA, help=f"the camera it renders (default {CAMERA})")
    parser.add_argument("--num-envs", type=int, nargs="+", default=[4, 16])
    parser.add_argument("--size-px", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--calls", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(1)
    for n in args.num_envs:
        camera, plain = make(args.task, n, args.camera, args.size_px), make(args.task, n, "", args.size_px)
        assert isinstance(camera, RenderingEnv)
        action = torch.zeros(n, camera.action_dim)
        for env in (camera, plain):
            env.reset(seed=0)
            env.step(action)  # warm-up: first frame, controller set-up
        runs: dict[str, list[tuple[float, float]]] = {"render": [], "camera": [], "state": []}
        for _ in range(args.repeats):
            runs["render"].append(rates(camera.render_images, args.calls, n))
            runs["camera"].append(rates(functools.partial(camera.step, action), args.calls, n))
            runs["state"].append(rates(functools.partial(plain.step, action), args.calls, n))
        wall = {k: statistics.median(r[0] for r in v) for k, v in runs.items()}
        cpu = {k: statistics.median(r[1] for r in v) for k, v in runs.items()}
        row = {
            "task": args.task,
            "camera": args.camera,
            "num_envs": n,
            "size_px": args.size_px,
            "render_frames_per_s": round(wall["render"], 1),
            "step_with_camera_per_s": round(wall["camera"], 1),
            "step_state_only_per_s": round(wall["state"], 1),
            "state_over_camera": round(wall["state"] / wall["camera"], 1),
            "render_frames_per_cpu_s": round(cpu["render"], 1),
            "step_with_camera_per_cpu_s": round(cpu["camera"], 1),
            "step_state_only_per_cpu_s": round(cpu["state"], 1),
            "state_over_camera_cpu": round(cpu["state"] / cpu["camera"], 1),
            "repeats": args.repeats,
            "calls": args.calls,
        }
        print(json.dumps(row), flush=True)
        camera.close()
        plain.close()


if __name__ == "__main__":
    main()
