"""CLI smoke: every subcommand's --help, and train -> eval -> play -> export on a tiny run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from embodied.cli import COMMAND_MODULES, main


@pytest.mark.parametrize("command", [m.replace("_", "-") for m in COMMAND_MODULES])
def test_every_subcommand_has_help(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main([command, "--help"])
    assert exit_info.value.code == 0
    assert "usage: embodied" in capsys.readouterr().out


def test_train_eval_play_export_list(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run_dir = tmp_path / "run"
    code = main([
        "train", "quad-hover", "--preset", "nominal", "--run-dir", str(run_dir), "--no-progress", "--num-envs", "16",
        "trainer.total_env_steps=1024", "trainer.eval_every_env_steps=0", "trainer.eval_episodes=20",
    ])  # fmt: skip
    assert code == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert out[-1] == str(run_dir), "the run directory must be the last line"
    assert any(line.startswith("eval: success_rate") for line in out)

    assert main(["eval", str(run_dir), "--episodes", "8", "--json"]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert {"success_rate", "mean_return", "mean_episode_length"} <= result.keys()
    assert 0.0 <= result["success_rate"] <= 1.0 and result["mean_episode_length"] > 0

    video = tmp_path / "hover.mp4"
    assert main(["play", str(run_dir), "--video", str(video)]) == 0
    assert video.stat().st_size > 1000 and video.with_suffix(".png").stat().st_size > 1000

    assert main(["export", str(run_dir), "--format", "onnx"]) == 0
    assert (run_dir / "export" / "policy.onnx").is_file() and (run_dir / "export" / "policy_io.json").is_file()

    assert main(["list"]) == 0
    listing = capsys.readouterr().out
    for name in ("quad-hover", "mujoco-ant", "gym:<EnvId>", "ppo", "sac", "fasttd3", "quadrotor", "mujoco"):
        assert name in listing


def test_bad_input_exits_2_with_choices(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    assert main(["train", "quad-hovr", "--run-dir", str(tmp_path / "x")]) == 2
    assert "closest first" in caplog.text and "quad-hover" in caplog.text
    assert main(["train", "quad-hover", "--no-progress", "algo.not_a_key=1", "--run-dir", str(tmp_path / "y")]) == 2
    assert "algo.not_a_key" in caplog.text
    assert main(["eval", str(tmp_path)]) == 2
    assert "not a run directory" in caplog.text


def test_train_closes_its_env_when_training_ends(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`embodied train` closes the training simulator as soon as training ends, not when the
    trainer happens to be collected: Isaac Lab holds one simulation per process, and an
    `embodied eval` in the same process (tests/test_isaaclab_real.py) builds another."""
    from embodied.tasks.quadrotor.hover import QuadHover

    closed: list[int] = []
    real_close = QuadHover.close

    def close(self: QuadHover) -> None:
        closed.append(self.num_envs)
        real_close(self)

    monkeypatch.setattr(QuadHover, "close", close)
    argv = ["train", "quad-hover", "--preset", "nominal", "--run-dir", str(tmp_path / "run"), "--no-progress"]
    argv += ["--num-envs", "16"]
    assert main([*argv, "trainer.total_env_steps=512", "trainer.eval_episodes=0"]) == 0
    assert 16 in closed, f"the 16-env training env was not closed (closed: {closed})"


def test_train_with_evaluations_off_passes_its_evaluation_points(tmp_path: Path) -> None:
    """``trainer.eval_episodes=0`` turns evaluations off even where the grid
    (``eval_every_env_steps``) falls inside the budget: the run ends with no evaluation row."""
    run_dir = tmp_path / "run"
    argv = [
        "train",
        "quad-hover",
        "--preset",
        "nominal",
        "--run-dir",
        str(run_dir),
        "--no-progress",
        "--num-envs",
        "16",
    ]
    overrides = ["trainer.total_env_steps=1024", "trainer.eval_every_env_steps=256", "trainer.eval_episodes=0"]
    assert main([*argv, *overrides]) == 0
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert rows and not any("eval/success_rate" in row for row in rows)
