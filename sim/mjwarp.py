"""MuJoCo-Warp backend: ``N`` worlds of one model stepped by warp kernels, exposed as a VecEnv.

MuJoCo-Warp (``mujoco_warp``) runs MuJoCo's pipeline as warp kernels over a batch of worlds, on
CUDA (thousands of worlds) or on warp's CPU device (correct but slow: for tests and
development). Every state and derived field is a warp array; :func:`warp.to_torch` views it as a
torch tensor on the same memory, so tasks read ``qpos``/``qvel``/``out[name]`` and write ``ctrl``
with no copy on either device.

Tasks subclass :class:`MjwarpVecEnv` and fill in the same hooks as the MuJoCo backend
(``sim/mujoco.py``): the task terms are written once, against ``self.xp`` (numpy there, torch
here), and shared by both backends (``tasks/mujoco_locomotion.py``). Stepping follows the MuJoCo
backend: the control is held for ``frame_skip`` calls of ``mjw.step``, then
``mjw.rne_postconstraint`` fills ``cfrc_ext`` when the task reads contact forces; an auto-reset
is ``reset_data`` of the ended worlds, their sampled ``qpos``/``qvel``, then ``forward``.

Differences from the MuJoCo backend, all from the simulator: float32 physics; MuJoCo-Warp
has no PGS solver, so a PGS model (gymnasium's humanoid) runs with Newton (logged); contact
and constraint buffers have a fixed size per world
(:class:`MjwarpCfg`; an overflow is reported by MuJoCo-Warp, raise the sizes then).

The warp and mujoco_warp imports happen when an env is built, so this module imports without
them; a missing package raises :class:`~embodied.errors.MissingDependencyError` naming the
extra (``pip install "embodied[mjwarp]"``).

Shapes: ``N`` = ``num_envs`` (worlds); ``nq``/``nv``/``nu`` are the model's sizes.
"""

from __future__ import annotations

import logging
import os
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import mujoco
import numpy as np
import torch

from embodied.config import ConfigError, ranged
from embodied.env import ObsDict, StepResult
from embodied.errors import import_optional
from embodied.io_spec import IOSpec

log = logging.getLogger("embodied.sim.mjwarp")

INSTALL = 'pip install "embodied[mjwarp]"'
"""What provides warp-lang and mujoco-warp (pinned in pyproject's ``mjwarp`` extra)."""

KERNEL_CACHE_ENV = "EMBODIED_WARP_CACHE"
"""Environment variable naming warp's kernel cache folder (compiled kernels are reused across
runs: the first compile of a model's pipeline on the CPU takes minutes, a cached load seconds)."""


_WARP_READY: list[bool] = []
"""Non-empty once warp is configured and initialised in this process."""


def warp_modules() -> tuple[ModuleType, ModuleType]:
    """``(warp, mujoco_warp)``, warp initialised once with the kernel cache; a named error if absent."""
    wp = import_optional("warp", "the mjwarp backend", INSTALL)
    if not _WARP_READY:
        cache = os.environ.get(KERNEL_CACHE_ENV)
        if cache:
            wp.config.kernel_cache_dir = str(Path(cache).expanduser())
        # kernel-load lines on stdout would bury the CLI's own output (warnings still show)
        wp.config.log_level = wp.LOG_WARNING
        wp.init()
        _WARP_READY.append(True)
    mjw = import_optional("mujoco_warp", "the mjwarp backend", INSTALL)
    return wp, mjw


@dataclass(frozen=True)
class MjwarpCfg:
    """Options of the MuJoCo-Warp backend (buffer sizes are per world)."""

    contacts_per_world: int = ranged(64, 1, 100_000, "contacts")
    """Contact buffer per world (MuJoCo-Warp's ``naconmax`` is this times the world count)."""
    constraints_per_world: int = ranged(256, 1, 1_000_000, "rows")
    """Constraint rows per world (``njmax``)."""

    def __post_init__(self) -> None:
        for name in ("contacts_per_world", "constraints_per_world"):
            if getattr(self, name) < 1:
                raise ConfigError(f"mjwarp.{name} must be >= 1, got {getattr(self, name)}")


def warp_device(device: torch.device) -> str:
    """The warp device for a torch device: ``cpu`` or ``cuda:N`` (the same GPU as torch)."""
    if device.type == "cpu":
        return "cpu"
    if device.type == "cuda":
        return f"cuda:{device.index if device.index is not None else torch.cuda.current_device()}"
    raise ConfigError(f"the mjwarp backend runs on cpu or cuda, not {device}")


class MjwarpVecEnv(ABC):
    """A VecEnv over MuJoCo-Warp worlds; subclasses define observation, reward and resets.

    Hook contract (shared with ``sim/mujoco.py``'s ``MujocoVecEnv``): ``xp`` is the array module
    the hooks compute with (torch here), ``qpos``/``qvel``/``out[name]`` are ``[N, ...]`` tensors
    that alias the simulator's memory, ``rng`` is the numpy generator that draws reset states.
    """

    xp: Any = torch
    contact_forces: bool = False
    """Whether the task reads ``cfrc_ext`` (then every step ends with ``rne_postconstraint``)."""
    outputs: tuple[str, ...] = ()
    """Derived ``Data`` fields the task reads (``xpos``, ``cinert``, ...)."""
    randomized_fields = ("body_mass", "body_inertia", "geom_friction")
    """Model fields given one row per world when randomization is on (MuJoCo-Warp batches them)."""

    def __init__(
        self,
        model: mujoco.MjModel,
        backend: Any,
        warp_cfg: MjwarpCfg,
        num_envs: int,
        device: torch.device | str,
        seed: int,
    ) -> None:
        if num_envs < 1:
            raise ConfigError(f"num_envs must be >= 1, got {num_envs}")
        if backend.camera:
            raise ConfigError(
                f"env.backend.camera={backend.camera!r}: the mjwarp backend renders no camera images; "
                "use the mujoco backend (--backend mujoco) for image observations"
            )
        wp, mjw = warp_modules()
        self._wp, self._mjw = wp, mjw
        self.model = model
        self.backend = backend
        self.num_envs = int(num_envs)
        self.device = torch.device(device)
        self.wp_device = warp_device(self.device)
        self.dt = float(model.opt.timestep * backend.frame_skip)
        self.max_episode_steps = int(backend.max_episode_steps)
        self.action_dim = int(model.nu)
        n = self.num_envs
        if model.opt.solver == mujoco.mjtSolver.mjSOL_PGS:
            # MuJoCo-Warp has no PGS; Newton solves the same constraint problem (the contact
            # forces agree to the solvers' tolerances, the trajectories to a few steps)
            log.warning("MuJoCo-Warp has no PGS solver: this model (solver PGS) runs with Newton instead")
            model.opt.solver = mujoco.mjtSolver.mjSOL_NEWTON
        batch = {name: n for name in self.randomized_fields} if backend.randomization.enabled else None
        with wp.ScopedDevice(self.wp_device):
            try:
                self.wp_model = mjw.put_model(model, batch_sizes=batch)
            except (NotImplementedError, ValueError) as err:
                raise ConfigError(f"MuJoCo-Warp cannot simulate this model: {err}") from err
            self.wp_data = mjw.make_data(
                model,
                nworld=n,
                naconmax=warp_cfg.contacts_per_world * n,
                njmax=warp_cfg.constraints_per_world,
            )
        to_torch = wp.to_torch
        d = self.wp_data
        self.qpos: torch.Tensor = to_torch(d.qpos)
        self.qvel: torch.Tensor = to_torch(d.qvel)
        self.ctrl: torch.Tensor = to_torch(d.ctrl)
        names = set(self.outputs) | ({"cfrc_ext"} if self.contact_forces else set())
        self.out: dict[str, torch.Tensor] = {name: to_torch(getattr(d, name)) for name in sorted(names)}
        low, high = (torch.as_tensor(v, dtype=torch.float32, device=self.device) for v in model.actuator_ctrlrange.T)
        limited = torch.as_tensor(model.actuator_ctrllimited.astype(bool), device=self.device)
        # unlimited actuators pass the action through unscaled (as in sim/mujoco.py)
        self.ctrl_mid = torch.where(limited, 0.5 * (low + high), torch.zeros_like(low))
        self.ctrl_half = torch.where(limited, 0.5 * (high - low), torch.ones_like(low))
        self.rng = np.random.default_rng(seed)
        self.episode_step = torch.zeros(n, dtype=torch.int64, device=self.device)
        self._nominal = {name: getattr(model, name).copy() for name in self.randomized_fields}
        self.obs_spec = {"policy": (self.obs_dim(),)}
        self.reset(seed)

    # ----------------------------------------------------------------------------- task hooks
    @abstractmethod
    def obs_dim(self) -> int: ...

    @abstractmethod
    def observe(self) -> torch.Tensor:
        """Policy observation ``[N, obs_dim]`` (float32 after the base casts it)."""

    @abstractmethod
    def before_step(self) -> None: ...

    @abstractmethod
    def after_step(self, ctrl: torch.Tensor) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        """``(reward_terms {name: [N]}, terminated [N] bool)``; ``ctrl`` ``[N, nu]`` in actuator units."""

    @abstractmethod
    def sample_reset_state(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        """Initial ``(qpos [n, nq], qvel [n, nv])`` of ``n`` worlds drawn from ``self.rng``."""

    @abstractmethod
    def io_spec(self) -> IOSpec: ...

    def success(self) -> torch.Tensor:
        """``[N]`` bool: whether each world's task is solved now (read before any auto-reset, as on
        the MuJoCo backend). Tasks without a success notion keep False."""
        return torch.zeros(self.num_envs, dtype=torch.bool, device=self.device)

    # ------------------------------------------------------------------------------ physics
    def zeros(self, *shape: int) -> torch.Tensor:
        """A float scratch buffer for the hooks, on the simulator's device."""
        return torch.zeros(shape, dtype=torch.float32, device=self.device)

    def _sync(self) -> None:
        # warp launches on its own stream; torch reads after this see the finished kernels
        if self.device.type == "cuda":
            self._wp.synchronize_device(self.wp_device)

    def physics_steps(self, substeps: int) -> None:
        """``substeps`` calls of ``mjw.step`` on every world (then contact forces if read)."""
        mjw, m, d = self._mjw, self.wp_model, self.wp_data
        with self._wp.ScopedDevice(self.wp_device):
            for _ in range(substeps):
                mjw.step(m, d)
            if self.contact_forces:
                mjw.rne_postconstraint(m, d)
        self._sync()

    def raw_step(self, action: torch.Tensor) -> None:
        """The bare physics of one control step (``action`` [N, nu] as control, no task terms):
        what the bench compares :meth:`step` against (``ratio_vs_raw``)."""
        self.ctrl.copy_(self.ctrl_mid + self.ctrl_half * action.to(self.device, torch.float32).clamp(-1.0, 1.0))
        self.physics_steps(self.backend.frame_skip)

    def set_state(self, qpos: np.ndarray, qvel: np.ndarray, ids: torch.Tensor) -> None:
        """Reset the worlds ``ids`` (``[n]`` int64), write ``qpos [n, nq]``/``qvel [n, nv]``, forward.

        ``forward`` runs on every world; the derived fields of the other worlds are put back, so
        their next step reads the values of their last substep (as the MuJoCo backend does)."""
        wp, mjw = self._wp, self._mjw
        mask = torch.zeros(self.num_envs, dtype=torch.bool, device=self.device)
        mask[ids] = True
        keep = ~mask
        saved = {k: v[keep].clone() for k, v in self.out.items()}
        with wp.ScopedDevice(self.wp_device):
            mjw.reset_data(self.wp_model, self.wp_data, reset=wp.from_torch(mask))
            self._sync()
            self.qpos[ids] = torch.as_tensor(qpos, dtype=torch.float32, device=self.device)
            self.qvel[ids] = torch.as_tensor(qvel, dtype=torch.float32, device=self.device)
            mjw.forward(self.wp_model, self.wp_data)
        self._sync()
        for k, v in saved.items():
            self.out[k][keep] = v

    def randomize(self, ids: torch.Tensor) -> None:
        """Per-world model randomization hook, called for the worlds ``ids`` at each of their resets.

        The default draws body mass (inertia scaled alike) and sliding friction factors from
        ``backend.randomization``; a task overrides it to randomize other batched fields
        (``mjw.put_model``'s ``batch_sizes``), then calls :meth:`apply_model_changes`."""
        cfg = self.backend.randomization
        if not cfg.enabled or len(ids) == 0:
            return
        to_torch, m, n = self._wp.to_torch, self.wp_model, len(ids)
        nominal = {k: torch.as_tensor(v, dtype=torch.float32, device=self.device) for k, v in self._nominal.items()}
        (mass_lo, mass_hi), (friction_lo, friction_hi) = cfg.body_mass_scale, cfg.friction_scale
        mass_scale = torch.as_tensor(self.rng.uniform(mass_lo, mass_hi, size=(n, 1)), device=self.device)
        friction_scale = torch.as_tensor(self.rng.uniform(friction_lo, friction_hi, size=(n, 1)), device=self.device)
        to_torch(m.body_mass)[ids] = (nominal["body_mass"] * mass_scale).float()
        to_torch(m.body_inertia)[ids] = (nominal["body_inertia"] * mass_scale[:, :, None]).float()
        to_torch(m.geom_friction)[ids, :, 0] = (nominal["geom_friction"][:, 0] * friction_scale).float()
        self.apply_model_changes()

    def apply_model_changes(self) -> None:
        """Propagate edited model fields (masses, inertias) to MuJoCo-Warp's derived constants."""
        with self._wp.ScopedDevice(self.wp_device):
            self._mjw.set_const(self.wp_model, self.wp_data)
        self._sync()

    def body_masses(self) -> torch.Tensor:
        """Per-world body masses ``[N, nbody]`` (nominal rows unless randomization is on)."""
        mass = self._wp.to_torch(self.wp_model.body_mass)
        return mass.expand(self.num_envs, -1) if mass.shape[0] != self.num_envs else mass

    def _reset_envs(self, ids: torch.Tensor) -> None:
        self.randomize(ids)
        qpos, qvel = self.sample_reset_state(len(ids))
        self.set_state(qpos, qvel, ids)
        self.episode_step[ids] = 0

    def _observe(self) -> torch.Tensor:
        return self.observe().to(torch.float32)

    # ------------------------------------------------------------------------------- VecEnv
    def reset(self, seed: int | None = None) -> ObsDict:
        """Reset every world; ``seed`` reseeds the numpy generator. Obs ``[N, obs_dim]``."""
        if seed is not None:
            self.rng = np.random.default_rng(seed)
        self._reset_envs(torch.arange(self.num_envs, device=self.device))
        return {"policy": self._observe().clone()}

    def step(self, action: torch.Tensor) -> StepResult:
        """Hold ``action`` [N, nu] in [-1, 1] for ``frame_skip`` substeps; auto-reset ended worlds."""
        if tuple(action.shape) != (self.num_envs, self.action_dim):
            raise ValueError(f"action must be [{self.num_envs}, {self.action_dim}], got {tuple(action.shape)}")
        self.before_step()
        self.raw_step(action.detach())
        terms, terminated = self.after_step(self.ctrl)
        terms = {k: v.to(torch.float32) for k, v in terms.items()}
        reward = torch.stack(list(terms.values())).sum(dim=0)
        terminated = terminated.to(torch.bool)
        self.episode_step += 1
        truncated = (self.episode_step >= self.max_episode_steps) & ~terminated
        obs = self._observe().clone()
        success = self.success().to(torch.bool)
        final_obs = obs
        done = torch.nonzero(terminated | truncated).flatten()
        if len(done):
            final_obs = obs.clone()
            self._reset_envs(done)
            obs[done] = self._observe()[done]
        info: dict[str, Any] = {
            "final_obs": {"policy": final_obs},
            "reward_terms": terms,
            "success": success,
        }
        return {"policy": obs}, reward, terminated, truncated, info

    def state_dict(self) -> dict[str, Any]:
        """Integration state, derived outputs, model rows, counters and RNG.

        ``exact_resume`` is False: MuJoCo-Warp's full state (warm starts, contacts, solver
        buffers) is not captured, so a resumed run continues from the same positions and
        velocities but not bit-exactly."""
        state: dict[str, Any] = {
            "qpos": self.qpos.clone().cpu(),
            "qvel": self.qvel.clone().cpu(),
            "time": self._wp.to_torch(self.wp_data.time).clone().cpu(),
            "outputs": {k: v.clone().cpu() for k, v in self.out.items()},
            "episode_step": self.episode_step.clone().cpu(),
            "rng": self.rng.bit_generator.state,
        }
        if self.backend.randomization.enabled:
            state["model_fields"] = {
                k: self._wp.to_torch(getattr(self.wp_model, k)).clone().cpu() for k in self.randomized_fields
            }
        return state

    exact_resume = False

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if tuple(state["qpos"].shape) != tuple(self.qpos.shape):
            raise ValueError(f"state has qpos {tuple(state['qpos'].shape)}, this env {tuple(self.qpos.shape)}")
        for name, values in state.get("model_fields", {}).items():
            self._wp.to_torch(getattr(self.wp_model, name))[:] = values.to(self.device)
        if "model_fields" in state:
            self.apply_model_changes()
        self.qpos[:] = state["qpos"].to(self.device)
        self.qvel[:] = state["qvel"].to(self.device)
        self._wp.to_torch(self.wp_data.time)[:] = state["time"].to(self.device)
        with self._wp.ScopedDevice(self.wp_device):
            self._mjw.forward(self.wp_model, self.wp_data)
        self._sync()
        for name, values in state["outputs"].items():
            self.out[name][:] = values.to(self.device)
        self.episode_step[:] = state["episode_step"].to(self.device)
        self.rng.bit_generator.state = state["rng"]

    def close(self) -> None:
        """Drop the warp arrays (warp frees them when the last reference goes)."""
        self.out.clear()
