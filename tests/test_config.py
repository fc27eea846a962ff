"""Config layering and the errors users see for bad input."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pytest

from embodied.config import ConfigError, apply_overrides, closest, describe, parse_dotted


@dataclass(frozen=True)
class Inner:
    lr: float = 1e-3
    """learning rate"""
    hidden: tuple[int, ...] = (64, 64)


@dataclass(frozen=True)
class Outer:
    steps: int = 10
    """how many steps"""
    name: str = "a"
    flag: bool = False
    maybe: float | None = None
    inner: Inner = field(default_factory=Inner)


def test_overrides_apply_nested_and_coerce() -> None:
    cfg = apply_overrides(
        Outer(), parse_dotted(["steps=2e3", "inner.lr=3e-4", "inner.hidden=[32, 16]", "maybe=1"]), "cli"
    )
    assert cfg.steps == 2000 and isinstance(cfg.steps, int)
    assert cfg.inner.lr == pytest.approx(3e-4)
    assert cfg.inner.hidden == (32, 16)
    assert cfg.maybe == 1.0
    assert Outer().inner.lr == 1e-3  # the default was not mutated


def test_unknown_key_names_key_source_and_suggestion() -> None:
    with pytest.raises(ConfigError) as err:
        apply_overrides(Outer(), {"inner": {"lrr": 1.0}}, "my.yaml")
    msg = str(err.value)
    assert "my.yaml" in msg and "inner.lrr" in msg and msg.index("inner.lr") < msg.index("inner.hidden")


def test_wrong_type_names_expected_type() -> None:
    with pytest.raises(ConfigError, match=r"cli: key 'steps' expects int, got 'many'"):
        apply_overrides(Outer(), {"steps": "many"}, "cli")
    with pytest.raises(ConfigError, match="flag"):
        apply_overrides(Outer(), {"flag": 1}, "cli")
    with pytest.raises(ConfigError, match=r"steps.*2\.5"):
        apply_overrides(Outer(), {"steps": 2.5}, "cli")


def test_parse_dotted_rejects_missing_equals() -> None:
    with pytest.raises(ConfigError, match="key=value"):
        parse_dotted(["algo.lr"])


def test_closest_orders_by_similarity() -> None:
    assert closest("quad-hovr", ["mujoco-ant", "quad-hover", "gym"])[0] == "quad-hover"


def test_describe_lists_docs() -> None:
    rows = {key: doc for key, _, doc in describe(Outer())}
    assert rows["steps"] == "how many steps"
    assert rows["inner.lr"] == "learning rate"


def test_experiment_layers_and_errors(tmp_path: Path) -> None:
    from embodied.experiment import resolve_experiment

    bad = tmp_path / "bad.yaml"
    bad.write_text("trainer:\n  total_env_step: 5\n")
    with pytest.raises(ConfigError, match=r"bad\.yaml.*trainer\.total_env_step.*trainer\.total_env_steps"):
        resolve_experiment("quad-hover", "ppo", config_file=bad)
    good = tmp_path / "good.yaml"
    good.write_text("num_envs: 8\ntrainer:\n  total_env_steps: 1000\n")
    cfg = resolve_experiment("quad-hover", "ppo", config_file=good, overrides=["trainer.total_env_steps=2000"], seed=4)
    assert (cfg.num_envs, cfg.trainer.total_env_steps, cfg.seed) == (8, 2000, 4)


def test_unknown_task_algo_device_list_choices() -> None:
    from embodied import registry
    from embodied.experiment import resolve_experiment

    with pytest.raises(ConfigError, match=r"unknown task 'quad-hovr'.*closest first.*quad-hover"):
        resolve_experiment("quad-hovr")
    with pytest.raises(ConfigError, match=r"unknown algorithm 'ppp'.*ppo"):
        resolve_experiment("quad-hover", "ppp")
    import torch

    if not torch.cuda.is_available():
        with pytest.raises(ConfigError, match=r"CUDA is not available.*cpu"):
            registry.resolve_device("cuda")
    with pytest.raises(ConfigError, match="unknown device 'tpu'"):
        registry.resolve_device("tpu")
