"""collect -> bc-flow -> residual through the command line and the shared trainer (tiny budgets):
resume, rebuilding the run (its base comes from --base again) and export."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from embodied.algo import ExportUnsupportedError
from embodied.cli import main
from embodied.real.runner import PolicyRunner
from embodied.training.run import CHECKPOINT_FILE, load_run

FLOW = ["algo.policy.hidden=[32,32]", "algo.policy.chunk=2", "algo.policy.denoise_steps=2"]
QUICK = ["trainer.eval_episodes=4", "trainer.torch_threads=1", "--no-progress", "--num-envs", "2"]
SMALL = ["algo.actor_hidden=[32,32]", "algo.critic_hidden=[32,32]", "algo.learning_starts=8"]
SMALL += [
    "algo.critic_warmup_updates=2",
    "algo.batch_size=16",
    "algo.updates_per_step=1",
    "trainer.log_every_updates=1",
]


def test_residual_on_a_flow_base(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    demos = tmp_path / "demos"
    assert main(["collect", "scripted:arm-push", "--episodes", "4", "--num-envs", "2", "--out", str(demos)]) == 0
    bases = {}
    # the three ways a base executes its chunks: a fresh plan per step, open-loop, blended
    for name, exec_steps, ensemble in (("fresh", 1, "false"), ("open", 2, "false"), ("blend", 1, "true")):
        bases[name] = tmp_path / f"bc_{name}"
        argv = ["train", "arm-push", "--algo", "bc-flow", "--dataset", str(demos), "--run-dir", str(bases[name])]
        argv += [
            *FLOW,
            f"algo.policy.exec_steps={exec_steps}",
            f"algo.policy.temporal_ensemble={ensemble}",
            *QUICK,
            "trainer.total_env_steps=8",
        ]
        assert main(argv) == 0

    run = tmp_path / "res"
    argv = ["train", "arm-push", "--algo", "residual", "--base", str(bases["fresh"]), "--dataset", str(demos)]
    argv += ["--run-dir", str(run), *SMALL, *QUICK, "trainer.total_env_steps=40"]
    assert main(argv) == 0
    assert (run / CHECKPOINT_FILE).is_file()
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert any("algo/actor_loss" in row for row in rows)  # past the critic warm-up
    assert main(["train", "--resume", str(run), "trainer.total_env_steps=60", "--no-progress"]) == 0

    loaded = load_run(run)  # the base is rebuilt from trainer.base_run
    obs = torch.randn(5, 18)
    exported = loaded.policy.export_module()
    torch.testing.assert_close(exported(obs), loaded.policy.act(obs), rtol=0, atol=1e-6)
    # its ONNX export flies the evaluation like the checkpoint does (no artifact kind needed)
    capsys.readouterr()
    results = {}
    for kind in ("torch", "onnx"):
        assert main(["eval", str(run), "--episodes", "2", "--json", "--policy", kind]) == 0
        results[kind] = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert results["onnx"]["policy"] == "onnx" and (run / "export" / "policy.onnx").is_file()
    assert results["onnx"]["mean_episode_length"] == results["torch"]["mean_episode_length"]
    assert results["onnx"]["mean_return"] == pytest.approx(results["torch"]["mean_return"], abs=1e-3)

    # a base with state between calls exports as its planner plus the residual step (two graphs)
    for name in ("open", "blend"):
        stateful = tmp_path / f"res_{name}"
        argv = ["train", "arm-push", "--algo", "residual", "--base", str(bases[name]), "--run-dir", str(stateful)]
        argv += [*SMALL, *QUICK, "trainer.total_env_steps=20"]
        assert main(argv) == 0
        with pytest.raises(ExportUnsupportedError, match="two graphs"):
            load_run(stateful).policy.export_module()
        assert main(["export", str(stateful)]) == 0
        assert (stateful / "export" / "residual.onnx").is_file()
        policy_io = json.loads((stateful / "export" / "policy_io.json").read_text())
        assert policy_io["residual_step"]["file"] == "residual.onnx"
        capsys.readouterr()
        for kind in ("torch", "onnx"):
            assert main(["eval", str(stateful), "--episodes", "2", "--json", "--policy", kind]) == 0
            results[kind] = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
        assert results["onnx"]["mean_episode_length"] == results["torch"]["mean_episode_length"]
        assert results["onnx"]["mean_return"] == pytest.approx(results["torch"]["mean_return"], abs=1e-3)
        # the deploy runner composes the two graphs as the torch policy acts, step by step
        loaded = load_run(stateful)
        runner = PolicyRunner(stateful)
        env = loaded.make_env(1, seed=0)
        obs = env.reset(seed=0)
        for _ in range(5):
            want = loaded.policy.act(obs)
            got = runner(obs["policy"][0].numpy())
            np.testing.assert_allclose(got, want[0].numpy(), rtol=0, atol=1e-5)
            obs = env.step(want)[0]
        env.close()

    # without --base the algorithm says what it needs
    argv = ["train", "arm-push", "--algo", "residual", "--dataset", str(demos), "--run-dir", str(tmp_path / "x")]
    assert main([*argv, *QUICK, "trainer.total_env_steps=10"]) == 2
    assert "give --base RUN_DIR" in caplog.text
    capsys.readouterr()

    assert main(["list"]) == 0
    assert "residual" in capsys.readouterr().out
