"""Backend selection: tasks chosen per run on a backend, deprecated aliases, install hints for
missing optional packages, `embodied list` and `bench sim BACKEND:TASK` input checks.

The simulators themselves are exercised in test_mujoco_backend.py and test_mjwarp_backend.py;
nothing here imports warp (the missing-package tests make it unimportable on purpose).
"""

from __future__ import annotations

import logging
import sys

import pytest

pytest.importorskip("mujoco")
pytest.importorskip("gymnasium")

from embodied import registry
from embodied.cli import main
from embodied.config import ConfigError
from embodied.errors import MissingDependencyError
from embodied.tasks.mujoco_locomotion import Ant, HalfCheetah


def test_tasks_list_their_backends_default_first() -> None:
    assert registry.task_backends("halfcheetah") == ["mujoco", "mjwarp"]
    assert registry.task_backends("quad-hover") == ["quadrotor"]
    assert registry.task_backends("gym:Pendulum-v1") == ["gymnasium"]
    for name, entry in registry.TASKS.items():
        for backend in entry.implementations():
            assert backend in registry.BACKENDS, f"{name} names unregistered backend {backend}"


def test_backend_is_chosen_by_config_and_checked() -> None:
    assert registry.task_cfg("halfcheetah").backend.name == "mujoco"  # type: ignore[attr-defined]
    cfg = registry.task_cfg("halfcheetah", "mjwarp")
    assert registry.selected_backend("halfcheetah", cfg) == "mjwarp"
    assert registry.selected_backend("quad-hover", registry.task_cfg("quad-hover")) == "quadrotor"
    with pytest.raises(ConfigError, match="runs on: mujoco, mjwarp"):
        registry.task_cfg("halfcheetah", "maniskill")
    with pytest.raises(ConfigError, match="runs on: quadrotor"):
        registry.backend_override("quad-hover", "mujoco")
    assert registry.backend_override("ant", "mjwarp") == ["env.backend.name=mjwarp"]
    assert registry.backend_override("quad-hover", "quadrotor") == []


def test_deprecated_alias_builds_the_same_task_and_logs(caplog: pytest.LogCaptureFixture) -> None:
    registry._WARNED_ALIASES.discard("mujoco-ant")
    with caplog.at_level(logging.WARNING, logger="embodied.registry"):
        env = registry.make_env("mujoco-ant", registry.task_cfg("mujoco-ant"), num_envs=2, device="cpu", seed=0)
    assert type(env) is Ant
    assert "'mujoco-ant' is deprecated" in caplog.text and "--backend mujoco" in caplog.text
    env.close()
    env = registry.make_env("halfcheetah", registry.task_cfg("halfcheetah"), num_envs=2, device="cpu", seed=0)
    assert type(env) is HalfCheetah
    env.close()


@pytest.fixture
def no_mujoco_warp(monkeypatch: pytest.MonkeyPatch) -> None:
    """MuJoCo-Warp made unimportable (``None`` in ``sys.modules`` makes ``import`` raise)."""
    for name in [n for n in sys.modules if n == "mujoco_warp" or n.startswith("mujoco_warp.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "mujoco_warp", None)


def test_missing_mjwarp_names_the_extra(no_mujoco_warp: None) -> None:
    cfg = registry.task_cfg("halfcheetah", "mjwarp")
    with pytest.raises(MissingDependencyError, match=r'pip install "embodied\[mjwarp\]"'):
        registry.make_env("halfcheetah", cfg, num_envs=2, device="cpu", seed=0)
    from embodied.sim import mjwarp

    with pytest.raises(MissingDependencyError, match=r"warp.*embodied\[mjwarp\]"):
        mjwarp.warp_modules()
    assert "mujoco_warp" in registry.BACKENDS["mjwarp"].missing()


def test_missing_mjwarp_through_the_cli(
    no_mujoco_warp: None, tmp_path: object, caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["train", "halfcheetah", "--backend", "mjwarp", "--no-progress", "--run-dir", f"{tmp_path}/run"])
    assert code == 2
    assert 'pip install "embodied[mjwarp]"' in caplog.text
    assert main(["list"]) == 0
    listing = capsys.readouterr().out
    line = next(li for li in listing.splitlines() if li.strip().startswith("mjwarp "))
    assert "not installed" in line and "embodied[mjwarp]" in line
    assert "halfcheetah" in listing and "[mujoco, mjwarp]" in listing


def test_train_backend_flag_lands_in_the_config(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["train", "halfcheetah", "--backend", "mjwarp", "--print-config"]) == 0
    assert "env.backend.name = 'mjwarp'" in capsys.readouterr().out
    # an alias implies its backend; --backend names another one explicitly
    assert main(["train", "mujoco-halfcheetah", "--backend", "mjwarp", "--print-config"]) == 0
    out = capsys.readouterr().out
    assert "task_name = 'halfcheetah'" in out and "env.backend.name = 'mjwarp'" in out
    assert main(["train", "halfcheetah", "--backend", "quadrotor", "--print-config"]) == 2


def test_bench_target_is_checked(caplog: pytest.LogCaptureFixture) -> None:
    from embodied.backend_bench import parse_target

    assert parse_target("mjwarp:ant") == ("mjwarp", "ant")
    for form in ("gym:Pendulum-v1", "gymnasium:Pendulum-v1", "gymnasium:gym:Pendulum-v1"):
        assert parse_target(form) == ("gymnasium", "gym:Pendulum-v1")
    assert parse_target("isaaclab:Isaac-Cartpole-Direct") == ("isaaclab", "isaaclab:Isaac-Cartpole-Direct")
    for bad, why in [("mjwarp", "BACKEND:TASK"), ("nope:ant", "unknown backend"), ("quadrotor:ant", "runs on")]:
        with pytest.raises(ConfigError, match=why):
            parse_target(bad)
    assert main(["bench", "sim", "mjwarp:quad-hover", "--num-envs", "2"]) == 2
    assert "runs on: quadrotor" in caplog.text
    assert main(["bench", "sim", "Pendulum-v1", "--num-envs", "2"]) == 2
    assert "gym:Pendulum-v1" in caplog.text  # the error teaches the target forms


def test_bench_sim_measures_gymnasium_against_its_vector_step() -> None:
    pytest.importorskip("gymnasium")
    from embodied.backend_bench import bench_backend_task

    result = bench_backend_task("gym:Pendulum-v1", num_envs=4, device="cpu", steps=10, repeats=1)
    assert result["bench"] == "gym:Pendulum-v1" and result["raw_steps_per_s"] > 0
    assert result["ratio_vs_raw"] == pytest.approx(result["steps_per_s"] / result["raw_steps_per_s"])


def test_maniskill_task_name_sets_the_env_id() -> None:
    """The backend itself is tested in tests/test_maniskill_backend.py (where ManiSkill runs)."""
    from embodied.sim import maniskill

    cfg = registry.task_cfg("maniskill:PickCube-v1")
    assert isinstance(cfg, maniskill.ManiSkillCfg) and cfg.env_id == "PickCube-v1"
    assert registry.task_backends("maniskill:PickCube-v1") == ["maniskill"]
    assert isinstance(maniskill.vulkan_drivers(), list)
