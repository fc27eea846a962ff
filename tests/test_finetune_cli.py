"""collect -> bc-flow -> reinflow through the command line and the shared trainer (tiny budgets)."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from embodied.cli import main
from embodied.export.artifact import POLICY_FILE, read_policy_artifact
from embodied.training.run import CHECKPOINT_FILE, load_run

FLOW = ["algo.policy.hidden=[32,32]", "algo.policy.chunk=2", "algo.policy.denoise_steps=2"]
QUICK = ["trainer.eval_episodes=4", "trainer.torch_threads=1"]


def test_collect_clone_finetune(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    demos = tmp_path / "demos"
    assert main(["collect", "scripted:arm-push", "--episodes", "6", "--num-envs", "3", "--out", str(demos)]) == 0
    assert (demos / "data" / "main_data.hdf5").is_file()
    meta = json.loads((demos / "data" / "metadata.json").read_text())
    assert meta["total_episodes"] == 6

    bc_dir = tmp_path / "bc"
    argv = ["train", "arm-push", "--algo", "bc-flow", "--dataset", str(demos), "--run-dir", str(bc_dir)]
    argv += ["--num-envs", "2", "--no-progress", *FLOW, *QUICK, "trainer.total_env_steps=20"]
    assert main(argv) == 0
    assert (bc_dir / CHECKPOINT_FILE).is_file()
    assert load_run(bc_dir).cfg.trainer.dataset == str(demos)

    rf_dir = tmp_path / "rf"
    argv = ["train", "arm-push", "--algo", "reinflow", "--base", str(bc_dir), "--run-dir", str(rf_dir)]
    argv += ["--num-envs", "2", "--no-progress", *FLOW, *QUICK, "algo.num_steps_per_env=5", "algo.num_minibatches=2"]
    argv += ["trainer.total_env_steps=20"]
    assert main(argv) == 0
    loaded = load_run(rf_dir)  # rebuilt without the base run: the checkpoint holds everything
    assert loaded.cfg.algo_name == "reinflow"

    # both runs wrote a flow policy artifact; export, eval --policy onnx read it like an MLP's
    for run_dir in (bc_dir, rf_dir):
        assert read_policy_artifact(run_dir / POLICY_FILE).kind == "flow"
    capsys.readouterr()
    assert main(["export", str(rf_dir), "--format", "onnx"]) == 0
    io = json.loads((rf_dir / "export" / "policy_io.json").read_text())
    assert io["extra"]["action_chunk"] == {"length": 2, "exec_steps": 1, "temporal_ensemble": False}
    capsys.readouterr()
    for policy in ("torch", "onnx"):
        assert main(["eval", str(rf_dir), "--episodes", "3", "--policy", policy, "--json"]) == 0
    torch_eval, onnx_eval = (json.loads(line) for line in capsys.readouterr().out.strip().splitlines()[-2:])
    assert torch_eval["mean_episode_length"] == onnx_eval["mean_episode_length"]
    with caplog.at_level(logging.ERROR, logger="embodied"):
        assert main(["export", str(bc_dir), "--format", "c"]) == 2
    assert "cannot hold a flow policy" in caplog.text and "mish" in caplog.text

    # an algorithm without preload names itself; a mismatched flow architecture names the key
    argv = ["train", "arm-push", "--algo", "ppo", "--dataset", str(demos), "--run-dir", str(tmp_path / "ppo")]
    assert main([*argv, "--no-progress", "trainer.total_env_steps=10"]) == 2
    argv = ["train", "arm-push", "--algo", "reinflow", "--base", str(bc_dir), "--run-dir", str(tmp_path / "rf2")]
    assert main([*argv, "--no-progress", "algo.policy.chunk=3", "trainer.total_env_steps=10"]) == 2


def test_collect_names_tasks_without_an_expert(tmp_path: Path) -> None:
    assert main(["collect", "scripted:quad-hover", "--episodes", "1", "--out", str(tmp_path / "x")]) == 2
