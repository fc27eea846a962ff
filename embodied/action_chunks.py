"""Receding-horizon execution of action chunks, shared by evaluation, exports and ``deploy``.

A chunked policy (a flow sampler) maps an observation to ``H`` future actions at once. The
executor runs the first ``exec_steps`` of them, one per control period, then plans again from
the observation of that moment, so the policy acts at the rate it was trained at. A policy
without chunks is the case ``H = exec_steps = 1`` (a plan every call).

``policy_io.json`` carries the chunk in ``extra.action_chunk`` (:data:`CHUNK_EXTRA_KEY`):
``{"length": H, "exec_steps": E}``; absent means ``H = E = 1``. This module imports neither
torch nor numpy: plans may be numpy arrays (the deploy runtime) or torch tensors (evaluation).

Shapes: ``N`` = batch (envs), ``D`` = observation size, ``H`` = chunk length, ``A`` = action size.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from embodied.errors import EmbodiedError

CHUNK_EXTRA_KEY = "action_chunk"
"""``IOSpec.extra`` / ``policy_io.json`` ``extra`` key of a chunked policy's :class:`ChunkSpec`."""

ArrayT = TypeVar("ArrayT")
"""``numpy.ndarray`` or ``torch.Tensor``: anything indexed as ``plan[:, step]``."""


@dataclass(frozen=True)
class ChunkSpec:
    """``length`` actions per plan (``H``), the first ``exec_steps`` of which run before re-planning."""

    length: int = 1
    exec_steps: int = 1

    def __post_init__(self) -> None:
        if not 1 <= self.exec_steps <= self.length:
            raise EmbodiedError(
                f"action chunk: need 1 <= exec_steps <= length, got exec_steps={self.exec_steps}, length={self.length}"
            )

    def to_dict(self) -> dict[str, int]:
        return {"length": self.length, "exec_steps": self.exec_steps}

    @classmethod
    def from_extra(cls, extra: Mapping[str, Any], where: str = "policy_io extra") -> ChunkSpec:
        """The chunk ``extra`` declares (:data:`CHUNK_EXTRA_KEY`), or ``ChunkSpec()`` when none.

        Raises :class:`EmbodiedError` naming ``where`` for a malformed entry."""
        raw = extra.get(CHUNK_EXTRA_KEY)
        if raw is None:
            return cls()
        form = '{"length": H, "exec_steps": E} with integers 1 <= E <= H'
        if not isinstance(raw, Mapping) or set(raw) != {"length", "exec_steps"}:
            raise EmbodiedError(f"{where}.{CHUNK_EXTRA_KEY}: expected {form}, got {raw!r}")
        values = [raw["length"], raw["exec_steps"]]
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in values):
            raise EmbodiedError(f"{where}.{CHUNK_EXTRA_KEY}: expected {form}, got {raw!r}")
        try:
            return cls(int(raw["length"]), int(raw["exec_steps"]))
        except EmbodiedError as err:
            raise EmbodiedError(f"{where}.{CHUNK_EXTRA_KEY}: {err}") from None


class ChunkExecutor(Generic[ArrayT]):
    """``executor(obs [N, D]) -> action [N, A]``: the next action of the current plan.

    ``plan(obs [N, D]) -> [N, H, A]`` (or ``[N, A]`` for an unchunked policy) is called on the
    first call, every ``exec_steps`` calls after it, after :meth:`reset` and when the batch size
    changes. All rows share one schedule: an env whose episode ended mid-plan finishes the old
    plan first unless the caller resets (evaluation counts each env's first episode only).
    """

    def __init__(self, plan: Callable[[ArrayT], ArrayT], spec: ChunkSpec) -> None:
        self.plan_fn = plan
        self.spec = spec
        self._plan: Any = None
        self._step = 0

    def reset(self) -> None:
        """Drop the plan: the next call plans from its observation (episode start, re-arming)."""
        self._plan = None

    def __call__(self, obs: ArrayT) -> ArrayT:
        batch = len(obs)  # type: ignore[arg-type]  # numpy arrays and tensors both have a length
        if self._plan is None or len(self._plan) != batch or self._step >= self.spec.exec_steps:
            plan = self.plan_fn(obs)
            shape = tuple(plan.shape)  # type: ignore[attr-defined]
            if len(shape) == 2:  # an unchunked policy: a one-action plan
                plan = plan[:, None]  # type: ignore[index]
            elif len(shape) != 3 or shape[1] < self.spec.exec_steps:
                raise EmbodiedError(
                    f"a chunked policy must return [N, H, A] with H >= exec_steps={self.spec.exec_steps}, got {shape}"
                )
            self._plan, self._step = plan, 0
        action: ArrayT = self._plan[:, self._step]
        self._step += 1
        return action
