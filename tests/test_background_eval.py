"""Evaluations in a background process (``trainer.background_eval``): the same numbers as
evaluating in the training process, the evaluated weights kept on a stop at the success target,
an evaluation in flight carried through a checkpoint, and the fall-back when the child fails.

Each test spawns a real child process (``multiprocessing`` spawn) that imports torch and the
project, so each costs a few seconds of the second core."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import pytest
import torch
from signal_support import signal_handler

from embodied.experiment import ExperimentCfg, replace_trainer, resolve_experiment
from embodied.training.background_eval import background_eval_choice
from embodied.training.run import load_checkpoint, read_metrics
from embodied.training.trainer import Trainer

NUM_ENVS = 16
STEPS_PER_ENV = 8
UPDATE = NUM_ENVS * STEPS_PER_ENV
"""Env steps per PPO update (one rollout)."""


def _cfg(background: bool, total_updates: int, success_target: float | None = None) -> ExperimentCfg:
    """quad-hover PPO, evaluated after every update on 16 short episodes.

    Every episode starts level and at rest on the setpoint and lasts 0.2 s, so even an untrained
    policy (its mean is the hover command) ends most of them inside the success radius: the
    success target can be held after two evaluations."""
    cfg = resolve_experiment(
        "quad-hover",
        "ppo",
        overrides=[
            f"algo.num_steps_per_env={STEPS_PER_ENV}",
            "algo.lr_cooldown=0",
            "env.init_level_fraction=1.0",
            "env.episode_steps=20",
        ],
        num_envs=NUM_ENVS,
        seed=5,
    )
    return replace_trainer(
        cfg,
        total_env_steps=total_updates * UPDATE,
        eval_every_env_steps=UPDATE,
        eval_episodes=16,
        checkpoint_every_updates=1,
        torch_threads=1,
        background_eval=background,
        success_target=success_target,
        progress=False,
        tensorboard=False,
    )


def _evals(run_dir: Path) -> list[dict]:
    """The evaluation rows, without wall-clock entries."""
    return [
        {k: v for k, v in row.items() if k.startswith("eval/") and "time_s" not in k}
        for row in read_metrics(run_dir)
        if "eval/success_rate" in row
    ]


def _policy(run_dir: Path) -> dict[str, torch.Tensor]:
    """The saved policy's weights (``ckpt/latest.pt``)."""
    policy: dict[str, torch.Tensor] = load_checkpoint(run_dir)["algo"]["policy"]
    return policy


def test_background_evaluations_match_evaluating_in_the_training_process(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    here = Trainer(_cfg(False, 4), tmp_path / "here")
    assert here._background is None
    here.train()
    background = Trainer(_cfg(True, 4), tmp_path / "background")
    assert background._background is not None
    background.train()
    # the child rebuilt the policy from the run's config and flew every snapshot itself
    assert "background evaluation failed" not in caplog.text
    rows = _evals(tmp_path / "here")
    assert [r["eval/env_steps"] for r in rows] == [UPDATE * i for i in range(1, 5)]
    assert _evals(tmp_path / "background") == rows
    # training never saw the evaluations: the final weights are the same
    here_w, background_w = _policy(tmp_path / "here"), _policy(tmp_path / "background")
    assert here_w.keys() == background_w.keys()
    for key in here_w:
        assert torch.equal(here_w[key], background_w[key]), key


def test_a_stop_on_the_success_target_keeps_the_evaluated_weights(tmp_path: Path) -> None:
    here = Trainer(_cfg(False, 20, success_target=0.5), tmp_path / "here")
    here.train()
    rows = _evals(tmp_path / "here")
    assert len(rows) == 2 and all(r["eval/success_rate"] >= 0.5 for r in rows), rows
    background = Trainer(_cfg(True, 20, success_target=0.5), tmp_path / "background")
    state = background.train()
    # the second result arrives one evaluation later: training ran one update past it ...
    assert state.env_steps == 3 * UPDATE
    assert _evals(tmp_path / "background") == rows
    assert state.env_steps_to_target == UPDATE
    # ... and the saved policy is the one evaluated, as the synchronous run saved it
    here_policy, background_policy = _policy(tmp_path / "here"), _policy(tmp_path / "background")
    assert here_policy and here_policy.keys() == background_policy.keys()
    for key in here_policy:
        assert torch.equal(here_policy[key], background_policy[key]), key
    from embodied.training.run_policy import policy_artifact

    # the policy artifact that export and deploy read was written from the kept weights
    artifact = policy_artifact(tmp_path / "background")
    assert artifact.env_steps == state.env_steps
    obs = torch.linspace(-1.0, 1.0, 4 * artifact.io_spec.obs_dim).reshape(4, -1)
    torch.testing.assert_close(
        artifact.module()(obs), policy_artifact(tmp_path / "here").module()(obs), rtol=0.0, atol=0.0
    )


def test_an_evaluation_in_flight_at_a_stop_is_kept_and_redone_on_resume(tmp_path: Path) -> None:
    straight = Trainer(_cfg(True, 5), tmp_path / "straight")
    straight.train()
    trainer = Trainer(_cfg(True, 5), tmp_path / "split")
    real_update = trainer.algo.update
    updates = 0

    def update_then_ctrl_c() -> dict[str, float]:
        nonlocal updates
        updates += 1
        if updates == 2:
            os.kill(os.getpid(), signal.SIGINT)  # honoured at the next loop top, after this update's eval point
        return real_update()

    trainer.algo.update = update_then_ctrl_c  # type: ignore[method-assign]
    # A test run started as a background job inherits Ctrl-C ignored, and the trainer leaves an
    # ignored signal ignored (embodied.stop.deferred_stop): give this test Python's own handler.
    with signal_handler(signal.SIGINT, signal.default_int_handler), pytest.raises(KeyboardInterrupt):
        trainer.train()
    pending = load_checkpoint(tmp_path / "split")["trainer"]["pending_eval"]
    assert pending is not None and pending["env_steps"] == 2 * UPDATE
    # the snapshot is a state dict of the policy's form (tensors), never a pickled module
    policy = load_checkpoint(tmp_path / "split")["algo"]["policy"]
    assert set(pending) == {"env_steps", "train_time_s", "seed", "policy_state"}
    assert pending["policy_state"].keys() == policy.keys()
    assert all(isinstance(v, torch.Tensor) for v in pending["policy_state"].values())
    Trainer(_cfg(True, 5), tmp_path / "split", resume=True).train()
    assert _evals(tmp_path / "split") == _evals(tmp_path / "straight")


def test_a_child_that_cannot_build_the_task_falls_back_to_evaluating_here(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    from embodied.training import trainer as trainer_module
    from embodied.training.background_eval import BackgroundEvaluator

    here = Trainer(_cfg(False, 3), tmp_path / "here")
    here.train()

    def child_without_the_task(make_env: object, *args: Any) -> BackgroundEvaluator:
        # as for a task registered at run time in the trainer's process only
        return BackgroundEvaluator(_unknown_task_envs, *args)

    monkeypatch.setattr(trainer_module, "BackgroundEvaluator", child_without_the_task)
    trainer = Trainer(_cfg(True, 3), tmp_path / "fallback")
    assert trainer._background is not None
    trainer.train()
    assert "background evaluation failed" in caplog.text
    assert _evals(tmp_path / "fallback") == _evals(tmp_path / "here")


def _unknown_task_envs(num_envs: int, seed: int) -> None:
    from embodied import registry

    registry.make_env("no-such-task", None, num_envs, "cpu", seed)


def test_the_automatic_choice_needs_a_spare_core_and_one_cpu_process() -> None:
    cpu = torch.device("cpu")
    cores = len(os.sched_getaffinity(0))
    use, _ = background_eval_choice("auto", device=cpu, processes=1, periodic=True, threads=cores)
    assert not use
    use, why = background_eval_choice(True, device=cpu, processes=1, periodic=True, threads=cores)
    assert use, why
    assert not background_eval_choice("auto", device=cpu, processes=2, periodic=True, threads=1)[0]
    assert not background_eval_choice(True, device=torch.device("cuda"), processes=1, periodic=True, threads=1)[0]
    assert not background_eval_choice("auto", device=cpu, processes=1, periodic=False, threads=1)[0]
    assert not background_eval_choice(False, device=cpu, processes=1, periodic=True, threads=1)[0]
    if cores >= 2:
        assert background_eval_choice("auto", device=cpu, processes=1, periodic=True, threads=1)[0]


def test_a_script_without_a_main_guard_is_not_run_again_by_the_child(tmp_path: Path) -> None:
    import subprocess
    import sys

    marker = tmp_path / "top-level-runs.txt"
    script = tmp_path / "train_script.py"
    script.write_text(
        "from pathlib import Path\n"
        "from embodied.experiment import replace_trainer, resolve_experiment\n"
        "from embodied.training.trainer import Trainer\n"
        f"with open({str(marker)!r}, 'a') as fh:\n"
        "    fh.write('ran\\n')\n"
        "cfg = resolve_experiment('quad-hover', 'ppo', num_envs=16, overrides=['algo.num_steps_per_env=8'])\n"
        "cfg = replace_trainer(cfg, total_env_steps=128 * 3, eval_every_env_steps=128, eval_episodes=4,\n"
        "                      torch_threads=1, background_eval=True, progress=False, tensorboard=False)\n"
        f"state = Trainer(cfg, Path({str(tmp_path / 'run')!r})).train()\n"
        "assert len(state.evals) == 3, state.evals\n"
    )
    subprocess.run([sys.executable, str(script)], check=True, cwd=tmp_path, timeout=300)
    assert marker.read_text() == "ran\n"


def test_a_run_with_no_evaluation_point_in_its_budget_starts_no_child(tmp_path: Path) -> None:
    short = replace_trainer(_cfg(True, 4), eval_every_env_steps=5 * UPDATE)
    trainer = Trainer(short, tmp_path / "short")
    assert trainer._background is None
    trainer.train()
    assert [r["eval/env_steps"] for r in _evals(tmp_path / "short")] == [4 * UPDATE]  # the final one only
