"""Throughput of the built-in quadrotor's bare physics step, and the timing helpers the task
benchmarks of ``embodied bench env`` share (:mod:`embodied.commands.bench`).

``steps_per_s`` counts env steps summed over envs (``num_envs * steps / seconds``), the median
of several timed repeats after a warm-up (which includes any ``torch.compile`` time, reported
separately as ``warmup_s``).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

from embodied.sim.quadrotor import RPM, Quadrotor, QuadrotorCfg


def time_repeats(
    step: Callable[[int], None], steps: int, repeats: int, warmup: int
) -> tuple[float, list[float], list[float]]:
    """Run ``step(i)`` ``warmup`` times, then ``repeats`` timed blocks of ``steps`` calls.

    Returns ``(warmup_s, wall_seconds, cpu_seconds)`` per block. Process CPU time is reported
    too because on a shared machine wall time mostly measures the other processes.
    """
    start = time.perf_counter()
    for i in range(warmup):
        step(i)
    warmup_s = time.perf_counter() - start
    walls: list[float] = []
    cpus: list[float] = []
    for _ in range(repeats):
        start, cpu_start = time.perf_counter(), time.process_time()
        for i in range(steps):
            step(i)
        walls.append(time.perf_counter() - start)
        cpus.append(time.process_time() - cpu_start)
    return warmup_s, walls, cpus


def summarize(
    num_envs: int, steps: int, warmup_s: float, blocks: list[float], cpus: list[float], **extra: Any
) -> dict[str, Any]:
    """Result dict: median ``steps_per_s`` plus the per-repeat rates and settings."""
    rates = [num_envs * steps / b for b in blocks]
    return {
        "num_envs": num_envs,
        "steps": steps,
        "repeats": len(blocks),
        "steps_per_s": statistics.median(rates),
        "steps_per_s_repeats": rates,
        "step_time_us": 1e6 * statistics.median(blocks) / steps,
        "steps_per_cpu_s": statistics.median(num_envs * steps / max(c, 1e-9) for c in cpus),
        "warmup_s": warmup_s,
        "threads": torch.get_num_threads(),
        **extra,
    }


def bench_quadrotor(
    num_envs: int, device: str = "cpu", steps: int = 200, compile: bool = False, repeats: int = 5
) -> dict[str, Any]:
    """Bare RK4 physics step of ``num_envs`` quadrotors (no observation, reward or reset)."""
    dev = torch.device(device)
    sim = Quadrotor(QuadrotorCfg(compile=compile, ground_z_m=None), num_envs, dev, torch.Generator(dev).manual_seed(0))
    hover = sim.cfg.params.hover_rpm
    sim.state[:, RPM] = hover
    # A fixed command pattern around hover keeps every env airborne and the arithmetic realistic.
    gen = torch.Generator(dev).manual_seed(1)
    cmds = [hover * (1.0 + 0.05 * torch.randn(num_envs, 4, generator=gen, device=dev)) for _ in range(8)]
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)

    def step(i: int) -> None:
        sim.step(cmds[i % len(cmds)])
        if i == steps - 1:
            sync()

    warmup_s, blocks, cpus = time_repeats(step, steps, repeats, warmup=max(20, steps // 5))
    return summarize(num_envs, steps, warmup_s, blocks, cpus, bench="sim quadrotor", device=str(dev), compile=compile)
