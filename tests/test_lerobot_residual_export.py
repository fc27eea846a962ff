"""``embodied export RUN --format lerobot`` for a residual run on a LeRobot base: a small ACT
(lerobot 0.4.4's real architecture, random weights, chunks of 4 with 2 executed per plan), a
residual trained on it for a few steps through the CLI, exported as a LeRobot checkpoint of type
``embodied_residual`` (the plugin ``integrations/lerobot_policy_embodied``) and loaded back by
LeRobot's own loaders. Nothing is downloaded.

Runs in the LeRobot environment (``bash scripts/setup_lerobot.sh``); skips elsewhere.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from lerobot_support import save_policy
from test_lerobot_base import arm_push_env

from embodied.cli import main
from embodied.errors import EmbodiedError
from embodied.export.onnx import PARITY_TOL
from embodied.training.lerobot_base import load_lerobot_policy
from embodied.training.run import load_run

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("lerobot") is None or importlib.util.find_spec("lerobot_policy_embodied") is None,
    reason="lerobot and its embodied plugin are not installed here; they come from bash scripts/setup_lerobot.sh",
)

TRAIN = ["--num-envs", "2", "--no-progress", "env.backend.camera=top", "trainer.eval_episodes=1"]
TRAIN += ["trainer.torch_threads=1", "algo.actor_hidden=[16,16]", "algo.critic_hidden=[16,16]", "algo.num_critics=2"]
# a large actor step so a few updates move the residual well away from zero (it starts at exactly the base)
TRAIN += ["algo.batch_size=8", "algo.learning_starts=4", "algo.updates_per_step=1", "algo.actor_lr=0.05"]


@pytest.fixture(scope="module")
def demos_and_act(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("lerobot_residual_export")
    argv = ["collect", "scripted:arm-push", "--episodes", "2", "--num-envs", "2", "--images", "--camera", "top"]
    assert main([*argv, "--format", "lerobot", "--out", str(root / "demos")]) == 0
    return root / "demos", save_policy("act", root / "demos", root / "act")


@pytest.fixture(scope="module")
def residual_run(demos_and_act: tuple[Path, Path]) -> Path:
    """A residual trained 40 env steps on the ACT base through the CLI, then exported."""
    _, act = demos_and_act
    run = act.parent / "residual"
    argv = ["train", "arm-push", "--algo", "residual", "--base", f"lerobot:{act}", "--run-dir", str(run), *TRAIN]
    assert main([*argv, "algo.critic_warmup_updates=0", "trainer.total_env_steps=40"]) == 0
    assert main(["export", str(run), "--format", "lerobot", "--no-record"]) == 0
    return run


def test_export_acts_as_the_run_and_not_as_the_base(residual_run: Path, demos_and_act: tuple[Path, Path]) -> None:
    """The checkpoint through ``lerobot:`` loading against the run's policy step by step (parity),
    and against the base alone (the residual is in the checkpoint, not dropped)."""
    _, act = demos_and_act
    folder = residual_run / "export" / "lerobot"
    assert (folder / "model.safetensors").is_file() and (folder / "base" / "model.safetensors").is_file()
    assert json.loads((folder / "config.json").read_text())["type"] == "embodied_residual"
    env = arm_push_env(2)
    try:
        run = load_run(residual_run).policy
        exported = load_lerobot_policy(f"lerobot:{folder}", "arm-push", env.obs_spec, env.action_dim, "top")
        base = load_lerobot_policy(f"lerobot:{act}", "arm-push", env.obs_spec, env.action_dim, "top")
        obs, errors, residuals = env.reset(seed=5), [], []
        for _ in range(12):  # 6 plans of the base (2 of each chunk of 4 executed)
            want = run.act(obs)
            got = exported.act(obs, deterministic=True)
            errors.append(float((got - want).abs().max()))
            residuals.append(float((got - base.act(obs, deterministic=True)).abs().max()))
            obs = env.step(want)[0]
    finally:
        env.close()
    assert max(errors) <= PARITY_TOL
    assert min(residuals) > 100 * PARITY_TOL  # dropping the residual would fail the parity check


def test_lerobot_loads_it_itself(residual_run: Path) -> None:
    """A fresh interpreter, as LeRobot's scripts (lerobot-eval) do it: plugin discovery, the config
    by its type, the policy class's from_pretrained, the saved processors, select_action."""
    code = (
        "import torch\n"
        "from lerobot.utils.import_utils import register_third_party_plugins\n"
        "register_third_party_plugins()\n"
        "from lerobot.configs.policies import PreTrainedConfig\n"
        "from lerobot.policies.factory import get_policy_class, make_pre_post_processors\n"
        f"path = {str(residual_run / 'export' / 'lerobot')!r}\n"
        "cfg = PreTrainedConfig.from_pretrained(path)\n"
        "policy = get_policy_class(cfg.type).from_pretrained(path)\n"
        "pre, post = make_pre_post_processors(cfg, pretrained_path=path)\n"
        "batch = {'observation.state': torch.zeros(18), 'observation.images.top': torch.zeros(3, 64, 64),\n"
        "         'task': 'push the block to the goal'}\n"
        "action = post(policy.select_action(pre(batch)))\n"
        "print(cfg.type, type(policy).__name__, type(policy.base).__name__, tuple(action.shape))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "embodied_residual EmbodiedResidualPolicy ACTPolicy (1, 3)"


def test_eval_flies_the_export(residual_run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = residual_run / "export" / "lerobot"
    argv = ["eval", f"lerobot:{folder}", "--task", "arm-push", "--camera", "top", "--episodes", "1", "--json"]
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["episodes"] == 1 and out["mean_episode_length"] > 0


def test_other_formats_are_refused_naming_lerobot(residual_run: Path) -> None:
    from embodied.training.run_policy import export_run

    with pytest.raises(EmbodiedError, match="export it with --format lerobot"):
        export_run(residual_run, "onnx")
    assert main(["export", str(residual_run), "--format", "c", "--no-record"]) == 2
