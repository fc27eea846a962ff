"""When a training run evaluates, where, and what a checkpoint keeps of it (:class:`EvalScheduler`).

The trainer asks at each update whether an evaluation point of the env-step grid
(``trainer.eval_every_env_steps``) has been reached (:meth:`EvalScheduler.due`). At a point, the
evaluation started at the previous one is collected and its row written (:meth:`~EvalScheduler.collect`),
then this one is handed to the background evaluator (:meth:`~EvalScheduler.start`,
:mod:`embodied.training.background_eval`) or, where there is none, evaluated in the training
process (:meth:`~EvalScheduler.evaluate_here`). A result is always collected at a fixed point of
the run (the next evaluation point, or the end), never when it happens to be ready, so the rows
and their order do not depend on timing. The snapshot in flight is the scheduler's checkpoint
state (:meth:`~EvalScheduler.state_dict`, the ``pending_eval`` entry of the checkpoint's
``trainer`` mapping); a resume hands it to the background evaluator again
(:meth:`~EvalScheduler.begin`), or evaluates it here when it is collected.

The evaluation rows and the success-target bookkeeping live in the run's
:class:`~embodied.training.train_state.TrainState`, which the trainer passes to each call (a resume
replaces it).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from torch import nn

from embodied.algo import Algorithm
from embodied.errors import DegenerateRunError, NonFiniteError
from embodied.experiment import TrainerCfg
from embodied.progress import TrainProgress
from embodied.training.background_eval import BackgroundEvalError, BackgroundEvaluator, EvalSnapshot
from embodied.training.evaluate import EvalEnvs, EvalResult, evaluate_module
from embodied.training.train_state import TrainState

log = logging.getLogger(__name__)

EVAL_SEED_OFFSET = 1_000_003
"""Evaluation envs are seeded apart from training envs so they never replay training episodes."""

EVAL_SEED_STRIDE = 7919
"""Each evaluation's seed is this much past the previous one's, so each evaluation flies other episodes."""

WriteRow = Callable[[int, dict[str, float]], None]
"""Writes one metrics row at an env-step count (the trainer's ``metrics.jsonl`` / TensorBoard)."""


def next_eval_point(env_steps: int, every_env_steps: int) -> int | None:
    """The first point of the grid ``every_env_steps, 2 * every_env_steps, ...`` after ``env_steps``
    (None: ``every_env_steps`` 0, no periodic evaluation)."""
    return (env_steps // every_env_steps + 1) * every_env_steps if every_env_steps > 0 else None


def target_held_by(rates: list[float], target: float, rule: str) -> bool:
    """Whether the last two success rates of ``rates`` hold ``target`` under ``rule``: ``each``
    at or above it, or ``mean`` (the last at or above it, and the mean of the two)."""
    if len(rates) < 2:
        return False
    previous, last = rates[-2:]
    if rule == "mean":
        return last >= target and (previous + last) / 2.0 >= target
    return previous >= target and last >= target


class EvalScheduler:
    """The periodic and final evaluations of one training run.

    ``tcfg``: the run's trainer config (grid, episodes, success target, finiteness checks).
    ``seed``: the run's seed (evaluation seeds are derived from it, :meth:`seed`). ``algo``: its
    ``policy`` is what is evaluated. ``eval_envs`` builds the evaluation envs (picklable: the
    background evaluator's child calls it too). ``config_path``: the run's ``config.yaml``, named
    in the error for a degenerate evaluation. ``write_row`` writes an evaluation's metrics row.
    """

    def __init__(
        self,
        tcfg: TrainerCfg,
        seed: int,
        algo: Algorithm,
        eval_envs: EvalEnvs,
        config_path: Path,
        write_row: WriteRow,
    ) -> None:
        self.tcfg = tcfg
        self.run_seed = seed
        self.algo = algo
        self.eval_envs = eval_envs
        self.config_path = config_path
        self.write_row = write_row
        self.background: BackgroundEvaluator | None = None
        """The child process evaluating beside training (None: evaluations run in this process);
        the trainer sets it once it is known whether one is used (:meth:`periodic_ahead`)."""
        self.pending: EvalSnapshot | None = None
        """The snapshot whose evaluation is in flight (None: none); collected at the next
        evaluation point, or at the end."""
        self.policy_restored = False
        """An evaluated snapshot's weights were put back since the last save (the trainer clears it)."""
        self._next_point: int | None = None

    # ----------------------------------------------------------------- the grid
    @property
    def evaluations_on(self) -> bool:
        """Whether this run evaluates at all (``trainer.eval_episodes`` 0 turns every evaluation off)."""
        return self.tcfg.eval_episodes > 0

    def periodic_ahead(self, env_steps: int) -> bool:
        """Whether an evaluation point after ``env_steps`` falls within the budget (a run too
        short for one, e.g. a smoke test, needs no background evaluator)."""
        point = next_eval_point(env_steps, self.tcfg.eval_every_env_steps)
        return point is not None and self.evaluations_on and point <= self.tcfg.total_env_steps

    def begin(self, env_steps: int) -> None:
        """Start the schedule at ``env_steps`` (0, or a resumed run's count): the next point is the
        first after it, and a snapshot the checkpoint had in flight goes to the background
        evaluator again (without one, :meth:`collect` evaluates it here). With evaluations off
        there is no next point, so :meth:`due` never fires."""
        on = self.evaluations_on
        self._next_point = next_eval_point(env_steps, self.tcfg.eval_every_env_steps) if on else None
        if self.pending is not None and self.background is not None:
            self._submit(self.pending)

    def due(self, env_steps: int) -> bool:
        """Whether ``env_steps`` has reached the next evaluation point; when it has, the point moves
        one interval on (each point is due once; an update that crosses several is one evaluation)."""
        if self._next_point is None or env_steps < self._next_point:
            return False
        self._next_point += self.tcfg.eval_every_env_steps
        return True

    def final_due(self, state: TrainState) -> bool:
        """Whether the run's end needs an evaluation: evaluations are on and none was logged at
        the last step."""
        evals = state.evals
        evaluated_last_step = bool(evals) and evals[-1]["eval/env_steps"] == state.env_steps
        return self.evaluations_on and not evaluated_last_step

    # ----------------------------------------------------------- evaluations
    def seed(self, state: TrainState) -> int:
        """The next evaluation's seed: apart from the training envs', another for each evaluation."""
        return self.run_seed + EVAL_SEED_OFFSET + EVAL_SEED_STRIDE * len(state.evals)

    def evaluate_here(self, state: TrainState) -> EvalResult:
        """Evaluate the current policy in this process and write its row at ``state.env_steps``."""
        start = time.perf_counter()
        result = evaluate_module(self.algo.policy, self.eval_envs, self.tcfg.eval_episodes, self.seed(state))
        elapsed = time.perf_counter() - start
        state.eval_time_s += elapsed
        self.record(state, result, state.env_steps, state.train_time_s, {"perf/eval_time_s": elapsed})
        return result

    def start(self, state: TrainState) -> bool:
        """Hand a snapshot of the current policy to the background evaluator and keep it as the
        one in flight. False where there is none, or it cannot take the snapshot (then the
        caller evaluates here, and so does every later point)."""
        if self.background is None:
            return False
        try:
            snapshot = EvalSnapshot.take(self._policy_module(), state.env_steps, state.train_time_s, self.seed(state))
        except Exception as err:  # a policy whose state cannot be copied
            self._drop_background(err)
            return False
        return self._submit(snapshot)

    def collect(self, state: TrainState, progress: TrainProgress) -> bool:
        """Wait for the evaluation in flight (if any) and write its row at the step its snapshot was taken.

        When it makes the success target held, the snapshot's weights are put back into the
        policy (the policy kept is the one evaluated, not the one trained on past it) and this
        returns True."""
        snapshot, self.pending = self.pending, None
        if snapshot is None:
            return False
        start = time.perf_counter()
        result: EvalResult | None = None
        if self.background is not None:
            try:
                result, child_s = self.background.collect()
            except BackgroundEvalError as err:
                self._drop_background(err)
        if result is None:  # no evaluator (failed, or a resume without one): evaluate it here
            result = evaluate_module(
                snapshot.policy_like(self._policy_module()), self.eval_envs, self.tcfg.eval_episodes, snapshot.seed
            )
            child_s = time.perf_counter() - start
        waited = time.perf_counter() - start
        state.eval_time_s += waited
        perf = {"perf/eval_time_s": child_s, "perf/eval_wait_s": waited}
        self.record(state, result, snapshot.env_steps, snapshot.train_time_s, perf)
        progress.update(state.env_steps, {"eval/success_rate": result.success_rate})
        if not self.target_held(state):
            return False
        self._policy_module().load_state_dict(snapshot.policy_state)
        self.policy_restored = True
        log.info(
            "keeping the policy evaluated at %d env steps (training ran on to %d while it was evaluated)",
            snapshot.env_steps,
            state.env_steps,
        )
        return True

    def close(self) -> None:
        """Stop the background evaluator (the snapshot in flight stays, for a checkpoint)."""
        if self.background is not None:
            self.background.close()
        self.background = None

    # ----------------------------------------------------------------- rows
    def record(
        self, state: TrainState, result: EvalResult, env_steps: int, train_time_s: float, perf: dict[str, float]
    ) -> None:
        """Keep, write and check the evaluation of the policy as it was at ``env_steps``
        (``perf``: its timings, written but not kept)."""
        row = {f"eval/{k}": float(v) for k, v in result.as_dict().items()}
        row |= {"eval/train_time_s": train_time_s, "eval/env_steps": float(env_steps)}
        self.keep(state, row)
        self.write_row(env_steps, row | perf)
        log.info(
            "eval at %d env steps (%.2f s training): success %.1f %%, return %.2f, length %.1f",
            env_steps,
            train_time_s,
            100 * result.success_rate,
            result.mean_return,
            result.mean_episode_length,
        )
        if self.tcfg.check_finite:
            self._check(result, env_steps)

    def keep(self, state: TrainState, row: dict[str, float]) -> None:
        """Keep an evaluation row in ``state`` and note when the success target was first reached."""
        state.evals.append(row)
        target = self.tcfg.success_target
        if target is not None and state.time_to_target_s is None and row["eval/success_rate"] >= target:
            state.time_to_target_s = row["eval/train_time_s"]
            state.env_steps_to_target = int(row["eval/env_steps"])

    def target_held(self, state: TrainState) -> bool:
        """The last two evaluations hold the success target (``trainer.success_hold``)."""
        target = self.tcfg.success_target
        rates = [e["eval/success_rate"] for e in state.evals[-2:]]
        return target is not None and target_held_by(rates, target, self.tcfg.success_hold)

    # ----------------------------------------------------------- checkpoints
    def state_dict(self) -> dict[str, Any]:
        """The scheduler's entries of a checkpoint's ``trainer`` mapping: ``pending_eval``, the
        snapshot in flight (numbers and tensors, see :meth:`EvalSnapshot.to_checkpoint`) or None."""
        return {"pending_eval": None if self.pending is None else self.pending.to_checkpoint()}

    def load_state_dict(self, trainer_entry: dict[str, Any]) -> None:
        """Take the snapshot in flight from a checkpoint's ``trainer`` mapping (checked by
        :mod:`embodied.training.checkpoint_schema`; one written before ``pending_eval`` existed has none)."""
        pending = trainer_entry.get("pending_eval")
        self.pending = None if pending is None else EvalSnapshot.from_checkpoint(pending)

    # ----------------------------------------------------------------- helpers
    def _policy_module(self) -> nn.Module:
        """The policy as a torch module (snapshots are only taken of one)."""
        policy = self.algo.policy
        if not isinstance(policy, nn.Module):
            raise TypeError(f"background evaluation needs a torch module policy, got {type(policy).__name__}")
        return policy

    def _submit(self, snapshot: EvalSnapshot) -> bool:
        """Hand ``snapshot`` to the background evaluator and keep it as the one in flight;
        False (evaluating here from now on) where the child cannot take it."""
        assert self.background is not None
        try:
            self.background.submit(snapshot)
        except Exception as err:  # a child that cannot start or be reached
            self._drop_background(err)
            return False
        self.pending = snapshot
        return True

    def _drop_background(self, err: Exception) -> None:
        """Evaluate in this process from now on (after the background evaluator failed)."""
        log.warning("background evaluation failed, evaluating in the training process from now on: %s", err)
        self.close()

    def _check(self, result: EvalResult, env_steps: int) -> None:
        where = f"evaluation at {env_steps} env steps"
        if not (math.isfinite(result.mean_return) and math.isfinite(result.std_return)):
            raise NonFiniteError(f"non-finite mean return {result.mean_return} in the {where}")
        if result.mean_episode_length <= 1.0:
            raise DegenerateRunError(
                f"every episode of the {where} ended at its first step: the simulation diverges at once; "
                f"check the env.* values in {self.config_path}"
            )
