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


TARGET_FORMS = (
    "BACKEND:TASK for a registered task (mjwarp:halfcheetah, mujoco:arm-push), or a prefixed task name "
    "(gym:Pendulum-v1, maniskill:PushCube-v1, isaaclab:Isaac-Cartpole-Direct, robosuite:Lift), "
    "optionally after its backend (gymnasium:Pendulum-v1 = gymnasium:gym:Pendulum-v1 = gym:Pendulum-v1)"
)
"""The bench target forms :func:`parse_target` accepts (error messages and ``--help``)."""


def _prefix_of(backend: str) -> str | None:
    """The task-name prefix whose entries run on ``backend`` (``gymnasium`` -> ``gym:``), if any."""
    return next((p for p, (entry, _) in registry.PREFIXED.items() if entry.backend == backend), None)


def parse_target(text: str) -> tuple[str, str]:
    """``(backend, task)`` for a bench target, both checked against the registry (see :data:`TARGET_FORMS`).

    ``"mjwarp:halfcheetah"`` -> ``("mjwarp", "halfcheetah")``; a prefixed task name keeps its
    prefix and names its backend: ``"gym:Pendulum-v1"`` and ``"gymnasium:Pendulum-v1"`` ->
    ``("gymnasium", "gym:Pendulum-v1")``, ``"maniskill:PushCube-v1"`` -> ``("maniskill",
    "maniskill:PushCube-v1")``."""
    for prefix, (entry, _) in registry.PREFIXED.items():
        if text.startswith(prefix) and len(text) > len(prefix):
            return entry.backend, text
    backend, sep, task = text.partition(":")
    if not sep or not backend or not task:
        raise ConfigError(f"bench sim: expected {TARGET_FORMS}; got {text!r}")
    if backend not in registry.BACKENDS:
        raise ConfigError(
            f"in {text!r}: unknown backend {backend!r}; backends: {', '.join(registry.BACKENDS)}, "
            f"task prefixes: {', '.join(registry.PREFIXED)}"
        )
    backend_prefix = _prefix_of(backend)
    if backend_prefix is not None:
        task = task if task.startswith(backend_prefix) else backend_prefix + task
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
                f"bench sim {target}: the {backend} backend has no raw step to compare against "
                f"(no raw_step on {type(env).__name__}); `embodied bench --help` lists the other benches"
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
