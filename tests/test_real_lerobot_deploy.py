"""``embodied deploy`` of LeRobot policies: small ACT and SmolVLA checkpoints (lerobot 0.4.4's real
classes, random weights, saved with ``save_pretrained``; SmolVLA on the tiny local backbone of
tests/lerobot_support.py) deployed through the node (:func:`~embodied.real.deploy.build_node`,
:class:`~embodied.real.node.PolicyNode`) on arm-push's robot config with the top camera. The node's
commands equal, step for step, what ``embodied eval lerobot:`` computes (``load_lerobot_policy`` on
the same observations, the same seed for SmolVLA's flow sampling), and the refusals name what is
wrong.

Limits: the node's transport here is the in-process one (``MemoryTransport``; cyclonedds is not
in the LeRobot environment, and the DDS transport is tested on its own elsewhere); the robot is
the MuJoCo task published as the robot's topics (:class:`~embodied.real.sim_state.ArmPushState`).

Runs in the LeRobot environment (``bash scripts/setup_lerobot.sh``); skips elsewhere.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from flow_deploy_support import ARM_ROBOT, ArmPublisher
from lerobot_support import CAMERA, save_policy
from real_support import write_robot_variant
from test_real_camera import CAMERA_INPUT

from embodied import registry
from embodied.cli import main
from embodied.config import apply_overrides
from embodied.env import IMAGE_GROUP
from embodied.errors import EmbodiedError
from embodied.real.deploy import build_node, open_runner
from embodied.real.robot_config import load_robot
from embodied.real.safety import SafetyState
from embodied.real.torch_runner import TorchPolicyRunner
from embodied.real.transports.memory import MemoryTransport
from embodied.training.lerobot_base import load_lerobot_policy

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("lerobot") is None,
    reason="lerobot is not installed here; its environment comes from bash scripts/setup_lerobot.sh",
)

TRAINED = "push the block to the goal"
STEPS = 6
"""Steps flown after arming: three plans of SmolVLA / ACT (n_action_steps 2)."""


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A LeRobotDataset of arm-push with the top camera (for the checkpoints' normalization)."""
    root = tmp_path_factory.mktemp("lerobot_deploy")
    argv = ["collect", "scripted:arm-push", "--episodes", "1", "--num-envs", "1", "--images", "--camera", "top"]
    assert main([*argv, "--format", "lerobot", "--out", str(root / "demos")]) == 0
    return root


@pytest.fixture(scope="module")
def checkpoints(root: Path) -> dict[str, Path]:
    return {kind: save_policy(kind, root / "demos", root / kind) for kind in ("act", "smolvla")}


def camera_robot(tmp_path: Path, **edits: Any) -> Path:
    """arm_push_sim.yaml with the top camera as its camera input, plus ``edits`` (dotted keys)."""
    base: dict[str, Any] = {"inputs.top_camera": CAMERA_INPUT, "camera": {"input": "top_camera"}}
    return write_robot_variant(tmp_path, ARM_ROBOT, base | edits)


def arm_push_env() -> Any:
    cfg = apply_overrides(registry.task_cfg("arm-push"), {"backend": {"camera": "top"}}, "test")
    return registry.make_env("arm-push", cfg, 1, "cpu", 0)


class Flight:
    """The node on a hand-driven clock, fed one env's observations as the robot's topics."""

    def __init__(self, source: str, robot: Path, **kwargs: Any) -> None:
        self.now_s = 1000.0
        self.seed = 0
        transport = MemoryTransport()
        self.node = build_node(transport, source, robot, clock=lambda: self.now_s, **kwargs)
        self.publish = ArmPublisher(transport, load_robot(robot))
        spec = self.node.io_spec
        self.scale = np.array([f.scale for f in spec.action_fields])
        self.offset = np.array([f.offset for f in spec.action_fields])

    def period(self, obs: dict[str, torch.Tensor]) -> np.ndarray | None:
        """One control period on ``obs``; the sampling seed of period ``k`` is ``k``. Returns the
        command as a normalized action (None: nothing sent)."""
        self.now_s += self.node.period_s
        self.seed += 1
        self.publish(obs["policy"][0].numpy(), obs[IMAGE_GROUP][0].numpy() if IMAGE_GROUP in obs else None)
        torch.manual_seed(self.seed)
        command = self.node.step(self.now_s)
        return None if command is None else (command - self.offset) / self.scale

    def arm(self, obs: dict[str, torch.Tensor]) -> np.ndarray:
        """Periods on ``obs`` until the node drives (the re-arm rule; the task frozen meanwhile)."""
        for _ in range(20):
            action = self.period(obs)
            if self.node.state is SafetyState.ARMED and action is not None:
                return action
        raise AssertionError(f"the node did not arm: {self.node.status()}")


def fly_beside(flight: Flight, env: Any, policy: Any, seed: int) -> float:
    """Fly :data:`STEPS` steps of ``env`` on the node's commands, ``policy`` (``obs dict -> [1, A]``,
    fresh) run beside it on the env's own observation with the same sampling seed each period.
    Returns ``max |node action - policy action|``."""
    obs = env.reset(seed=seed)
    action: np.ndarray | None = flight.arm(obs)
    worst = 0.0
    for step in range(STEPS):
        if step:
            action = flight.period(obs)
        assert action is not None and flight.node.state is SafetyState.ARMED, flight.node.status()
        torch.manual_seed(flight.seed)
        want = policy(obs)
        worst = max(worst, float(np.max(np.abs(action - want[0].numpy()))))
        obs = env.step(torch.as_tensor(action, dtype=torch.float32)[None])[0]
    return worst


@pytest.mark.parametrize("kind", ["act", "smolvla"])
def test_the_node_commands_what_eval_computes(kind: str, checkpoints: dict[str, Path], tmp_path: Path) -> None:
    source = f"lerobot:{checkpoints[kind]}"
    robot = camera_robot(tmp_path, task="arm-push")
    flight = Flight(source, robot)
    assert isinstance(flight.node.runner, TorchPolicyRunner) and flight.node.runner.image_shape == (64, 64, 3)
    env = arm_push_env()
    try:
        # embodied eval lerobot:PATH --task arm-push --camera top: the same loader, the same act()
        policy = load_lerobot_policy(source, "arm-push", env.obs_spec, env.action_dim, "top")
        worst = fly_beside(flight, env, lambda obs: policy.act(obs, deterministic=True), seed=4)
    finally:
        env.close()
    assert worst <= 1e-5, worst


def test_the_robot_configs_instruction_is_lerobots_task(checkpoints: dict[str, Path], tmp_path: Path) -> None:
    source = f"lerobot:{checkpoints['smolvla']}"
    default = TorchPolicyRunner(source, load_robot(camera_robot(tmp_path)), task="arm-push")
    assert default.instruction == TRAINED  # the task's training instruction (LEROBOT_TASKS)
    flight = Flight(source, camera_robot(tmp_path, task="arm-push", instruction="pick the red cube"))
    runner = flight.node.runner
    assert isinstance(runner, TorchPolicyRunner) and runner.instruction == "pick the red cube"
    seen: list[Any] = []
    wrapper = runner._policy.lerobot
    preprocess = wrapper.preprocessor

    def recording(batch: dict[str, Any]) -> Any:
        seen.append(batch["task"])
        return preprocess(batch)

    wrapper.preprocessor = recording
    obs = np.zeros(18, dtype=np.float32)
    image = np.full((64, 64, 3), 90, dtype=np.uint8)
    torch.manual_seed(0)
    other = runner(obs, image)
    assert seen == [["pick the red cube"]]
    default.prepare(load_robot(camera_robot(tmp_path)))
    torch.manual_seed(0)
    assert not np.allclose(other, default(obs, image), atol=1e-6)  # the instruction reaches the VLM


def test_the_queue_restarts_when_the_node_rearms(checkpoints: dict[str, Path], tmp_path: Path) -> None:
    """A deactivation empties LeRobot's action queue: after re-arming the node plans afresh."""
    flight = Flight(f"lerobot:{checkpoints['act']}", camera_robot(tmp_path, task="arm-push"))
    env = arm_push_env()
    try:
        obs = env.reset(seed=1)
        first = flight.arm(obs)
        runner = flight.node.runner
        assert isinstance(runner, TorchPolicyRunner)
        act = runner._policy.lerobot.lerobot  # LeRobot's ACTPolicy
        assert len(act._action_queue) == 1  # n_action_steps 2: one action left of the plan
        flight.node.deactivate("test")
        flight.period(obs)
        assert len(act._action_queue) == 0
        flight.node.activate()
        np.testing.assert_allclose(flight.arm(obs), first, rtol=0, atol=1e-6)  # ACT: the same fresh plan
    finally:
        env.close()


def test_refusals_name_what_is_wrong(checkpoints: dict[str, Path], tmp_path: Path) -> None:
    act = checkpoints["act"]
    # no task: the feature mapping and the interface are the task's
    with pytest.raises(EmbodiedError, match=r"--task NAME. or .task: NAME. in robot config .*variant_"):
        Flight(f"lerobot:{act}", camera_robot(tmp_path))
    # no camera input for a policy that reads one
    with pytest.raises(
        EmbodiedError,
        match=r"observation\.images\.top, 64x64x3 RGB\) and robot config .*arm_push_sim\.yaml has no camera",
    ):
        Flight(f"lerobot:{act}", ARM_ROBOT, task="arm-push")
    # two cameras, the robot config feeds one
    two = tmp_path / "two_cameras"
    shutil.copytree(act, two)
    config = json.loads((two / "config.json").read_text())
    config["input_features"]["observation.images.wrist"] = config["input_features"][CAMERA]
    (two / "config.json").write_text(json.dumps(config))
    with pytest.raises(
        EmbodiedError, match=r"reads 2 cameras \(observation\.images\.top, observation\.images\.wrist\); robot config"
    ):
        Flight(f"lerobot:{two}", camera_robot(tmp_path, task="arm-push"))
    # a policy type no installed LeRobot policy or plugin defines
    unknown = tmp_path / "unknown_type"
    shutil.copytree(act, unknown)
    (unknown / "config.json").write_text(json.dumps(json.loads((act / "config.json").read_text()) | {"type": "nope"}))
    with pytest.raises(EmbodiedError, match=r"knows no policy type of .*unknown_type.*config\.json"):
        Flight(f"lerobot:{unknown}", camera_robot(tmp_path, task="arm-push"))
    # a task whose actions the policy does not output
    with pytest.raises(EmbodiedError, match=r"action: the policy outputs shape \(3,\), the task acts with \(4,\)"):
        Flight(f"lerobot:{act}", camera_robot(tmp_path), task="quad-hover")


def test_a_picture_of_another_size_needs_camera_resize(root: Path, tmp_path: Path) -> None:
    small = save_policy("act", root / "demos", tmp_path / "small", image_px=32)
    env = arm_push_env()
    try:
        obs = env.reset(seed=0)  # 64x64 pictures
        flight = Flight(f"lerobot:{small}", camera_robot(tmp_path, task="arm-push"))
        for _ in range(3):
            assert flight.period(obs) is None or flight.node.state is not SafetyState.ARMED
        assert flight.node.rejections["invalid_image"] == 3
        assert "image is 64x64 (height x width), the policy reads 32x32" in flight.node.last_error
        assert "camera.resize: true" in flight.node.last_error
        scaled = Flight(
            f"lerobot:{small}", camera_robot(tmp_path, task="arm-push", camera={"input": "top_camera", "resize": True})
        )
        assert np.isfinite(scaled.arm(obs)).all() and not scaled.node.rejections
    finally:
        env.close()


def test_print_launch_passes_the_lerobot_source(
    checkpoints: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    robot = camera_robot(tmp_path, task="arm-push")
    assert main(["deploy", f"lerobot:{checkpoints['act']}", "--robot", str(robot), "--print-launch"]) == 0
    assert f"export_dir:=lerobot:{checkpoints['act']} robot_config:={robot.resolve()}" in capsys.readouterr().out


@pytest.mark.parametrize("missing", ["lerobot.configs.policies", "torch"])
def test_without_lerobot_the_error_names_its_setup(
    missing: str, checkpoints: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Python without LeRobot (or without torch: a robot-side install for ONNX exports) gets an
    error naming the LeRobot environment. Absence is simulated the way Python's import system
    defines it, a ``None`` entry in ``sys.modules`` (importing it raises ImportError), since this
    environment has both."""
    import embodied.training

    monkeypatch.setitem(sys.modules, missing, None)
    # the torch side is imported afresh, as in a process that never loaded it
    monkeypatch.delitem(sys.modules, "embodied.training.torch_deploy", raising=False)
    monkeypatch.delattr(embodied.training, "torch_deploy", raising=False)
    with pytest.raises(EmbodiedError, match=r"bash scripts/setup_lerobot\.sh") as err:
        open_runner(
            f"lerobot:{checkpoints['act']}",
            load_robot(camera_robot(tmp_path)),
            task="arm-push",
        )
    want = (
        "runs on torch and LeRobot, which this Python cannot import"
        if missing == "torch"
        else "needs the 'lerobot.configs.policies' package"
    )
    assert want in str(err.value)


def _train_argv(algo: str, base: Path, run: Path) -> list[str]:
    """A tiny ``embodied train arm-push --algo ALGO --base lerobot:BASE`` (as tests/test_reinflow_smolvla.py
    and tests/test_lerobot_base.py train them)."""
    argv = ["train", "arm-push", "--algo", algo, "--base", f"lerobot:{base}", "--run-dir", str(run), "--num-envs", "2"]
    argv += ["--no-progress", "env.backend.camera=top", "trainer.eval_episodes=1", "trainer.torch_threads=1"]
    if algo == "reinflow":
        argv += ["trainer.total_env_steps=6", "algo.num_steps_per_env=3", "algo.num_minibatches=2"]
        return [*argv, "algo.num_epochs=1", "algo.critic_hidden=[32,32]"]
    return [*argv, "trainer.total_env_steps=8", "algo.batch_size=8", "algo.learning_starts=2"]


@pytest.mark.slow  # trains a run first
@pytest.mark.parametrize(("algo", "kind"), [("reinflow", "smolvla"), ("residual", "act")])
def test_a_run_on_a_lerobot_base_deploys_from_its_directory(
    algo: str, kind: str, checkpoints: dict[str, Path], tmp_path: Path
) -> None:
    """A run that fine-tuned a LeRobot policy (ReinFlow in place, or a residual on its actions)
    deploys from its directory and commands what ``embodied eval RUN`` computes."""
    from embodied.training.evaluate import load_torch_policy

    run = tmp_path / algo
    assert main(_train_argv(algo, checkpoints[kind], run)) == 0
    flight = Flight(str(run), camera_robot(tmp_path))  # the task is the run's
    assert isinstance(flight.node.runner, TorchPolicyRunner)
    env = arm_push_env()
    try:
        policy = load_torch_policy(run, env)  # what `embodied eval RUN` flies
        worst = fly_beside(flight, env, policy, seed=2)
    finally:
        env.close()
    assert worst <= 1e-5, worst
    with pytest.raises(EmbodiedError, match="was trained on 'arm-push', the deploy names task 'quad-hover'"):
        Flight(str(run), camera_robot(tmp_path), task="quad-hover")


@pytest.mark.slow  # two processes start Cyclone DDS, the simulator renders every step
def test_a_lerobot_checkpoint_flies_arm_push_over_dds(checkpoints: dict[str, Path], tmp_path: Path) -> None:
    """`embodied deploy lerobot:PATH` and `embodied sim-robot arm-push` as two processes over Cyclone
    DDS on loopback, on simulation time: the command line, the DDS transport and the torch runner."""
    pytest.importorskip("cyclonedds")
    from test_real_arm_dds import fly_arm_push_over_dds

    robot = camera_robot(tmp_path, task="arm-push")
    node_out = fly_arm_push_over_dds(f"lerobot:{checkpoints['act']}", robot, ["--env", "backend.camera=top"])
    assert "policy runner: torch (a LeRobot checkpoint runs on LeRobot's own torch code)" in node_out, node_out


@pytest.mark.slow  # trains and exports a run first
def test_an_embodied_export_to_lerobot_deploys_as_a_lerobot_checkpoint(root: Path, tmp_path: Path) -> None:
    """`embodied export RUN --format lerobot` writes a checkpoint of the `embodied` policy type (the
    plugin in integrations/lerobot_policy_embodied); deployed as lerobot:RUN/export/lerobot it
    commands what `embodied eval RUN` computes."""
    from embodied.training.evaluate import load_torch_policy

    run = tmp_path / "bc"
    argv = ["train", "arm-push", "--algo", "bc-flow", "--dataset", str(root / "demos"), "--run-dir", str(run)]
    argv += ["--num-envs", "2", "--no-progress", "algo.policy.hidden=[32,32]", "algo.policy.chunk=4"]
    argv += ["algo.policy.exec_steps=2", "algo.policy.temporal_ensemble=false", "algo.policy.denoise_steps=2"]
    assert main([*argv, "trainer.eval_episodes=1", "trainer.torch_threads=1", "trainer.total_env_steps=8"]) == 0
    assert main(["export", str(run), "--format", "lerobot", "--no-record"]) == 0
    flight = Flight(f"lerobot:{run / 'export' / 'lerobot'}", ARM_ROBOT, task="arm-push")
    assert isinstance(flight.node.runner, TorchPolicyRunner) and flight.node.runner.image_shape is None
    env = registry.make_env("arm-push", registry.task_cfg("arm-push"), 1, "cpu", 0)
    try:
        worst = fly_beside(flight, env, load_torch_policy(run, env), seed=5)
    finally:
        env.close()
    assert worst <= 1e-5, worst
