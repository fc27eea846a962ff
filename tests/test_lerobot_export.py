"""``embodied export RUN --format lerobot``: a trained run as a LeRobot checkpoint that LeRobot's
own loaders read, acting as ``embodied eval`` acts (max |error| <= 1e-5 on 100 observations).

Runs in the LeRobot environment (``bash scripts/setup_lerobot.sh``, which also installs the
policy plugin ``integrations/lerobot_policy_embodied``); skips elsewhere. Nothing is downloaded.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from embodied import registry
from embodied.cli import main
from embodied.training.evaluate import load_policy

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("lerobot") is None or importlib.util.find_spec("lerobot_policy_embodied") is None,
    reason="lerobot and its embodied plugin are not installed here; they come from bash scripts/setup_lerobot.sh",
)


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A bc-flow run (chunks of 4, 2 executed per plan) trained briefly on a LeRobotDataset."""
    root = tmp_path_factory.mktemp("export")
    demos, run = root / "demos", root / "bc"
    argv = ["collect", "scripted:arm-push", "--episodes", "4", "--num-envs", "4", "--format", "lerobot"]
    assert main([*argv, "--out", str(demos)]) == 0
    argv = ["train", "arm-push", "--algo", "bc-flow", "--dataset", str(demos), "--run-dir", str(run), "--num-envs", "2"]
    argv += ["--no-progress", "algo.policy.hidden=[32,32]", "algo.policy.chunk=4", "algo.policy.exec_steps=2"]
    argv += ["algo.policy.temporal_ensemble=false"]
    argv += ["algo.policy.denoise_steps=2", "trainer.eval_episodes=2", "trainer.torch_threads=1"]
    assert main([*argv, "trainer.total_env_steps=20"]) == 0
    assert main(["export", str(run), "--format", "lerobot", "--no-record"]) == 0
    return run


def test_lerobot_select_action_matches_embodied_eval(run_dir: Path) -> None:
    """100 observations of an arm-push rollout, one step at a time: LeRobot's from_pretrained +
    processors + select_action against the policy `embodied eval` flies."""
    from embodied.export.lerobot_checkpoint import STATE_KEY, load_lerobot_checkpoint

    policy, pre, post = load_lerobot_checkpoint(run_dir / "export" / "lerobot")
    assert type(policy).__name__ == "EmbodiedPolicy" and policy.config.chunk_size == 4
    assert policy.config.n_action_steps == 2
    env = registry.make_env("arm-push", registry.task_cfg("arm-push"), 1, "cpu", 7)
    try:
        ours = load_policy("torch", run_dir, env)
        obs, errors = env.reset(seed=7), []
        for _ in range(100):
            action = ours(obs)
            with torch.no_grad():
                theirs = post(policy.select_action(pre({STATE_KEY: obs["policy"]})))
            errors.append(float((theirs - action).abs().max()))
            obs = env.step(action)[0]
    finally:
        env.close()
    assert max(errors) <= 1e-5


def test_lerobot_finds_the_plugin_itself(run_dir: Path) -> None:
    """A fresh interpreter, as LeRobot's scripts do it: register_third_party_plugins() imports the
    installed lerobot_policy_embodied, then LeRobot's factory loads the checkpoint by its type."""
    code = (
        "from lerobot.utils.import_utils import register_third_party_plugins\n"
        "register_third_party_plugins()\n"
        "from lerobot.configs.policies import PreTrainedConfig\n"
        "from lerobot.policies.factory import get_policy_class\n"
        f"path = {str(run_dir / 'export' / 'lerobot')!r}\n"
        "cfg = PreTrainedConfig.from_pretrained(path)\n"
        "policy = get_policy_class(cfg.type).from_pretrained(path)\n"
        "print(cfg.type, type(policy).__name__)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "embodied EmbodiedPolicy"


def test_eval_flies_the_lerobot_export(run_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for policy in ("torch", "lerobot"):
        assert main(["eval", str(run_dir), "--policy", policy, "--episodes", "4", "--json"]) == 0
    torch_line, lerobot_line = capsys.readouterr().out.strip().splitlines()[-2:]
    # the same deterministic policy on the same seed: the same episodes
    assert torch_line.replace('"policy": "torch"', "") == lerobot_line.replace('"policy": "lerobot"', "")


def test_temporal_ensemble_policy_is_refused(tmp_path: Path) -> None:
    """LeRobot's queue cannot average overlapping plans: such a policy is refused by name."""
    from embodied.errors import EmbodiedError
    from embodied.export.artifact import PolicyArtifact
    from embodied.export.lerobot_checkpoint import write_lerobot_checkpoint
    from embodied.policies.flow import FlowPolicy, FlowPolicyCfg

    env = registry.make_env("arm-push", registry.task_cfg("arm-push"), 1, "cpu", 0)
    try:
        io_spec = env.io_spec()
    finally:
        env.close()
    cfg = FlowPolicyCfg(hidden=(8,), chunk=2, exec_steps=1, temporal_ensemble=True)
    artifact = PolicyArtifact.from_module(FlowPolicy(io_spec.obs_dim, io_spec.action_dim, cfg).export_module(), io_spec)
    with pytest.raises(EmbodiedError, match="temporal_ensemble"):
        write_lerobot_checkpoint(artifact, tmp_path / "out")
    assert not (tmp_path / "out").exists()
