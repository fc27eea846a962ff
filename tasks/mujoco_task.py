"""The shared base of tasks on the MuJoCo and MuJoCo-Warp backends, whatever the robot.

A task's terms (observation, reward, termination, reset noise, IOSpec) are written once, in a
mixin on :class:`MujocoTaskTerms`, against ``self.xp``: numpy on the MuJoCo backend (float64
views of the C batch), torch on MuJoCo-Warp (float32 views of warp arrays, zero-copy). One class
per backend joins the terms to :class:`OnMujoco` or :class:`OnMjwarp`. The gymnasium locomotion
tasks (``mujoco_locomotion.py``), go1-flat and arm-push are built this way; none imports another's
module.

Shapes: ``N`` = ``num_envs``; every hook works on ``[N, ...]`` arrays.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import mujoco
import numpy as np
import torch

from embodied.config import ConfigError
from embodied.io_spec import ActionField, IOSpec, ObsTerm, obs_fields
from embodied.sim.mjwarp import MjwarpCfg, MjwarpVecEnv
from embodied.sim.mujoco import MujocoBackendCfg, MujocoVecEnv, gymnasium_asset
from embodied.sim.mujoco_model import load_mjcf

_CONVENTIONS = {
    "world_frame": "MuJoCo world, z up",
    "free_joint_velocity": "linear velocity in the world frame, angular velocity in the body frame",
    "quaternion": "(w, x, y, z), body -> world",
    "com_fields": "cinert/cvel/cfrc_ext are MuJoCo's com-based spatial quantities (rotation first)",
}


def actuator_fields(
    model: mujoco.MjModel,
    units: str,
    mid: np.ndarray,
    half: np.ndarray,
    description: str = "actuator control (gear converts it to joint torque)",
) -> tuple[ActionField, ...]:
    """One action field per actuator: control = ``action * half[i] + mid[i]`` (``[nu]`` each)."""
    return tuple(
        ActionField(
            name=mujoco.mj_id2name(model, mujoco.mjtObj.mjOBJ_ACTUATOR, i) or f"actuator_{i}",
            size=1,
            units=units,
            scale=float(half[i]),
            offset=float(mid[i]),
            description=description,
        )
        for i in range(model.nu)
    )


def _actions(model: mujoco.MjModel, units: str) -> tuple[ActionField, ...]:
    low, high = model.actuator_ctrlrange.T
    return actuator_fields(model, units, (low + high) / 2, (high - low) / 2)


def validate_cfg(cfg: object) -> None:
    """Weights and noise scales must be >= 0, ``*_range`` pairs ordered (low <= high)."""
    for name, value in vars(cfg).items():
        if (name.endswith("_weight") or name == "reset_noise_scale") and value < 0:
            raise ConfigError(f"{name} must be >= 0, got {value}")
        if name.endswith("_range") and value[0] > value[1]:
            raise ConfigError(f"{name} must be (low, high) with low <= high, got {value}")


@dataclass(frozen=True)
class MujocoTaskBackendCfg(MujocoBackendCfg):
    """Which simulator runs the task (``name``) and its options; ``nthread`` is MuJoCo's only."""

    name: str = "mujoco"
    """Simulator backend: ``mujoco`` (CPU, C threads) or ``mjwarp`` (MuJoCo-Warp; CUDA or warp's CPU device)."""
    mjwarp: MjwarpCfg = field(default_factory=MjwarpCfg)
    """MuJoCo-Warp buffer sizes (used when ``name`` is ``mjwarp``)."""


class MujocoTaskTerms:
    """Terms shared by every locomotion task: the model, reset noise and IOSpec assembly.

    The backend base supplies ``xp``, ``model``, ``qpos``, ``qvel``, ``out``, ``rng``, ``dt``,
    ``num_envs``, ``body_masses()`` and the helpers below (``cat``, ``zeros``, ``asarray``)."""

    xml = ""
    xp: Any
    model: mujoco.MjModel
    rng: np.random.Generator
    num_envs: int
    dt: float
    qpos: Any
    qvel: Any
    out: dict[str, Any]
    cat: Callable[[list[Any]], Any]
    """``parts`` (``[N, k_i]``) side by side as the float32 observation ``[N, sum k_i]``."""
    body_masses: Callable[[], Any]
    """Per-env body masses ``[N, nbody]``."""
    zeros: Callable[..., Any]
    """A float scratch buffer of the given shape, in the backend's array type."""
    asarray: Callable[[np.ndarray], Any]
    """A numpy array as the backend's array type (on its device)."""

    def _noisy_qpos(self, n: int, scale: float) -> np.ndarray:
        """qpos0 + U(-scale, scale), ``[n, nq]``."""
        return self.model.qpos0 + self.rng.uniform(-scale, scale, size=(n, self.model.nq))

    def _spec(self, obs_terms: tuple[ObsTerm, ...], actions: tuple[ActionField, ...] = ()) -> IOSpec:
        """The task's IOSpec; ``actions`` default to the actuators' control ranges."""
        return IOSpec(
            obs_fields=obs_fields(obs_terms),
            action_fields=actions or _actions(self.model, "ctrl"),
            control_period_s=self.dt,
            conventions=_CONVENTIONS,
        )


def _model(xml: str) -> mujoco.MjModel:
    return load_mjcf(gymnasium_asset(xml))


class OnMujoco(MujocoVecEnv):
    """The MuJoCo backend (``sim/mujoco.py``) for a locomotion task: numpy float64 terms."""

    xp = np
    xml = ""

    def __init__(self, cfg: Any, num_envs: int, device: torch.device | str, seed: int) -> None:
        self.cfg = cfg
        super().__init__(self.load_model(), cfg.backend, num_envs, device, seed)
        self._before = self.zeros(num_envs, 2)

    def load_model(self) -> mujoco.MjModel:
        """The task's model (default: ``xml`` from the gymnasium package)."""
        return _model(self.xml)

    def cat(self, parts: list[np.ndarray]) -> np.ndarray:
        return np.concatenate(parts, axis=1, dtype=np.float32)

    def zeros(self, *shape: int) -> np.ndarray:
        return np.zeros(shape)

    def asarray(self, values: np.ndarray) -> np.ndarray:
        """``values`` as this backend's array type (numpy float64 here)."""
        return np.asarray(values, dtype=np.float64)


class OnMjwarp(MjwarpVecEnv):
    """The MuJoCo-Warp backend (``sim/mjwarp.py``) for a locomotion task: torch float32 terms."""

    xml = ""

    def __init__(self, cfg: Any, num_envs: int, device: torch.device | str, seed: int) -> None:
        self.cfg = cfg
        super().__init__(self.load_model(), cfg.backend, cfg.backend.mjwarp, num_envs, device, seed)
        self._before = self.zeros(num_envs, 2)

    def load_model(self) -> mujoco.MjModel:
        """The task's model (default: ``xml`` from the gymnasium package)."""
        return _model(self.xml)

    def cat(self, parts: list[torch.Tensor]) -> torch.Tensor:
        return torch.cat(parts, dim=1).to(torch.float32)

    def asarray(self, values: np.ndarray) -> torch.Tensor:
        """``values`` as this backend's array type (float32 tensor on the simulator's device)."""
        return torch.as_tensor(values, dtype=torch.float32, device=self.device)
