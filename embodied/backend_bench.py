"""``embodied bench sim BACKEND:TASK``: a task's full step on a chosen backend against that
backend's raw physics step at the same batch.

``ratio_vs_raw`` = task env-steps/s over raw env-steps/s: 1.0 means the adapter (control
mapping, observation, reward, termination, auto-reset) costs nothing beside the physics; the
target is >= 0.9. The raw step is the backend's own (:class:`RawStepper`): what a hand-written
loop on that simulator would do per control step.
"""

from __future__ import annotations

import statistics
import time
from typing import Any, Protocol, runtime_checkable

import torch

from embodied import registry
from embodied.config import ConfigError


@runtime_checkable
class RawStepper(Protocol):
    """A backend env that can run its bare physics for one control step (no task terms)."""

    def raw_step(self, action: torch.Tensor) -> None:
        """Write ``action`` [N, A] as the control and advance the physics one control period."""
        ...


def parse_target(text: str) -> tuple[str, str]:
    """``"mjwarp:halfcheetah"`` -> ``("mjwarp", "halfcheetah")``, both checked against the registry.

    A backend whose task names carry it (``maniskill:PushCube-v1``, a ``registry.PREFIXED`` name)
    keeps the whole text as the task: ``("maniskill", "maniskill:PushCube-v1")``."""
    backend, sep, task = text.partition(":")
    if not sep or not backend or not task:
        raise ConfigError(f"expected BACKEND:TASK (e.g. mjwarp:halfcheetah), got {text!r}")
    if backend not in registry.BACKENDS:
        raise ConfigError(f"in {text!r}: unknown backend {backend!r}; backends: {', '.join(registry.BACKENDS)}")
    if backend + sep in registry.PREFIXED:
        task = text
    registry.check_backend(task, backend)
    return backend, task


def _seconds(fn: Any, actions: torch.Tensor) -> float:
    start = time.perf_counter()
    for action in actions:
        fn(action)
    return time.perf_counter() - start


def bench_backend_task(
    target: str, num_envs: int, device: str, steps: int, repeats: int = 3, **_options: Any
) -> dict[str, Any]:
    """Env-steps/s of task and raw steps, interleaved ``repeats`` times; medians and their ratio."""
    backend, task = parse_target(target)
    env = registry.make_env(task, registry.task_cfg(task, backend), num_envs, device, seed=0)
    try:
        if not isinstance(env, RawStepper):
            raise ConfigError(
                f"bench sim {target}: the {backend} backend has no raw physics step to compare against; "
                "`embodied bench --help` lists the other benches (e.g. mujoco-ant, quadrotor)"
            )
        gen = torch.Generator().manual_seed(0)
        actions = (torch.rand((steps, num_envs, env.action_dim), generator=gen) * 2 - 1).to(env.device)
        start = time.perf_counter()
        env.step(actions[0])  # warm-up: compiles or loads the kernels
        env.raw_step(actions[0])
        warmup_s = time.perf_counter() - start
        task_s: list[float] = []
        raw_s: list[float] = []
        for _ in range(repeats):  # interleaved: background load hits both alike
            task_s.append(_seconds(env.step, actions))
            raw_s.append(_seconds(env.raw_step, actions))
    finally:
        env.close()
    task_rate = num_envs * steps / statistics.median(task_s)
    raw_rate = num_envs * steps / statistics.median(raw_s)
    return {
        "bench": target,
        "num_envs": num_envs,
        "device": device,
        "steps": steps,
        "repeats": repeats,
        "steps_per_s": task_rate,
        "raw_steps_per_s": raw_rate,
        "ratio_vs_raw": task_rate / raw_rate,
        "warmup_s": warmup_s,
    }
