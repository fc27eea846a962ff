"""Name -> implementation tables for tasks, algorithms and simulator backends.

Entries name their implementation as ``"module:attribute"`` strings and are imported only
when used, so listing them never imports a simulator. Adding a task, an algorithm or a
backend is one line here.
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable
from dataclasses import Field, dataclass
from typing import Any, ClassVar, Protocol

import torch

from embodied.algo import Algorithm
from embodied.config import ConfigError, unknown_choice_message
from embodied.env import VecEnv
from embodied.errors import EmbodiedError


class ConfigDataclass(Protocol):
    """Any dataclass instance: task and algorithm configs are frozen dataclasses."""

    __dataclass_fields__: ClassVar[dict[str, Field[Any]]]


@dataclass(frozen=True)
class Entry:
    """An implementation (``target``) and its config dataclass (``cfg``), both ``module:attr``."""

    target: str
    cfg: str
    summary: str
    backend: str = ""


def _load(ref: str) -> Callable[..., object]:
    """The callable named by ``"module:attribute"`` (imported now, not when the table is read)."""
    module, _, attr = ref.partition(":")
    target: object = getattr(importlib.import_module(module), attr)
    if not callable(target):
        raise EmbodiedError(f"registry entry {ref!r} names a {type(target).__name__}, not a class or function")
    return target


TASKS: dict[str, Entry] = {
    "quad-hover": Entry(
        "embodied.tasks.quad_hover:QuadHover",
        "embodied.tasks.quad_hover:QuadHoverCfg",
        "Crazyflie-class quadrotor: reach and hold a setpoint from random initial states",
        backend="quadrotor",
    ),
    "mujoco-halfcheetah": Entry(
        "embodied.tasks.mujoco_locomotion:HalfCheetah",
        "embodied.tasks.mujoco_locomotion:HalfCheetahCfg",
        "HalfCheetah-v5 equivalent: planar runner (MuJoCo batch)",
        backend="mujoco",
    ),
    "mujoco-ant": Entry(
        "embodied.tasks.mujoco_locomotion:Ant",
        "embodied.tasks.mujoco_locomotion:AntCfg",
        "Ant-v5 equivalent: quadruped runner (MuJoCo batch)",
        backend="mujoco",
    ),
    "mujoco-humanoid": Entry(
        "embodied.tasks.mujoco_locomotion:Humanoid",
        "embodied.tasks.mujoco_locomotion:HumanoidCfg",
        "Humanoid-v5 equivalent: walker (MuJoCo batch)",
        backend="mujoco",
    ),
    "arm-push": Entry(
        "embodied.tasks.arm_push:ArmPush",
        "embodied.tasks.arm_push:ArmPushCfg",
        "planar 3-link arm pushes a block to a goal; sparse or dense reward, scripted expert (MuJoCo batch)",
        backend="mujoco",
    ),
}

ALGOS: dict[str, Entry] = {
    "ppo": Entry("embodied.algos.ppo:PPO", "embodied.algos.ppo:PPOCfg", "PPO (on-policy, GAE, adaptive KL)"),
    "fasttd3": Entry(
        "embodied.algos.fasttd3:FastTD3",
        "embodied.algos.fasttd3:FastTD3Cfg",
        "FastTD3 (off-policy, C51 twin critics, parallel envs)",
    ),
    "sac": Entry(
        "embodied.algos.sac:SAC", "embodied.algos.sac:SACCfg", "SAC (auto temperature, critic ensembles, optional C51)"
    ),
    "bc-flow": Entry(
        "embodied.algos.bc_flow:BCFlow",
        "embodied.algos.bc_flow:BCFlowCfg",
        "behaviour cloning of a flow-matching action-chunk policy (--dataset PATH)",
    ),
    "reinflow": Entry(
        "embodied.algos.reinflow:ReinFlow",
        "embodied.algos.reinflow:ReinFlowCfg",
        "ReinFlow: PPO over a flow policy's noisy denoising chain (--base RUN_DIR of bc-flow)",
    ),
}

EXPERTS: dict[str, str] = {
    "arm-push": "embodied.tasks.arm_push_expert:ScriptedExpert",
}
"""Scripted experts by task (``embodied collect scripted:TASK``): a class whose instances have
``act(obs, deterministic) -> action``."""


def make_expert(task_name: str) -> Any:
    """The scripted expert of ``task_name``; a named error lists the tasks that have one."""
    if task_name not in EXPERTS:
        raise ConfigError(unknown_choice_message("scripted expert", task_name, EXPERTS))
    return _load(EXPERTS[task_name])()


BACKENDS: dict[str, str] = {
    "quadrotor": "built-in batched torch quadrotor (CPU or CUDA, no extra dependencies)",
    "mujoco": "MuJoCo's native batch API on C threads (CPU; pip install 'embodied[mujoco]')",
}


GYM_PREFIX = "gym:"
"""``gym:<EnvId>`` wraps any registered gymnasium env id (``sim/gymnasium.py``)."""
GYM_ENTRY = Entry(
    "embodied.sim.gymnasium:GymnasiumVecEnv",
    "embodied.sim.gymnasium:GymnasiumCfg",
    "any registered gymnasium env id, e.g. gym:Pendulum-v1",
    backend="gymnasium",
)


def task_entry(name: str) -> Entry:
    if name.startswith(GYM_PREFIX):
        return GYM_ENTRY
    if name not in TASKS:
        raise ConfigError(unknown_choice_message("task", name, TASKS))
    return TASKS[name]


def algo_entry(name: str) -> Entry:
    if name not in ALGOS:
        raise ConfigError(unknown_choice_message("algorithm", name, ALGOS))
    return ALGOS[name]


def _as_config(ref: str, cfg: object) -> ConfigDataclass:
    if not dataclasses.is_dataclass(cfg) or isinstance(cfg, type):
        raise EmbodiedError(f"registry entry {ref!r} built a {type(cfg).__name__}, not a dataclass instance")
    return cfg


def task_cfg(name: str) -> ConfigDataclass:
    """Default config instance of task ``name`` (``gym:<id>`` fills in ``env_id``)."""
    ref = task_entry(name).cfg
    cfg_cls = _load(ref)
    if name.startswith(GYM_PREFIX):
        return _as_config(ref, cfg_cls(env_id=name[len(GYM_PREFIX) :]))
    return _as_config(ref, cfg_cls())


def algo_cfg(name: str) -> ConfigDataclass:
    """Default config instance of algorithm ``name``."""
    ref = algo_entry(name).cfg
    return _as_config(ref, _load(ref)())


def make_env(name: str, cfg: object, num_envs: int, device: torch.device | str, seed: int) -> VecEnv:
    """Build task ``name`` as a VecEnv: ``Task(cfg, num_envs=, device=, seed=)``.

    The result is checked against the :class:`VecEnv` protocol (every member present), so a
    task missing part of the contract fails here with its name rather than mid-training.
    """
    ref = task_entry(name).target
    env = _load(ref)(cfg, num_envs=num_envs, device=torch.device(device), seed=seed)
    if not isinstance(env, VecEnv):
        raise EmbodiedError(f"{ref} built a {type(env).__name__} that does not implement VecEnv (embodied/env.py)")
    return env


def make_algo(name: str, cfg: object, env: VecEnv) -> Algorithm:
    """Build algorithm ``name`` for ``env``: ``Algo(cfg, env)``; it reads only the env's specs."""
    ref = algo_entry(name).target
    algo = _load(ref)(cfg, env)
    if not isinstance(algo, Algorithm):
        raise EmbodiedError(f"{ref} built a {type(algo).__name__} that does not implement Algorithm (embodied/algo.py)")
    return algo


def resolve_device(device: str) -> torch.device:
    """``cpu``/``cuda``/``cuda:N``; a clear error when CUDA is asked for but absent."""
    valid = ["cpu", "cuda"]
    kind = device.split(":")[0]
    if kind not in valid:
        raise ConfigError(unknown_choice_message("device", device, valid))
    if kind == "cuda" and not torch.cuda.is_available():
        raise ConfigError(
            f"--device {device}: CUDA is not available on this machine (torch {torch.__version__}, "
            "built without CUDA or no GPU visible); valid choices here: cpu"
        )
    return torch.device(device)
