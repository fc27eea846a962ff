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
