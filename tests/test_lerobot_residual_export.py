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
from typing import Any

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

TRAIN = ["--num-envs", "2", "--no-progress", "env.backend.camera=top", "trainer.eval_episodes=0"]
TRAIN += ["trainer.torch_threads=1", "algo.actor_hidden=[16,16]", "algo.critic_hidden=[16,16]", "algo.num_critics=2"]
# a large actor step so a few updates move the residual well away from zero (it starts at exactly the base)
TRAIN += ["algo.batch_size=8", "algo.learning_starts=4", "algo.updates_per_step=1", "algo.actor_lr=0.05"]


@pytest.fixture(scope="module")
def demos_and_act(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("lerobot_residual_export")
    argv = ["collect", "scripted:arm-push", "--episodes", "2", "--num-envs", "2", "--images", "--camera", "top"]
    assert main([*argv, "--format", "lerobot", "--out", str(root / "demos")]) == 0
    return root / "demos", save_policy("act", root / "demos", root / "act")


O2O = ["--dataset", "DEMOS", "algo.cql_num_actions=2", "algo.offline_steps=4", "algo.offline_updates_per_step=2"]


def train_and_export(algo: str, base: Path, run: Path, *extra: str) -> Path:
    """``embodied train arm-push --algo ALGO --base lerobot:BASE`` for 40 env steps, then
    ``embodied export RUN --format lerobot`` (which fails above the parity tolerance)."""
    argv = ["train", "arm-push", "--algo", algo, "--base", f"lerobot:{base}", "--run-dir", str(run), *TRAIN, *extra]
    assert main([*argv, "algo.critic_warmup_updates=0", "trainer.total_env_steps=40"]) == 0
    assert main(["export", str(run), "--format", "lerobot", "--no-record"]) == 0
    return run


def run_against_export(run_dir: Path, base: Path, steps: int = 12) -> tuple[float, float]:
    """Max ``|export - run|`` and min over steps of max ``|export - base alone|`` over a rollout,
    the checkpoint loaded through ``lerobot:`` loading; every step samples from the same seed."""
    folder = run_dir / "export" / "lerobot"
    env = arm_push_env(2)
    try:
        run = load_run(run_dir).policy
        exported = load_lerobot_policy(f"lerobot:{folder}", "arm-push", env.obs_spec, env.action_dim, "top")
        alone = load_lerobot_policy(f"lerobot:{base}", "arm-push", env.obs_spec, env.action_dim, "top")
        obs, errors, residuals = env.reset(seed=5), [], []
        for step in range(steps):
            torch.manual_seed(step)
            want = run.act(obs)
            torch.manual_seed(step)
            got = exported.act(obs, deterministic=True)
            torch.manual_seed(step)
            residuals.append(float((got - alone.act(obs, deterministic=True)).abs().max()))
            errors.append(float((got - want).abs().max()))
            obs = env.step(want)[0]
    finally:
        env.close()
    return max(errors), min(residuals)


@pytest.fixture(scope="module")
def residual_run(demos_and_act: tuple[Path, Path]) -> Path:
    """A residual trained on the ACT base through the CLI, then exported."""
    _, act = demos_and_act
    return train_and_export("residual", act, act.parent / "residual")


def test_export_acts_as_the_run_and_not_as_the_base(residual_run: Path, demos_and_act: tuple[Path, Path]) -> None:
    """12 steps (6 plans of the base, 2 of each chunk of 4 executed): the checkpoint acts as the
    run's policy, and not as the base alone (the residual is in it, not dropped)."""
    folder = residual_run / "export" / "lerobot"
    assert (folder / "model.safetensors").is_file() and (folder / "base" / "model.safetensors").is_file()
    assert json.loads((folder / "config.json").read_text())["type"] == "embodied_residual"
    err, residual = run_against_export(residual_run, demos_and_act[1])
    assert err <= PARITY_TOL
    assert residual > 100 * PARITY_TOL  # dropping the residual would fail the parity check


@pytest.mark.slow
@pytest.mark.parametrize(
    ("algo", "kind", "overrides"),
    [
        ("o2o-residual", "act", {}),
        ("residual", "act", {"temporal_ensemble_coeff": 0.01, "n_action_steps": 1}),  # ACT's own ensembling
        ("residual", "smolvla", {}),  # flow sampling: the same seed on both sides
        ("residual", "diffusion", {"n_obs_steps": 1}),  # diffusion sampling, likewise
    ],
)
def test_other_algos_and_bases_export(
    algo: str, kind: str, overrides: dict[str, Any], demos_and_act: tuple[Path, Path], tmp_path: Path
) -> None:
    demos, _ = demos_and_act
    base = save_policy(kind, demos, tmp_path / kind, overrides=overrides)
    extra = [str(demos) if arg == "DEMOS" else arg for arg in O2O] if algo == "o2o-residual" else []
    run = train_and_export(algo, base, tmp_path / "run", *extra)
    err, residual = run_against_export(run, base, steps=6)
    assert err <= PARITY_TOL
    assert residual > 100 * PARITY_TOL


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
    """``eval lerobot:RUN/export/lerobot --task --camera`` and ``eval RUN --policy lerobot``: the same
    deterministic policy (ACT and the residual) on the same seed, so the same episode."""
    folder = residual_run / "export" / "lerobot"
    argv = ["eval", f"lerobot:{folder}", "--task", "arm-push", "--camera", "top", "--episodes", "1", "--json"]
    assert main(argv) == 0
    assert main(["eval", str(residual_run), "--policy", "lerobot", "--episodes", "1", "--json"]) == 0
    # LeRobot's from_pretrained prints a line of its own (stdout) before each JSON object
    objects = [line for line in capsys.readouterr().out.splitlines() if line.startswith("{")]
    by_ref, by_run = (json.loads(line) for line in objects[-2:])
    assert by_ref["episodes"] == 1 and by_ref["mean_episode_length"] > 0
    assert by_ref.pop("policy") == f"lerobot:{folder}" and by_run.pop("policy") == "lerobot"
    assert by_ref == by_run


def test_other_formats_are_refused_naming_lerobot(residual_run: Path) -> None:
    from embodied.training.run_policy import export_run

    with pytest.raises(
        EmbodiedError, match=r"format .onnx. cannot hold a residual on a LeRobot base.*--format lerobot"
    ):
        export_run(residual_run, "onnx")


def test_bases_the_checkpoint_cannot_reproduce_are_refused(demos_and_act: tuple[Path, Path]) -> None:
    from embodied.training.lerobot_residual_export import exportable_base

    env = arm_push_env(1)
    try:
        base = load_lerobot_policy(f"lerobot:{demos_and_act[1]}", "arm-push", env.obs_spec, env.action_dim, "top")
    finally:
        env.close()
    assert exportable_base(base, Path("run")) is base.lerobot
    base.lerobot_queue = False  # acted through embodied's chunk runner
    with pytest.raises(EmbodiedError, match="not its own select_action"):
        exportable_base(base, Path("run"))
    base.lerobot_queue, base.state_group = True, "privileged"
    with pytest.raises(EmbodiedError, match=r"reads observation group 'privileged' as observation\.state"):
        exportable_base(base, Path("run"))
