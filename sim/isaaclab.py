"""Isaac Lab as a VecEnv: an adapter around a ``ManagerBasedRLEnv`` or ``DirectRLEnv``.

Task name ``isaaclab:<TaskId>`` (e.g. ``isaaclab:Isaac-Cartpole-Direct``) builds the task that
Isaac Lab's task package (``isaaclab_tasks``) registers, through :func:`make_isaaclab_env`, and
wraps it; :class:`IsaacLabVecEnv` also wraps an env you created yourself. Isaac Lab 3 runs
"kit-less" (no Isaac Sim) on Newton physics, whose warp kernels run on CUDA or on warp's CPU
device: ``.venv-isaaclab`` (``scripts/setup_isaaclab.sh``, Python 3.12) has it; see
docs/backends.md "Isaac Lab". A task whose config needs Isaac Sim (PhysX, RTX cameras) starts
it through Isaac Lab's own ``launch_simulation``. This module imports without Isaac Lab; only
:func:`make_isaaclab_env` imports it.

What the adapter relies on (checked against Isaac Lab 3.0.0 itself by tests/test_isaaclab_real.py):

- ``reset(seed=None) -> (obs, extras)`` and ``step(action) -> (obs, reward, terminated,
  time_outs, extras)``, every value a torch tensor ``[N, ...]`` on ``env.device``;
- ``obs`` is a dict of observation groups, each a ``[N, d]`` tensor (groups built with
  ``concatenate_terms=True``); the ``policy`` group feeds the actor, a ``critic`` group (when the
  task defines one) the critic;
- environments reset inside ``step``: the returned ``obs`` of an ended env is already its next
  episode's first observation. The observation it ended on is in ``extras["final_obs"]`` only
  when the env config has ``compute_final_obs=True`` (Isaac Lab's opt-in; :func:`make_isaaclab_env`
  sets it); without it the adapter reports ``exact_final_obs = False`` and hands the reset
  observation as ``final_obs`` (off-policy targets then bootstrap time-outs from the wrong
  state);
- time-outs come as the fourth value and, for RSL-RL-style wrappers, as ``extras["time_outs"]``;
  either marks the env truncated. Isaac Lab can report an env both terminated and timed out on
  one step; the adapter keeps it terminated only (never both, the VecEnv contract);
- Isaac Lab reuses its buffers: ``terminated``, ``time_outs``, the reward and (manager-based
  envs) observation groups are overwritten in place by the next ``step``, so the adapter hands
  out copies;
- ``num_envs``, ``device``, ``step_dt`` (control period, s), ``max_episode_length`` (steps) and
  ``single_action_space`` (a gymnasium Box) on the env or its ``unwrapped``.

Actions: the policy's [-1, 1] output is clipped to [-1, 1] and, where the env's action space is
bounded, mapped onto its bounds; an unbounded space (Isaac Lab's action terms carry their own
scale, e.g. ``JointPositionActionCfg.scale``, the direct Cartpole's ``action_scale``) receives
the clipped action unchanged.

Shapes: ``N`` = ``num_envs``.
"""

from __future__ import annotations

import contextlib
import importlib.resources
import logging
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from embodied.config import ConfigError
from embodied.env import ObsDict, StepResult
from embodied.errors import EmbodiedError, import_optional
from embodied.io_spec import IOSpec, ObsField, affine_action_fields

log = logging.getLogger("embodied.sim.isaaclab")

INSTALL = (
    "bash scripts/setup_isaaclab.sh, then run .venv-isaaclab/bin/embodied "
    "(Isaac Lab 3 kit-less, Python 3.12; docs/backends.md, 'Isaac Lab')"
)

BUILTIN_ASSETS = "builtin"
"""``asset_root`` value naming the asset tree shipped with embodied (``sim/assets/isaaclab``)."""


def builtin_asset_root() -> Path:
    """The shipped asset tree: a Cartpole and a ground plane written for embodied, laid out where
    Isaac Lab's Cartpole tasks look for theirs (``<root>/Isaac/IsaacLab/...``)."""
    return Path(str(importlib.resources.files("embodied.sim") / "assets" / "isaaclab"))


@dataclass(frozen=True)
class IsaacLabCfg:
    """An Isaac Lab task run as an embodied VecEnv."""

    task_id: str = ""
    """Registered Isaac Lab gymnasium id, e.g. ``Isaac-Cartpole-v0`` (``isaaclab:<id>`` sets it)."""
    factory: str = ""
    """``module:function(cfg, num_envs, device, seed)`` returning the Isaac Lab env; empty:
    :func:`make_isaaclab_env` (Isaac Lab's registry)."""
    policy_group: str = "policy"
    """Observation group fed to the actor."""
    critic_group: str = "critic"
    """Observation group fed to the critic, when the task defines it (else the policy group)."""
    headless: bool = True
    """Start Isaac Sim without a window, where the task needs Isaac Sim (:func:`make_isaaclab_env` only)."""
    asset_root: str = ""
    """Where Isaac Lab loads its assets from (``ISAACSIM_ASSET_ROOT``): empty keeps Isaac Lab's
    (NVIDIA's asset server, a download), ``builtin`` the Cartpole assets shipped here (no
    download), or a folder laid out like NVIDIA's (``<root>/Isaac/IsaacLab/...``)."""
    overrides: tuple[str, ...] = ()
    """Isaac Lab's own Hydra-style config overrides, as its scripts take them, e.g.
    ``presets=newton_mjwarp`` or ``env.episode_length_s=2.0``."""

    def __post_init__(self) -> None:
        if not self.task_id and not self.factory:
            raise ConfigError(
                "isaaclab: task_id is empty; use the task name isaaclab:<TaskId>, e.g. isaaclab:Isaac-Cartpole-Direct"
            )
        bad = [p for p in self.overrides if "=" not in p]
        if bad:
            raise ConfigError(f"env.overrides: each entry is key=value (e.g. env.episode_length_s=2.0), got {bad}")
        if self.asset_root not in ("", BUILTIN_ASSETS) and not Path(self.asset_root).is_dir():
            raise ConfigError(f"env.asset_root: {self.asset_root!r} is not a folder (or use 'builtin' or '')")


def set_asset_root(asset_root: str) -> None:
    """Point Isaac Lab at ``asset_root`` (``ISAACSIM_ASSET_ROOT``) before it reads the variable.

    Isaac Lab reads it once, when ``isaaclab.utils.assets`` is first imported."""
    if not asset_root:
        return
    root = str(builtin_asset_root() if asset_root == BUILTIN_ASSETS else Path(asset_root).resolve())
    current = os.environ.get("ISAACSIM_ASSET_ROOT")
    assets = sys.modules.get("isaaclab.utils.assets")
    if assets is not None and current != root:
        raise ConfigError(
            f"env.asset_root: Isaac Lab already read its asset root ({current!r}) in this process; "
            f"set ISAACSIM_ASSET_ROOT={root} before it starts"
        )
    os.environ["ISAACSIM_ASSET_ROOT"] = root


def make_isaaclab_env(cfg: IsaacLabCfg, num_envs: int, device: torch.device, seed: int) -> Any:
    """Build ``cfg.task_id`` from Isaac Lab's registry with final observations on.

    Kit-less tasks (Newton) start nothing; a task that needs Isaac Sim starts it through Isaac
    Lab's ``launch_simulation``, held open until the env closes. Needs Isaac Lab; on a machine
    without it this raises a named :class:`~embodied.errors.MissingDependencyError`."""
    set_asset_root(cfg.asset_root)
    app = import_optional("isaaclab.app", "the isaaclab backend", INSTALL)
    gymnasium = import_optional("gymnasium", "the isaaclab backend", INSTALL)
    import_optional("isaaclab_tasks", "the isaaclab backend", INSTALL)  # registers the Isaac-* ids
    parse = import_optional("isaaclab_tasks.utils", "the isaaclab backend", INSTALL)
    if cfg.task_id not in gymnasium.registry:
        ids = sorted(k for k in gymnasium.registry if k.startswith("Isaac-"))
        from embodied.config import closest

        raise ConfigError(
            f"isaaclab: unknown task {cfg.task_id!r}; closest: {', '.join(closest(cfg.task_id, ids, 5))} "
            f"({len(ids)} registered by isaaclab_tasks)"
        )
    env_cfg = parse.parse_env_cfg(cfg.task_id, device=str(device), num_envs=num_envs, overrides=list(cfg.overrides))
    env_cfg.seed = seed
    if hasattr(env_cfg, "compute_final_obs"):
        env_cfg.compute_final_obs = True  # Isaac Lab's opt-in for extras["final_obs"]
    launcher = contextlib.ExitStack()
    launch = getattr(app, "launch_simulation", None)
    if launch is not None:  # Isaac Lab 3: starts Isaac Sim only where the config needs it
        launcher.enter_context(launch(env_cfg, {"headless": cfg.headless, "device": str(device)}))
    else:  # Isaac Lab 2: Isaac Sim always
        app.AppLauncher(headless=cfg.headless, device=str(device))
    try:
        env = gymnasium.make(cfg.task_id, cfg=env_cfg)
    except BaseException:
        launcher.close()
        raise
    env.embodied_launcher = launcher  # closed with the env (IsaacLabVecEnv.close)
    return env


def _load_factory(ref: str) -> Callable[..., Any]:
    import importlib

    module, _, attr = ref.partition(":")
    try:
        return getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as err:
        raise ConfigError(f"isaaclab factory {ref!r} cannot be loaded ({err}); expected module:function") from err


def _group(obs: Any, name: str, where: str) -> torch.Tensor:
    if not isinstance(obs, dict) or name not in obs:
        groups = list(obs) if isinstance(obs, dict) else type(obs).__name__
        raise EmbodiedError(f"isaaclab {where}: no observation group {name!r}; the env returned {groups}")
    value = obs[name]
    if not isinstance(value, torch.Tensor) or value.dim() != 2:
        raise EmbodiedError(
            f"isaaclab {where}: observation group {name!r} must be one [N, d] tensor "
            f"(concatenate_terms=True in its ObservationGroupCfg), got {type(value).__name__}"
        )
    return value


class IsaacLabVecEnv:
    """An Isaac Lab RL env as a VecEnv (see the module docstring for what it relies on).

    Build it from the registry (``isaaclab:<TaskId>``) or wrap an existing env with
    ``IsaacLabVecEnv.wrap(env)``."""

    exact_resume = False
    """Isaac Sim's state cannot be captured: a resumed run starts fresh episodes."""

    def __init__(self, cfg: IsaacLabCfg, num_envs: int, device: torch.device | str, seed: int) -> None:
        build = _load_factory(cfg.factory) if cfg.factory else make_isaaclab_env
        env = build(cfg, num_envs=num_envs, device=torch.device(device), seed=seed)
        self._setup(env, cfg, seed)
        if self.num_envs != num_envs:
            raise EmbodiedError(f"isaaclab: asked for {num_envs} envs, the env has {self.num_envs}")

    @classmethod
    def wrap(cls, env: Any, cfg: IsaacLabCfg | None = None, seed: int | None = None) -> IsaacLabVecEnv:
        """Adapt an Isaac Lab env created elsewhere (``gym.make(..., cfg=env_cfg)``)."""
        self = cls.__new__(cls)
        self._setup(env, cfg or IsaacLabCfg(task_id="(wrapped)"), seed)
        return self

    def _setup(self, env: Any, cfg: IsaacLabCfg, seed: int | None) -> None:
        self.env = env
        self.cfg = cfg
        base = getattr(env, "unwrapped", env)
        self.num_envs = int(base.num_envs)
        self.device = torch.device(base.device)
        self.dt = float(base.step_dt)
        self.max_episode_steps = int(base.max_episode_length)
        space = base.single_action_space
        self.action_dim = int(np.prod(space.shape))
        low = np.broadcast_to(np.asarray(space.low, dtype=np.float64), (self.action_dim,))
        high = np.broadcast_to(np.asarray(space.high, dtype=np.float64), (self.action_dim,))
        self._bounded = bool(np.isfinite(low).all() and np.isfinite(high).all())
        mid, half = ((low + high) / 2, (high - low) / 2) if self._bounded else (np.zeros_like(low), np.ones_like(low))
        self._mid = torch.as_tensor(mid, dtype=torch.float32, device=self.device)
        self._half = torch.as_tensor(half, dtype=torch.float32, device=self.device)
        self.exact_final_obs = True
        """False once a step ended episodes without ``extras["final_obs"]`` (see module docstring)."""
        obs = self.reset(seed)
        self.obs_spec = {name: tuple(value.shape[1:]) for name, value in obs.items()}

    # ------------------------------------------------------------------------------ helpers
    def _groups(self, obs: Any, where: str) -> ObsDict:
        # copies: Isaac Lab may overwrite its observation buffers in place on the next step
        out = {"policy": _group(obs, self.cfg.policy_group, where).to(torch.float32, copy=True)}
        if isinstance(obs, dict) and self.cfg.critic_group in obs:
            out["critic"] = _group(obs, self.cfg.critic_group, where).to(torch.float32, copy=True)
        return out

    def _final_obs(self, obs: ObsDict, done: torch.Tensor, extras: dict[str, Any]) -> ObsDict:
        if not bool(done.any()):
            return obs
        final = extras.get("final_obs")
        if final is None:
            if self.exact_final_obs:
                log.warning(
                    "isaaclab: episodes ended without extras['final_obs']; set compute_final_obs=True in the "
                    "env config (Isaac Lab >= the release with it) so time-outs bootstrap from the right state"
                )
            self.exact_final_obs = False
            return obs
        groups = self._groups(final, "extras['final_obs']")
        rows = done.unsqueeze(1)
        return {k: torch.where(rows, groups[k], v) for k, v in obs.items()}

    # ------------------------------------------------------------------------------- VecEnv
    def reset(self, seed: int | None = None) -> ObsDict:
        obs, _ = self.env.reset(seed=seed)
        return self._groups(obs, "reset")

    def step(self, action: torch.Tensor) -> StepResult:
        """Clip ``action`` [N, A] to [-1, 1], map onto a bounded space, step; auto-reset is Isaac Lab's."""
        if tuple(action.shape) != (self.num_envs, self.action_dim):
            raise ValueError(f"action must be [{self.num_envs}, {self.action_dim}], got {tuple(action.shape)}")
        act = self._mid + self._half * action.detach().to(self.device, torch.float32).clamp(-1.0, 1.0)
        raw_obs, reward, terminated, time_outs, extras = self.env.step(act)
        extras = dict(extras or {})
        # copies: Isaac Lab overwrites reset_terminated / reset_time_outs / its reward buffer in place
        terminated = terminated.to(self.device, torch.bool, copy=True).reshape(self.num_envs)
        truncated = time_outs.to(self.device, torch.bool).reshape(self.num_envs)
        if "time_outs" in extras:
            truncated = truncated | torch.as_tensor(extras["time_outs"], device=self.device).bool().reshape(-1)
        truncated = truncated & ~terminated
        obs = self._groups(raw_obs, "step")
        reward = reward.to(self.device, torch.float32, copy=True).reshape(self.num_envs)
        info: dict[str, Any] = {
            "final_obs": self._final_obs(obs, terminated | truncated, extras),
            # Isaac Lab logs per-term episode sums in extras["log"]; per step only the total is known
            "reward_terms": {"total": reward},
            "success": torch.zeros(self.num_envs, dtype=torch.bool, device=self.device),
        }
        return obs, reward, terminated, truncated, info

    def raw_step(self, action: torch.Tensor) -> None:
        """Isaac Lab's own ``step`` on ``action`` [N, A] as the env expects it (already on its device):
        ``embodied bench sim isaaclab:<TaskId>``'s reference for the adapter's cost (``ratio_vs_raw``)."""
        self.env.step(action)

    def io_spec(self) -> IOSpec:
        dim = self.obs_spec["policy"][0]
        return IOSpec(
            obs_fields=(ObsField("policy_obs", dim, description=f"Isaac Lab group {self.cfg.policy_group!r}"),),
            action_fields=affine_action_fields(self._mid.tolist(), self._half.tolist(), "Isaac Lab action term input"),
            control_period_s=self.dt,
            conventions={"source": f"Isaac Lab task {self.cfg.task_id}"},
        )

    def state_dict(self) -> dict[str, Any]:
        """Nothing of Isaac Sim's state (``exact_resume`` is False): resumed runs start fresh episodes."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.reset()

    def close(self) -> None:
        self.env.close()
        launcher = getattr(self.env, "embodied_launcher", None)
        if launcher is not None:
            launcher.close()
