"""collect --images -> bc-flow (image-instruction) -> ReinFlow / residual -> export / eval through the
command line (tiny budgets): the fine-tuning commands take an image-instruction base like any policy."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from embodied.cli import main
from embodied.policies.image_flow import ImageInstructionFlowPolicy
from embodied.training.run import load_run

pytest.importorskip("wordllama", reason='the VLA policy\'s text model: pip install "embodied[instruction]"')

VLA = ["algo.policy.hidden=[32,32]", "algo.policy.chunk=2", "algo.policy.denoise_steps=2"]
VLA += ["algo.policy.instruction=push the block to the goal", "env.backend.camera=top", "env.backend.image_size_px=40"]
QUICK = ["--num-envs", "2", "--no-progress", "trainer.eval_episodes=2", "trainer.torch_threads=1"]


@pytest.mark.slow
def test_vla_collect_clone_finetune_export(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    demos = tmp_path / "demos"
    argv = ["collect", "scripted:arm-push", "--episodes", "2", "--num-envs", "2", "--images", "--camera", "top"]
    assert main([*argv, "--out", str(demos)]) == 0
    bc = tmp_path / "bc"
    argv = ["train", "arm-push", "--algo", "bc-flow", "--dataset", str(demos), "--run-dir", str(bc), *QUICK, *VLA]
    # the dataset's 64 px images do not fit a 40 px policy: named, not a shape error deep inside
    with caplog.at_level(logging.ERROR, logger="embodied"):
        assert main([*argv, "trainer.total_env_steps=4"]) == 2
    assert "image" in caplog.text
    argv[-1] = "env.backend.image_size_px=64"
    assert main([*argv, "trainer.total_env_steps=4"]) == 0
    assert isinstance(load_run(bc).policy, ImageInstructionFlowPolicy)
    vla = [*VLA[:-1], "env.backend.image_size_px=64"]
    rf = tmp_path / "rf"
    argv = ["train", "arm-push", "--algo", "reinflow", "--base", str(bc), "--run-dir", str(rf), *QUICK, *vla]
    argv += ["algo.num_steps_per_env=3", "algo.num_minibatches=2", "trainer.total_env_steps=6"]
    assert main(argv) == 0
    assert isinstance(load_run(rf).policy, ImageInstructionFlowPolicy)  # rebuilt from its checkpoint alone
    res = tmp_path / "res"
    argv = ["train", "arm-push", "--algo", "residual", "--base", str(bc), "--run-dir", str(res), *QUICK]
    argv += ["--dataset", str(demos), "env.backend.camera=top", "algo.learning_starts=2", "algo.batch_size=4"]
    argv += ["trainer.total_env_steps=8"]
    assert main(argv) == 0
    capsys.readouterr()
    assert main(["export", str(rf), "--format", "onnx"]) == 0
    assert "parity onnx" in capsys.readouterr().out
    assert json.loads((rf / "export" / "policy_io.json").read_text())["image_input"]["shape"][1:] == [64, 64, 3]
    with caplog.at_level(logging.ERROR, logger="embodied"):
        assert main(["export", str(rf), "--format", "c"]) == 2
    assert "encoder.convs.0 (Conv2d)" in caplog.text
    for run_dir in (rf, res):
        assert main(["eval", str(run_dir), "--episodes", "2", "--json"]) == 0
