"""Camera rendering throughput of the batched MuJoCo backend (arm-push, ``top`` camera).

Per batch size ``N``: frames/s of ``render_images()`` alone (one offscreen renderer, ``N``
scenes per call) and env steps/s of ``step`` with the camera on against the same env without it,
measured in the same process, interleaved, median of ``--repeats`` runs. Prints one JSON line per
``N``. Run with one thread, e.g.::

    OMP_NUM_THREADS=1 .venv/bin/python bench/mujoco_camera.py --num-envs 16 64 --size-px 64
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import statistics
import time
from collections.abc import Callable

import torch

from embodied.tasks.arm_push import ArmPush, ArmPushCfg


def make(num_envs: int, camera: str, size_px: int) -> ArmPush:
    cfg = ArmPushCfg()
    backend = dataclasses.replace(cfg.backend, camera=camera, image_size_px=size_px)
    return ArmPush(dataclasses.replace(cfg, backend=backend), num_envs=num_envs, device="cpu", seed=0)


def per_second(fn: Callable[[], object], calls: int, items: int) -> float:
    """Items per second over ``calls`` calls of ``fn`` (each producing ``items``)."""
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return calls * items / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--num-envs", type=int, nargs="+", default=[16, 64])
    parser.add_argument("--size-px", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--calls", type=int, default=20)
    args = parser.parse_args()
    torch.set_num_threads(1)
    for n in args.num_envs:
        with_camera, without = make(n, "top", args.size_px), make(n, "", args.size_px)
        action = torch.zeros(n, 3)
        for env in (with_camera, without):
            env.reset(seed=0)
            env.step(action)  # warm-up: GL context, first frame
        render, step_camera, step_plain = [], [], []
        for _ in range(args.repeats):
            render.append(per_second(with_camera.render_images, args.calls, n))
            step_camera.append(per_second(functools.partial(with_camera.step, action), args.calls, n))
            step_plain.append(per_second(functools.partial(without.step, action), args.calls, n))
        row = {
            "num_envs": n,
            "size_px": args.size_px,
            "render_frames_per_s": round(statistics.median(render)),
            "step_with_camera_per_s": round(statistics.median(step_camera)),
            "step_without_camera_per_s": round(statistics.median(step_plain)),
            "camera_step_cost_ratio": round(statistics.median(step_plain) / statistics.median(step_camera), 1),
            "repeats": args.repeats,
        }
        print(json.dumps(row), flush=True)
        with_camera.close()
        without.close()


if __name__ == "__main__":
    main()
