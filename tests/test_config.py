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


ABSURD = [
    ("env.sim.params.inertia_kgm2=[.nan, 1.66e-5, 2.93e-5]", r"'env\.sim\.params\.inertia_kgm2\[0\]' must be a finite"),
    ("env.sim.params.thrust_coef_n_per_rpm2=.inf", r"'env\.sim\.params\.thrust_coef_n_per_rpm2' must be a finite"),
    ("env.sim.params.arm_length_m=inf", r"'env\.sim\.params\.arm_length_m' must be a finite"),
    ("env.sim.params.max_rpm=.inf", r"'env\.sim\.params\.max_rpm' must be a finite"),
    ("env.disturbance_force_std_n=1e30", r"'env\.disturbance_force_std_n' = 1e\+30 N is outside its plausible range"),
    ("env.sim.substeps=1e12", r"'env\.sim\.substeps' must be in \[1, 1000\]"),
    ("trainer.eval_episodes=1e12", r"'trainer\.eval_episodes' must be in"),
    ("num_envs=1e12", r"'num_envs' must be in"),
    ("env.reward_constant=1e39", r"'env\.reward_constant' must be in"),
    ("seed=1e23", r"'seed' must be in"),
    ("device=cpu:abc", r"'device' must be cpu, cuda or cuda:N"),
]


@pytest.mark.parametrize(("override", "message"), ABSURD)
def test_absurd_values_are_refused_naming_key_and_source(override: str, message: str) -> None:
    from embodied.experiment import resolve_experiment

    with pytest.raises(ConfigError, match=r"^command line: .*" + message):
        resolve_experiment("quad-hover", overrides=[override])


def test_range_errors_name_the_file_they_came_from(tmp_path: Path) -> None:
    from embodied.experiment import resolve_experiment

    path = tmp_path / "my.yaml"
    path.write_text("env:\n  sim:\n    params:\n      mass_kg: -1.0\n")
    with pytest.raises(ConfigError, match=rf"^{path}: key 'env.sim.params.mass_kg' = -1.0 kg is outside"):
        resolve_experiment("quad-hover", config_file=path)
    with pytest.raises(ConfigError, match=rf"^{path}: quadrotor params: mass_kg must be > 0"):
        resolve_experiment("quad-hover", config_file=path, allow=["unphysical"])
    path.write_text("trainer:\n  eval_episodes: .nan\n")
    with pytest.raises(ConfigError, match=rf"^{path}: key 'trainer.eval_episodes' expects int"):
        resolve_experiment("quad-hover", config_file=path)


def test_a_lifted_bound_accepts_more_but_never_nan(tmp_path: Path) -> None:
    from embodied.experiment import resolve_experiment

    key = "env.sim.substeps"
    with pytest.raises(ConfigError, match=f"add --i-know-what-im-doing {key}"):
        resolve_experiment("quad-hover", overrides=[f"{key}=2000"])
    assert resolve_experiment("quad-hover", overrides=[f"{key}=2000"], allow=[key]).env.sim.substeps == 2000
    with pytest.raises(ConfigError, match="seed"):  # not liftable: every RNG must take it
        resolve_experiment("quad-hover", overrides=["seed=5000000000"], allow=["seed"])
    with pytest.raises(ConfigError, match="finite"):
        resolve_experiment("quad-hover", overrides=["env.pos_weight=.nan"], allow=["env.pos_weight"])


def test_infinity_only_where_the_default_is_infinite() -> None:
    from embodied.config import check_number

    check_number("algo.obs_clip", float("inf"), float("inf"), "command line")
    with pytest.raises(ConfigError, match=r"'algo\.obs_clip' must be a finite number, got nan"):
        check_number("algo.obs_clip", float("nan"), float("inf"), "command line")
    with pytest.raises(ConfigError, match="must be a finite number, got inf"):
        check_number("algo.lr", float("inf"), 1e-3, "command line")


def test_a_config_file_that_is_not_utf8_is_named(tmp_path: Path) -> None:
    from embodied.config import load_yaml

    path = tmp_path / "my.yaml"
    path.write_bytes("# caf\xe9\nnum_envs: 16\n".encode("latin-1"))
    with pytest.raises(ConfigError, match=rf"^{path}: not UTF-8 text \(byte 0xe9 at offset 5\)"):
        load_yaml(path)


def test_a_truncated_saved_config_is_refused(tmp_path: Path) -> None:
    import yaml

    from embodied.config import to_plain
    from embodied.experiment import load_experiment, resolve_experiment

    text = yaml.safe_dump(to_plain(resolve_experiment("quad-hover")), sort_keys=False)
    path = tmp_path / "config.yaml"
    path.write_text(text)
    load_experiment(path)
    path.write_text(text[: text.index("trainer:")])
    with pytest.raises(ConfigError, match=r"missing key\(s\) trainer: the file is truncated or damaged"):
        load_experiment(path)


def test_a_saved_config_cut_inside_its_last_value_is_refused(tmp_path: Path) -> None:
    """The saved config ends with ``base_run: null``: a cut to ``base_run: nu`` leaves a string,
    which no PPO run can hold (training refuses a base for it); a cut to ``base_run:`` still
    loads as null, which is the same config."""
    import yaml

    from embodied.config import to_plain
    from embodied.experiment import load_experiment, resolve_experiment

    text = yaml.safe_dump(to_plain(resolve_experiment("quad-hover")), sort_keys=False)
    assert text.endswith("base_run: null\n"), "the test cuts the last value"
    path = tmp_path / "config.yaml"
    path.write_text(text[: -len("ll\n")])
    with pytest.raises(ConfigError, match=r"config.yaml: trainer.base_run / trainer.dataset name a source, but "):
        load_experiment(path)
    path.write_text(text[: -len(" null\n")])
    assert load_experiment(path).trainer.base_run is None


def test_a_config_saved_before_later_keys_loads_with_the_behaviour_it_had(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Keys added by a later version are filled with the value the old run used, and logged;
    any other missing key is still a damaged file."""
    import yaml

    from embodied.config import to_plain
    from embodied.experiment import KEYS_ADDED_LATER, load_experiment, resolve_experiment

    plain = to_plain(resolve_experiment("halfcheetah"))
    assert "backend" in plain["env"] and "dataset" in plain["trainer"]
    del plain["env"]["backend"], plain["trainer"]["dataset"], plain["trainer"]["base_run"]
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(plain, sort_keys=False))
    with caplog.at_level("INFO", logger="embodied.experiment"):
        cfg = load_experiment(path)
    assert cfg.env.backend.name == "mujoco" and cfg.trainer.dataset is None
    said = " ".join(r.getMessage() for r in caplog.records)
    assert "predates key env.backend" in said and "predates key trainer.dataset" in said
    assert set(KEYS_ADDED_LATER) >= {"env.backend", "trainer.dataset"}
    del plain["trainer"]["total_env_steps"]
    path.write_text(yaml.safe_dump(plain, sort_keys=False))
    with pytest.raises(ConfigError, match=r"missing key\(s\) trainer.total_env_steps: the file is truncated"):
        load_experiment(path)
    # A config of this version cut short (its last keys, which arrived in the same release, gone)
    # is damaged, not old: the keys it still holds date it.
    current = to_plain(resolve_experiment("halfcheetah"))
    del current["trainer"]["dataset"], current["trainer"]["base_run"]
    path.write_text(yaml.safe_dump(current, sort_keys=False))
    with pytest.raises(ConfigError, match=r"missing key\(s\) trainer.dataset, trainer.base_run: the file is truncated"):
        load_experiment(path)


def test_flow_runs_saved_before_temporal_ensembling_load_as_trained(tmp_path: Path) -> None:
    """algo.policy.temporal_ensemble arrived in its own release: a bc-flow config without it
    loads with the behaviour it was trained with (off); one holding the older group's keys is old,
    not damaged."""
    import yaml

    from embodied.config import to_plain
    from embodied.experiment import load_experiment, resolve_experiment

    plain = to_plain(resolve_experiment("arm-push", "bc-flow"))
    assert plain["algo"]["policy"]["temporal_ensemble"] is True  # the shipped config's setting
    del plain["algo"]["policy"]["temporal_ensemble"]
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(plain, sort_keys=False))
    assert load_experiment(path).algo.policy.temporal_ensemble is False


@pytest.mark.parametrize(
    ("task", "algo", "key", "old_value"),
    [
        ("quad-hover", "ppo", "env.randomization_ramp", 0.0),
        ("halfcheetah", "fasttd3", "algo.critic_subset", 0),
    ],
)
def test_runs_saved_before_the_finetuning_release_load_as_trained(
    tmp_path: Path, task: str, algo: str, key: str, old_value: object
) -> None:
    """Keys of the release that added residual RL and the randomization curriculum: a run saved
    before them (its config lacks the key) loads with the behaviour it was trained with."""
    import yaml

    from embodied.config import to_plain
    from embodied.experiment import FINETUNING_RELEASE_KEYS, load_experiment, resolve_experiment

    assert key in FINETUNING_RELEASE_KEYS
    group, name = key.split(".")
    plain = to_plain(resolve_experiment(task, algo))
    del plain[group][name]
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(plain, sort_keys=False))
    assert getattr(getattr(load_experiment(path), group), name) == old_value


def test_runs_saved_before_the_ramp_start_load_with_the_ramp_from_the_first_update(tmp_path: Path) -> None:
    """A quad-hover run saved before ``env.randomization_ramp_start`` existed ramped from its first
    update: loading its config gives 0, not the value of the preset it might look like."""
    import yaml

    from embodied.commands.train import preset_file
    from embodied.config import to_plain
    from embodied.experiment import load_experiment, resolve_experiment

    plain = to_plain(resolve_experiment("quad-hover", "ppo", preset_file("quad-hover", "ppo", "sweep")))
    assert plain["env"]["randomization_ramp_start"] > 0.0
    del plain["env"]["randomization_ramp_start"]
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(plain, sort_keys=False))
    assert load_experiment(path).env.randomization_ramp_start == 0.0


def test_runs_saved_before_the_critic_gap_inputs_load_without_them(tmp_path: Path) -> None:
    """A quad-hover run saved before ``env.critic_gap_inputs`` existed had a critic without the
    gap draws: its config loads (the key filled in as False), so the run still resumes."""
    import yaml

    from embodied.commands.train import preset_file
    from embodied.config import to_plain
    from embodied.experiment import load_experiment, resolve_experiment

    plain = to_plain(resolve_experiment("quad-hover", "ppo", preset_file("quad-hover", "ppo", "sweep")))
    del plain["env"]["critic_gap_inputs"]
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(plain, sort_keys=False))
    assert load_experiment(path).env.critic_gap_inputs is False


def test_a_union_key_names_its_values_as_yaml_writes_them() -> None:
    from embodied.experiment import resolve_experiment

    with pytest.raises(ConfigError, match=r"'trainer.background_eval' expects true/false or 'auto', got 'maybe'"):
        resolve_experiment("quad-hover", overrides=["trainer.background_eval=maybe"])
    with pytest.raises(ConfigError, match=r"'trainer.success_target' expects float or null, got 'high'"):
        resolve_experiment("quad-hover", overrides=["trainer.success_target=high"])


def test_the_success_hold_rule_is_one_of_its_names() -> None:
    from embodied.experiment import resolve_experiment

    with pytest.raises(ConfigError, match=r"trainer.success_hold.*each.*mean"):
        resolve_experiment("quad-hover", overrides=["trainer.success_hold=median"])
    assert resolve_experiment("quad-hover", overrides=["trainer.success_hold=mean"]).trainer.success_hold == "mean"
    assert resolve_experiment("quad-hover").trainer.success_hold == "each"  # the nominal config
