"""The shared trainer: exact resume, atomic checkpoints, NaN detection, run directory contents."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from embodied.env import StepResult
from embodied.errors import NonFiniteError
from embodied.experiment import ExperimentCfg, replace_trainer, resolve_experiment
from embodied.run import load_checkpoint
from embodied.trainer import Trainer


def _tiny_cfg(total_env_steps: int) -> ExperimentCfg:
    cfg = resolve_experiment(
        "quad-hover",
        "ppo",
        overrides=["algo.num_steps_per_env=8"],
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
    return {k: v for k, v in trainer.algo.state_dict().items() if isinstance(v, torch.Tensor)} | {
        f"model.{k}": v for k, v in trainer.algo.policy.state_dict().items()
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


def test_nan_reward_stops_with_location_and_keeps_checkpoint(tmp_path: Path) -> None:
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

    trainer.env.step = poisoned_step
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
    from embodied.run import METRICS_FILE, read_metrics

    path = tmp_path / METRICS_FILE
    path.write_text('{"env_steps": 1}\n{"env_steps": 2}\n{"env_steps": 3, "eval/succ')
    assert [row["env_steps"] for row in read_metrics(tmp_path)] == [1, 2]
    path.write_text('{"env_steps": 1}\n{"env_steps": 2\n{"env_steps": 3}\n')
    with pytest.raises(EmbodiedError, match=r"metrics.jsonl: line 2 is not a JSON row"):
        read_metrics(tmp_path)
