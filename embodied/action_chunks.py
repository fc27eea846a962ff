"""Receding-horizon execution of action chunks, shared by evaluation, exports and ``deploy``.

A chunked policy (a flow sampler) maps an observation to ``H`` future actions at once. The
executor runs the first ``exec_steps`` of them, one per control period, then plans again from
the observation of that moment, so the policy acts at the rate it was trained at. A policy
without chunks is the case ``H = exec_steps = 1`` (a plan every call).

With ``temporal_ensemble`` (``exec_steps`` must be 1) the policy plans every period and the
action is the mean of what the last ``H`` plans said for this period: the plan made now (its
first action), the one made a period ago (its second), and so on. Successive plans of a cloned
policy disagree in ways that push it off the demonstrations; their average does not
(temporal ensembling, as in ACT, with uniform weights).

``policy_io.json`` carries the chunk in ``extra.action_chunk`` (:data:`CHUNK_EXTRA_KEY`):
``{"length": H, "exec_steps": E, "temporal_ensemble": bool}``; absent means ``H = E = 1``. This module imports neither
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
    temporal_ensemble: bool = False
    """Plan every period and act the mean of the last ``length`` plans' actions for it."""

    def __post_init__(self) -> None:
        if not 1 <= self.exec_steps <= self.length:
            raise EmbodiedError(
                f"action chunk: need 1 <= exec_steps <= length, got exec_steps={self.exec_steps}, length={self.length}"
            )
        if self.temporal_ensemble and self.exec_steps != 1:
            raise EmbodiedError(
                f"action chunk: temporal_ensemble plans every period, so exec_steps must be 1 (got {self.exec_steps})"
            )

    def to_dict(self) -> dict[str, int | bool]:
        return {"length": self.length, "exec_steps": self.exec_steps, "temporal_ensemble": self.temporal_ensemble}

    @classmethod
    def from_extra(cls, extra: Mapping[str, Any], where: str = "policy_io extra") -> ChunkSpec:
        """The chunk ``extra`` declares (:data:`CHUNK_EXTRA_KEY`), or ``ChunkSpec()`` when none.

        Raises :class:`EmbodiedError` naming ``where`` for a malformed entry."""
        raw = extra.get(CHUNK_EXTRA_KEY)
        if raw is None:
            return cls()
        form = '{"length": H, "exec_steps": E, "temporal_ensemble": false|true} with integers 1 <= E <= H'
        keys = {"length", "exec_steps", "temporal_ensemble"}
        if not isinstance(raw, Mapping) or not {"length", "exec_steps"} <= set(raw) <= keys:
            raise EmbodiedError(f"{where}.{CHUNK_EXTRA_KEY}: expected {form}, got {raw!r}")
        values = [raw["length"], raw["exec_steps"]]
        ensemble = raw.get("temporal_ensemble", False)
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in values) or not isinstance(ensemble, bool):
            raise EmbodiedError(f"{where}.{CHUNK_EXTRA_KEY}: expected {form}, got {raw!r}")
        try:
            return cls(int(raw["length"]), int(raw["exec_steps"]), ensemble)
        except EmbodiedError as err:
            raise EmbodiedError(f"{where}.{CHUNK_EXTRA_KEY}: {err}") from None


class ChunkExecutor(Generic[ArrayT]):
    """``executor(obs [N, D]) -> action [N, A]``: the next action of the current plan.

    ``plan(obs [N, D]) -> [N, H, A]`` (or ``[N, A]`` for an unchunked policy) is called on the
    first call, every ``exec_steps`` calls after it (every call with ``temporal_ensemble``),
    after :meth:`reset` and when the batch size changes. All rows share one schedule: an env
    whose episode ended mid-plan finishes the old plan first unless the caller resets
    (evaluation counts each env's first episode only).
    """

    def __init__(self, plan: Callable[[ArrayT], ArrayT] | None, spec: ChunkSpec) -> None:
        self.plan_fn = plan
        """The planner ``__call__`` uses (None: only :meth:`step`, which is given one)."""
        self.spec = spec
        self._plans: list[Any] = []
        """Plans still in use, newest last; each ``[N, H, A]``."""
        self._step = 0
        """Calls since the newest plan was made."""

    def reset(self) -> None:
        """Drop the plans: the next call plans from its observation (episode start, re-arming)."""
        self._plans = []

    def _new_plan(self, obs: ArrayT, plan_fn: Callable[[ArrayT], ArrayT]) -> Any:
        plan: Any = plan_fn(obs)
        shape = tuple(plan.shape)
        if len(shape) == 2:  # an unchunked policy: a one-action plan
            return plan[:, None]
        if len(shape) != 3 or shape[1] < self.spec.exec_steps:
            raise EmbodiedError(
                f"a chunked policy must return [N, H, A] with H >= exec_steps={self.spec.exec_steps}, got {shape}"
            )
        return plan

    def __call__(self, obs: ArrayT) -> ArrayT:
        if self.plan_fn is None:
            raise EmbodiedError("this ChunkExecutor has no planner: call step(obs, plan)")
        return self.step(obs, self.plan_fn)

    def step(self, obs: ArrayT, plan_fn: Callable[[ArrayT], ArrayT]) -> ArrayT:
        """The next action ``[N, A]``, planning with ``plan_fn`` when a plan is due."""
        batch = len(obs)  # type: ignore[arg-type]  # numpy arrays and tensors both have a length
        if self._plans and len(self._plans[-1]) != batch:
            self.reset()
        if self.spec.temporal_ensemble:
            # the newest plan says a[0] for now, the one before a[1], ...: average those
            self._plans = [*self._plans, self._new_plan(obs, plan_fn)][-self.spec.length :]
            ages = range(len(self._plans) - 1, -1, -1)
            total: Any = sum(plan[:, age] for plan, age in zip(self._plans, ages, strict=True))
            mean: ArrayT = total / len(self._plans)
            return mean
        if not self._plans or self._step >= self.spec.exec_steps:
            self._plans, self._step = [self._new_plan(obs, plan_fn)], 0
        action: ArrayT = self._plans[-1][:, self._step]
        self._step += 1
        return action
