"""Shared pieces of the small torch environments that tests write for themselves."""

from __future__ import annotations

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
