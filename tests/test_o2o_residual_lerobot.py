"""o2o-residual on a pretrained LeRobot base with demonstrations from a LeRobotDataset: a small
ACT or Diffusion (lerobot 0.4.4's real architectures, random weights, saved with ``save_pretrained``) loaded
through ``--base lerobot:PATH``, demonstrations that ``embodied collect --format lerobot`` wrote
(camera images included, which the base needs to label each demonstration step with its action),
the offline Cal-QL phase, then online, resume, and the rebuilt run.

Runs in the LeRobot environment (``bash scripts/setup_lerobot.sh``); skips elsewhere.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest
import torch
from lerobot_support import save_policy
from test_lerobot_base import arm_push_env

from embodied.algo import PreloadSource
from embodied.algos.residual import BASE_GROUP
from embodied.algos.residual_o2o import ResidualO2O, ResidualO2OCfg
from embodied.cli import main
from embodied.data.demos import load_dataset
from embodied.training.lerobot_base import load_lerobot_policy
from embodied.training.run import CHECKPOINT_FILE, load_run

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("lerobot") is None,
    reason="lerobot is not installed here; its environment comes from bash scripts/setup_lerobot.sh",
)


@pytest.fixture(scope="module")
def demos_and_act(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("o2o_lerobot")
    argv = ["collect", "scripted:arm-push", "--episodes", "2", "--num-envs", "2", "--images", "--camera", "top"]
    assert main([*argv, "--format", "lerobot", "--out", str(root / "demos")]) == 0
    return root / "demos", save_policy("act", root / "demos", root / "act")


def test_demonstrations_carry_the_lerobot_base_actions(demos_and_act: tuple[Path, Path]) -> None:
    demos, act = demos_and_act
    env = arm_push_env(2)
    base = load_lerobot_policy(f"lerobot:{act}", "arm-push", env.obs_spec, env.action_dim, "top")
    torch.manual_seed(0)
    algo = ResidualO2O(ResidualO2OCfg(num_critics=2, buffer_size_per_env=64, batch_size=8), env)
    algo.preload(PreloadSource(base_run=act, base_policy=base, dataset=demos))
    data = load_dataset(demos, obs_dim=18, action_dim=3)
    assert algo.demos is not None and len(algo.demos) == len(data.obs) > 2
    assert data.images is not None
    # each demonstration row holds the base's fresh plan's first action at that row's images
    rows = torch.tensor([0, len(data.obs) // 2, len(data.obs) - 1])
    obs = {"policy": torch.as_tensor(data.obs)[rows], "image": torch.as_tensor(data.images)[rows]}
    want = base.plan(obs)[:, 0]
    got = algo.demos.obs[BASE_GROUP][rows, 0]  # the buffer holds the steps as one env's rows
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5)
    env.close()


@pytest.mark.slow  # the whole trainer, resume and export (minutes on a loaded 2-core CPU)
@pytest.mark.parametrize("kind", ["act", "diffusion"])
def test_offline_then_online_on_a_lerobot_base(kind: str, demos_and_act: tuple[Path, Path], tmp_path: Path) -> None:
    demos, base = demos_and_act
    if kind == "diffusion":  # its plans read the observation queues LeRobotPolicy fills (n_obs_steps=1)
        base = save_policy("diffusion", demos, tmp_path / "diffusion", overrides={"n_obs_steps": 1})
    run = tmp_path / "o2o_res"
    argv = ["train", "arm-push", "--algo", "o2o-residual", "--base", f"lerobot:{base}", "--dataset", str(demos)]
    argv += ["--run-dir", str(run), "--num-envs", "2", "--no-progress", "env.backend.camera=top"]
    argv += ["trainer.eval_episodes=2", "trainer.torch_threads=1", "trainer.total_env_steps=4"]
    argv += ["algo.num_critics=2", "algo.actor_hidden=[16,16]", "algo.critic_hidden=[16,16]", "algo.batch_size=8"]
    argv += ["algo.cql_num_actions=2", "algo.offline_steps=4", "algo.offline_updates_per_step=2"]
    argv += ["algo.learning_starts=2", "algo.updates_per_step=1"]
    assert main(argv) == 0
    assert (run / CHECKPOINT_FILE).is_file()
    assert load_run(run).algo.phase == "online"  # 2 trainer steps x 2 offline steps
    assert main(["train", "--resume", str(run), "--no-progress", "trainer.total_env_steps=12"]) == 0
    loaded = load_run(run)  # the base is loaded from lerobot:PATH again
    assert loaded.algo.phase == "online" and loaded.algo.env_steps == 8
    obs = arm_push_env(2).reset(seed=0)
    assert np.isfinite(loaded.policy.act(obs, deterministic=True).numpy()).all()
