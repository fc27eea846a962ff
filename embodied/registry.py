"""Name -> implementation tables for tasks, algorithms and simulator backends.

Entries name their implementation as ``"module:attribute"`` strings and are imported only
when used, so listing them never imports a simulator. Adding a task, an algorithm or a
backend is one line here.

A task names its model and terms; the simulator backend that runs it is chosen per run. A task
with several backends lists one implementation per backend (``Entry.backends``) and carries the
choice in its config (``env.backend.name``, set by ``embodied train TASK --backend NAME``); the
old ``<backend>-<task>`` names stay as aliases. This module is the only place that maps a
backend name to code.
"""

from __future__ import annotations

import dataclasses
import importlib
import logging
from collections.abc import Callable
from dataclasses import Field, dataclass
from typing import Any, ClassVar, Protocol

import torch

from embodied.algo import Algorithm, Preloadable
from embodied.config import ConfigError, apply_overrides, unknown_choice_message
from embodied.env import VecEnv
from embodied.errors import EmbodiedError, absent_modules, import_optional

log = logging.getLogger("embodied.registry")


class ConfigDataclass(Protocol):
    """Any dataclass instance: task and algorithm configs are frozen dataclasses."""

    __dataclass_fields__: ClassVar[dict[str, Field[Any]]]


@dataclass(frozen=True)
class Entry:
    """An implementation (``target``) and its config dataclass (``cfg``), both ``module:attr``.

    ``backend`` is the default backend; ``backends`` maps every backend a task runs on to its
    implementation (empty: only ``backend``, implemented by ``target``)."""

    target: str
    cfg: str
    summary: str
    backend: str = ""
    backends: tuple[tuple[str, str], ...] = ()

    def implementations(self) -> dict[str, str]:
        """Backend name -> ``module:attr``, the default backend first."""
        return dict(self.backends) if self.backends else {self.backend: self.target}


@dataclass(frozen=True)
class Backend:
    """A simulator backend: what it is, what it needs, what it can do.

    ``modules`` are imported before an env is built (a missing one raises
    :class:`~embodied.errors.MissingDependencyError` naming ``install``); the capability fields
    say what the typed protocols of ``embodied/env.py`` report for its envs."""

    summary: str
    install: str
    """How to get the backend's packages: a pip extra or a setup document."""
    modules: tuple[str, ...] = ()
    devices: tuple[str, ...] = ("cpu",)
    """Where its envs run (``cpu``, ``cuda``)."""
    renders: bool = False
    """Whether its envs can render camera images into their observations (:class:`embodied.env.RenderingEnv`,
    docs/backends.md "Images"); the quadrotor's videos are drawn from its state by ``play``, not rendered."""
    exact_resume: bool = True
    """Whether ``load_state_dict`` restores the simulator bit-exactly (:class:`embodied.env.ResumeReport`)."""
    status_modules: tuple[str, ...] = ()
    """Modules ``embodied list`` also imports to call the backend installed, beyond ``modules``
    (those the backend's own code imports when it builds an env, e.g. Isaac Lab's)."""
    checks: tuple[str, ...] = ()
    """Checks ``embodied list`` runs (``embodied.sim.capabilities.CHECKS``: ``batch``, ``vulkan``, ``gl``)."""

    def missing(self) -> list[str]:
        """Modules of ``modules`` that are not installed (found without importing them)."""
        return absent_modules(self.modules)


def _load(ref: str) -> Callable[..., object]:
    """The callable named by ``"module:attribute"`` (imported now, not when the table is read)."""
    module, _, attr = ref.partition(":")
    target: object = getattr(importlib.import_module(module), attr)
    if not callable(target):
        raise EmbodiedError(f"registry entry {ref!r} names a {type(target).__name__}, not a class or function")
    return target


TASKS: dict[str, Entry] = {
    "quad-hover": Entry(
        "embodied.tasks.quadrotor.hover:QuadHover",
        "embodied.tasks.quadrotor.hover:QuadHoverCfg",
        "Crazyflie-class quadrotor: reach and hold a setpoint from random initial states",
        backend="quadrotor",
    ),
    "quad-track": Entry(
        "embodied.tasks.quadrotor.track:QuadTrack",
        "embodied.tasks.quadrotor.track:QuadTrackCfg",
        "Crazyflie-class quadrotor: follow a moving setpoint (figure-eight, circle, random smooth paths)",
        backend="quadrotor",
    ),
    "halfcheetah": Entry(
        "embodied.tasks.mujoco_locomotion:HalfCheetah",
        "embodied.tasks.mujoco_locomotion:HalfCheetahCfg",
        "HalfCheetah-v5 equivalent: planar runner",
        backend="mujoco",
        backends=(
            ("mujoco", "embodied.tasks.mujoco_locomotion:HalfCheetah"),
            ("mjwarp", "embodied.tasks.mujoco_locomotion:HalfCheetahWarp"),
        ),
    ),
    "ant": Entry(
        "embodied.tasks.mujoco_locomotion:Ant",
        "embodied.tasks.mujoco_locomotion:AntCfg",
        "Ant-v5 equivalent: quadruped runner",
        backend="mujoco",
        backends=(
            ("mujoco", "embodied.tasks.mujoco_locomotion:Ant"),
            ("mjwarp", "embodied.tasks.mujoco_locomotion:AntWarp"),
        ),
    ),
    "humanoid": Entry(
        "embodied.tasks.mujoco_locomotion:Humanoid",
        "embodied.tasks.mujoco_locomotion:HumanoidCfg",
        "Humanoid-v5 equivalent: walker",
        backend="mujoco",
        backends=(
            ("mujoco", "embodied.tasks.mujoco_locomotion:Humanoid"),
            ("mjwarp", "embodied.tasks.mujoco_locomotion:HumanoidWarp"),
        ),
    ),
    "go1-flat": Entry(
        "embodied.tasks.go1_flat:Go1Flat",
        "embodied.tasks.go1_flat:Go1FlatCfg",
        "Unitree Go1 class quadruped (PD joints): track a commanded forward velocity on flat ground",
        backend="mujoco",
        backends=(
            ("mujoco", "embodied.tasks.go1_flat:Go1Flat"),
            ("mjwarp", "embodied.tasks.go1_flat:Go1FlatWarp"),
        ),
    ),
    "arm-push": Entry(
        "embodied.tasks.arm_push:ArmPush",
        "embodied.tasks.arm_push:ArmPushCfg",
        "planar 3-link arm pushes a block to a goal; sparse or dense reward, scripted expert",
        backend="mujoco",
        backends=(
            ("mujoco", "embodied.tasks.arm_push:ArmPush"),
            ("mjwarp", "embodied.tasks.arm_push:ArmPushWarp"),
        ),
    ),
}

TASK_ALIASES: dict[str, tuple[str, str]] = {
    "mujoco-halfcheetah": ("halfcheetah", "mujoco"),
    "mujoco-ant": ("ant", "mujoco"),
    "mujoco-humanoid": ("humanoid", "mujoco"),
}
"""Deprecated task names -> ``(task, backend)``; they keep working and log a deprecation line."""

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
        "ReinFlow: PPO over a flow policy's noisy denoising chain (--base RUN_DIR of bc-flow, or lerobot:PATH of a SmolVLA)",
    ),
    "o2o": Entry(
        "embodied.algos.o2o:O2O",
        "embodied.algos.o2o:O2OCfg",
        "offline-to-online: Cal-QL pretraining, then RLPD or WSRL-style SAC (--dataset PATH)",
    ),
    "o2o-residual": Entry(
        "embodied.algos.residual_o2o:ResidualO2O",
        "embodied.algos.residual_o2o:ResidualO2OCfg",
        "offline-to-online on a pretrained policy (e.g. image-instruction): Cal-QL residual, then online (--base RUN_DIR --dataset PATH)",
    ),
    "residual": Entry(
        "embodied.algos.residual:Residual",
        "embodied.algos.residual:ResidualCfg",
        "residual RL: a zero-initialized residual on a frozen base, TD3 critic ensemble (--base RUN_DIR [--dataset PATH])",
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


BACKENDS: dict[str, Backend] = {
    "quadrotor": Backend("built-in batched torch quadrotor", install="(built in)", devices=("cpu", "cuda")),
    "mujoco": Backend(
        "MuJoCo's native batch API on C threads (physics on the CPU; tensors moved to the device)",
        install='pip install "embodied[mujoco]"',
        modules=("mujoco", "gymnasium"),
        devices=("cpu", "cuda"),
        renders=True,
        checks=("batch", "gl"),
    ),
    "mjwarp": Backend(
        "MuJoCo-Warp: batched worlds as warp kernels, zero-copy torch tensors (warp's CPU device works, slowly)",
        install='pip install "embodied[mjwarp]"',
        modules=("mujoco", "gymnasium", "warp", "mujoco_warp"),
        devices=("cpu", "cuda"),
        exact_resume=False,
    ),
    "gymnasium": Backend(
        "any gymnasium env, stepped one by one (tensors moved to the device)",
        install='pip install "embodied[gym]"',
        modules=("gymnasium",),
        devices=("cpu", "cuda"),
    ),
    "isaaclab": Backend(
        "Isaac Lab 3 ManagerBasedRLEnv / DirectRLEnv, kit-less on Newton (warp CPU or CUDA) or with Isaac Sim",
        install=(
            "bash scripts/setup_isaaclab.sh, then run .venv-isaaclab/bin/embodied "
            "(Isaac Lab 3 needs Python 3.12: its own environment; docs/backends.md)"
        ),
        # imported when sim/isaaclab.py builds a registered task (a wrapped env needs none)
        status_modules=("isaaclab", "isaaclab_tasks", "newton", "warp"),
        devices=("cpu", "cuda"),
        exact_resume=False,
    ),
    "maniskill": Backend(
        "ManiSkill3: GPU-batched physx on CUDA, one physx CPU scene per env on the CPU (needs Vulkan)",
        install='pip install --no-deps "mani-skill==3.0.1" "sapien==3.0.3" && pip install "embodied[maniskill]" '
        "plus a Vulkan driver (docs/backends.md)",
        modules=("mani_skill",),  # sim/maniskill.py checks the Vulkan driver and the task's assets when it builds
        devices=("cpu", "cuda"),
        renders=True,
        exact_resume=False,
        checks=("vulkan",),
    ),
    "robosuite": Backend(
        "robosuite (Lift, Stack, Door with a Panda), one env per slot stepped in a loop; its own environment",
        install=(
            "bash scripts/setup_robosuite.sh, then run .venv-robosuite/bin/embodied "
            "(robosuite needs mujoco <= 3.9: its own environment; docs/backends.md)"
        ),
        modules=("robosuite",),
        devices=("cpu", "cuda"),
        renders=True,
        exact_resume=False,
        checks=("gl",),
    ),
}


GYM_PREFIX = "gym:"
"""``gym:<EnvId>`` wraps any registered gymnasium env id (``sim/gymnasium.py``)."""
GYM_ENTRY = Entry(
    "embodied.sim.gymnasium:GymnasiumVecEnv",
    "embodied.sim.gymnasium:GymnasiumCfg",
    "any registered gymnasium env id, e.g. gym:Pendulum-v1",
    backend="gymnasium",
)

ISAACLAB_PREFIX = "isaaclab:"
"""``isaaclab:<TaskId>`` runs a registered Isaac Lab task (``sim/isaaclab.py``; needs Isaac Sim)."""
ISAACLAB_ENTRY = Entry(
    "embodied.sim.isaaclab:IsaacLabVecEnv",
    "embodied.sim.isaaclab:IsaacLabCfg",
    "any registered Isaac Lab task, e.g. isaaclab:Isaac-Cartpole-v0 (Isaac Sim, GPU)",
    backend="isaaclab",
)

MANISKILL_PREFIX = "maniskill:"
"""``maniskill:<EnvId>`` runs a ManiSkill3 task (``sim/maniskill.py``; needs a Vulkan driver)."""
MANISKILL_ENTRY = Entry(
    "embodied.sim.maniskill:ManiSkillVecEnv",
    "embodied.sim.maniskill:ManiSkillCfg",
    "ManiSkill3 tasks, e.g. maniskill:PushCube-v1 (state observations; camera images with env.backend.camera; "
    "needs Vulkan, docs/backends.md)",
    backend="maniskill",
)

ROBOSUITE_PREFIX = "robosuite:"
"""``robosuite:<Env>`` runs a robosuite environment with a Panda (``sim/robosuite.py``; in ``.venv-robosuite``)."""
ROBOSUITE_ENTRY = Entry(
    "embodied.sim.robosuite:RobosuiteVecEnv",
    "embodied.sim.robosuite:RobosuiteCfg",
    "robosuite tasks with a Panda, e.g. robosuite:Lift, robosuite:Stack, robosuite:Door (camera images with "
    "env.backend.camera; own environment)",
    backend="robosuite",
)

PREFIXED: dict[str, tuple[Entry, str]] = {
    GYM_PREFIX: (GYM_ENTRY, "env_id"),
    ISAACLAB_PREFIX: (ISAACLAB_ENTRY, "task_id"),
    MANISKILL_PREFIX: (MANISKILL_ENTRY, "env_id"),
    ROBOSUITE_PREFIX: (ROBOSUITE_ENTRY, "env_name"),
}
"""Task-name prefix -> (entry, the config field the rest of the name fills in)."""


def _prefixed(name: str) -> tuple[Entry, str, str] | None:
    """``(entry, config field, id)`` for a prefixed task name, else None."""
    for prefix, (entry, id_field) in PREFIXED.items():
        if name.startswith(prefix):
            return entry, id_field, name[len(prefix) :]
    return None


_WARNED_ALIASES: set[str] = set()


def canonical_task(name: str) -> tuple[str, str | None]:
    """``(task name, backend the name implies or None)``; a deprecated alias logs once."""
    if name in TASK_ALIASES:
        task, backend = TASK_ALIASES[name]
        if name not in _WARNED_ALIASES:
            _WARNED_ALIASES.add(name)
            log.warning("task name %r is deprecated: use %r (with --backend %s)", name, task, backend)
        return task, backend
    return name, None


def task_entry(name: str) -> Entry:
    prefixed = _prefixed(name)
    if prefixed is not None:
        return prefixed[0]
    task, _ = canonical_task(name)
    if task not in TASKS:
        raise ConfigError(unknown_choice_message("task", name, [*TASKS, *TASK_ALIASES]))
    return TASKS[task]


def task_backends(name: str) -> list[str]:
    """Backends task ``name`` runs on, its default first."""
    return list(task_entry(name).implementations())


class _BackendChoice(Protocol):
    name: str


class _ChoosesBackend(Protocol):
    """A task config that carries its backend choice (tasks with several backends)."""

    backend: _BackendChoice


def check_backend(name: str, backend: str) -> None:
    """A :class:`ConfigError` unless task ``name`` runs on ``backend`` (lists the ones it does)."""
    choices = task_backends(name)
    if backend not in choices:
        raise ConfigError(f"task {name!r} has no backend {backend!r}; it runs on: {', '.join(choices)}")


BACKEND_KEY = ("backend", "name")
"""Where a task with several backends keeps the choice in its config (``env.backend.name``)."""


def backend_override(name: str, backend: str) -> list[str]:
    """The config override that selects ``backend`` for task ``name`` (none for its only one)."""
    check_backend(name, backend)
    return [f"env.{'.'.join(BACKEND_KEY)}={backend}"] if task_entry(name).backends else []


def selected_backend(name: str, cfg: object) -> str:
    """The backend a run of task ``name`` with config ``cfg`` uses (checked against the task's)."""
    entry = task_entry(name)
    if not entry.backends:
        return entry.backend
    choice: _ChoosesBackend = cfg  # type: ignore[assignment]  # tasks with several backends carry it
    backend = str(choice.backend.name)
    check_backend(name, backend)
    return backend


def require_backend(backend: str) -> Backend:
    """The backend's row, after importing its packages (a named install hint when one is missing)."""
    if backend not in BACKENDS:
        raise ConfigError(unknown_choice_message("backend", backend, BACKENDS))
    row = BACKENDS[backend]
    for module in row.modules:
        import_optional(module, f"the {backend} backend", row.install)
    return row


def algo_entry(name: str) -> Entry:
    if name not in ALGOS:
        raise ConfigError(unknown_choice_message("algorithm", name, ALGOS))
    return ALGOS[name]


def algo_preloads(name: str) -> bool:
    """Whether algorithm ``name`` starts from a dataset or a base run (:class:`~embodied.algo.Preloadable`,
    the check training makes through ``preload_algorithm``)."""
    algo_class = _load(algo_entry(name).target)
    return isinstance(algo_class, type) and issubclass(algo_class, Preloadable)


def _as_config(ref: str, cfg: object) -> ConfigDataclass:
    if not dataclasses.is_dataclass(cfg) or isinstance(cfg, type):
        raise EmbodiedError(f"registry entry {ref!r} built a {type(cfg).__name__}, not a dataclass instance")
    return cfg


def task_cfg(name: str, backend: str | None = None) -> ConfigDataclass:
    """Default config instance of task ``name`` (``gym:<id>`` fills in ``env_id``), set to run on
    ``backend`` when given (checked against the task's backends)."""
    ref = task_entry(name).cfg
    cfg_cls = _load(ref)
    prefixed = _prefixed(name)
    if prefixed is not None:
        return _as_config(ref, cfg_cls(**{prefixed[1]: prefixed[2]}))
    cfg = _as_config(ref, cfg_cls())
    if backend is not None:
        check_backend(name, backend)
        if task_entry(name).backends:
            cfg = apply_overrides(cfg, {BACKEND_KEY[0]: {BACKEND_KEY[1]: backend}}, f"--backend {backend}")
    return cfg


def algo_cfg(name: str) -> ConfigDataclass:
    """Default config instance of algorithm ``name``."""
    ref = algo_entry(name).cfg
    return _as_config(ref, _load(ref)())


def make_env(name: str, cfg: object, num_envs: int, device: torch.device | str, seed: int) -> VecEnv:
    """Build task ``name`` as a VecEnv: ``Task(cfg, num_envs=, device=, seed=)``.

    The result is checked against the :class:`VecEnv` protocol (every member present), so a
    task missing part of the contract fails here with its name rather than mid-training.
    """
    backend = selected_backend(name, cfg)
    dev = torch.device(device)
    if backend:  # an entry that names no backend (a plug-in task) has nothing to check
        row = require_backend(backend)
        if dev.type not in row.devices:
            raise ConfigError(f"the {backend} backend runs on {' or '.join(row.devices)}, not {dev}")
    ref = task_entry(name).implementations()[backend]
    env = _load(ref)(cfg, num_envs=num_envs, device=dev, seed=seed)
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
            f"device {device!r} (from --device or the config's device key, e.g. a --preset gpu): CUDA is "
            f"not available on this machine (torch {torch.__version__}, built without CUDA or no GPU "
            "visible); valid choices here: cpu (pass --device cpu)"
        )
    return torch.device(device)
