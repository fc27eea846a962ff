"""Gymnasium in both directions: any registered env id as a VecEnv, any VecEnv as a gymnasium env.

``GymnasiumVecEnv`` (task name ``gym:<EnvId>``) runs ``gymnasium.make_vec`` and converts at the
boundary: numpy in and out of gymnasium, torch tensors [N, ...] on ``device`` for embodied.
Box actions arrive normalized to [-1, 1] and are rescaled to the space's bounds; a Discrete
action space is exposed as ``action_space_kind == "discrete"`` (``num_actions`` choices, actions
are integer indices ``[N]`` or ``[N, 1]``) so continuous-only algorithms can reject it.
Observations are flattened to float32 group ``"policy"``. Terminated and truncated stay apart,
and each of gymnasium 1.x's autoreset modes is translated into the embodied contract (the
returned observation of an ended env is already the next episode's first one, the last one is
in ``info["final_obs"]``).

``to_gymnasium(vec_env)`` exposes an embodied VecEnv as a ``gymnasium.vector.VectorEnv``
(same-step autoreset, numpy float32); ``to_gymnasium_env(vec_env)`` wraps a one-env batch as a
plain ``gymnasium.Env`` so ``gymnasium.utils.env_checker.check_env`` can inspect it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import gymnasium
import numpy as np
import torch
from gymnasium import spaces
from gymnasium.vector import AutoresetMode, VectorEnv

from embodied.config import ConfigError, closest, ranged
from embodied.env import ObsDict, StepResult
from embodied.errors import EmbodiedError
from embodied.io_spec import ActionField, IOSpec, ObsField


@dataclass(frozen=True)
class GymnasiumCfg:
    """A registered gymnasium environment run as an embodied VecEnv."""

    env_id: str = ""
    """Registered gymnasium id, e.g. ``Pendulum-v1`` (the task name ``gym:<id>`` sets it)."""
    vectorization: Literal["sync", "async", "vector_entry_point"] = "sync"
    """gymnasium ``make_vec`` mode; ``async`` runs one process per env (slower on few cores)."""
    normalize_action: bool = True
    """Rescale Box actions from [-1, 1] to the space's bounds; False passes them unchanged."""
    max_episode_steps: int = ranged(0, 0, 10_000_000, "control steps")
    """Time limit override in steps; 0 keeps the id's registered limit."""

    def __post_init__(self) -> None:
        if self.max_episode_steps < 0:
            raise ConfigError(f"max_episode_steps must be >= 0 (0: registered limit), got {self.max_episode_steps}")


def _check_env_id(env_id: str) -> gymnasium.envs.registration.EnvSpec:
    ids = list(gymnasium.registry.keys())
    if not env_id or env_id not in gymnasium.registry:
        near = ", ".join(closest(env_id, ids, n=5)[:5])
        raise ConfigError(
            f"unknown gymnasium env id {env_id!r}; closest registered ids: {near} "
            f"({len(ids)} registered; gymnasium.pprint_registry() lists them)"
        )
    return gymnasium.spec(env_id)


def _flat_batch(space: spaces.Space[Any], batch: Any, n: int) -> np.ndarray:
    """Batched observations of ``space`` as float32 ``[n, flatdim]``."""
    if isinstance(space, spaces.Box):
        return np.asarray(batch, dtype=np.float32).reshape(n, -1)
    if isinstance(space, spaces.Discrete):
        onehot = np.zeros((n, int(space.n)), dtype=np.float32)
        onehot[np.arange(n), np.asarray(batch, dtype=np.int64) - int(space.start)] = 1.0
        return onehot
    rows = [
        spaces.flatten(space, item)
        for item in gymnasium.vector.utils.iterate(gymnasium.vector.utils.batch_space(space, n), batch)
    ]
    return np.asarray(rows, dtype=np.float32).reshape(n, -1)


class GymnasiumVecEnv:
    """``num_envs`` copies of ``cfg.env_id`` through ``gymnasium.make_vec``; see module docstring.

    ``action_space_kind`` is ``"box"`` (``action_dim`` = flattened Box size) or ``"discrete"``
    (``action_dim`` = 1, ``num_actions`` choices).
    """

    exact_resume = False
    """A generic gymnasium env's simulator state cannot be captured: resumed runs re-reset it."""

    def __init__(self, cfg: GymnasiumCfg, num_envs: int, device: torch.device | str, seed: int) -> None:
        spec = _check_env_id(cfg.env_id)
        if num_envs < 1:
            raise ConfigError(f"num_envs must be >= 1, got {num_envs}")
        self.cfg = cfg
        self.num_envs = int(num_envs)
        self.device = torch.device(device)
        make_kwargs: dict[str, Any] = {}
        if cfg.max_episode_steps:
            make_kwargs["max_episode_steps"] = cfg.max_episode_steps
        vector_kwargs: dict[str, Any] = {}
        if cfg.vectorization in ("sync", "async"):
            # same-step autoreset matches the embodied contract directly
            vector_kwargs["autoreset_mode"] = AutoresetMode.SAME_STEP
        elif spec.vector_entry_point is None:
            raise ConfigError(f"{cfg.env_id} has no vector_entry_point; use vectorization 'sync' or 'async'")
        self.vec: VectorEnv = gymnasium.make_vec(
            cfg.env_id,
            num_envs=self.num_envs,
            vectorization_mode=cfg.vectorization,
            vector_kwargs=vector_kwargs,
            **make_kwargs,
        )
        self.autoreset_mode = AutoresetMode(self.vec.metadata.get("autoreset_mode", AutoresetMode.NEXT_STEP))
        self._single_obs = self.vec.single_observation_space
        act = self.vec.single_action_space
        self.num_actions = 0
        if isinstance(act, spaces.Box):
            self.action_space_kind = "box"
            self.action_dim = int(np.prod(act.shape))
            low = np.asarray(act.low, dtype=np.float64).reshape(-1)
            high = np.asarray(act.high, dtype=np.float64).reshape(-1)
            bounded = np.isfinite(low) & np.isfinite(high) & cfg.normalize_action
            # unbounded dimensions (or normalize_action=False) pass the action through
            self._act_mid = np.where(bounded, (low + high) / 2, 0.0)
            self._act_half = np.where(bounded, (high - low) / 2, 1.0)
            self._act_shape = act.shape
            self._act_dtype = act.dtype
        elif isinstance(act, spaces.Discrete):
            self.action_space_kind = "discrete"
            self.action_dim = 1
            self.num_actions = int(act.n)
            self._act_start = int(act.start)
        else:
            self.vec.close()
            raise EmbodiedError(f"{cfg.env_id}: action space {act} is not supported (only Box and Discrete)")
        self.obs_spec = {"policy": (spaces.flatdim(self._single_obs),)}
        limit = cfg.max_episode_steps or spec.max_episode_steps or 0
        self.max_episode_steps = int(limit)
        self.dt = self._control_period()
        self._seed = seed
        self.episode_step = np.zeros(self.num_envs, dtype=np.int64)
        self.reset(seed)

    def _control_period(self) -> float:
        envs = getattr(self.vec, "envs", None)
        if envs:
            dt = getattr(envs[0].unwrapped, "dt", None)
            if isinstance(dt, int | float) and dt > 0:
                return float(dt)
        fps = self.vec.metadata.get("render_fps")
        return 1.0 / float(fps) if fps else 0.0

    def _obs(self, batch: Any) -> np.ndarray:
        return _flat_batch(self._single_obs, batch, self.num_envs)

    def _to_torch(self, array: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(np.ascontiguousarray(array)).to(self.device)

    def _gym_action(self, action: torch.Tensor) -> np.ndarray:
        a = action.detach().cpu().numpy()
        if self.action_space_kind == "discrete":
            index = a.reshape(self.num_envs, -1)
            if index.shape[1] != 1:
                raise ValueError(f"discrete actions must be [{self.num_envs}] or [{self.num_envs}, 1] indices")
            return index[:, 0].astype(np.int64) + self._act_start
        flat = np.asarray(a, dtype=np.float64).reshape(self.num_envs, self.action_dim)
        if self.cfg.normalize_action:
            flat = np.clip(flat, -1.0, 1.0)
        physical = self._act_mid + self._act_half * flat
        return physical.reshape(self.num_envs, *self._act_shape).astype(self._act_dtype)

    def reset(self, seed: int | None = None) -> ObsDict:
        """Reset every env (``seed`` -> env i gets ``seed + i``). Obs ``[N, obs_dim]`` float32."""
        obs, _ = self.vec.reset(seed=seed)
        self.episode_step[:] = 0
        return {"policy": self._to_torch(self._obs(obs))}

    def step(self, action: torch.Tensor) -> StepResult:
        """Box: ``action`` [N, A] in [-1, 1]; Discrete: indices [N] or [N, 1]."""
        obs_raw, reward, terminated, truncated, info = self.vec.step(self._gym_action(action))
        obs = self._obs(obs_raw)
        term = np.asarray(terminated, dtype=bool)
        trunc = np.asarray(truncated, dtype=bool)
        done = term | trunc
        final = obs.copy()
        if done.any():
            if self.autoreset_mode == AutoresetMode.SAME_STEP:
                # the env already reset: the returned obs is the next episode's first one
                mask = info.get("_final_obs", done)
                for i in np.flatnonzero(mask):
                    final[i] = np.asarray(spaces.flatten(self._single_obs, info["final_obs"][i]), dtype=np.float32)
            else:
                # next-step or disabled autoreset: reset the ended envs now, keep the others
                reset_obs, _ = self.vec.reset(options={"reset_mask": done.copy()})
                obs = np.where(done[:, None], self._obs(reset_obs), obs)
        self.episode_step = np.where(done, 0, self.episode_step + 1)
        success = np.zeros(self.num_envs, dtype=bool)
        for key in ("is_success", "success"):
            if key in info:
                success = np.asarray(info[key], dtype=bool) & done
                break
        reward_np = np.asarray(reward, dtype=np.float32)
        return (
            {"policy": self._to_torch(obs)},
            self._to_torch(reward_np),
            self._to_torch(term),
            self._to_torch(trunc),
            {
                "final_obs": {"policy": self._to_torch(final)},
                "reward_terms": {"env": self._to_torch(reward_np)},
                "success": self._to_torch(success),
            },
        )

    def raw_step(self, action: torch.Tensor) -> None:
        """The gymnasium vector env's own step on ``action`` [N, A] mapped to its space (``bench sim``'s
        reference): no observation flattening, final observations, torch tensors or episode counting.

        Meant for benchmarks only: it leaves this adapter's episode counters behind the env's."""
        self.vec.step(self._gym_action(action))

    def io_spec(self) -> IOSpec:
        obs = (ObsField("obs", self.obs_spec["policy"][0], description=f"flattened {self._single_obs}"),)
        actions: tuple[ActionField, ...]
        if self.action_space_kind == "discrete":
            actions = (ActionField("action_index", 1, low=0.0, high=float(self.num_actions - 1)),)
        else:
            space = self.vec.single_action_space
            assert isinstance(space, spaces.Box)
            # normalized actions live in [-1, 1]; raw ones in the space's own bounds
            low = np.full(self.action_dim, -1.0) if self.cfg.normalize_action else space.low.reshape(-1)
            high = np.full(self.action_dim, 1.0) if self.cfg.normalize_action else space.high.reshape(-1)
            actions = tuple(
                ActionField(
                    f"action_{i}",
                    1,
                    scale=float(self._act_half[i]),
                    offset=float(self._act_mid[i]),
                    low=float(low[i]),
                    high=float(high[i]),
                )
                for i in range(self.action_dim)
            )
        return IOSpec(
            obs,
            actions,
            control_period_s=self.dt,
            extra={"env_id": self.cfg.env_id, "action_space_kind": self.action_space_kind},
        )

    def state_dict(self) -> dict[str, Any]:
        """Episode counters only: an arbitrary gymnasium env's simulator state is not capturable;
        after loading, call ``reset`` (episodes restart)."""
        return {"episode_step": torch.from_numpy(self.episode_step.copy()), "env_id": self.cfg.env_id}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("env_id") != self.cfg.env_id:
            raise ValueError(f"state is for {state.get('env_id')!r}, this env runs {self.cfg.env_id!r}")
        self.episode_step[:] = np.asarray(state["episode_step"])

    def close(self) -> None:
        self.vec.close()


# ------------------------------------------------------------------------ embodied -> gymnasium
def _vec_spaces(vec_env: Any) -> tuple[spaces.Box, spaces.Box]:
    obs_dim = int(vec_env.obs_spec["policy"][0])
    obs = spaces.Box(-np.inf, np.inf, shape=(obs_dim,), dtype=np.float32)
    act = spaces.Box(-1.0, 1.0, shape=(int(vec_env.action_dim),), dtype=np.float32)
    return obs, act


class EmbodiedVectorEnv(VectorEnv):
    """An embodied VecEnv as a gymnasium vector env (numpy float32; same-step autoreset).

    ``info["final_obs"]`` is ``[N, obs_dim]`` with mask ``info["_final_obs"]`` (ended envs).
    """

    def __init__(self, vec_env: Any) -> None:
        self.env = vec_env
        self.num_envs = int(vec_env.num_envs)
        self.single_observation_space, self.single_action_space = _vec_spaces(vec_env)
        self.observation_space = gymnasium.vector.utils.batch_space(self.single_observation_space, self.num_envs)
        self.action_space = gymnasium.vector.utils.batch_space(self.single_action_space, self.num_envs)
        self.metadata = {"autoreset_mode": AutoresetMode.SAME_STEP}
        if getattr(vec_env, "dt", 0):
            self.metadata["render_fps"] = round(1.0 / float(vec_env.dt))

    def reset(
        self, *, seed: int | list[int | None] | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        if isinstance(seed, list):
            seed = seed[0]
        if seed is not None:
            self._np_random, self._np_random_seed = gymnasium.utils.seeding.np_random(seed)
        obs = self.env.reset(seed)
        return obs["policy"].cpu().numpy(), {}

    def step(self, actions: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        action = torch.as_tensor(np.asarray(actions, dtype=np.float32), device=self.env.device)
        obs, reward, terminated, truncated, info = self.env.step(action.reshape(self.num_envs, -1))
        term = terminated.cpu().numpy()
        trunc = truncated.cpu().numpy()
        out_info: dict[str, Any] = {
            "final_obs": info["final_obs"]["policy"].cpu().numpy(),
            "_final_obs": term | trunc,
        }
        for name, value in info.get("reward_terms", {}).items():
            out_info[f"reward_{name}"] = value.cpu().numpy()
        return obs["policy"].cpu().numpy(), reward.cpu().numpy(), term, trunc, out_info

    def close_extras(self, **kwargs: Any) -> None:
        self.env.close()


def to_gymnasium(vec_env: Any) -> EmbodiedVectorEnv:
    """Expose an embodied VecEnv (any task) as a ``gymnasium.vector.VectorEnv``."""
    return EmbodiedVectorEnv(vec_env)


class EmbodiedEnv(gymnasium.Env[np.ndarray, np.ndarray]):
    """A one-env embodied VecEnv as a plain ``gymnasium.Env`` (for ``env_checker`` and tools)."""

    metadata: dict[str, Any] = {"render_modes": []}  # noqa: RUF012 - gymnasium's class attribute

    def __init__(self, vec_env: Any) -> None:
        if int(vec_env.num_envs) != 1:
            raise ValueError(f"EmbodiedEnv wraps a batch of one env, got num_envs={vec_env.num_envs}")
        self.env = vec_env
        self.observation_space, self.action_space = _vec_spaces(vec_env)

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        super().reset(seed=seed)
        return self.env.reset(seed)["policy"][0].cpu().numpy(), {}

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        a = torch.as_tensor(np.asarray(action, dtype=np.float32), device=self.env.device).reshape(1, -1)
        obs, reward, terminated, truncated, info = self.env.step(a)
        done = bool(terminated[0] or truncated[0])
        # gymnasium's single envs do not autoreset: report the episode's last observation
        shown = info["final_obs"]["policy"] if done else obs["policy"]
        return shown[0].cpu().numpy(), float(reward[0]), bool(terminated[0]), bool(truncated[0]), {}

    def close(self) -> None:
        self.env.close()


def to_gymnasium_env(vec_env: Any) -> EmbodiedEnv:
    """Wrap a one-env embodied VecEnv as a ``gymnasium.Env`` (build the task with num_envs=1)."""
    return EmbodiedEnv(vec_env)
