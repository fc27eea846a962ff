"""ManiSkill3 backend (``maniskill:<EnvId>``): a ManiSkill3 task as an embodied VecEnv.

ManiSkill3 (``mani-skill`` 3.0.1 with ``sapien`` 3.0.3) batches its tasks itself on CUDA
(``physx_cuda``: one env object with ``N`` parallel scenes, torch tensors on the GPU); its physx
CPU backend runs one scene per env object, so on the CPU this adapter builds ``N`` of them and
steps them in a loop. Either way ManiSkill hands back torch tensors (``[n, ...]`` per env object),
which are concatenated into the ``[N, ...]`` batch of the VecEnv contract.

- Observations: ManiSkill's flat ``state`` observation as group ``"policy"`` (float32 ``[N, D]``).
  With ``env.backend.camera`` set to one of the task's sensor cameras (``base_camera`` for
  PushCube) the env is a :class:`~embodied.env.RenderingEnv`: ManiSkill renders that camera
  itself (``obs_mode="rgb+state"``, ``sensor_configs`` width = height = ``image_size_px``) and
  group ``"image"`` holds ``[N, H, W, 3]`` uint8 RGB; the state vector is the same as without
  images. Renderer: SAPIEN's ``cpu`` backend with physx CPU (lavapipe, a software Vulkan driver:
  tens of frames per second, docs/benchmarks/maniskill.md), ``gpu`` with ``physx_cuda``. Every sensor camera of
  the task is rendered (ManiSkill renders them together); only the named one is returned.
- Actions: ``[N, A]`` in [-1, 1], clipped and mapped onto the controller's bounds (the
  ``pd_*_delta_*`` controllers are already normalized to [-1, 1]).
- Episodes: ``terminated`` is ManiSkill's own (success or failure, unless
  ``terminate_on_success=false``), ``truncated`` is the time limit registered for the task (or
  ``max_episode_steps``) counted here. Ended envs reset at once (partial reset on CUDA, a reset
  of that env object on the CPU) and ``info["final_obs"]`` holds the observation each ended on.
- ``info["success"]``: whether ManiSkill reported success at any step of the ended episode.
- Seeds: ``reset(seed)`` seeds env ``i`` with ``seed + i``; auto-resets draw from ManiSkill's own
  per-env generators, which that seed determined.

ManiSkill needs a Vulkan device even for state observations on the physx CPU backend: Debian
12's lavapipe (Mesa 22.3) is too old, Mesa >= 23 lavapipe (bookworm-backports) works. A missing
package, a missing or unusable Vulkan driver, and a task whose assets are not downloaded each
raise :class:`~embodied.errors.MissingDependencyError` naming the fix; ManiSkill's interactive
download prompt is never shown. ``mani_skill`` is imported only when an env is built.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

import torch

from embodied.config import ConfigError, closest, ranged
from embodied.env import IMAGE_GROUP, ObsDict, StepResult, check_image_size_px
from embodied.errors import EmbodiedError, MissingDependencyError, import_optional
from embodied.io_spec import ActionField, IOSpec, ObsField
from embodied.sim.capabilities import vulkan_drivers

log = logging.getLogger("embodied.sim.maniskill")

INSTALL = (
    'pip install --no-deps "mani-skill==3.0.1" "sapien==3.0.3" && pip install "embodied[maniskill]", '
    "plus a Vulkan driver (Mesa >= 23 lavapipe on CPU; docs/backends.md)"
)
"""What provides ManiSkill (``--no-deps``: sapien would add opencv-python beside this package's
opencv-python-headless, two copies of ``cv2``; the extra lists the rest of their dependencies)."""

VULKAN_HINT = (
    "on Debian 12 install Mesa >= 23 lavapipe from bookworm-backports: "
    "apt-get install -t bookworm-backports mesa-vulkan-drivers (docs/backends.md)"
)

VULKAN_ERRORS = ("rendering device", "vk::", "vulkan", "ErrorIncompatibleDriver")
"""Fragments of SAPIEN's messages when it finds no usable Vulkan device (matched lower-cased)."""


@dataclass(frozen=True)
class ManiSkillBackendCfg:
    """Camera images of a ManiSkill task (the same keys as the MuJoCo backend's)."""

    camera: str = ""
    """ManiSkill sensor camera rendered into ``obs["image"]`` every step (``base_camera`` for most
    tabletop tasks); "" renders nothing (``render_backend="none"``)."""
    image_size_px: int = 64
    """Width = height of the camera images (pixels), when ``camera`` is set."""

    def __post_init__(self) -> None:
        check_image_size_px(self.image_size_px)


@dataclass(frozen=True)
class ManiSkillCfg:
    """A ManiSkill3 task (the task name ``maniskill:<EnvId>`` sets ``env_id``)."""

    env_id: str = ""
    """ManiSkill3 env id, e.g. ``PushCube-v1``."""
    control_mode: str = ""
    """ManiSkill controller, e.g. ``pd_ee_delta_pos`` (end-effector moves); empty: the task's default."""
    reward_mode: str = "normalized_dense"
    """``normalized_dense`` (per-step reward in [0, 1]), ``dense``, ``sparse`` or ``none``."""
    max_episode_steps: int = ranged(0, 0, 10_000_000, "control steps")
    """Time limit in control steps; 0 keeps the limit registered for the task."""
    terminate_on_success: bool = True
    """ManiSkill ends an episode on success (or failure); False ends episodes only at the time limit
    (success still reported in ``info["success"]``)."""
    sim_backend: str = ""
    """ManiSkill ``sim_backend``; empty: ``physx_cuda`` on a CUDA device, ``physx_cpu`` on the CPU."""
    backend: ManiSkillBackendCfg = field(default_factory=ManiSkillBackendCfg)
    """Camera images (``env.backend.camera``, ``env.backend.image_size_px``)."""

    def __post_init__(self) -> None:
        if not self.env_id:
            raise ConfigError(
                "maniskill: env_id is empty; use the task name maniskill:<EnvId>, e.g. maniskill:PushCube-v1"
            )
        if self.max_episode_steps < 0:
            raise ConfigError(f"max_episode_steps must be >= 0 (0: registered limit), got {self.max_episode_steps}")
        if self.reward_mode not in ("normalized_dense", "dense", "sparse", "none"):
            raise ConfigError(f"reward_mode must be normalized_dense, dense, sparse or none, got {self.reward_mode!r}")


def _import_maniskill() -> ModuleType:
    """``gymnasium`` with ManiSkill's env ids registered; a named error if either is absent."""
    import_optional("mani_skill", "the maniskill backend", INSTALL)
    import_optional("mani_skill.envs", "the maniskill backend", INSTALL)  # registers the env ids
    return import_optional("gymnasium", "the maniskill backend", INSTALL)


@contextlib.contextmanager
def _no_download_prompt(env_id: str) -> Iterator[None]:
    """Turn ManiSkill's interactive "download the assets?" question into a named error."""
    from mani_skill.utils import download_asset

    def refuse(message: str) -> bool:
        what = message.split("Would you like")[0].strip()  # ManiSkill's text up to its question
        raise MissingDependencyError(
            f"maniskill:{env_id} needs assets that are not downloaded ({what}); download them once "
            f"with: python -m mani_skill.utils.download_asset {env_id}"
        )

    asked = download_asset.prompt_yes_no
    download_asset.prompt_yes_no = refuse
    try:
        yield
    finally:
        download_asset.prompt_yes_no = asked


def _check_env_id(env_id: str) -> int:
    """The registered time limit of ``env_id``; a named error with the closest ids if unknown."""
    from mani_skill.utils.registration import REGISTERED_ENVS

    if env_id not in REGISTERED_ENVS:
        near = ", ".join(closest(env_id, REGISTERED_ENVS, n=5)[:5])
        raise ConfigError(f"unknown ManiSkill env id {env_id!r}; closest: {near} ({len(REGISTERED_ENVS)} registered)")
    return int(REGISTERED_ENVS[env_id].max_episode_steps or 0)


class ManiSkillVecEnv:
    """``num_envs`` envs of one ManiSkill3 task; see the module docstring.

    ``parts`` are ManiSkill env objects: one with ``N`` scenes on CUDA, ``N`` with one scene each
    on the CPU; ``part_size`` is the number of scenes per object.
    """

    exact_resume = False
    """ManiSkill's controllers and task state are not captured: resumed runs restart episodes."""

    def __init__(self, cfg: ManiSkillCfg, num_envs: int, device: torch.device | str, seed: int) -> None:
        if num_envs < 1:
            raise ConfigError(f"num_envs must be >= 1, got {num_envs}")
        gym = _import_maniskill()
        registered_limit = _check_env_id(cfg.env_id)
        self.cfg = cfg
        self.num_envs = int(num_envs)
        self.device = torch.device(device)
        if not (cfg.max_episode_steps or registered_limit):
            raise ConfigError(f"maniskill:{cfg.env_id} registers no time limit; set env.max_episode_steps")
        sim_backend = cfg.sim_backend or ("physx_cuda" if self.device.type == "cuda" else "physx_cpu")
        batched = sim_backend != "physx_cpu"
        self.part_size = self.num_envs if batched else 1
        self.camera = cfg.backend.camera
        kwargs: dict[str, Any] = {
            "num_envs": self.part_size,
            "obs_mode": "state",
            "reward_mode": cfg.reward_mode,
            "sim_backend": sim_backend,
            # state observations need no renderer (SAPIEN still opens a Vulkan device)
            "render_backend": "none",
        }
        if self.camera:
            size = cfg.backend.image_size_px
            # "+state": the flat state vector beside the pictures, the same one as obs_mode="state"
            kwargs.update(obs_mode="rgb+state", render_backend="gpu" if batched else "cpu")
            kwargs["sensor_configs"] = {"width": size, "height": size}
        if cfg.control_mode:
            kwargs["control_mode"] = cfg.control_mode
        self.parts: list[Any] = []
        try:
            with _no_download_prompt(cfg.env_id):
                for _ in range(self.num_envs // self.part_size):
                    # .unwrapped: the time limit and auto-reset are done here, for every backend alike
                    self.parts.append(gym.make(cfg.env_id, **kwargs).unwrapped)
                    if len(self.parts) == 1:
                        self._check_camera(self.parts[0])  # before building the other N - 1
        except (EmbodiedError, ConfigError):  # assets not downloaded (the refused prompt), no such camera
            self.close()
            raise
        except AssertionError as err:  # ManiSkill checks its arguments with asserts
            self.close()
            raise ConfigError(f"maniskill:{cfg.env_id}: {err} (env.control_mode / env.reward_mode)") from err
        except RuntimeError as err:
            self.close()
            if any(fragment in str(err).lower() for fragment in (f.lower() for f in VULKAN_ERRORS)):
                found = ", ".join(vulkan_drivers()) or "none"
                raise MissingDependencyError(
                    f"the maniskill backend needs a usable Vulkan device, also on its CPU physics backend "
                    f"(SAPIEN: {err}; driver manifests found: {found}); {VULKAN_HINT}"
                ) from err
            raise
        first = self.parts[0]
        self.sim_device = torch.device(str(first.device))
        space = first.single_action_space
        if not isinstance(space, gym.spaces.Box) or len(space.shape) != 1:
            self.close()
            raise EmbodiedError(f"maniskill:{cfg.env_id}: action space {space} is not supported (a flat Box only)")
        self.action_dim = int(space.shape[0])
        low = torch.as_tensor(space.low, dtype=torch.float32)
        high = torch.as_tensor(space.high, dtype=torch.float32)
        self._act_mid = ((low + high) / 2).to(self.sim_device)
        self._act_half = ((high - low) / 2).to(self.sim_device)
        state_space = first.single_observation_space["state"] if self.camera else first.single_observation_space
        self.obs_spec: dict[str, tuple[int, ...]] = {"policy": (int(state_space.shape[0]),)}
        if self.camera:
            self.obs_spec[IMAGE_GROUP] = (cfg.backend.image_size_px, cfg.backend.image_size_px, 3)
        self.max_episode_steps = int(cfg.max_episode_steps or registered_limit)
        self.dt = 1.0 / float(first.control_freq)
        self.control_mode = str(first.control_mode)
        self.episode_step = torch.zeros(self.num_envs, dtype=torch.int64, device=self.sim_device)
        self._succeeded = torch.zeros(self.num_envs, dtype=torch.bool, device=self.sim_device)
        self.reset(seed)

    def _check_camera(self, part: Any) -> None:
        """A named error listing the task's sensor cameras when ``env.backend.camera`` is not one."""
        if self.camera and self.camera not in part.scene.sensors:
            names = ", ".join(sorted(part.scene.sensors)) or "none"
            raise ConfigError(
                f"maniskill:{self.cfg.env_id} has no sensor camera {self.camera!r} (env.backend.camera; its cameras: {names})"
            )

    # ------------------------------------------------------------------ conversions
    def _groups(self, raw: Any) -> ObsDict:
        """ManiSkill's observation of one env object -> ``{"policy": [n, D] float32, "image": [n, H, W, 3] uint8}``
        (``"image"`` only with a camera), on the simulator's device."""
        if not self.camera:
            return {"policy": raw.to(torch.float32)}
        return {"policy": raw["state"].to(torch.float32), IMAGE_GROUP: raw["sensor_data"][self.camera]["rgb"]}

    def _cat(self, parts: list[ObsDict]) -> ObsDict:
        """Groups of every env object -> the ``[N, ...]`` batch on the VecEnv's device."""
        return {group: self._out(torch.cat([p[group] for p in parts])) for group in parts[0]}

    def _sim_action(self, action: torch.Tensor) -> torch.Tensor:
        """``action`` [N, A] in [-1, 1] -> the controller's units on the simulator's device."""
        a = action.detach().to(self.sim_device, torch.float32).reshape(self.num_envs, self.action_dim)
        return self._act_mid + self._act_half * a.clamp(-1.0, 1.0)

    def _slices(self) -> Iterator[tuple[Any, slice]]:
        for index, part in enumerate(self.parts):
            yield part, slice(index * self.part_size, (index + 1) * self.part_size)

    def _out(self, x: torch.Tensor) -> torch.Tensor:
        return x.to(self.device)

    # ------------------------------------------------------------------ VecEnv
    def reset(self, seed: int | None = None) -> ObsDict:
        """Reset every env (``seed`` -> env ``i`` gets ``seed + i``). Obs ``[N, D]`` float32."""
        rows = []
        for part, rows_of in self._slices():
            seeds = None if seed is None else [seed + i for i in range(rows_of.start, rows_of.stop)]
            # one scene: ManiSkill takes an int seed; several: one seed per scene
            obs, _ = part.reset(seed=seeds if seeds is None or len(seeds) > 1 else seeds[0])
            rows.append(self._groups(obs))
        self.episode_step.zero_()
        self._succeeded.zero_()
        return self._cat(rows)

    def render_images(self) -> torch.Tensor:
        """Camera images of every env now, ``[N, H, W, 3]`` uint8 (:class:`embodied.env.RenderingEnv`)."""
        if not self.camera:
            raise RuntimeError("this env renders no images: set env.backend.camera to one of the task's sensor cameras")
        # get_obs renders the sensors again from the current state; nothing is stepped
        return self._cat([self._groups(part.get_obs()) for part, _ in self._slices()])[IMAGE_GROUP]

    def step(self, action: torch.Tensor) -> StepResult:
        """Advance every env one control period; ended envs reset (``info["final_obs"]``)."""
        sim_action = self._sim_action(action)
        obs_rows, rewards, terms, successes = [], [], [], []
        for part, rows in self._slices():
            obs, reward, terminated, _, info = part.step(sim_action[rows])
            obs_rows.append(self._groups(obs))
            rewards.append(reward)
            terms.append(terminated)
            successes.append(info.get("success", torch.zeros(self.part_size, dtype=torch.bool)))
        obs = {group: torch.cat([row[group] for row in obs_rows]) for group in obs_rows[0]}
        reward = torch.cat(rewards).to(torch.float32).reshape(self.num_envs)
        self._succeeded |= torch.cat(successes).to(self.sim_device, torch.bool).reshape(self.num_envs)
        terminated = torch.cat(terms).to(self.sim_device, torch.bool).reshape(self.num_envs)
        if not self.cfg.terminate_on_success:
            terminated = torch.zeros_like(terminated)
        self.episode_step += 1
        truncated = (self.episode_step >= self.max_episode_steps) & ~terminated
        done = terminated | truncated
        success = self._succeeded & done
        final_obs = obs
        if bool(done.any()):
            final_obs = {group: values.clone() for group, values in obs.items()}
            obs = self._reset_ended(obs, done)
            self.episode_step[done] = 0
            self._succeeded[done] = False
        return (
            self._cat([obs]),
            self._out(reward),
            self._out(terminated),
            self._out(truncated),
            {
                "final_obs": self._cat([final_obs]),
                "reward_terms": {"env": self._out(reward)},
                "success": self._out(success),
            },
        )

    def _reset_ended(self, obs: ObsDict, done: torch.Tensor) -> ObsDict:
        """``obs`` (every group) with the rows of ended envs replaced by their next episode's first observation."""
        out = {group: rows.clone() for group, rows in obs.items()}
        for part, rows in self._slices():
            ended = torch.nonzero(done[rows]).flatten()
            if len(ended) == 0:
                continue
            if self.part_size == 1:
                first = self._groups(part.reset()[0])
            else:  # partial reset: ManiSkill re-initializes the listed scenes only
                first = self._groups(part.reset(options={"env_idx": ended})[0])
                first = {group: values[ended] for group, values in first.items()}
            for group, values in first.items():
                out[group][rows.start + ended] = values.to(out[group].device)
        return out

    def raw_step(self, action: torch.Tensor) -> None:
        """ManiSkill's own step of every env object, unconverted and without resets: what a
        hand-written loop over ManiSkill does per control step (``ratio_vs_raw`` in the bench)."""
        sim_action = self._sim_action(action)
        for part, rows in self._slices():
            part.step(sim_action[rows])

    def io_spec(self) -> IOSpec:
        obs = (ObsField("state", self.obs_spec["policy"][0], description=f"ManiSkill {self.cfg.env_id} state obs"),)
        actions = tuple(
            ActionField(
                f"action_{i}",
                1,
                scale=float(self._act_half[i]),
                offset=float(self._act_mid[i]),
                description=f"ManiSkill controller {self.control_mode}",
            )
            for i in range(self.action_dim)
        )
        return IOSpec(
            obs,
            actions,
            control_period_s=self.dt,
            extra={"env_id": self.cfg.env_id, "control_mode": self.control_mode},
        )

    def state_dict(self) -> dict[str, Any]:
        """Episode counters only (see :attr:`exact_resume`); after loading, call ``reset``."""
        return {"episode_step": self.episode_step.cpu().clone(), "env_id": self.cfg.env_id}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("env_id") != self.cfg.env_id:
            raise EmbodiedError(f"state is for {state.get('env_id')!r}, this env runs {self.cfg.env_id!r}")
        self.episode_step.copy_(torch.as_tensor(state["episode_step"]).to(self.sim_device))

    def close(self) -> None:
        for part in self.parts:
            part.close()
        self.parts = []
