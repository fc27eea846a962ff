"""The contract layer: registry results are checked against the protocols, optional env
capabilities are protocols, and discrete action spaces are rejected with a named error."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from embodied import registry
from embodied.algo import Algorithm
from embodied.cli import main
from embodied.env import (
    ActionSpaceReport,
    PhysicalStateEnv,
    ResumeReport,
    VecEnv,
    action_space_kind,
    require_box_actions,
    resumes_exactly,
)
from embodied.errors import EmbodiedError

pytestmark = pytest.mark.filterwarnings("ignore:.*Box observation space.*infinity")


def test_registry_builds_protocol_instances() -> None:
    env = registry.make_env("quad-hover", registry.task_cfg("quad-hover"), 2, "cpu", seed=0)
    assert isinstance(env, VecEnv)
    for name in registry.ALGOS:
        assert isinstance(registry.make_algo(name, registry.algo_cfg(name), env), Algorithm)


class HalfAnEnv:
    """Has the attributes of a VecEnv but no ``step``/``reset``/... methods."""

    def __init__(self, cfg: object, num_envs: int, device: torch.device, seed: int) -> None:
        self.num_envs, self.device, self.obs_spec, self.action_dim, self.dt = num_envs, device, {"policy": (1,)}, 1, 0.1


def test_registry_rejects_a_target_that_is_not_a_vecenv(monkeypatch: pytest.MonkeyPatch) -> None:
    entry = registry.Entry(f"{__name__}:HalfAnEnv", "embodied.tasks.quadrotor.hover:QuadHoverCfg", "not an env")
    monkeypatch.setitem(registry.TASKS, "not-an-env", entry)
    with pytest.raises(EmbodiedError, match=r"HalfAnEnv built a HalfAnEnv that does not implement VecEnv"):
        registry.make_env("not-an-env", registry.task_cfg("not-an-env"), 1, "cpu", seed=0)


def test_registry_rejects_a_config_that_is_not_a_dataclass(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(registry.ALGOS, "dict-cfg", registry.Entry("embodied.algos.ppo:PPO", "builtins:dict", "x"))
    with pytest.raises(EmbodiedError, match=r"'builtins:dict' built a dict, not a dataclass instance"):
        registry.algo_cfg("dict-cfg")


def test_capabilities_are_protocols() -> None:
    quad = registry.make_env("quad-hover", registry.task_cfg("quad-hover"), 1, "cpu", seed=0)
    assert isinstance(quad, PhysicalStateEnv)
    assert not isinstance(quad, ActionSpaceReport) and action_space_kind(quad) == "box"
    assert not isinstance(quad, ResumeReport) and resumes_exactly(quad)

    pendulum = registry.make_env("gym:Pendulum-v1", registry.task_cfg("gym:Pendulum-v1"), 1, "cpu", seed=0)
    assert not isinstance(pendulum, PhysicalStateEnv)
    assert isinstance(pendulum, ActionSpaceReport) and action_space_kind(pendulum) == "box"
    assert isinstance(pendulum, ResumeReport) and not resumes_exactly(pendulum)
    require_box_actions(pendulum, "PPO")  # a Box space passes


@pytest.mark.parametrize("algo", sorted(registry.ALGOS))
def test_discrete_action_space_is_rejected_at_construction(algo: str) -> None:
    env = registry.make_env("gym:CartPole-v1", registry.task_cfg("gym:CartPole-v1"), 2, "cpu", seed=0)
    assert action_space_kind(env) == "discrete"
    with pytest.raises(EmbodiedError, match=r"needs continuous \(box\) actions.*'discrete'"):
        registry.make_algo(algo, registry.algo_cfg(algo), env)


def test_cartpole_ppo_from_the_cli_exits_2_naming_the_action_space(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    run_dir = tmp_path / "cartpole"
    code = main(["train", "gym:CartPole-v1", "--algo", "ppo", "--run-dir", str(run_dir), "--no-progress"])
    assert code == 2
    assert "PPO needs continuous (box) actions" in caplog.text and "'discrete'" in caplog.text


def test_zero_sized_action_is_rejected() -> None:
    env = registry.make_env("quad-hover", registry.task_cfg("quad-hover"), 1, "cpu", seed=0)
    env.action_dim = 0
    with pytest.raises(EmbodiedError, match="action_dim >= 1, got 0"):
        require_box_actions(env, "SAC")
