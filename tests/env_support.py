"""Shared pieces of the small torch environments that tests write for themselves."""

from __future__ import annotations

from pathlib import Path
from typing import Any


class StatelessEnvMixin:
    """The ``VecEnv`` methods of a test environment that keeps no state worth saving and holds no
    resources: ``state_dict`` is empty, loading and closing do nothing."""

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass

    def close(self) -> None:
        pass


def fill_rollout(algo: Any, env: Any, obs: dict[str, Any]) -> dict[str, Any]:
    """Step ``env`` with ``algo`` (act, step, observe) until ``algo.ready_to_update()``; returns
    the last observation, where the next rollout continues."""
    from embodied.algo import Transition

    while not algo.ready_to_update():
        action = algo.act(obs)
        next_obs, reward, term, trunc, info = env.step(action)
        algo.observe(Transition(obs, action, reward, term, trunc, next_obs, info["final_obs"]))
        obs = next_obs
    return obs


def load_config_saved_before_camera_keys(run_dir: Path, task: str, algo: str) -> Any:
    """``task``'s experiment config for ``algo``, written to ``run_dir/config.yaml`` without its
    ``env.backend`` group (as a run saved before the task had camera keys) and loaded back.
    Checks first that the written group holds the camera keys, off (camera "", 64 px)."""
    import yaml

    from embodied.experiment import load_experiment, resolve_experiment
    from embodied.training.run import write_config

    write_config(run_dir, resolve_experiment(task, algo))
    path = run_dir / "config.yaml"
    data = yaml.safe_load(path.read_text())
    assert data["env"]["backend"] == {"camera": "", "image_size_px": 64}
    del data["env"]["backend"]
    path.write_text(yaml.safe_dump(data))
    return load_experiment(path)


def repeated_image_rollouts(env: Any, steps: int, seed: int = 7) -> list[list[Any]]:
    """Two rollouts of ``env`` (a :class:`~embodied.env.RenderingEnv` with a camera) from
    ``reset(seed)`` under the same ``steps`` random actions (``[N, A]`` in [-1, 1], drawn once):
    each is a list of ``steps + 1`` image batches ``[N, H, W, 3]`` uint8, the reset's first."""
    import torch

    from embodied.env import IMAGE_GROUP

    gen = torch.Generator().manual_seed(0)
    actions = [torch.rand(env.num_envs, env.action_dim, generator=gen) * 2 - 1 for _ in range(steps)]
    runs = []
    for _ in range(2):
        frames = [env.reset(seed=seed)[IMAGE_GROUP]]
        frames += [env.step(a)[0][IMAGE_GROUP] for a in actions]
        runs.append(frames)
    return runs
