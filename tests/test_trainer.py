"""The shared trainer: exact resume, atomic checkpoints, NaN detection, run directory contents."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch import nn

from embodied.env import StepResult
from embodied.errors import NonFiniteError
from embodied.experiment import ExperimentCfg, replace_trainer, resolve_experiment
from embodied.tasks.quadrotor.hover import QuadHover
from embodied.training.run import load_checkpoint
from embodied.training.trainer import Trainer


def _tiny_cfg(total_env_steps: int) -> ExperimentCfg:
    cfg = resolve_experiment(
        "quad-hover",
        "ppo",
        # The split runs first train to a smaller budget; a schedule set in fractions of the budget
        # (the shipped learning-rate cooldown) would then differ from the straight run's.
        overrides=["algo.num_steps_per_env=8", "algo.lr_cooldown=0"],
        num_envs=8,
        seed=3,
    )
    return replace_trainer(
        cfg,
        total_env_steps=total_env_steps,
        eval_episodes=0,
        eval_every_env_steps=0,
        checkpoint_every_updates=1,
        progress=False,
        tensorboard=False,
        success_target=None,
    )


def _params(trainer: Trainer) -> dict[str, torch.Tensor]:
    policy = trainer.algo.policy
    assert isinstance(policy, nn.Module)  # PPO's actor-critic: its weights are a state_dict
    return {k: v for k, v in trainer.algo.state_dict().items() if isinstance(v, torch.Tensor)} | {
        f"model.{k}": v for k, v in policy.state_dict().items()
    }


def test_resume_continues_bit_exactly(tmp_path: Path) -> None:
    steps_per_update = 8 * 8
    straight = Trainer(_tiny_cfg(4 * steps_per_update), tmp_path / "straight")
    straight.train()

    half = Trainer(_tiny_cfg(2 * steps_per_update), tmp_path / "split")
    half.train()
    resumed = Trainer(_tiny_cfg(4 * steps_per_update), tmp_path / "split", resume=True)
    assert resumed.state.env_steps == 2 * steps_per_update
    resumed.train()

    a, b = _params(straight), _params(resumed)
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key
    for group in straight.obs:
        assert torch.equal(straight.obs[group], resumed.obs[group])


def test_run_directory_contents(tmp_path: Path) -> None:
    cfg = replace_trainer(_tiny_cfg(2 * 64), eval_episodes=16, tensorboard=True)
    Trainer(cfg, tmp_path / "run").train()
    run = tmp_path / "run"
    assert (run / "config.yaml").is_file() and (run / "git.txt").is_file()
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert any("eval/success_rate" in r for r in rows)
    assert any(k.startswith("reward/") for r in rows for k in r)
    assert any(p.name.startswith("events.out.tfevents") for p in (run / "tb").iterdir())
    ckpt = load_checkpoint(run)
    assert ckpt["trainer"]["env_steps"] == 2 * 64
    assert not list((run / "ckpt").glob("*.tmp")), "temp files must be renamed away"


def test_nan_reward_stops_with_location_and_keeps_checkpoint(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    trainer = Trainer(_tiny_cfg(10 * 64), tmp_path / "nan")
    real_step = trainer.env.step
    calls = {"n": 0}

    def poisoned_step(action: torch.Tensor) -> StepResult:
        obs, reward, terminated, truncated, info = real_step(action)
        calls["n"] += 1
        if calls["n"] > 20:  # after two updates (and their checkpoints)
            reward = reward.clone()
            reward[5] = float("nan")
        return obs, reward, terminated, truncated, info

    monkeypatch.setattr(trainer.env, "step", poisoned_step)
    with pytest.raises(
        NonFiniteError, match=r"non-finite reward 'reward' \(first at env 5\).*last good checkpoint kept"
    ):
        trainer.train()
    assert load_checkpoint(tmp_path / "nan")["trainer"]["updates"] == 2


def test_gymnasium_run_resumes_with_fresh_episodes(tmp_path: Path) -> None:
    cfg = resolve_experiment("gym:Pendulum-v1", "sac", overrides=["algo.learning_starts=64", "algo.batch_size=32"])
    cfg = replace_trainer(cfg, total_env_steps=100, eval_episodes=0, progress=False, tensorboard=False)
    Trainer(cfg, tmp_path / "gym").train()
    resumed = Trainer(replace_trainer(cfg, total_env_steps=150), tmp_path / "gym", resume=True)
    assert resumed.state.env_steps == 100
    state = resumed.train()
    assert state.env_steps == 150
    assert load_checkpoint(tmp_path / "gym")["trainer"]["env_steps"] == 150


def test_read_metrics_skips_only_a_torn_last_line(tmp_path: Path) -> None:
    """A run killed mid-write leaves a partial last line: the rows before it are still read;
    a bad line elsewhere is corruption and raises naming the file and line."""
    from embodied.errors import EmbodiedError
    from embodied.training.run import METRICS_FILE, read_metrics

    path = tmp_path / METRICS_FILE
    path.write_text('{"env_steps": 1}\n{"env_steps": 2}\n{"env_steps": 3, "eval/succ')
    assert [row["env_steps"] for row in read_metrics(tmp_path)] == [1, 2]
    path.write_text('{"env_steps": 1}\n{"env_steps": 2\n{"env_steps": 3}\n')
    with pytest.raises(EmbodiedError, match=r"metrics.jsonl: line 2 is not a JSON row"):
        read_metrics(tmp_path)


def _comparable(rows: list[dict]) -> list[dict]:
    """Metrics rows without wall-clock entries (which differ between any two runs)."""
    return [
        {k: v for k, v in r.items() if k != "time" and not k.startswith("perf/") and "time_s" not in k} for r in rows
    ]


def test_resume_after_a_mid_rollout_stop_logs_the_rows_of_an_uninterrupted_run(tmp_path: Path) -> None:
    from embodied.training.run import read_metrics

    straight = Trainer(_tiny_cfg(4 * 64), tmp_path / "straight")
    straight.train()
    first = Trainer(_tiny_cfg(2 * 64 + 24), tmp_path / "split")  # ends 24 env steps into a rollout
    first.train()
    # As if killed after logging a row its checkpoint never saw: the resume must drop it.
    with (tmp_path / "split" / "metrics.jsonl").open("a") as fh:
        fh.write(json.dumps({"env_steps": 192, "time": 0.0, "algo/loss": 1.0}) + "\n" + '{"env_steps": 25')
    Trainer(_tiny_cfg(4 * 64), tmp_path / "split", resume=True).train()
    assert _comparable(read_metrics(tmp_path / "split")) == _comparable(read_metrics(tmp_path / "straight"))


def test_a_stop_during_the_final_evaluation_keeps_the_last_step(tmp_path: Path) -> None:
    from embodied.training.run import read_metrics

    cfg = replace_trainer(_tiny_cfg(2 * 64), eval_episodes=8, checkpoint_every_updates=1000)
    straight = Trainer(cfg, tmp_path / "straight")
    straight.train()
    trainer = Trainer(cfg, tmp_path / "stopped")

    def interrupted_eval() -> None:
        raise KeyboardInterrupt  # a second Ctrl-C in the middle of the final evaluation

    trainer.run_eval = interrupted_eval  # type: ignore[method-assign,assignment]
    with pytest.raises(KeyboardInterrupt):
        trainer.train()
    assert load_checkpoint(tmp_path / "stopped")["trainer"]["env_steps"] == 2 * 64
    resumed = Trainer(cfg, tmp_path / "stopped", resume=True)
    assert resumed.train().evals, "the resume runs the evaluation that was cut short"
    assert _comparable(read_metrics(tmp_path / "stopped")) == _comparable(read_metrics(tmp_path / "straight"))


def test_a_signal_during_a_checkpoint_write_is_honoured_after_it(tmp_path: Path) -> None:
    import signal

    from signal_support import signal_handler

    from embodied.stop import Terminated

    trainer = Trainer(_tiny_cfg(8 * 64), tmp_path / "run")
    real_save = trainer.save

    def save_hit_by_sigterm() -> Path:
        signal.raise_signal(signal.SIGTERM)  # arrives while the checkpoint is being written
        return real_save()

    trainer.save = save_hit_by_sigterm  # type: ignore[method-assign]
    with signal_handler(signal.SIGTERM, signal.default_int_handler), pytest.raises(Terminated):
        trainer.train()
    assert load_checkpoint(tmp_path / "run")["trainer"]["env_steps"] == 64


def test_a_run_whose_episodes_all_end_at_step_one_stops(tmp_path: Path) -> None:
    from embodied.config import UNPHYSICAL
    from embodied.experiment import resolve_experiment
    from embodied.training.trainer import DegenerateRunError

    cfg = resolve_experiment(
        "quad-hover",
        overrides=["algo.num_steps_per_env=8", "env.disturbance_force_std_n=1e6"],
        num_envs=8,
        allow=[UNPHYSICAL],  # a force no vehicle meets, on purpose: the run must stop by itself
    )
    cfg = replace_trainer(cfg, total_env_steps=10 * 64, eval_episodes=0, progress=False, tensorboard=False)
    with pytest.raises(DegenerateRunError, match="ended at its first step"):
        Trainer(cfg, tmp_path / "run").train()


def test_a_second_trainer_on_a_held_run_dir_is_refused(tmp_path: Path) -> None:
    from embodied.errors import EmbodiedError
    from embodied.training.run_lock import RunLockedError

    first = Trainer(_tiny_cfg(64), tmp_path / "run")
    with pytest.raises(RunLockedError, match="in use by another process"):
        Trainer(_tiny_cfg(64), tmp_path / "run", resume=True)
    first.train()
    with pytest.raises(EmbodiedError, match="already holds a run"):
        Trainer(_tiny_cfg(64), tmp_path / "run")


def test_the_training_env_learns_how_far_training_has_come(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A task with a curriculum (``env.randomization_ramp``) is told ``env_steps / total`` before
    each rollout: half-way through a ramp over all of training its draws reach half their range;
    resumed, the schedule continues from the checkpoint's counters."""
    overrides = ["algo.num_steps_per_env=8", "env.randomization_ramp=1.0", "env.sim.randomization.mass_scale=[0.5,1.5]"]
    cfg = resolve_experiment("quad-hover", "ppo", overrides=overrides, num_envs=8, seed=3)
    cfg = replace_trainer(
        cfg, total_env_steps=4 * 64, eval_episodes=0, eval_every_env_steps=0, progress=False, tensorboard=False
    )
    seen: list[float] = []
    trainer = Trainer(cfg, tmp_path / "run")
    env = trainer.env
    assert isinstance(env, QuadHover)
    tell = env.set_training_progress

    def record_and_tell(fraction: float) -> None:
        seen.append(fraction)
        tell(fraction)

    monkeypatch.setattr(env, "set_training_progress", record_and_tell)
    trainer.train()
    assert seen == [0.0, 0.25, 0.5, 0.75, 1.0]
    assert env.randomization_scale == 1.0
    resumed = Trainer(replace_trainer(cfg, total_env_steps=8 * 64), tmp_path / "run", resume=True)
    resumed._tell_progress()
    assert isinstance(resumed.env, QuadHover)
    assert resumed.env.randomization_scale == 0.5
