"""robosuite as a VecEnv: ``num_envs`` robosuite environments stepped in a loop on the CPU.

Task name ``robosuite:<Env>`` (``robosuite:Lift``, ``robosuite:Stack``, ``robosuite:Door``; any
registered robosuite environment with one arm should work, those three are the ones tested)
builds :class:`RobosuiteVecEnv` with a Panda arm under robosuite's default controller for it
(operational-space pose control of the arm plus the gripper, 7 actions in [-1, 1]).

robosuite 1.5.2 needs mujoco <= 3.9 and numpy 1.26, so it lives in its own environment
(``bash scripts/setup_robosuite.sh`` creates ``.venv-robosuite``); embodied runs in process
there, and this module imports robosuite only when an env is built. From an environment without
it, building one raises :class:`~embodied.errors.MissingDependencyError` naming that command.

What the adapter does with robosuite's envs:

- observation group ``policy`` = ``[N, proprio + object]`` float32: robosuite's
  ``robot0_proprio-state`` (for a Panda 50 values: joint positions, their cos and sin, joint
  velocities and accelerations, 7 each; end-effector position, quaternion and site quaternion;
  gripper joint positions and velocities; world frame as robosuite reports them) followed by
  its ``object-state`` (object poses and object-to-gripper vectors; Lift 10, Stack 23, Door
  14); no cameras;
- reward: robosuite's own, dense (``reward_shaping=True``, the default here) or sparse;
- ``info["success"]``: whether robosuite's ``_check_success()`` held at any step of the episode
  that ended (robosuite episodes do not end on success unless ``terminate_on_success``);
- time limit: ``horizon`` steps, counted here (robosuite's own ``done`` is switched off with
  ``ignore_done=True``), reported as ``truncated``; the ended env is reset at once and
  ``info["final_obs"]`` holds the observation it ended on;
- seeds: env ``i`` draws its placements and initial joint noise from ``seed + i``.

Shapes: ``N`` = ``num_envs``, ``A`` = 7 for one Panda.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from embodied.config import ConfigError
from embodied.env import ObsDict, StepResult
from embodied.errors import MissingDependencyError, import_optional
from embodied.io_spec import IOSpec, ObsField, affine_action_fields

log = logging.getLogger("embodied.sim.robosuite")

SETUP = (
    "bash scripts/setup_robosuite.sh, then run .venv-robosuite/bin/embodied "
    "(robosuite needs mujoco <= 3.9: its own environment; docs/backends.md)"
)
"""How to get the robosuite environment: the install hint every missing-dependency error names."""

MUJOCO_MAX = (3, 9)
"""Newest mujoco (major, minor) robosuite 1.5.2 runs with."""

ROBOSUITE_LOGGER = "robosuite_logs"
"""The logger robosuite 1.5 writes to (its own console handler)."""

OBJECT_GROUP = "object-state"
PROPRIO_SUFFIX = "_proprio-state"


@dataclass(frozen=True)
class RobosuiteCfg:
    """A robosuite environment run as an embodied VecEnv (``robosuite:<Env>`` sets ``env_name``)."""

    env_name: str = ""
    """robosuite environment, e.g. ``Lift``, ``Stack``, ``Door``."""
    robot: str = "Panda"
    """robosuite robot name."""
    reward_shaping: bool = True
    """Dense (shaped) reward; False: robosuite's sparse success reward."""
    reward_scale: float = 1.0
    """robosuite's reward scale (the largest per-step reward)."""
    horizon: int = 500
    """Episode length in control steps; the episode is truncated there."""
    control_freq: int = 20
    """Control steps per second (robosuite's ``control_freq``; dt = 1 / control_freq)."""
    terminate_on_success: bool = False
    """End the episode (``terminated``) at the first step where the task succeeds."""
    hard_reset: bool = False
    """Rebuild the MuJoCo model at every reset (robosuite's default; much slower than a soft reset)."""

    def __post_init__(self) -> None:
        if not self.env_name:
            raise ConfigError("robosuite: env_name is empty; use the task name robosuite:<Env>, e.g. robosuite:Lift")
        if self.horizon < 1:
            raise ConfigError(f"env.horizon must be >= 1 control steps, got {self.horizon}")
        if self.control_freq < 1:
            raise ConfigError(f"env.control_freq must be >= 1 Hz, got {self.control_freq}")
        if self.reward_scale <= 0:
            raise ConfigError(f"env.reward_scale must be > 0, got {self.reward_scale}")


def import_robosuite() -> Any:
    """The ``robosuite`` module, or a :class:`MissingDependencyError` naming the setup command.

    Also refuses a mujoco newer than robosuite 1.5.2 runs with (the core environment's 4.0), so
    the failure says which environment to use instead of breaking inside robosuite."""
    mujoco = import_optional("mujoco", "the robosuite backend", SETUP)
    version = tuple(int(part) for part in str(mujoco.__version__).split(".")[:2])
    if version > MUJOCO_MAX:
        raise MissingDependencyError(
            f"the robosuite backend needs mujoco <= {MUJOCO_MAX[0]}.{MUJOCO_MAX[1]}, this environment has "
            f"{mujoco.__version__}; run it from its own environment: {SETUP}"
        )
    suite = import_optional("robosuite", "the robosuite backend", SETUP)
    # robosuite logs a line at INFO for every env it builds (controller file); keep its warnings
    logging.getLogger(ROBOSUITE_LOGGER).setLevel(logging.WARNING)
    return suite


def _obs_keys(obs: dict[str, Any]) -> list[str]:
    """robosuite's observation groups the policy sees: each robot's proprio state, then objects."""
    keys = sorted(k for k in obs if k.endswith(PROPRIO_SUFFIX))
    return keys + ([OBJECT_GROUP] if OBJECT_GROUP in obs else [])


class RobosuiteVecEnv:
    """``num_envs`` robosuite envs behind the VecEnv contract; see the module docstring."""

    exact_resume = False
    """robosuite's controller state is not captured: a resumed run starts fresh episodes."""

    def __init__(self, cfg: RobosuiteCfg, num_envs: int, device: torch.device | str, seed: int) -> None:
        if num_envs < 1:
            raise ConfigError(f"num_envs must be >= 1, got {num_envs}")
        suite = import_robosuite()
        if cfg.env_name not in suite.ALL_ENVIRONMENTS:
            raise ConfigError(
                f"unknown robosuite environment {cfg.env_name!r}; registered: {', '.join(sorted(suite.ALL_ENVIRONMENTS))}"
            )
        if cfg.robot not in suite.ALL_ROBOTS:
            raise ConfigError(
                f"unknown robosuite robot {cfg.robot!r}; registered: {', '.join(sorted(suite.ALL_ROBOTS))}"
            )
        self.cfg = cfg
        self.num_envs = int(num_envs)
        self.device = torch.device(device)
        self.envs = [self._make(suite, seed + i) for i in range(self.num_envs)]
        first = self.envs[0]
        low, high = (np.asarray(bound, dtype=np.float64) for bound in first.action_spec)
        self.action_dim = int(low.size)
        self._act_mid = (low + high) / 2
        self._act_half = (high - low) / 2
        self.dt = float(first.control_timestep)
        self.max_episode_steps = cfg.horizon
        obs = first.reset()
        self._keys = _obs_keys(obs)
        self._sizes = [int(np.asarray(obs[k]).size) for k in self._keys]
        self.obs_spec = {"policy": (sum(self._sizes),)}
        self.episode_step = np.zeros(self.num_envs, dtype=np.int64)
        self._succeeded = np.zeros(self.num_envs, dtype=bool)
        self._obs = np.zeros((self.num_envs, self.obs_spec["policy"][0]), dtype=np.float32)
        self.reset(seed)

    def _make(self, suite: Any, seed: int) -> Any:
        cfg = self.cfg
        return suite.make(
            cfg.env_name,
            robots=cfg.robot,
            has_renderer=False,
            has_offscreen_renderer=False,
            use_camera_obs=False,
            use_object_obs=True,
            reward_shaping=cfg.reward_shaping,
            reward_scale=cfg.reward_scale,
            control_freq=cfg.control_freq,
            horizon=cfg.horizon,
            ignore_done=True,  # the horizon is counted here, so robosuite never refuses a step
            hard_reset=cfg.hard_reset,
            seed=seed,
        )

    # ------------------------------------------------------------------------------ helpers
    def _flat(self, obs: dict[str, Any]) -> np.ndarray:
        """One env's policy observation ``[obs_dim]`` from robosuite's observation dict."""
        return np.concatenate([np.asarray(obs[k], dtype=np.float32).reshape(-1) for k in self._keys])

    def _to_torch(self, array: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(np.ascontiguousarray(array)).to(self.device)

    def _robosuite_actions(self, action: torch.Tensor) -> np.ndarray:
        """``action`` [N, A] in [-1, 1] -> robosuite's action bounds, float64 [N, A]."""
        if tuple(action.shape) != (self.num_envs, self.action_dim):
            raise ValueError(f"action must be [{self.num_envs}, {self.action_dim}], got {tuple(action.shape)}")
        flat = np.clip(action.detach().cpu().numpy().astype(np.float64), -1.0, 1.0)
        return self._act_mid + self._act_half * flat

    # ------------------------------------------------------------------------------- VecEnv
    def reset(self, seed: int | None = None) -> ObsDict:
        """Reset every env (``seed``: env ``i`` restarts its random stream at ``seed + i``).
        Returns ``{"policy": [N, obs_dim]}``."""
        for i, env in enumerate(self.envs):
            if seed is not None:
                # in place: robosuite's placement samplers hold this same Generator object
                env.rng.bit_generator.state = np.random.default_rng(seed + i).bit_generator.state
            self._obs[i] = self._flat(env.reset())
        self.episode_step[:] = 0
        self._succeeded[:] = False
        return {"policy": self._to_torch(self._obs.copy())}

    def step(self, action: torch.Tensor) -> StepResult:
        """Step every env with ``action`` [N, A] in [-1, 1]; ended envs reset (module docstring)."""
        actions = self._robosuite_actions(action)
        reward = np.zeros(self.num_envs, dtype=np.float32)
        success_now = np.zeros(self.num_envs, dtype=bool)
        for i, env in enumerate(self.envs):
            obs, r, _, _ = env.step(actions[i])
            self._obs[i] = self._flat(obs)
            reward[i] = r
            success_now[i] = bool(env._check_success())
        self.episode_step += 1
        self._succeeded |= success_now
        terminated = success_now if self.cfg.terminate_on_success else np.zeros(self.num_envs, dtype=bool)
        truncated = (self.episode_step >= self.cfg.horizon) & ~terminated
        done = terminated | truncated
        final = self._obs.copy()
        success = self._succeeded & done
        for ended in np.flatnonzero(done):
            self._obs[ended] = self._flat(self.envs[ended].reset())
        self.episode_step[done] = 0
        self._succeeded[done] = False
        reward_t = self._to_torch(reward)
        return (
            {"policy": self._to_torch(self._obs.copy())},
            reward_t,
            self._to_torch(terminated),
            self._to_torch(truncated),
            {
                "final_obs": {"policy": self._to_torch(final)},
                "reward_terms": {"robosuite": reward_t},
                "success": self._to_torch(success),
            },
        )

    def raw_step(self, action: torch.Tensor) -> None:
        """robosuite's own step of every env with ``action`` [N, A] (no conversion of its
        observation, no success check, no time limit): what the bench compares :meth:`step`
        against (``ratio_vs_raw``)."""
        actions = self._robosuite_actions(action)
        for i, env in enumerate(self.envs):
            env.step(actions[i])

    def io_spec(self) -> IOSpec:
        obs = tuple(
            ObsField(key.replace("-", "_"), size, description=f"robosuite observation {key!r}")
            for key, size in zip(self._keys, self._sizes, strict=True)
        )
        actions = affine_action_fields(
            self._act_mid.tolist(),
            self._act_half.tolist(),
            "robosuite controller input (arm pose deltas, then the gripper)",
        )
        return IOSpec(
            obs,
            actions,
            control_period_s=self.dt,
            extra={"robosuite_env": self.cfg.env_name, "robot": self.cfg.robot},
        )

    def state_dict(self) -> dict[str, Any]:
        """Only which environment ran (``exact_resume`` is False): nothing of robosuite's state."""
        return {"env_name": self.cfg.env_name}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Check ``state`` is for this environment and start fresh episodes."""
        if state.get("env_name") != self.cfg.env_name:
            raise ValueError(f"state is for {state.get('env_name')!r}, this env runs {self.cfg.env_name!r}")
        self.reset()

    def close(self) -> None:
        for env in self.envs:
            env.close()
