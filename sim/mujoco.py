"""Batched MuJoCo backend: many simulations of one model stepped in C, exposed as a VecEnv.

Physics runs in MuJoCo's native batch (``sim/mujoco_native.py``) on C threads; state and
derived fields are numpy views of the batch's own storage, so a step copies only what the
task assembles into its observation (float64 -> float32, then ``torch.from_numpy``).

Tasks subclass :class:`MujocoVecEnv` and fill in the hooks: observation size and assembly, what
to remember before a step, the reward terms and termination after it, the reset-state
distribution and the IOSpec. Per-env model randomization (body mass, friction) is off by
default (:class:`MujocoRandomizationCfg`). Stepping follows gymnasium's
``MujocoEnv`` (v5): the control is held for ``frame_skip`` substeps of ``mj_step``, after which
``mj_rnePostConstraint`` fills ``cfrc_ext`` when the task reads contact forces; a reset is
``mj_resetData``, the sampled ``qpos``/``qvel``, then ``mj_forward``.

Shapes: ``N`` = ``num_envs``; ``nq``/``nv``/``nu`` are the model's sizes.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import mujoco
import numpy as np
import torch

from embodied.config import ConfigError, ranged
from embodied.env import IMAGE_GROUP, ObsDict, StepResult, check_image_size_px
from embodied.io_spec import IOSpec
from embodied.sim.mujoco_camera import BatchCamera
from embodied.sim.mujoco_native import NativeBatch


@dataclass(frozen=True)
class MujocoRandomizationCfg:
    """Per-env model randomization, redrawn for an env at each of its resets (off by default)."""

    enabled: bool = False
    """Draw per-env body masses and geom friction; False keeps the nominal model everywhere."""
    body_mass_scale: tuple[float, float] = ranged((0.8, 1.2), 0.1, 10.0, "x nominal")
    """Uniform range of the factor applied to every body's nominal mass (inertia scales with it)."""
    friction_scale: tuple[float, float] = ranged((0.5, 1.5), 0.01, 10.0, "x nominal")
    """Uniform range of the factor applied to every geom's nominal sliding friction."""

    def __post_init__(self) -> None:
        for name in ("body_mass_scale", "friction_scale"):
            lo, hi = getattr(self, name)
            if not 0.0 < lo <= hi:
                raise ConfigError(f"randomization.{name} must satisfy 0 < low <= high, got {(lo, hi)}")


@dataclass(frozen=True)
class MujocoBackendCfg:
    """Options of the batched MuJoCo backend shared by every MuJoCo task."""

    frame_skip: int = ranged(5, 1, 1000, "physics steps")
    """Physics substeps per control step (gymnasium v5 default 5): dt = timestep * frame_skip."""
    max_episode_steps: int = ranged(1000, 1, 10_000_000, "control steps")
    """Time limit in control steps; reaching it truncates (not terminates) the episode."""
    nthread: int = ranged(0, 0, 1024, "threads")
    """C threads stepping the batch; 0 uses one per logical CPU."""
    randomization: MujocoRandomizationCfg = field(default_factory=MujocoRandomizationCfg)
    camera: str = ""
    """Named camera of the task's model rendered into ``obs["image"]`` every step; "" renders nothing."""
    image_size_px: int = 64
    """Width = height of the camera images (pixels), when ``camera`` is set."""

    def __post_init__(self) -> None:
        check_image_size_px(self.image_size_px)
        if self.frame_skip < 1:
            raise ConfigError(f"frame_skip must be >= 1, got {self.frame_skip}")
        if self.max_episode_steps < 1:
            raise ConfigError(f"max_episode_steps must be >= 1, got {self.max_episode_steps}")
        if self.nthread < 0:
            raise ConfigError(f"nthread must be >= 0 (0: one per CPU), got {self.nthread}")


def gymnasium_asset(xml_name: str) -> Path:
    """Path of a model XML shipped inside the installed gymnasium package (read, never copied)."""
    try:
        import gymnasium
    except ImportError as err:  # pragma: no cover - depends on the environment
        raise ImportError(
            "the MuJoCo locomotion tasks load their models from gymnasium: pip install 'embodied[mujoco]'"
        ) from err
    path = Path(gymnasium.__file__).parent / "envs" / "mujoco" / "assets" / xml_name
    if not path.is_file():
        raise FileNotFoundError(f"gymnasium {gymnasium.__version__} ships no {xml_name} at {path}")
    return path


class MujocoVecEnv(ABC):
    """A VecEnv over :class:`NativeBatch`; subclasses define observation, reward and resets.

    ``info`` carries ``final_obs``, ``reward_terms`` and ``success`` (the VecEnv contract).
    With ``backend.camera`` set it is a :class:`embodied.env.RenderingEnv`: every observation
    dict (``final_obs`` too) holds ``"image"`` ``[N, H, W, 3]`` uint8 from that camera.
    """

    contact_forces: bool = False
    """Whether the task reads ``cfrc_ext``: then the batch is persistent and every step ends
    with ``mj_rnePostConstraint``, exactly as gymnasium computes it."""
    outputs: tuple[str, ...] = ()
    """``mjData`` derived fields the task reads (``xpos``, ``cinert``, ...)."""

    def __init__(
        self,
        model: mujoco.MjModel,
        backend: MujocoBackendCfg,
        num_envs: int,
        device: torch.device | str,
        seed: int,
    ) -> None:
        if num_envs < 1:
            raise ConfigError(f"num_envs must be >= 1, got {num_envs}")
        self.model = model
        self.backend = backend
        self.num_envs = int(num_envs)
        self.device = torch.device(device)
        self.dt = float(model.opt.timestep * backend.frame_skip)
        self.max_episode_steps = backend.max_episode_steps
        self.action_dim = int(model.nu)
        self.physics = NativeBatch(model, self.num_envs, backend.nthread, persistent=self.contact_forces)
        p = self.physics
        self.qpos = p.state_field(mujoco.mjtState.mjSTATE_QPOS)
        self.qvel = p.state_field(mujoco.mjtState.mjSTATE_QVEL)
        self.ctrl = p.state_field(mujoco.mjtState.mjSTATE_CTRL)
        self.time_s = p.state_field(mujoco.mjtState.mjSTATE_TIME)
        names = set(self.outputs) | ({"cfrc_ext"} if self.contact_forces else set())
        self.out = {name: p.output(name) for name in sorted(names)}
        low, high = model.actuator_ctrlrange.T.astype(np.float64)
        limited = model.actuator_ctrllimited.astype(bool)
        # unlimited actuators pass the action through unscaled
        self.ctrl_mid = np.where(limited, 0.5 * (low + high), 0.0)
        self.ctrl_half = np.where(limited, 0.5 * (high - low), 1.0)
        self.rng = np.random.default_rng(seed)
        self.episode_step = np.zeros(self.num_envs, dtype=np.int64)
        self._nominal_mass = model.body_mass.copy()
        self._nominal_inertia = model.body_inertia.copy()
        self._nominal_friction = model.geom_friction.copy()
        self.obs_spec: dict[str, tuple[int, ...]] = {"policy": (self.obs_dim(),)}
        self.camera = backend.camera
        self._camera: BatchCamera | None = None
        if backend.camera:
            self._camera = BatchCamera(model, backend.camera, backend.image_size_px)
            self.obs_spec[IMAGE_GROUP] = (backend.image_size_px, backend.image_size_px, 3)
        self.reset(seed)

    # ----------------------------------------------------------------------------- task hooks
    @abstractmethod
    def obs_dim(self) -> int:
        """Length of the policy observation."""

    @abstractmethod
    def observe(self) -> np.ndarray:
        """Policy observation of every env, ``[N, obs_dim]`` float32, from the current fields."""

    @abstractmethod
    def before_step(self) -> None:
        """Record what the reward compares against after the step (e.g. position before)."""

    @abstractmethod
    def after_step(self, ctrl: np.ndarray) -> tuple[dict[str, np.ndarray], np.ndarray]:
        """``(reward_terms {name: [N] float64}, terminated [N] bool)`` after the substeps.

        ``ctrl`` is ``[N, nu]``, the physical control applied (actuator units).
        """

    @abstractmethod
    def sample_reset_state(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        """Initial ``(qpos [n, nq], qvel [n, nv])`` of ``n`` envs drawn from ``self.rng``."""

    @abstractmethod
    def io_spec(self) -> IOSpec: ...

    def success(self) -> np.ndarray:
        """``[N]`` bool: whether each env's task is solved in the current state (read before any
        auto-reset, reported where an episode ends). Tasks without a success notion keep False."""
        return np.zeros(self.num_envs, dtype=bool)

    # ------------------------------------------------------------------------------ physics
    def set_state(self, qpos: np.ndarray, qvel: np.ndarray, ids: np.ndarray | None = None) -> None:
        """Like gymnasium's ``reset`` + ``set_state``: reset data, write qpos/qvel, forward.

        ``qpos`` ``[n, nq]``, ``qvel`` ``[n, nv]`` for the ``n`` envs in ``ids`` (all if None).
        """
        rows = slice(None) if ids is None else ids
        self.physics.reset(ids)
        self.qpos[rows] = qpos
        self.qvel[rows] = qvel
        self.physics.forward(ids)

    def _randomize(self, ids: np.ndarray) -> None:
        cfg = self.backend.randomization
        if not cfg.enabled or len(ids) == 0:
            return
        p = self.physics
        mass, inertia, friction = p.expand("body_mass"), p.expand("body_inertia"), p.expand("geom_friction")
        n = len(ids)
        mass_scale = self.rng.uniform(*cfg.body_mass_scale, size=(n, 1))
        mass[ids] = self._nominal_mass * mass_scale
        # a uniformly denser body: inertia scales with mass, the centre of mass stays put
        inertia[ids] = self._nominal_inertia * mass_scale[:, :, None]
        friction_scale = self.rng.uniform(*cfg.friction_scale, size=(n, 1))
        friction[ids, :, 0] = self._nominal_friction[:, 0] * friction_scale
        p.set_const(ids)

    def body_masses(self) -> np.ndarray:
        """Per-env body masses ``[N, nbody]`` (nominal rows unless randomization is on)."""
        if self.backend.randomization.enabled:
            return self.physics.expand("body_mass")
        return np.broadcast_to(self._nominal_mass, (self.num_envs, self.model.nbody))

    def _reset_envs(self, ids: np.ndarray) -> None:
        self._randomize(ids)
        qpos, qvel = self.sample_reset_state(len(ids))
        self.set_state(qpos, qvel, ids if len(ids) < self.num_envs else None)
        self.episode_step[ids] = 0

    def _to_torch(self, array: np.ndarray) -> torch.Tensor:
        tensor = torch.from_numpy(array)  # shares memory: no copy on the CPU
        return tensor if self.device.type == "cpu" else tensor.to(self.device)

    def _images(self, ids: np.ndarray | None = None) -> np.ndarray:
        """``[n, H, W, 3]`` uint8 camera images of envs ``ids`` (all if None) in their current state."""
        if self._camera is None:
            raise RuntimeError("this env renders no images: set env.backend.camera to one of the model's cameras")
        return self._camera.render(self.physics.state, ids)

    def render_images(self) -> torch.Tensor:
        """Camera images of every env now, ``[N, H, W, 3]`` uint8 (:class:`embodied.env.RenderingEnv`)."""
        return self._to_torch(self._images())

    def _obs_dict(self, policy: np.ndarray, images: np.ndarray | None) -> ObsDict:
        obs = {"policy": self._to_torch(policy)}
        if images is not None:
            obs[IMAGE_GROUP] = self._to_torch(images)
        return obs

    # ------------------------------------------------------------------------------- VecEnv
    def reset(self, seed: int | None = None) -> ObsDict:
        """Reset every env; ``seed`` reseeds the env's numpy generator. Obs ``[N, obs_dim]``."""
        if seed is not None:
            self.rng = np.random.default_rng(seed)
        self._reset_envs(np.arange(self.num_envs))
        return self._obs_dict(self.observe(), self._images() if self._camera is not None else None)

    def _apply(self, action: torch.Tensor) -> np.ndarray:
        """Write ``action`` [N, nu] in [-1, 1] as the control; the control ``[N, nu]`` (actuator units)."""
        if tuple(action.shape) != (self.num_envs, self.action_dim):
            raise ValueError(f"action must be [{self.num_envs}, {self.action_dim}], got {tuple(action.shape)}")
        # clamp in torch and write straight into MuJoCo's control rows: np.clip and fresh float64
        # arrays cost more than the physics of a small batch (the adapter-overhead target)
        act = action.detach().to("cpu").clamp(-1.0, 1.0).numpy()
        np.multiply(self.ctrl_half, act, out=self.ctrl)
        self.ctrl += self.ctrl_mid
        return self.ctrl.copy()

    def _physics_steps(self) -> None:
        self.physics.step(self.backend.frame_skip)
        if self.contact_forces:
            self.physics.rne_post_constraint()

    def raw_step(self, action: torch.Tensor) -> None:
        """The bare physics of one control step (``action`` [N, nu] as control, no task terms):
        what ``embodied bench sim mujoco:TASK`` compares :meth:`step` against (``ratio_vs_raw``)."""
        self._apply(action)
        self._physics_steps()

    def step(self, action: torch.Tensor) -> StepResult:
        """Hold ``action`` [N, nu] in [-1, 1] for ``frame_skip`` substeps; auto-reset ended envs."""
        ctrl = self._apply(action)
        self.before_step()
        self._physics_steps()
        terms, terminated = self.after_step(ctrl)
        reward = np.zeros(self.num_envs)
        for value in terms.values():
            reward += value
        self.episode_step += 1
        truncated = (self.episode_step >= self.max_episode_steps) & ~terminated
        obs = self.observe()
        images = self._images() if self._camera is not None else None
        success = self.success()
        final_obs, final_images = obs, images
        done = np.flatnonzero(terminated | truncated)
        if len(done):
            final_obs = obs.copy()
            self._reset_envs(done)
            obs[done] = self.observe()[done]
            if images is not None:
                final_images = images.copy()
                images[done] = self._images(done)
        info: dict[str, Any] = {
            "final_obs": self._obs_dict(final_obs, final_images),
            "reward_terms": {k: self._to_torch(v.astype(np.float32)) for k, v in terms.items()},
            "success": self._to_torch(success),
        }
        return (
            self._obs_dict(obs, images),
            self._to_torch(reward.astype(np.float32)),
            self._to_torch(terminated),
            self._to_torch(truncated),
            info,
        )

    def state_dict(self) -> dict[str, Any]:
        """Physics rows, derived outputs, per-env model fields, counters and RNG (bit-exact resume)."""

        # tensors, not numpy arrays: checkpoints load with weights_only=True, which rejects numpy
        def tensor(a: np.ndarray) -> torch.Tensor:
            return torch.from_numpy(a.copy())

        state: dict[str, Any] = {
            "physics_state": tensor(self.physics.state),
            "outputs": {k: tensor(v) for k, v in self.out.items()},
            "episode_step": tensor(self.episode_step),
            "rng": self.rng.bit_generator.state,
        }
        if self.backend.randomization.enabled:
            state["model_fields"] = {
                k: tensor(self.physics.expand(k)) for k in ("body_mass", "body_inertia", "geom_friction")
            }
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` (its arrays as tensors, or numpy arrays from older checkpoints)."""
        if tuple(state["physics_state"].shape) != self.physics.state.shape:
            raise ValueError(
                f"state has {state['physics_state'].shape} physics rows, this env {self.physics.state.shape}"
            )
        for name, values in state.get("model_fields", {}).items():
            self.physics.expand(name)[:] = np.asarray(values)
        if "model_fields" in state:
            self.physics.set_const()
        self.physics.state[:] = np.asarray(state["physics_state"])
        self.physics.forward()
        # restore the outputs of the interrupted step (the forward above recomputed them at the
        # current state; gymnasium's rewards read the values of the step's last substep)
        for name, values in state["outputs"].items():
            self.out[name][:] = np.asarray(values)
        self.episode_step[:] = np.asarray(state["episode_step"])
        self.rng.bit_generator.state = state["rng"]

    def close(self) -> None:
        if self._camera is not None:
            self._camera.close()
        self.physics.close()
