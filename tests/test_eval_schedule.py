"""The evaluation schedule on its own (:class:`~embodied.training.eval_schedule.EvalScheduler`):
points of the env-step grid, its checkpoint entry round-tripped, and a snapshot in flight at a
stop evaluated after the resume, here or in a new background child, to the same row.

The scheduler evaluates a real quad-hover PPO policy on real envs (4 short episodes); the
resume test starts two real evaluation children (a few seconds of the second core each)."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from embodied import registry
from embodied.algo import Algorithm
from embodied.experiment import ExperimentCfg, replace_trainer, resolve_experiment
from embodied.policies.cpu_tanh import use_sigmoid_tanh
from embodied.progress import TrainProgress
from embodied.training.background_eval import BackgroundEvaluator, EvalSnapshot, PolicyRecipe
from embodied.training.checkpoint_schema import check_trainer_entry
from embodied.training.eval_schedule import EvalScheduler, next_eval_point, target_held_by
from embodied.training.evaluate import EvalEnvs, evaluate_module
from embodied.training.train_state import TrainState

NUM_ENVS = 4
EVERY = 100
TOTAL = 1000


def _cfg(eval_every_env_steps: int = EVERY, eval_episodes: int = 4) -> ExperimentCfg:
    cfg = resolve_experiment("quad-hover", "ppo", overrides=["env.episode_steps=20"], num_envs=NUM_ENVS, seed=11)
    return replace_trainer(
        cfg,
        total_env_steps=TOTAL,
        eval_every_env_steps=eval_every_env_steps,
        eval_episodes=eval_episodes,
        torch_threads=1,
        progress=False,
        tensorboard=False,
    )


class _Run:
    """A scheduler over a real env and algorithm, with the rows it writes."""

    def __init__(self, cfg: ExperimentCfg) -> None:
        self.cfg = cfg
        self.env = registry.make_env(cfg.task_name, cfg.env, NUM_ENVS, "cpu", cfg.seed)
        self.algo: Algorithm = registry.make_algo(cfg.algo_name, cfg.algo, self.env)
        self.rows: list[tuple[int, dict[str, float]]] = []
        self.scheduler = EvalScheduler(
            cfg.trainer,
            cfg.seed,
            self.algo,
            EvalEnvs(cfg.task_name, cfg.env, "cpu"),
            Path("config.yaml"),
            write_row=lambda env_steps, row: self.rows.append((env_steps, row)),
        )

    def policy(self) -> nn.Module:
        policy = self.algo.policy
        assert isinstance(policy, nn.Module)
        return policy

    def evaluator(self) -> BackgroundEvaluator:
        cfg = self.cfg
        recipe = PolicyRecipe(cfg.task_name, cfg.env, cfg.algo_name, cfg.algo)
        # The child takes this process's tanh form, as the trainer hands it over: with a fixed
        # "tanh" the two differ in the last bits wherever this process measured sigmoid faster.
        tanh_form = "sigmoid" if use_sigmoid_tanh() else "tanh"
        return BackgroundEvaluator(
            EvalEnvs(cfg.task_name, cfg.env, "cpu"), recipe, cfg.trainer.eval_episodes, 1, tanh_form
        )


@pytest.fixture(scope="module")
def run() -> _Run:
    return _Run(_cfg())


def test_each_grid_point_is_due_once_from_the_step_the_run_starts_at(run: _Run) -> None:
    scheduler = run.scheduler
    assert not scheduler.due(0), "nothing is due before begin()"
    scheduler.begin(0)
    assert [scheduler.due(s) for s in (0, 50, 99, 100, 100, 150)] == [False, False, False, True, False, False]
    # an update that crosses two points is one evaluation; the next point is one interval on
    assert scheduler.due(250) and not scheduler.due(250) and scheduler.due(300)
    scheduler.begin(350)  # a resumed run's count
    assert not scheduler.due(399) and scheduler.due(400) and not scheduler.due(499)
    assert next_eval_point(350, EVERY) == 400 and next_eval_point(400, EVERY) == 500
    assert next_eval_point(350, 0) is None
    # an evaluation point within the budget is what a background evaluator is started for
    assert scheduler.periodic_ahead(TOTAL - 1) and not scheduler.periodic_ahead(TOTAL)


def test_without_a_grid_or_episodes_nothing_is_due() -> None:
    no_grid = _Run(_cfg(eval_every_env_steps=0))
    no_grid.scheduler.begin(0)
    assert not any(no_grid.scheduler.due(s) for s in (0, EVERY, TOTAL))
    assert not no_grid.scheduler.periodic_ahead(0)
    no_episodes = _Run(_cfg(eval_episodes=0))
    assert not no_episodes.scheduler.periodic_ahead(0)
    assert not no_episodes.scheduler.final_due(TrainState(env_steps=TOTAL))


@pytest.mark.parametrize(
    ("rates", "each", "mean"),
    [
        ([0.93], False, False),  # one evaluation holds nothing
        ([0.92, 0.93], True, True),
        ([0.916, 0.928], False, True),  # one unlucky evaluation: the mean of 1,000 episodes holds it
        ([0.95, 0.90], False, False),  # the kept (last) policy itself is below the target
        ([0.90, 0.93], False, False),  # the mean is below
        ([0.5, 0.92, 0.93], True, True),  # only the last two count
    ],
)
def test_two_evaluations_hold_the_target_each_or_on_the_mean(rates: list[float], each: bool, mean: bool) -> None:
    assert target_held_by(rates, 0.92, "each") is each
    assert target_held_by(rates, 0.92, "mean") is mean


def test_the_scheduler_holds_the_target_by_the_configured_rule() -> None:
    state = TrainState(env_steps=TOTAL)
    state.evals += [{"eval/success_rate": 0.916}, {"eval/success_rate": 0.928}]
    for hold, held in (("each", False), ("mean", True)):
        cfg = _cfg()
        cfg = replace_trainer(cfg, success_target=0.92, success_hold=hold)
        scheduler = EvalScheduler(cfg.trainer, 0, None, None, Path("config.yaml"), lambda *_: None)  # type: ignore[arg-type]
        assert scheduler.target_held(state) is held


def test_the_final_evaluation_is_due_unless_the_last_step_was_evaluated(run: _Run) -> None:
    state = TrainState(env_steps=TOTAL)
    assert run.scheduler.final_due(state)
    state.evals.append({"eval/env_steps": float(TOTAL - EVERY), "eval/success_rate": 1.0})
    assert run.scheduler.final_due(state)
    state.evals.append({"eval/env_steps": float(TOTAL), "eval/success_rate": 1.0})
    assert not run.scheduler.final_due(state)


def test_an_evaluation_here_writes_its_row_at_the_current_step_with_the_next_seed(run: _Run) -> None:
    run.rows.clear()
    state = TrainState(env_steps=200, train_time_s=1.5)
    seed = run.scheduler.seed(state)
    result = run.scheduler.evaluate_here(state)
    assert run.scheduler.seed(state) != seed, "each evaluation flies other episodes"
    assert result == evaluate_module(run.policy(), run.scheduler.eval_envs, 4, seed)
    ((env_steps, row),) = run.rows
    assert env_steps == 200 and row["eval/env_steps"] == 200.0 and row["eval/train_time_s"] == 1.5
    assert row["eval/success_rate"] == result.success_rate and "perf/eval_time_s" in row
    assert state.evals == [{k: v for k, v in row.items() if not k.startswith("perf/")}]
    assert state.eval_time_s > 0.0


def _saved_and_loaded(entry: dict[str, Any]) -> dict[str, Any]:
    """``entry`` through ``torch.save`` and a ``weights_only`` load, as a checkpoint carries it."""
    buffer = io.BytesIO()
    torch.save(entry, buffer)
    buffer.seek(0)
    loaded: dict[str, Any] = torch.load(buffer, weights_only=True)
    return loaded


def test_the_snapshot_in_flight_round_trips_through_the_checkpoint_entry(run: _Run) -> None:
    assert run.scheduler.state_dict() == {"pending_eval": None}
    snapshot = EvalSnapshot.take(run.policy(), env_steps=300, train_time_s=2.0, seed=1234)
    run.scheduler.pending = snapshot
    entry = _saved_and_loaded(run.scheduler.state_dict())
    # the checkpoint's trainer mapping with this entry passes the checkpoint schema
    counters = {
        "env_steps": 400,
        "updates": 3,
        "train_time_s": 3.0,
        "eval_time_s": 0.0,
        "evals": [],
        "time_to_target_s": None,
        "env_steps_to_target": None,
    }
    check_trainer_entry(counters | entry, Path("latest.pt"), NUM_ENVS, run.policy().state_dict())
    other = _Run(_cfg())
    other.scheduler.load_state_dict(counters | entry)
    restored = other.scheduler.pending
    assert restored is not None
    assert (restored.env_steps, restored.train_time_s, restored.seed) == (300, 2.0, 1234)
    assert restored.policy_state.keys() == snapshot.policy_state.keys()
    for key, value in snapshot.policy_state.items():
        assert torch.equal(restored.policy_state[key], value), key
    # a checkpoint written before pending_eval existed has none in flight
    other.scheduler.load_state_dict(counters)
    assert other.scheduler.pending is None
    run.scheduler.pending = None


def test_a_snapshot_in_flight_at_a_stop_is_evaluated_after_the_resume_to_the_same_row() -> None:
    progress = TrainProgress(TOTAL, enabled=False)
    stopped = _Run(_cfg())
    stopped.scheduler.background = stopped.evaluator()
    state = TrainState(env_steps=300, train_time_s=2.0)
    snapshot_weights = {k: v.clone() for k, v in stopped.policy().state_dict().items()}
    try:
        assert stopped.scheduler.start(state), "the background evaluator takes the snapshot"
        entry = _saved_and_loaded(stopped.scheduler.state_dict())
    finally:
        stopped.scheduler.close()  # a stop: the child is killed, the snapshot stays for the checkpoint
    assert entry["pending_eval"]["env_steps"] == 300

    rows = []
    for background in (False, True):
        resumed = _Run(_cfg())
        with torch.no_grad():  # training ran on past the snapshot: the current weights differ
            for param in resumed.policy().parameters():
                param.add_(0.5)
        resumed.scheduler.load_state_dict(entry)
        if background:
            resumed.scheduler.background = resumed.evaluator()
        resumed_state = TrainState(env_steps=400, train_time_s=3.0)
        try:
            resumed.scheduler.begin(resumed_state.env_steps)  # hands the snapshot to the new child
            assert not resumed.scheduler.collect(resumed_state, progress)
        finally:
            resumed.scheduler.close()
        assert resumed.scheduler.pending is None
        ((env_steps, row),) = resumed.rows
        assert env_steps == 300 and row["eval/train_time_s"] == 2.0, "logged at the snapshot's step"
        assert ("perf/eval_wait_s" in row) and resumed_state.evals == [
            {k: v for k, v in row.items() if not k.startswith("perf/")}
        ]
        rows.append(resumed_state.evals[0])
    assert rows[0] == rows[1], "the same numbers, evaluated here or in the background"

    template = _Run(_cfg())
    template.policy().load_state_dict(snapshot_weights)
    expected = evaluate_module(
        template.policy(), EvalEnvs("quad-hover", template.cfg.env, "cpu"), 4, entry["pending_eval"]["seed"]
    )
    assert rows[0]["eval/success_rate"] == expected.success_rate
    assert rows[0]["eval/mean_return"] == expected.mean_return
