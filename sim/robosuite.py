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
  14);
- observation group ``image`` = ``[N, H, W, 3]`` uint8 RGB when ``env.backend.camera`` names one
  of the model's cameras (:class:`~embodied.env.RenderingEnv`): robosuite's own offscreen render
  of that camera (``use_camera_obs=True``, ``camera_names``, ``camera_heights/widths`` =
  ``env.backend.image_size_px``), MuJoCo through EGL or OSMesa as chosen by
  :mod:`embodied.sim.offscreen_gl`. robosuite's default ``macros.IMAGE_CONVENTION = "opengl"``
  hands the rows out bottom-up (``mjr_readPixels`` order); they are flipped here to the env
  contract's row 0 at the top (as ``mujoco.Renderer``), and left alone under ``"opencv"``,
  where robosuite flips them itself;
- reward: robosuite's own, dense (``reward_shaping=True``, the default here) or sparse;
- ``info["success"]``: whether robosuite's ``_check_success()`` held at any step of the episode
  that ended (robosuite episodes do not end on success unless ``terminate_on_success``);
- time limit: ``horizon`` steps, counted here (robosuite's own ``done`` is switched off with
  ``ignore_done=True``), reported as ``truncated``; the ended env is reset at once and
  ``info["final_obs"]`` holds the observation it ended on;
- seeds: env ``i`` draws its placements and initial joint noise from ``seed + i``.

Shapes: ``N`` = ``num_envs``, ``A`` = 7 for one Panda, ``H = W`` = ``env.backend.image_size_px``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from embodied.config import ConfigError, ranged
from embodied.env import IMAGE_GROUP, ObsDict, StepResult, check_image_size_px
from embodied.errors import MissingDependencyError, import_optional
from embodied.io_spec import IOSpec, ObsField, affine_action_fields
from embodied.sim.offscreen_gl import available_gl_platform, gl_install_hint

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
IMAGE_SUFFIX = "_image"
"""robosuite's observation key of a camera's RGB picture is ``<camera>_image``."""


@dataclass(frozen=True)
class RobosuiteBackendCfg:
    """Camera images of a robosuite task (the same keys as the MuJoCo and ManiSkill backends')."""

    camera: str = ""
    """Camera of the robosuite model rendered into ``obs["image"]`` every step (Lift: ``frontview``,
    ``birdview``, ``agentview``, ``sideview``, ``robot0_robotview``, ``robot0_eye_in_hand``); ""
    renders nothing (no offscreen renderer is made)."""
    image_size_px: int = 64
    """Width = height of the camera images (pixels), when ``camera`` is set."""

    def __post_init__(self) -> None:
        check_image_size_px(self.image_size_px)


@dataclass(frozen=True)
class RobosuiteCfg:
    """A robosuite environment run as an embodied VecEnv (``robosuite:<Env>`` sets ``env_name``)."""

    env_name: str = ""
    """robosuite environment, e.g. ``Lift``, ``Stack``, ``Door``."""
    robot: str = "Panda"
    """robosuite robot name."""
    reward_shaping: bool = True
    """Dense (shaped) reward; False: robosuite's sparse success reward."""
    reward_scale: float = ranged(1.0, 1e-6, 1e6)
    """robosuite's reward scale (the largest per-step reward)."""
    horizon: int = ranged(500, 1, 10_000_000, "control steps")
    """Episode length in control steps; the episode is truncated there."""
    control_freq: int = ranged(20, 1, 1000, "Hz")
    """Control steps per second (robosuite's ``control_freq``; dt = 1 / control_freq)."""
    terminate_on_success: bool = False
    """End the episode (``terminated``) at the first step where the task succeeds."""
    hard_reset: bool = False
    """Rebuild the MuJoCo model at every reset (robosuite's default; much slower than a soft reset)."""
    backend: RobosuiteBackendCfg = field(default_factory=RobosuiteBackendCfg)
    """Camera images (``env.backend.camera``, ``env.backend.image_size_px``)."""

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


def _observation_row_step(suite: Any) -> int:
    """Row step (1 or -1) that turns robosuite's camera observations to row 0 at the top.

    robosuite renders with ``mjr_readPixels`` (row 0 at the bottom, OpenGL's order) and applies
    ``IMAGE_CONVENTION_MAPPING[macros.IMAGE_CONVENTION]`` as a row step: 1 under its default
    ``"opengl"`` (bottom row first), -1 under ``"opencv"`` (already top first); so the step that
    undoes it is the negative of robosuite's."""
    from robosuite.utils.mjcf_utils import IMAGE_CONVENTION_MAPPING

    return -int(IMAGE_CONVENTION_MAPPING[suite.macros.IMAGE_CONVENTION])


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
        self.camera = cfg.backend.camera
        """The camera rendered into ``obs["image"]``; "" when images are off (:class:`~embodied.env.RenderingEnv`)."""
        if self.camera and available_gl_platform() is None:
            raise MissingDependencyError(
                f"robosuite camera images (env.backend.camera={self.camera!r}) need an offscreen GL platform; "
                f"install one: {gl_install_hint()}"
            )
        self._row_step = _observation_row_step(suite)
        self.envs = [self._make_first(suite, seed)] + [self._make(suite, seed + i) for i in range(1, self.num_envs)]
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
        self.obs_spec: dict[str, tuple[int, ...]] = {"policy": (sum(self._sizes),)}
        self.episode_step = np.zeros(self.num_envs, dtype=np.int64)
        self._succeeded = np.zeros(self.num_envs, dtype=bool)
        self._obs = np.zeros((self.num_envs, self.obs_spec["policy"][0]), dtype=np.float32)
        size = cfg.backend.image_size_px
        self._images = np.zeros((self.num_envs, size, size, 3) if self.camera else (0,), dtype=np.uint8)
        """``[N, H, W, 3]`` uint8: every env's latest picture, row 0 at the top (empty without a camera)."""
        if self.camera:
            self.obs_spec[IMAGE_GROUP] = (size, size, 3)
        self.reset(seed)

    def _make(self, suite: Any, seed: int, camera: str | None = None) -> Any:
        """One robosuite env; ``camera`` (default ``env.backend.camera``) is rendered into its observations."""
        cfg = self.cfg
        camera = self.camera if camera is None else camera
        size = cfg.backend.image_size_px
        pictures = {"camera_names": camera, "camera_heights": size, "camera_widths": size} if camera else {}
        return suite.make(
            cfg.env_name,
            robots=cfg.robot,
            has_renderer=False,
            has_offscreen_renderer=bool(camera),
            use_camera_obs=bool(camera),
            use_object_obs=True,
            reward_shaping=cfg.reward_shaping,
            reward_scale=cfg.reward_scale,
            control_freq=cfg.control_freq,
            horizon=cfg.horizon,
            ignore_done=True,  # the horizon is counted here, so robosuite never refuses a step
            hard_reset=cfg.hard_reset,
            seed=seed,
            **pictures,
        )

    def _make_first(self, suite: Any, seed: int) -> Any:
        """Env 0, built before the others: an unknown ``env.backend.camera`` fails here naming the model's cameras.

        robosuite itself only says that the camera's observable is invalid (a ValueError while the env
        is built), so on that path a camera-less env is built to read the model's camera names."""
        try:
            return self._make(suite, seed)
        except ValueError:
            if not self.camera:
                raise
            probe = self._make(suite, seed, camera="")
            cameras = tuple(probe.sim.model.camera_names)
            probe.close()
            if self.camera in cameras:
                raise
            raise ConfigError(
                f"robosuite:{self.cfg.env_name} has no camera {self.camera!r} "
                f"(env.backend.camera; its cameras: {', '.join(cameras)})"
            ) from None

    # ------------------------------------------------------------------------------ helpers
    def _flat(self, obs: dict[str, Any]) -> np.ndarray:
        """One env's policy observation ``[obs_dim]`` from robosuite's observation dict."""
        return np.concatenate([np.asarray(obs[k], dtype=np.float32).reshape(-1) for k in self._keys])

    def _store(self, i: int, obs: dict[str, Any]) -> None:
        """Keep env ``i``'s policy vector and (with a camera) its picture, turned row 0 at the top."""
        self._obs[i] = self._flat(obs)
        if self.camera:
            self._images[i] = obs[self.camera + IMAGE_SUFFIX][:: self._row_step]

    def _groups(self, policy: np.ndarray, images: np.ndarray) -> ObsDict:
        """``{"policy": [N, D] float32, "image": [N, H, W, 3] uint8}`` (``"image"`` only with a camera)."""
        groups = {"policy": self._to_torch(policy)}
        if self.camera:
            groups[IMAGE_GROUP] = self._to_torch(images)
        return groups

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
        Returns ``{"policy": [N, obs_dim]}``, with a camera also ``"image": [N, H, W, 3]`` uint8."""
        for i, env in enumerate(self.envs):
            if seed is not None:
                # in place: robosuite's placement samplers hold this same Generator object
                env.rng.bit_generator.state = np.random.default_rng(seed + i).bit_generator.state
            self._store(i, env.reset())
        self.episode_step[:] = 0
        self._succeeded[:] = False
        return self._groups(self._obs.copy(), self._images.copy())

    def step(self, action: torch.Tensor) -> StepResult:
        """Step every env with ``action`` [N, A] in [-1, 1]; ended envs reset (module docstring)."""
        actions = self._robosuite_actions(action)
        reward = np.zeros(self.num_envs, dtype=np.float32)
        success_now = np.zeros(self.num_envs, dtype=bool)
        for i, env in enumerate(self.envs):
            obs, r, _, _ = env.step(actions[i])
            self._store(i, obs)
            reward[i] = r
            success_now[i] = bool(env._check_success())
        self.episode_step += 1
        self._succeeded |= success_now
        terminated = success_now if self.cfg.terminate_on_success else np.zeros(self.num_envs, dtype=bool)
        truncated = (self.episode_step >= self.cfg.horizon) & ~terminated
        done = terminated | truncated
        final = self._groups(self._obs.copy(), self._images.copy())
        success = self._succeeded & done
        for ended in np.flatnonzero(done):
            self._store(int(ended), self.envs[ended].reset())
        self.episode_step[done] = 0
        self._succeeded[done] = False
        reward_t = self._to_torch(reward)
        return (
            self._groups(self._obs.copy(), self._images.copy()),
            reward_t,
            self._to_torch(terminated),
            self._to_torch(truncated),
            {
                "final_obs": final,
                "reward_terms": {"robosuite": reward_t},
                "success": self._to_torch(success),
            },
        )

    def render_images(self) -> torch.Tensor:
        """Camera images of every env's current state, ``[N, H, W, 3]`` uint8, row 0 at the top,
        rendered again without stepping (:class:`embodied.env.RenderingEnv`)."""
        if not self.camera:
            raise RuntimeError("this env renders no images: set env.backend.camera to one of the model's cameras")
        size = self.cfg.backend.image_size_px
        # robosuite's sim.render returns mjr_readPixels' rows (bottom first) whatever its image convention
        frames = [env.sim.render(camera_name=self.camera, width=size, height=size)[::-1] for env in self.envs]
        return self._to_torch(np.stack(frames))

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
